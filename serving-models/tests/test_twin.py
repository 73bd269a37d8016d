"""The project's model code in the real tritonserver (pytriton's, CPU), with upstream's
library on a tiny synthetic release: the operator's rendered CosyVoice2 repository with our
``cosyvoice2`` orchestrator, ``token2wav``, ``audio_tokenizer`` (``s3tokenizer``) and
``speaker_embedding`` (Kaldi fbank, ONNX Runtime); ``tensorrt_llm`` stays the CPU twin's
stand-in (no TensorRT-LLM on this machine).

Two things differ from what the operator renders, both named here: the twin's one transform
(KIND_GPU -> KIND_CPU, ``cpu_twin.to_cpu``) and the paths (``model_dir`` and
``llm_tokenizer_dir`` point at the synthetic release, which the serving entrypoint's model
view would hold).
"""

from __future__ import annotations

import json
import queue
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api import spec
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.render import triton

from .conftest import PACKAGE_ROOT, ROOT, debian_python, library_path, require_library

OURS = ("cosyvoice2", "token2wav", "audio_tokenizer", "speaker_embedding")
FIRST_CHUNK_TOKENS = 10


def service() -> Any:
    raw = yaml.safe_load((ROOT / "examples" / "cosyvoice2.yaml").read_text())["spec"]
    raw["engine"]["maxBatchSize"] = 2
    raw["serving"]["dynamicBatching"]["preferredBatchSizes"] = [2]
    raw["serving"]["instancesPerGpu"] = 2
    raw["serving"]["streamChunking"] = {"firstChunkTokens": FIRST_CHUNK_TOKENS}
    return spec.parse(raw)


def with_paths(text: str, release: Path) -> str:
    config = text_format.Parse(text, mc.ModelConfig())
    for key, value in (("model_dir", release), ("llm_tokenizer_dir", release / "llm")):
        if key in config.parameters:
            config.parameters[key].string_value = str(value)
    return text_format.MessageToString(config)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, release: Path
) -> Iterator[tuple[cpu_twin.TritonServer, Path]]:
    require_library()
    work = tmp_path_factory.mktemp("model-code")
    rendered = triton.render_repository(service(), "/engine")
    twin = cpu_twin.to_cpu(rendered)
    twin = {name: with_paths(text, release) for name, text in twin.items()}
    repo = cpu_twin.write_repository(twin, work / "repo")
    for name in OURS:
        shutil.copy(PACKAGE_ROOT / "models" / name / "model.py", repo / name / "1" / "model.py")
    records = work / "devices"
    env = {
        "COSYVOICE_MODELS_PATH": library_path(),
        "COSYVOICE_DEVICE_RECORD_DIR": str(records),
        "OMP_NUM_THREADS": "1",
    }
    triton_server = cpu_twin.TritonServer(repo, work, env=env)
    triton_server.start(ready_timeout=300)
    try:
        yield triton_server, records
    finally:
        triton_server.stop()


