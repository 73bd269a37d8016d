"""The project's model code in the real tritonserver (pytriton's, CPU), with upstream's
library on a tiny synthetic release: the operator's rendered CosyVoice2 repository with our
``cosyvoice2`` orchestrator, ``token2wav``, ``audio_tokenizer`` (``s3tokenizer``) and
``speaker_embedding`` (Kaldi fbank, ONNX Runtime); ``tensorrt_llm`` stays the CPU twin's
stand-in (no TensorRT-LLM on this machine). The server is ``conftest.cosyvoice2_twin``
(shared with ``test_default_speaker``).

Two things differ from what the operator renders, both named there: the twin's one transform
(KIND_GPU -> KIND_CPU, ``cpu_twin.to_cpu``) and the paths (``model_dir``,
``llm_tokenizer_dir`` and ``default_speaker`` point at the synthetic release and the
speaker's file, which the serving entrypoint's model view would hold).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from twins import FIRST_CHUNK_TOKENS, CosyVoice2Twin, debian_python, infer, stream

from cosyvoice_operator.devtools.closedloop import cpu_twin


def test_streams_complete_with_the_chunk_schedule_rendered(cosyvoice2_twin: CosyVoice2Twin) -> None:
    from cosyvoice_serving_models.chunking import Chunking

    targets = ["Hello there, this is a test.", "A second stream, a little longer than one."]
    chunks = stream(cosyvoice2_twin.server, targets, "cosyvoice2")
    for target in targets:
        # The LLM stand-in answers a count of tokens that grows with the prompt's length;
        # the chunk sizes tell the schedule: firstChunkTokens, then 25 x 2^k, then the rest.
        sizes = [len(c) for c in chunks[target]]
        total = sum(sizes) // 960
        assert sum(sizes) == total * 960, sizes
        expected = Chunking(first=FIRST_CHUNK_TOKENS).schedule(total)
        assert sizes[0] == FIRST_CHUNK_TOKENS * 960 - 3840, sizes  # 160 ms held for the fade
        assert len(sizes) == len(expected), (sizes, expected)
        # (every chunk finite and non-zero: checked by twins.streams)


def test_each_instance_runs_on_the_device_triton_gave_it(cosyvoice2_twin: CosyVoice2Twin) -> None:
    records = cosyvoice2_twin.device_records
    entries = [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]
    for model in ("token2wav", "audio_tokenizer", "speaker_embedding"):
        instances = [e for e in entries if e["instance"].startswith(model)]
        assert len(instances) == 2, (model, entries)  # instancesPerGpu 2
        assert len({e["pid"] for e in instances}) == 2
        for entry in instances:
            assert entry["kind"] == "CPU" and entry["device"] == "cpu", entry


def active_streams(server: cpu_twin.TritonServer) -> list[float]:
    """Every orchestrator instance's ``cosyvoice_active_streams`` gauge, as Triton serves it."""
    return [
        float(line.rsplit(" ", 1)[1])
        for line in server.metrics().splitlines()
        if line.startswith("cosyvoice_active_streams{")
    ]


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_the_orchestrator_reports_its_active_streams(cosyvoice2_twin: CosyVoice2Twin) -> None:
    """A stream held in flight counts 1 in its instance's gauge (the others 0), and once it
    ended every gauge reads 0 again. Self-contained: the stream is this test's own, held by
    the stand-in LLM while ``llm-pause`` exists in the twin's folder (``conftest``,
    ``COSYVOICE_TWIN_LLM_PAUSE_FILE``), so no earlier test decides what is read. An instance
    sets its gauge back to 0 when its ``execute`` returns, just after it sent the final
    response (a drain waits that long more): the client may see the final response first,
    so the gauges are read until they are all 0, for 60 s at most."""
    server = cosyvoice2_twin.server
    pause = server.work / "llm-pause"
    wait_until("no stream of another test", lambda: active_streams(server) == [0.0] * 4)
    assert len(active_streams(server)) == 4  # one per instance (maxBatchSize 2 -> 4)
    pause.touch()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            playing = pool.submit(stream, server, ["A stream held in flight."], "cosyvoice2")
            wait_until("the stream in a gauge", lambda: sum(active_streams(server)) == 1)
            assert sorted(active_streams(server)) == [0.0, 0.0, 0.0, 1.0]
        finally:
            pause.unlink(missing_ok=True)
        chunks = playing.result(timeout=300)["A stream held in flight."]
    assert len(chunks) > 1  # it went on after the pause, to its end
    wait_until("every gauge back to 0", lambda: active_streams(server) == [0.0] * 4)


