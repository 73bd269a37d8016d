"""The default speaker (issue 19, item 5) end to end on the CPU, with upstream's library and
the tiny synthetic release: the engine builder's tool (``speaker_prompt``) turns a WAV and its
transcript into the speaker file, and the real tritonserver (pytriton's) serves the operator's
rendered CosyVoice2 repository with our ``cosyvoice2``, ``token2wav``, ``audio_tokenizer`` and
``speaker_embedding`` and ``default_speaker`` pointing at that file (``tensorrt_llm`` is the
CPU twin's stand-in).

Two things are checked. The file holds what the pod itself computes for a request that sends
the same recording: the ``audio_tokenizer`` and ``speaker_embedding`` models' answers and the
orchestrator's prompt mel. And a request without reference audio speaks with it: the
``tensorrt_llm`` stand-in answers 3 speech tokens per text token of its prompt (the speaker's
transcript + the target text), so that request yields exactly the audio length of one that
sends the recording with the transcript as its reference text, and more than one whose
reference text is empty.
"""

from __future__ import annotations

import queue
import shutil
import wave
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
TRANSCRIPT = "This is the default voice of the service, reading a sentence of its own."
TARGET = "Hello there."
SAMPLES_PER_TOKEN = 960
RATE = 16000


def service() -> Any:
    raw = yaml.safe_load((ROOT / "examples" / "cosyvoice2.yaml").read_text())["spec"]
    raw["engine"]["maxBatchSize"] = 1
    raw["serving"]["dynamicBatching"]["preferredBatchSizes"] = [1]
    raw["speakers"] = {"default": {"audioUri": "pvc://voices/narrator.wav", "transcript": "x"}}
    return spec.parse(raw)


def write_recording(path: Path) -> Any:
    """2.5 s of a voiced-like signal as 16-bit PCM; the samples as the tool reads them back."""
    t = np.arange(int(RATE * 2.5)) / RATE
    pitch = 140 + 30 * np.sin(2 * np.pi * 0.8 * t)
    signal = sum(np.sin(2 * np.pi * k * np.cumsum(pitch) / RATE) / k for k in range(1, 8))
    noise = np.random.default_rng(3).standard_normal(t.size) * 0.01
    pcm = np.round((0.2 * signal + noise) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm.tobytes())
    return pcm.astype(np.float32) / 32768.0


@pytest.fixture(scope="module")
def speaker(tmp_path_factory: pytest.TempPathFactory, release: Path) -> tuple[Path, Any]:
    """The speaker file, made by the engine builder's tool from a WAV, and the recording."""
    work = tmp_path_factory.mktemp("speaker")
    wav = write_recording(work / "narrator.wav")
    (work / "transcript.txt").write_text(TRANSCRIPT, encoding="utf-8")
    out = work / "engine" / "speakers" / "default.npz"
    printed = debian_python(
        "-m",
        "cosyvoice_serving_models.speaker_prompt",
        "--model-dir",
        str(release),
        "--variant",
        "cosyvoice2",
        "--audio",
        str(work / "narrator.wav"),
        "--transcript-file",
        str(work / "transcript.txt"),
        "--out",
        str(out),
    )
    assert "speech tokens" in printed and out.is_file()
    return out, wav


def with_paths(text: str, release: Path, speaker_file: Path) -> str:
    config = text_format.Parse(text, mc.ModelConfig())
    for key, value in (
        ("model_dir", release),
        ("llm_tokenizer_dir", release / "llm"),
        ("default_speaker", speaker_file),
    ):
        if key in config.parameters:
            config.parameters[key].string_value = str(value)
    return text_format.MessageToString(config)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, release: Path, speaker: tuple[Path, Any]
) -> Iterator[Any]:
    require_library()
    work = tmp_path_factory.mktemp("default-speaker")
    rendered = triton.render_repository(service(), "/engine")
    assert rendered["cosyvoice2"].count('"default_speaker"') == 1
    twin = {
        name: with_paths(text, release, speaker[0])
        for name, text in cpu_twin.to_cpu(rendered).items()
    }
    repo = cpu_twin.write_repository(twin, work / "repo")
    for name in OURS:
        shutil.copy(PACKAGE_ROOT / "models" / name / "model.py", repo / name / "1" / "model.py")
    env = {"COSYVOICE_MODELS_PATH": library_path(), "OMP_NUM_THREADS": "1"}
    triton_server = cpu_twin.TritonServer(repo, work, env=env)
    triton_server.start(ready_timeout=300)
    try:
        yield triton_server
    finally:
        triton_server.stop()


def tensors(values: dict[str, Any]) -> list[Any]:
    import tritonclient.grpc as grpcclient

    types = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}
    out = []
    for name, value in values.items():
        dtype = "BYTES" if value.dtype == object else types[value.dtype]
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def infer(server: Any, model: str, values: dict[str, Any], output: str) -> Any:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        return client.infer(model, tensors(values)).as_numpy(output)
    finally:
        client.close()


def samples(server: Any, values: dict[str, Any], model: str = "cosyvoice2") -> int:
    """The audio of one stream, all of it."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    total = 0
    try:
        client.async_stream_infer(model, tensors(values), enable_empty_final_response=True)
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


def request(target: str, wav: Any = None, reference_text: str | None = None) -> dict[str, Any]:
    values: dict[str, Any] = {"target_text": np.array([[target.encode()]], dtype=object)}
    if wav is not None:
        values["reference_wav"] = wav.reshape(1, -1).astype(np.float32)
        values["reference_wav_len"] = np.array([[wav.size]], dtype=np.int32)
        values["reference_text"] = np.array([[(reference_text or "").encode()]], dtype=object)
    return values


def test_the_speaker_file_holds_what_the_pod_computes_for_that_recording(
    server: Any, speaker: tuple[Path, Any]
) -> None:
    from cosyvoice_serving_models import features, speakers

    path, wav = speaker
    prompt = speakers.load_prompt(path)
    assert prompt.text == TRANSCRIPT
    reference = {
        "reference_wav": wav.reshape(1, -1),
        "reference_wav_len": np.array([[wav.size]], dtype=np.int32),
    }
    tokens = infer(server, "audio_tokenizer", reference, "prompt_speech_tokens").reshape(-1)
    embedding = infer(
        server, "speaker_embedding", {"reference_wav": wav.reshape(1, -1)}, "prompt_spk_embedding"
    ).reshape(-1)
    mel = features.prompt_mel(wav)
    count = min(mel.shape[0] // 2, tokens.size)
    assert count > 0
    assert np.array_equal(prompt.speech_tokens, tokens[:count].astype(np.int32))
    assert np.array_equal(prompt.embedding.astype(np.float16), embedding.astype(np.float16))
    assert prompt.speech_feat.shape == (2 * count, 80)
    assert np.allclose(prompt.speech_feat, mel[: 2 * count], atol=1e-4)


def test_a_request_without_reference_audio_speaks_with_the_default_speaker(
    server: Any, speaker: tuple[Path, Any]
) -> None:
    _, wav = speaker
    default = samples(server, request(TARGET))
    assert default > 0 and default % SAMPLES_PER_TOKEN == 0
    # The same text in the LLM's prompt: the default speaker's transcript reached it.
    assert default == samples(server, request(TARGET, wav, TRANSCRIPT))
    assert default > samples(server, request(TARGET, wav, ""))
