"""Shared pieces of the tests of the project's model code with upstream's library: paths,
the Debian interpreter that runs upstream's library, the tritonserver twins and the requests
sent to them. The fixtures built on them are in ``conftest.py``.

This folder has no ``__init__.py`` on purpose: ``tests/`` at the top of the repository is the
package ``tests``, and ``make test`` collects both folders in one pytest run, where a second
package of that name would clash. Its modules are imported by their own names (pytest puts
the folder on ``sys.path``): ``from twins import ...``.

They need what ``scripts/setup-serving-models.sh`` installs (``make test`` and ``make
serving-models`` run it first): Debian's python3-torch and python3-torchaudio, and upstream's
library in ``~/.cache/cosyvoice-operator/upstream-cpu-site``. Without them they fail, naming
the script; nothing skips.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import uuid
import wave
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api import spec
from cosyvoice_operator.devtools.closedloop import cpu_twin

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = ROOT / "serving-models"
DEBIAN_PYTHON = "/usr/bin/python3"
DEBIAN_SITE = Path("/usr/lib/python3/dist-packages")
if str(PACKAGE_ROOT) not in sys.path:  # our package's pure pieces, imported by the tests
    sys.path.insert(0, str(PACKAGE_ROOT))
UPSTREAM_SITE = Path(
    os.environ.get(
        "COSYVOICE_UPSTREAM_SITE",
        str(Path.home() / ".cache" / "cosyvoice-operator" / "upstream-cpu-site"),
    )
)

# The default speaker every twin is rendered with (spec.speakers.default): the builder's tool
# makes its file from a recording and this transcript.
# Our model code in each twin; the twin's stand-ins serve the rest (tensorrt_llm, the
# trtllm-serve processes). CosyVoice3's token2wav and vocoder run on fakes of their two
# networks, whose upstream classes no PyPI package holds (cv3_fakes).
COSYVOICE2_OURS = ("cosyvoice2", "token2wav", "audio_tokenizer", "speaker_embedding")
COSYVOICE3_OURS = ("cosyvoice3", "token2wav", "vocoder", "audio_tokenizer", "speaker_embedding")
FIRST_CHUNK_TOKENS = 10
TRANSCRIPT = "This is the default voice of the service, reading a sentence of its own."
TARGET = "Hello there."
RATE = 16000
SAMPLES_PER_TOKEN = 960


@dataclass(frozen=True)
class CosyVoice2Twin:
    """The CosyVoice2 twin (``conftest.cosyvoice2_twin``): the server, the folder where each
    instance recorded its device, the default speaker's file and its recording."""

    server: cpu_twin.TritonServer
    device_records: Path
    speaker: Path
    recording: Any


@dataclass(frozen=True)
class CosyVoice3Twin:
    """The CosyVoice3 twin (``conftest.cosyvoice3_twin``): the server, the stand-in LLM
    servers, the repository, the default speaker's file and the folder where each instance
    recorded its device."""

    server: cpu_twin.TritonServer
    llm: cpu_twin.LlmStandIn
    repo: Path
    speaker: Path
    device_records: Path


def library_path() -> str:
    """sys.path entries for our package and upstream's library (Debian torch last)."""
    return os.pathsep.join([str(PACKAGE_ROOT), str(UPSTREAM_SITE), str(DEBIAN_SITE)])


def require_library() -> None:
    missing = [
        str(p)
        for p in (DEBIAN_SITE / "torch", DEBIAN_SITE / "torchaudio", UPSTREAM_SITE / "cosyvoice")
        if not p.is_dir()
    ]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run scripts/setup-serving-models.sh")


