"""Our ``cosyvoice3`` orchestrator in the real tritonserver: the operator's rendered
CosyVoice3 repository for a pod of two LLM groups (``gpusPerReplica: 2``), with our
``audio_tokenizer`` (on a tiny ``speech_tokenizer_v3.onnx``) and ``speaker_embedding``, and
the twin's stand-ins for ``token2wav``, ``vocoder`` and the two trtllm-serve processes
(``cpu_twin.LlmStandIn``: OpenAI chat completions, streamed). The PyPI packages hold no
CosyVoice3 flow or vocoder (README).

What the twin changes, named here: KIND_GPU -> KIND_CPU (``cpu_twin.to_cpu``); the LLM URLs
point at the stand-ins' free ports; ``model_dir`` / ``llm_tokenizer_dir`` at a model directory
holding the tiny release's yaml (as ``cosyvoice3.yaml``: only its ``feat_extractor`` is read
here), tokenizer and ``campplus.onnx``, and a tiny ``speech_tokenizer_v3.onnx``
(``tiny_onnx``).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api import spec
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.render import triton

from .conftest import PACKAGE_ROOT, ROOT, debian_python, library_path, require_library
from .test_twin import infer, stream

OURS = ("cosyvoice3", "audio_tokenizer", "speaker_embedding")


def service() -> Any:
    raw = yaml.safe_load((ROOT / "examples" / "cosyvoice3.yaml").read_text())["spec"]
    raw["serving"]["gpusPerReplica"] = 2
    raw["engine"]["tensorParallelSize"] = 1
    raw["serving"].pop("dynamicBatching", None)
    raw.pop("autoscaling", None)
    raw["replicas"] = 1
    return spec.parse(raw)


def twin_config(text: str, model_dir: Path, remap: dict[str, str]) -> str:
    config = text_format.Parse(text, mc.ModelConfig())
    for key, value in (
        ("model_dir", str(model_dir)),
        ("llm_tokenizer_dir", str(model_dir / "llm")),
    ):
        if key in config.parameters:
            config.parameters[key].string_value = value
    for key in ("llm_api_base", "llm_api_bases"):
        if key in config.parameters:
            urls = config.parameters[key].string_value.split(",")
            config.parameters[key].string_value = ",".join(remap[u] for u in urls)
    return text_format.MessageToString(config)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, release: Path
) -> Iterator[tuple[cpu_twin.TritonServer, cpu_twin.LlmStandIn, Path]]:
    require_library()
    work = tmp_path_factory.mktemp("cosyvoice3")
    model_dir = work / "model"
    (model_dir / "llm").mkdir(parents=True)
    shutil.copy(release / "cosyvoice2.yaml", model_dir / "cosyvoice3.yaml")
    shutil.copy(release / "llm" / "tokenizer.json", model_dir / "llm" / "tokenizer.json")
    shutil.copy(release / "campplus.onnx", model_dir / "campplus.onnx")
    tokenizer = model_dir / "speech_tokenizer_v3.onnx"
    debian_python(
        "-c",
        "import sys; from pathlib import Path; from cosyvoice_serving_models import tiny_onnx; "
        "tiny_onnx.write_speech_tokenizer(Path(sys.argv[1]), 'v3')",
        str(tokenizer),
    )
    svc = service()
    urls = triton.llm_urls(svc)
    assert len(urls) == 2
    with cpu_twin.LlmStandIn(urls, event_seconds=0.05) as llm:
        twin = cpu_twin.to_cpu(triton.render_repository(svc, "/engine"))
        twin = {n: twin_config(t, model_dir, llm.remap) for n, t in twin.items()}
        repo = cpu_twin.write_repository(twin, work / "repo")
        for name in OURS:
            shutil.copy(PACKAGE_ROOT / "models" / name / "model.py", repo / name / "1" / "model.py")
        env = {"COSYVOICE_MODELS_PATH": library_path(), "OMP_NUM_THREADS": "1"}
        triton_server = cpu_twin.TritonServer(repo, work, env=env)
        triton_server.start(ready_timeout=300)
        try:
            yield triton_server, llm, repo
        finally:
            triton_server.stop()


def test_each_stream_goes_to_the_least_loaded_llm_group(
    server: tuple[cpu_twin.TritonServer, cpu_twin.LlmStandIn, Path],
) -> None:
    """The counts are shared by every orchestrator process through one file: load a group
    there (as streams in flight on other instances would) and the next stream goes to the
    other one, both ways. No timing involved."""
    from cosyvoice_serving_models.llm_groups import LeastLoaded

    triton_server, llm, repo = server
    urls = [llm.remap[u] for u in triton.llm_urls(service())]
    groups = LeastLoaded(urls, str(repo / "cosyvoice3"))
    served = []
    for busy in ([0, 5], [5, 0], [5, 0]):
        Path(groups.path).write_text(json.dumps(busy))
        before = llm.requests_per_server()
        chunks = stream(triton_server, ["Stream to the least loaded group, please."], "cosyvoice3")
        assert sum(len(c) for c in chunks["Stream to the least loaded group, please."]) > 0
        after = llm.requests_per_server()
        served.append([b - a for a, b in zip(before, after, strict=True)])
        assert groups.counts() == busy  # the stream gave its slot back
    assert served == [[1, 0], [0, 1], [0, 1]]


def test_the_speech_tokenizer_is_the_releases_v3(
    server: tuple[cpu_twin.TritonServer, cpu_twin.LlmStandIn, Path], tmp_path: Path
) -> None:
    """Our ``audio_tokenizer`` in the CosyVoice3 repository reads ``speech_tokenizer_v3.onnx``
    (the release's yaml says cosyvoice3) through ``s3tokenizer``'s v3 converter: its tokens
    are those of the generated v3 weights run as upstream's model runs them."""
    import numpy as np

    triton_server, _, _ = server
    wav = np.sin(np.arange(16000 * 2, dtype=np.float32) / 7.0).reshape(1, -1)
    np.save(tmp_path / "wav.npy", wav)
    check = Path(__file__).parent / "reference_check.py"
    v2, v3 = (
        json.loads(debian_python(str(check), str(tmp_path / "wav.npy"), version).splitlines()[-1])
        for version in ("v2", "v3")
    )
    length = np.array([[wav.shape[1]]], dtype=np.int32)
    tokens = infer(
        triton_server,
        "audio_tokenizer",
        {"reference_wav": wav, "reference_wav_len": length},
        "prompt_speech_tokens",
    )
    assert tokens.reshape(-1).tolist() == v3["tokens"] != v2["tokens"]