def test_the_reference_models_answer_what_upstreams_computation_gives(
    cosyvoice2_twin: CosyVoice2Twin, tmp_path: Path
) -> None:
    """Our ``audio_tokenizer`` and ``speaker_embedding`` in tritonserver, on the reference
    every stream sends, against ``reference_check.py``: the tokenizer built from the generated
    weights directly (not read back from the ONNX file) and run as upstream's model runs it,
    and the embedding from upstream's fbank and the tiny network in NumPy. A reference cut by
    ``reference_wav_len`` is tokenized as the cut waveform."""
    triton_server = cosyvoice2_twin.server
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


def grpc_inputs(values: dict[str, Any]) -> list[Any]:
    import tritonclient.grpc as grpcclient

    types = {np.int32: "INT32", np.float16: "FP16", np.float32: "FP32", np.bool_: "BOOL"}
    out = []
    for name, value in values.items():
        tensor = grpcclient.InferInput(name, list(value.shape), types[value.dtype.type])
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def test_token2wav_takes_a_streams_state_whole_or_not_at_all(
    cosyvoice2_twin: CosyVoice2Twin,
) -> None:
    """Our ``token2wav`` keeps nothing between chunks (any instance serves any chunk): a
    streamed chunk brings the vocoder state the chunk before returned, ``hift_cache_mel``,
    ``_source`` and ``_speech``, all three (none for a stream's first chunk). Part of it, or a
    state sent with an offline request (no ``token_offset``), is that request's error, and
    the instance serves on: the next chunk with the whole state is synthesised. (This
    replaces a test of the CPU twin's stand-in, which refused a chunk by per-instance state
    that the deployed token2wav does not keep.)"""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from cosyvoice_serving_models.speakers import load_prompt

    prompt_tokens, feat, embedding = load_prompt(cosyvoice2_twin.speaker).as_request_inputs()
    tokens = np.random.default_rng(3).integers(0, 6561, size=(1, 43)).astype(np.int32)

    def chunk(end: int, offset: int | None, finalize: bool, **state: Any) -> dict[str, Any]:
        values = {
            "target_speech_tokens": tokens[:, :end],
            "prompt_speech_tokens": prompt_tokens,
            "prompt_speech_feat": feat,
            "prompt_spk_embedding": embedding,
            **state,
        }
        if offset is not None:
            values["token_offset"] = np.array([[offset]], dtype=np.int32)
            values["finalize"] = np.array([[finalize]], dtype=np.bool_)
        return values

    client = grpcclient.InferenceServerClient(cosyvoice2_twin.server.grpc)
    try:
        first = client.infer("token2wav", grpc_inputs(chunk(18, 0, False)))
        state = {
            f"hift_cache_{part}": first.as_numpy(f"hift_next_{part}")
            for part in ("mel", "source", "speech")
        }
        assert all(value is not None and value.size for value in state.values()), state
        part = {"hift_cache_speech": state["hift_cache_speech"]}
        with pytest.raises(InferenceServerException, match="a chunk's state needs all of"):
            client.infer("token2wav", grpc_inputs(chunk(43, 15, True, **part)))
        with pytest.raises(InferenceServerException, match="given to an offline request"):
            client.infer("token2wav", grpc_inputs(chunk(43, None, True, **state)))
        last = client.infer("token2wav", grpc_inputs(chunk(43, 15, True, **state)))
        audio = last.as_numpy("waveform")
        assert audio is not None and audio.size and np.isfinite(audio).all()
    finally:
        client.close()
