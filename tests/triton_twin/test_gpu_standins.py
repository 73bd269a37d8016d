"""The GPU data plane's stand-ins (``bench/gpu``) load and stream in the real Triton, on a CPU.

CI has no GPU, so the sweep itself runs only on the lent H200 (``bench/README.md``). What CI
checks: the repository that ``bench/gpu/pack.py`` lays out for a sweep point (the operator's
rendering with the GPU stand-ins' torch code, shrunk by ``COSYVOICE_STANDIN_SIZE=tiny`` and
turned to CPU instances by the twin's one transform) loads in ``tritonserver``; streams
requested by ``bench/gpu/loadgen.py`` over HTTP come back complete (960 samples per speech
token, one chunk per upstream hop); and the LLM stand-in's in-flight batching serves more
concurrent streams than it has slots, with every stream's length exact.

Needs a CPU build of torch that the Python-backend stub can import: Debian's
``python3-torch`` (``scripts/setup.sh`` installs it).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cosyvoice_operator.devtools.closedloop import cpu_twin

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "bench" / "gpu"
DEBIAN_SITE = Path("/usr/lib/python3/dist-packages")
SAMPLES_PER_TOKEN = 960
FIRST_HOP, LOOKAHEAD, TOKEN_RATE = 15, 3, 25


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


loadgen = _load("loadgen")
pack = _load("pack")


def expected_chunks(tokens: int) -> int:
    """Chunks of a stream of ``tokens`` speech tokens, by upstream's exponential schedule."""
    offset, hop, chunk, count = 0, FIRST_HOP, 0, 0
    while tokens - offset >= hop + LOOKAHEAD:
        count += 1
        offset += hop
        hop = TOKEN_RATE * 2**chunk
        chunk += 1
    return count + 1


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cpu_twin.TritonServer]:
    if not (DEBIAN_SITE / "torch").is_dir():
        pytest.fail("Debian's python3-torch is missing: run scripts/setup.sh")
    work = tmp_path_factory.mktemp("gpu-standins")
    params = {
        "orchestratorPerGpu": 4,
        "instancesPerGpu": 2,
        "maxQueueDelayUs": 500,
        "maxBatchSize": 2,
    }
    rendered = pack.repository(params, work / "as-packed", code="standins")
    twin = cpu_twin.to_cpu(rendered)
    repo = work / "repo"
    for name, text in twin.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
        for code in (work / "as-packed" / name / "1").glob("*.py"):
            (repo / name / "1" / code.name).write_bytes(code.read_bytes())
    env = {
        "COSYVOICE_STANDIN_PATH": f"{GPU / 'standins'}:{DEBIAN_SITE}",
        "COSYVOICE_STANDIN_SIZE": "tiny",
        "OMP_NUM_THREADS": "1",
    }
    triton = cpu_twin.TritonServer(repo, work, env=env)
    triton.start(ready_timeout=180)
    try:
        yield triton
    finally:
        triton.stop()


def test_pack_renders_the_operators_repository_with_only_the_llm_backend_changed(
    tmp_path: Path,
) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from cosyvoice_operator.api import spec
    from cosyvoice_operator.render import triton

    params = {
        "orchestratorPerGpu": 16,
        "instancesPerGpu": 2,
        "maxQueueDelayUs": 4000,
        "maxBatchSize": 16,
    }
    packed = pack.repository(params, tmp_path, code="standins")
    rendered = triton.render_repository(spec.parse(pack.point_spec(params)), pack.ENGINE_DIR)
    assert list(packed) == list(rendered)
    for name in rendered:
        a = text_format.Parse(packed[name], mc.ModelConfig())
        b = text_format.Parse(rendered[name], mc.ModelConfig())
        if name == "tensorrt_llm":
            assert (a.backend, b.backend) == ("python", "tensorrtllm")
            b.backend = "python"
        if name == "cosyvoice2":
            assert a.instance_group[0].count == 16
            b.instance_group[0].count = 16
        assert a == b, name
    token2wav = text_format.Parse(packed["token2wav"], mc.ModelConfig())
    assert token2wav.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert token2wav.instance_group[0].count == 2
    assert token2wav.dynamic_batching.max_queue_delay_microseconds == 4000
    assert (
        (tmp_path / "token2wav" / "1" / "model.py")
        .read_text()
        .startswith('"""GPU stand-in for CosyVoice2')
    )