def stream(
    server: cpu_twin.TritonServer, targets: list[str], model: str = "cosyvoice2"
) -> dict[str, list[Any]]:
    """Send every target as its own stream at once; each stream's chunks in arrival order."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    ids = {}
    try:
        for target in targets:
            request_id = str(uuid.uuid4())
            ids[request_id] = target
            client.async_stream_infer(
                model,
                cpu_twin.request_inputs(target),
                request_id=request_id,
                enable_empty_final_response=True,
            )
        chunks: dict[str, list[Any]] = {t: [] for t in targets}
        done: set[str] = set()
        while len(done) < len(targets):
            result, error = results.get(timeout=300)
            assert error is None, f"{error}\n{server.log_tail()}"
            response = result.get_response()
            target = ids[response.id]
            audio = result.as_numpy("waveform")
            if audio is not None:
                chunks[target].append(audio.reshape(-1))
            if response.parameters["triton_final_response"].bool_param:
                done.add(target)
        return chunks
    finally:
        client.stop_stream()
        client.close()


def test_streams_complete_with_the_chunk_schedule_rendered(
    server: tuple[cpu_twin.TritonServer, Path],
) -> None:
    from cosyvoice_serving_models.chunking import Chunking

    triton_server, _ = server
    targets = ["Hello there, this is a test.", "A second stream, a little longer than one."]
    chunks = stream(triton_server, targets)
    for target in targets:
        # The LLM stand-in answers a count of tokens that grows with the prompt's length;
        # the chunk sizes tell the schedule: firstChunkTokens, then 25 x 2^k, then the rest.
        sizes = [len(c) for c in chunks[target]]
        total = sum(sizes) // 960
        assert sum(sizes) == total * 960, sizes
        expected = Chunking(first=FIRST_CHUNK_TOKENS).schedule(total)
        assert sizes[0] == FIRST_CHUNK_TOKENS * 960 - 3840, sizes  # 160 ms held for the fade
        assert len(sizes) == len(expected), (sizes, expected)
        assert all(np.isfinite(c).all() and np.abs(c).max() > 0 for c in chunks[target])


def test_each_instance_runs_on_the_device_triton_gave_it(
    server: tuple[cpu_twin.TritonServer, Path],
) -> None:
    _, records = server
    entries = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    for model in ("token2wav", "audio_tokenizer", "speaker_embedding"):
        instances = [e for e in entries if e["instance"].startswith(model)]
        assert len(instances) == 2, (model, entries)  # instancesPerGpu 2
        assert len({e["pid"] for e in instances}) == 2
        for entry in instances:
            assert entry["kind"] == "CPU" and entry["device"] == "cpu", entry


def test_the_orchestrator_reports_its_active_streams(
    server: tuple[cpu_twin.TritonServer, Path],
) -> None:
    triton_server, _ = server
    metrics = triton_server.metrics().splitlines()
    lines = [line for line in metrics if line.startswith("cosyvoice_active_streams")]
    assert len(lines) == 4, lines  # one gauge per orchestrator instance (maxBatchSize 2 -> 4)
    assert all(line.endswith(" 0") for line in lines), lines  # no stream left behind


def infer(server: cpu_twin.TritonServer, model: str, inputs: dict[str, Any], output: str) -> Any:
    """One request to ``model`` (a batch of one), its ``output`` as NumPy."""
    import tritonclient.grpc as grpcclient

    types = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}
    tensors = []
    for name, value in inputs.items():
        tensor = grpcclient.InferInput(name, list(value.shape), types[value.dtype])
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        return client.infer(model, tensors).as_numpy(output)
    finally:
        client.close()


def test_the_reference_models_answer_what_upstreams_computation_gives(
    server: tuple[cpu_twin.TritonServer, Path], tmp_path: Path
) -> None:
    """Our ``audio_tokenizer`` and ``speaker_embedding`` in tritonserver, on the reference
    every stream sends, against ``reference_check.py``: the tokenizer built from the generated
    weights directly (not read back from the ONNX file) and run as upstream's model runs it,
    and the embedding from upstream's fbank and the tiny network in NumPy. A reference cut by
    ``reference_wav_len`` is tokenized as the cut waveform."""
    triton_server, _ = server
    wav = np.sin(np.arange(16000 * 2, dtype=np.float32) / 7.0).reshape(1, -1)
    cut = 16000 + 4000
    expected = {}
    for length in (wav.shape[1], cut):
        np.save(tmp_path / "wav.npy", wav[:, :length])
        line = debian_python(
            str(Path(__file__).parent / "reference_check.py"), str(tmp_path / "wav.npy")
        )
        expected[length] = json.loads(line.splitlines()[-1])
    for length in (wav.shape[1], cut):
        tokens = infer(
            triton_server,
            "audio_tokenizer",
            {"reference_wav": wav, "reference_wav_len": np.array([[length]], dtype=np.int32)},
            "prompt_speech_tokens",
        )
        assert tokens.dtype == np.int32 and tokens.shape[0] == 1
        assert tokens.reshape(-1).tolist() == expected[length]["tokens"]
        assert len(expected[length]["tokens"]) == -(-length // 640)  # 25 tokens a second
    embedding = infer(
        triton_server, "speaker_embedding", {"reference_wav": wav}, "prompt_spk_embedding"
    )
    assert embedding.dtype == np.float16 and embedding.shape == (1, 192)
    want = np.array(expected[wav.shape[1]]["embedding"], dtype=np.float32)
    assert np.abs(want).max() > 0.01
    np.testing.assert_allclose(embedding.reshape(-1).astype(np.float32), want, atol=2e-3, rtol=2e-3)
    # A bad length is that request's error, and the instance serves on.
    from tritonclient.utils import InferenceServerException

    bad = {"reference_wav": wav, "reference_wav_len": np.array([[0]], dtype=np.int32)}
    with pytest.raises(InferenceServerException, match=r"outside 1\.\.32000"):
        infer(triton_server, "audio_tokenizer", bad, "prompt_speech_tokens")
    again = {"reference_wav": wav, "reference_wav_len": np.array([[cut]], dtype=np.int32)}
    tokens = infer(triton_server, "audio_tokenizer", again, "prompt_speech_tokens")
    assert tokens.reshape(-1).tolist() == expected[cut]["tokens"]
