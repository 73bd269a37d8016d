"""The default speaker (issue 19, item 5) in the real tritonserver (pytriton's, CPU), with our
``cosyvoice2`` and ``token2wav`` on upstream's library and the tiny synthetic release.

The operator renders ``default_speaker`` for a service with ``spec.speakers.default``; the
engine builder would have written the file (``speaker_prompt.py``, upstream's frontend: not
on this machine, no ONNX Runtime or Whisper). Here the file is written by the same
``speakers.save_prompt`` from prompt features of the synthetic release's shapes: speech
tokens, the prompt mel of a tone by ``features.prompt_mel``, an embedding of 192.

What tells the default speaker was used: the ``tensorrt_llm`` stand-in answers 3 speech tokens
per text token of its prompt (the speaker's transcript + the target text), so a request
without reference audio yields exactly the audio length of a request that sends a reference
with the transcript as its text, and more than one whose reference text is empty.
"""

from __future__ import annotations

import shutil
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

from .conftest import PACKAGE_ROOT, ROOT, library_path, require_library

TRANSCRIPT = "This is the default voice of the service, reading a sentence of its own."
TARGET = "Hello there."
SAMPLES_PER_TOKEN = 960


def service() -> Any:
    raw = yaml.safe_load((ROOT / "examples" / "cosyvoice2.yaml").read_text())["spec"]
    raw["engine"]["maxBatchSize"] = 1
    raw["serving"]["dynamicBatching"]["preferredBatchSizes"] = [1]
    raw["speakers"] = {"default": {"audioUri": "pvc://voices/narrator.wav", "transcript": "x"}}
    return spec.parse(raw)


def write_default_speaker(path: Path) -> None:
    from cosyvoice_serving_models import features, speakers

    tone = np.sin(np.arange(16000 * 2, dtype=np.float32) / 5.0)
    prompt = speakers.aligned(
        TRANSCRIPT,
        np.arange(40) * 97 % 6561,
        features.prompt_mel(tone),
        np.random.default_rng(7).standard_normal(192),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    speakers.save_prompt(path, prompt)


def with_paths(text: str, release: Path, speaker: Path) -> str:
    config = text_format.Parse(text, mc.ModelConfig())
    for key, value in (
        ("model_dir", release),
        ("llm_tokenizer_dir", release / "llm"),
        ("default_speaker", speaker),
    ):
        if key in config.parameters:
            config.parameters[key].string_value = str(value)
    return text_format.MessageToString(config)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, release: Path) -> Iterator[Any]:
    require_library()
    work = tmp_path_factory.mktemp("default-speaker")
    speaker = work / "engine" / "speakers" / "default.npz"
    write_default_speaker(speaker)
    rendered = triton.render_repository(service(), "/engine")
    assert rendered["cosyvoice2"].count('"default_speaker"') == 1
    twin = {
        name: with_paths(text, release, speaker) for name, text in cpu_twin.to_cpu(rendered).items()
    }
    repo = cpu_twin.write_repository(twin, work / "repo")
    for name in ("cosyvoice2", "token2wav"):
        shutil.copy(PACKAGE_ROOT / "models" / name / "model.py", repo / name / "1" / "model.py")
    env = {"COSYVOICE_MODELS_PATH": library_path(), "OMP_NUM_THREADS": "1"}
    triton_server = cpu_twin.TritonServer(repo, work, env=env)
    triton_server.start(ready_timeout=300)
    try:
        yield triton_server
    finally:
        triton_server.stop()


def samples(server: Any, inputs: list[Any]) -> int:
    """The audio of one offline-sized stream, whole."""
    import queue

    import tritonclient.grpc as grpcclient

    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    total = 0
    try:
        client.async_stream_infer("cosyvoice2", inputs, enable_empty_final_response=True)
        while True:
            result, error = results.get(timeout=300)
            assert error is None, f"{error}\n{server.log_tail()}"
            audio = result.as_numpy("waveform")
            if audio is not None:
                assert np.isfinite(audio).all() and np.abs(audio).max() > 0
                total += audio.size
            if result.get_response().parameters["triton_final_response"].bool_param:
                return total
    finally:
        client.stop_stream()
        client.close()


def target_only(target: str) -> list[Any]:
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("target_text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[target.encode()]], dtype=object))
    return [tensor]


def test_a_request_without_reference_audio_speaks_with_the_default_speaker(server: Any) -> None:
    default = samples(server, target_only(TARGET))
    assert default > 0 and default % SAMPLES_PER_TOKEN == 0
    # The same text in the LLM's prompt: the default speaker's transcript reached it.
    assert default == samples(server, cpu_twin.request_inputs(TARGET, reference_text=TRANSCRIPT))
    assert default > samples(server, cpu_twin.request_inputs(TARGET, reference_text=""))