def test_pack_with_our_code_changes_only_the_llm_backend_count_and_paths(tmp_path: Path) -> None:
    """``--code ours`` (issue 20): the project's orchestrator and token2wav in the operator's
    repository, its model_dir and tokenizer dir at the synthetic release, and the orchestrator's
    stub wrapper (NumPy 1.26 for the one model that reads BYTES)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from cosyvoice_operator.api import spec
    from cosyvoice_operator.render import triton

    params = {"orchestratorPerGpu": 32, "instancesPerGpu": 2, "maxQueueDelayUs": 500}
    params["maxBatchSize"] = 32
    packed = pack.repository(params, tmp_path, code="ours", release="/tmp/r")
    rendered = triton.render_repository(spec.parse(pack.point_spec(params)), pack.ENGINE_DIR)
    paths = {"model_dir": "/tmp/r", "llm_tokenizer_dir": "/tmp/r/llm"}
    for name in rendered:
        a = text_format.Parse(packed[name], mc.ModelConfig())
        b = text_format.Parse(rendered[name], mc.ModelConfig())
        if name == "tensorrt_llm":
            b.backend = "python"
        for key, value in paths.items():
            if key in b.parameters:
                assert a.parameters[key].string_value == value, (name, key)
                b.parameters[key].string_value = value
        assert a == b, name
        source = (tmp_path / name / "1" / "model.py").read_text()
        ours = ROOT / "serving-models" / "models" / name / "model.py"
        assert (ours.exists() and source == ours.read_text()) == (name in pack.OURS), name
    stub = tmp_path / "cosyvoice2" / "triton_python_backend_stub"
    assert stub.read_text() == pack.ORCHESTRATOR_STUB and stub.stat().st_mode & 0o111
    assert not (tmp_path / "token2wav" / "triton_python_backend_stub").exists()


def test_streams_come_back_complete_through_the_gpu_standins(
    server: cpu_twin.TritonServer,
) -> None:
    port = server.http_port
    # 6 concurrent streams against 2 LLM slots and 4 orchestrator instances: some wait.
    seconds = [2.0, 4.0, 1.0, 6.0, 3.0, 2.5]

    async def run() -> list[Any]:
        return list(
            await asyncio.gather(
                *(loadgen.stream("127.0.0.1", port, "cosyvoice2", s, 120.0) for s in seconds)
            )
        )

    results = asyncio.run(run())
    for result in results:
        assert result.error == "", result.error
        tokens = 3 * len(loadgen.text_for(result.audio_seconds))
        assert result.chunks == expected_chunks(tokens), (result.audio_seconds, result.chunks)
        assert result.first_chunk_s is not None and result.done is not None
        assert result.first <= result.done
    summary = loadgen.summarize(results, duration=1.0, slo_s=1000.0)
    assert summary["errors"] == 0 and summary["requests"] == len(seconds)


def test_audio_length_matches_the_tokens(server: cpu_twin.TritonServer) -> None:
    import urllib.request

    body = json.dumps({"target_text": loadgen.text_for(1.0)}).encode()
    request = urllib.request.Request(
        f"{server.http}/v2/models/cosyvoice2/generate_stream",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    samples = 0
    with urllib.request.urlopen(request, timeout=120) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                assert "error" not in event, event
                samples += len(event["waveform"])  # generate's flat output
    tokens = 3 * len(loadgen.text_for(1.0))
    assert samples == tokens * SAMPLES_PER_TOKEN
