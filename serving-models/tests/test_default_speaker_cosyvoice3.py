"""The default speaker with our ``cosyvoice3`` orchestrator in the real tritonserver (issue 19,
item 5): the model directory of ``test_twin_cosyvoice3`` (the tiny release's yaml as
``cosyvoice3.yaml``, a tiny ``speech_tokenizer_v3.onnx``, ``campplus.onnx``), the builder's
tool making the speaker file from a WAV with ``--variant cosyvoice3``, and the stand-in
trtllm-serve recording what the orchestrator asks. A request without reference audio asks
the LLM with the speaker's transcript before the target text and the speaker's speech tokens
as the assistant's prefix: exactly the file's."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api import spec
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.render import triton

from .conftest import PACKAGE_ROOT, debian_python, library_path, require_library
from .test_default_speaker import TARGET, TRANSCRIPT, request, samples, write_recording
from .test_twin_cosyvoice3 import OURS, twin_config
from .test_twin_cosyvoice3 import service as cosyvoice3_service


def service() -> Any:
    raw = cosyvoice3_service()
    return spec.parse(
        {
            "model": {"variant": "cosyvoice3", "uri": raw.model.uri},
            "engine": {"tensorParallelSize": 1},
            "serving": {"gpusPerReplica": 1},
            "speakers": {"default": {"audioUri": "pvc://voices/a.wav", "transcript": "x"}},
        }
    )


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, release: Path
) -> Iterator[tuple[Any, Any, Path]]:
    require_library()
    work = tmp_path_factory.mktemp("cosyvoice3-speaker")
    model_dir = work / "model"
    (model_dir / "llm").mkdir(parents=True)
    shutil.copy(release / "cosyvoice2.yaml", model_dir / "cosyvoice3.yaml")
    shutil.copy(release / "llm" / "tokenizer.json", model_dir / "llm" / "tokenizer.json")
    shutil.copy(release / "campplus.onnx", model_dir / "campplus.onnx")
    debian_python(
        "-c",
        "import sys; from pathlib import Path; from cosyvoice_serving_models import tiny_onnx; "
        "tiny_onnx.write_speech_tokenizer(Path(sys.argv[1]), 'v3')",
        str(model_dir / "speech_tokenizer_v3.onnx"),
    )
    write_recording(work / "narrator.wav")
    (work / "transcript.txt").write_text(TRANSCRIPT, encoding="utf-8")
    speaker_file = work / "engine" / "speakers" / "default.npz"
    debian_python(
        "-m",
        "cosyvoice_serving_models.speaker_prompt",
        *("--model-dir", str(model_dir), "--variant", "cosyvoice3"),
        *("--audio", str(work / "narrator.wav"), "--transcript-file", str(work / "transcript.txt")),
        *("--out", str(speaker_file)),
    )
    svc = service()
    with cpu_twin.LlmStandIn(triton.llm_urls(svc), event_seconds=0.01) as llm:
        twin = cpu_twin.to_cpu(triton.render_repository(svc, "/engine"))
        twin = {n: twin_config(t, model_dir, llm.remap) for n, t in twin.items()}
        config = text_format.Parse(twin["cosyvoice3"], mc.ModelConfig())
        assert config.parameters["default_speaker"].string_value == ("/engine/speakers/default.npz")
        config.parameters["default_speaker"].string_value = str(speaker_file)
        twin["cosyvoice3"] = text_format.MessageToString(config)
        repo = cpu_twin.write_repository(twin, work / "repo")
        for name in OURS:
            shutil.copy(PACKAGE_ROOT / "models" / name / "model.py", repo / name / "1" / "model.py")
        env = {"COSYVOICE_MODELS_PATH": library_path(), "OMP_NUM_THREADS": "1"}
        triton_server = cpu_twin.TritonServer(repo, work, env=env)
        triton_server.start(ready_timeout=300)
        try:
            yield triton_server, llm, speaker_file
        finally:
            triton_server.stop()


def test_a_request_without_reference_audio_prompts_the_llm_with_the_default_speaker(
    server: tuple[Any, Any, Path],
) -> None:
    from cosyvoice_serving_models import speakers

    triton_server, llm, speaker_file = server
    prompt = speakers.load_prompt(speaker_file)
    assert prompt.speech_tokens.size > 0
    before = sum(llm.requests_per_server())
    assert samples(triton_server, request(TARGET), "cosyvoice3") > 0
    [asked] = [r for s in llm.servers for r in s.requests][before:]
    user, assistant = asked["messages"]
    assert user == {"role": "user", "content": TRANSCRIPT + TARGET}
    tokens = "".join(f"<|s_{int(t)}|>" for t in prompt.speech_tokens)
    assert assistant == {"role": "assistant", "content": tokens}