def debian_python(*args: str, timeout: float = 300) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), str(UPSTREAM_SITE)]))
    done = subprocess.run(
        [DEBIAN_PYTHON, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(f"{args} failed:\n{done.stderr[-4000:]}")
    return done.stdout


def example(variant: str) -> dict[str, Any]:
    """The spec of ``examples/<variant>.yaml``, as a dict to change."""
    raw: dict[str, Any] = yaml.safe_load((ROOT / "examples" / f"{variant}.yaml").read_text())
    return dict(raw["spec"])


def default_speaker(raw: dict[str, Any]) -> spec.ServiceSpec:
    """``raw`` with a default speaker (``spec.speakers.default``), parsed."""
    raw["speakers"] = {"default": {"audioUri": "pvc://voices/narrator.wav", "transcript": "x"}}
    return spec.parse(raw)


def set_parameters(text: str, values: Mapping[str, str]) -> str:
    """The config with those of ``values``' parameters it has set to the given strings."""
    config = text_format.Parse(text, mc.ModelConfig())
    for key, value in values.items():
        if key in config.parameters:
            config.parameters[key].string_value = value
    return text_format.MessageToString(config)


def remap_llm_urls(text: str, remap: Mapping[str, str]) -> str:
    """The config with its LLM URLs (``llm_api_base``, ``llm_api_bases``) remapped."""
    config = text_format.Parse(text, mc.ModelConfig())
    for key in ("llm_api_base", "llm_api_bases"):
        if key in config.parameters:
            urls = config.parameters[key].string_value.split(",")
            config.parameters[key].string_value = ",".join(remap[u] for u in urls)
    return text_format.MessageToString(config)


@contextmanager
def serve(
    rendered: Mapping[str, str],
    work: Path,
    ours: tuple[str, ...],
    configure: Callable[[str], str],
    env: Mapping[str, str] | None = None,
) -> Iterator[cpu_twin.TritonServer]:
    """The rendered repository in the real tritonserver: the twin's one transform
    (``cpu_twin.to_cpu``), ``configure`` applied to every config (the paths of the release,
    which the serving entrypoint's model view would hold), our ``model.py`` for ``ours`` (the
    twin's stand-ins for the rest)."""
    require_library()
    twin = {name: configure(text) for name, text in cpu_twin.to_cpu(dict(rendered)).items()}
    repo = cpu_twin.write_repository(twin, work / "repo")
    for name in ours:
        shutil.copy(PACKAGE_ROOT / "models" / name / "model.py", repo / name / "1" / "model.py")
    server = cpu_twin.TritonServer(
        repo,
        work,
        env={"COSYVOICE_MODELS_PATH": library_path(), "OMP_NUM_THREADS": "1", **(env or {})},
    )
    server.start(ready_timeout=300)
    try:
        yield server
    finally:
        server.stop()


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


def speaker_file(model_dir: Path, variant: str, work: Path) -> tuple[Path, Any]:
    """The default speaker's file, made by the engine builder's tool (``speaker_prompt``) from
    a WAV and ``TRANSCRIPT`` with the pod's own code, and the recording's samples."""
    work.mkdir(parents=True, exist_ok=True)
    wav = write_recording(work / "narrator.wav")
    (work / "transcript.txt").write_text(TRANSCRIPT, encoding="utf-8")
    out = work / "engine" / "speakers" / "default.npz"
    printed = debian_python(
        "-m",
        "cosyvoice_serving_models.speaker_prompt",
        *("--model-dir", str(model_dir), "--variant", variant),
        *("--audio", str(work / "narrator.wav"), "--transcript-file", str(work / "transcript.txt")),
        *("--out", str(out)),
    )
    assert "speech tokens" in printed and out.is_file()
    return out, wav


def tensors(values: Mapping[str, Any]) -> list[Any]:
    import tritonclient.grpc as grpcclient

    types = {np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32"}
    out = []
    for name, value in values.items():
        dtype = "BYTES" if value.dtype == object else types[value.dtype]
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def infer(server: cpu_twin.TritonServer, model: str, values: Mapping[str, Any], output: str) -> Any:
    """One request to ``model`` (a batch of one), its ``output`` as NumPy."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        return client.infer(model, tensors(values)).as_numpy(output)
    finally:
        client.close()


def request(target: str, wav: Any = None, reference_text: str | None = None) -> dict[str, Any]:
    """An orchestrator request: the text to speak and, when ``wav`` is given, the reference."""
    values: dict[str, Any] = {"target_text": np.array([[target.encode()]], dtype=object)}
    if wav is not None:
        values["reference_wav"] = wav.reshape(1, -1).astype(np.float32)
        values["reference_wav_len"] = np.array([[wav.size]], dtype=np.int32)
        values["reference_text"] = np.array([[(reference_text or "").encode()]], dtype=object)
    return values


def streams(
    server: cpu_twin.TritonServer, requests: Mapping[str, list[Any]], model: str
) -> dict[str, list[Any]]:
    """Send every request (its inputs) as its own stream at once; each stream's audio chunks
    in arrival order, each checked finite and non-zero."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    ids = {}
    try:
        for key, inputs in requests.items():
            request_id = str(uuid.uuid4())
            ids[request_id] = key
            client.async_stream_infer(
                model, inputs, request_id=request_id, enable_empty_final_response=True
            )
        chunks: dict[str, list[Any]] = {key: [] for key in requests}
        done: set[str] = set()
        while len(done) < len(requests):
            result, error = results.get(timeout=300)
            assert error is None, f"{error}\n{server.log_tail()}"
            response = result.get_response()
            key = ids[response.id]
            audio = result.as_numpy("waveform")
            if audio is not None:
                assert np.isfinite(audio).all() and np.abs(audio).max() > 0
                chunks[key].append(audio.reshape(-1))
            if response.parameters["triton_final_response"].bool_param:
                done.add(key)
        return chunks
    finally:
        client.stop_stream()
        client.close()


def stream(server: cpu_twin.TritonServer, targets: list[str], model: str) -> dict[str, list[Any]]:
    """Every target as its own stream at once, with the twin's reference
    (``cpu_twin.request_inputs``); each stream's chunks in arrival order."""
    return streams(server, {t: cpu_twin.request_inputs(t) for t in targets}, model)


def samples(server: cpu_twin.TritonServer, values: Mapping[str, Any], model: str) -> int:
    """The length of one stream's audio, all of it."""
    return sum(c.size for c in streams(server, {"one": tensors(values)}, model)["one"])
