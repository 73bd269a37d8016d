"""Run by ``test_cosyvoice3_audio.py`` under the interpreter that has torch and hyperpyyaml
(Debian's python3 with the twin's upstream site folder on ``PYTHONPATH``).

    cosyvoice3_check.py WORK_DIR

Our CosyVoice3 ``token2wav`` and ``vocoder`` code on a release whose two networks are the
stand-ins of :mod:`cv3_fakes` (upstream's CosyVoice3 classes are on no PyPI package). Prints
one JSON object with what the test asserts: what is built, what the flow is called with,
the vocoder's excitation tables across instances and the process's random generator, a
stream served chunk by chunk by alternating instances against one instance and against the
offline synthesis, and both ``model.py`` files in a stand-in of the Python backend's module.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import cv3_fakes  # type: ignore[import-not-found]  # beside this script
import numpy as np
import torch

from cosyvoice_serving_models.chunking import LOOKAHEAD_TOKENS, Chunking
from cosyvoice_serving_models.cosyvoice3_token2wav import Token2Mel, Vocoder
from cosyvoice_serving_models.token2wav import release_yaml_entries

MODELS = Path(__file__).resolve().parents[1] / "models"


def whole_yaml_refused(release: Path) -> str | None:
    """Why the whole yaml cannot be built ("Type: message"), or None when it can."""
    from hyperpyyaml import load_hyperpyyaml

    try:
        load_hyperpyyaml((release / "cosyvoice3.yaml").read_text())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def flow_calls(release: Path, prompt: dict[str, Any], tokens: Any) -> dict[str, Any]:
    engine = Token2Mel(release, "cpu")
    offline = engine.mel(tokens, prompt["tokens"], prompt["feat"], prompt["embedding"], None, True)
    call_offline = engine.flow.last_call
    chunk = engine.mel(
        tokens[:23], prompt["tokens"], prompt["feat"], prompt["embedding"], 10, False
    )
    call = engine.flow.last_call
    return {
        "attributes": sorted(k for k in vars(engine) if not k.startswith("_")),
        "offline_shape": list(offline.shape),
        "offline_call": {
            "streaming": call_offline["streaming"],
            "finalize": call_offline["finalize"],
        },
        "chunk_shape": list(chunk.shape),
        "chunk_equals_offline_frames": bool(np.array_equal(chunk, offline[:, 20:40])),
        "chunk_call": {
            "streaming": call["streaming"],
            "finalize": call["finalize"],
            "lengths": call["lengths"],
            "device": call["device"],
            "feat": [list(call["prompt_feat"].shape), str(call["prompt_feat"].dtype)],
            "embedding": [list(call["embedding"].shape), str(call["embedding"].dtype)],
            "prompt_token_dtype": str(call["prompt_token"].dtype),
        },
    }


def vocoder_tables(release: Path) -> dict[str, Any]:
    from hyperpyyaml import load_hyperpyyaml

    torch.manual_seed(1)
    first = Vocoder(release, "cpu")
    after = torch.rand(4)
    torch.manual_seed(1)
    untouched = torch.equal(after, torch.rand(4))
    torch.manual_seed(2)
    torch.rand(1000)
    second = Vocoder(release, "cpu")
    text = release_yaml_entries((release / "cosyvoice3.yaml").read_text(), ("hift",))
    unseeded = [load_hyperpyyaml(text)["hift"] for _ in range(2)]
    saved = torch.load(release / "hift.pt", map_location="cpu")
    return {
        "same_tables": bool(
            torch.equal(first.hift.sine_waves, second.hift.sine_waves)
            and torch.equal(first.hift.rand_ini, second.hift.rand_ini)
        ),
        "unseeded_tables_differ": not torch.equal(unseeded[0].sine_waves, unseeded[1].sine_waves),
        "process_generator_untouched": untouched,
        "checkpoint_loaded": bool(
            torch.equal(first.hift.conv_post.weight, saved["generator.conv_post.weight"])
        ),
    }


def stream(flows: list[Token2Mel], vocoders: list[Any], prompt: dict[str, Any], tokens: Any) -> Any:
    """The orchestrator's way (models/cosyvoice3): each chunk's mel from token2wav is appended
    to the stream's mel, the vocoder turns all of it into audio, the part not sent is sent;
    chunk ``i`` goes to instance ``i % len``."""
    schedule = Chunking(first=15, strategy="exponential").schedule(len(tokens))
    mel = np.zeros((80, 0), dtype=np.float32)
    sent: list[Any] = []
    done = 0
    for index, (offset, end) in enumerate(schedule):
        finalize = index == len(schedule) - 1
        window = tokens if finalize else tokens[: end + LOOKAHEAD_TOKENS]
        flow, vocoder = flows[index % len(flows)], vocoders[index % len(vocoders)]
        part = flow.mel(
            window, prompt["tokens"], prompt["feat"], prompt["embedding"], offset, finalize
        )
        mel = np.concatenate([mel, part], axis=1)
        speech = vocoder.speech(mel, finalize)
        sent.append(speech[done:])
        done = speech.shape[0]
    return np.concatenate(sent), mel, len(schedule)


def continuity(release: Path, prompt: dict[str, Any], tokens: Any) -> dict[str, Any]:
    flows = [Token2Mel(release, "cpu"), Token2Mel(release, "cpu")]
    torch.manual_seed(3)
    first = Vocoder(release, "cpu")
    torch.manual_seed(4)
    second = Vocoder(release, "cpu")
    alternating, mel, chunks = stream(flows, [first, second], prompt, tokens)
    single, _, _ = stream(flows[:1], [first], prompt, tokens)
    offline_mel = flows[0].mel(
        tokens, prompt["tokens"], prompt["feat"], prompt["embedding"], None, True
    )
    offline = first.speech(offline_mel, True)
    # The hazard the seed removes: the same stream over two vocoders with their own tables.
    torch.manual_seed(9)
    own = Vocoder(release, "cpu")
    own.hift.sine_waves = torch.rand_like(own.hift.sine_waves)
    mixed, _, _ = stream(flows, [first, own], prompt, tokens)
    return {
        "chunks": chunks,
        "samples": int(alternating.shape[0]),
        "offline_samples": int(offline.shape[0]),
        "stream_mel_equals_offline_mel": bool(np.array_equal(mel, offline_mel)),
        "alternating_vs_single": float(np.abs(alternating - single).max()),
        "alternating_vs_offline": float(np.abs(alternating - offline).max()),
        "own_tables_vs_single": float(np.abs(mixed - single).max()),
        "peak": float(np.abs(alternating).max()),
    }


class FakeTensor:
    def __init__(self, name: str, value: Any):
        self._name, self._value = name, np.asarray(value)

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return True

    def as_numpy(self) -> Any:
        return self._value


class FakeResponse:
    def __init__(self, output_tensors: Any = None, error: Any = None):
        self.outputs = {t.name(): t.as_numpy() for t in output_tensors or []}
        self.error = error


def backend_module() -> types.ModuleType:
    """The part of ``triton_python_backend_utils`` the two models use."""
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = FakeTensor  # type: ignore[attr-defined]
    pb.InferenceResponse = FakeResponse  # type: ignore[attr-defined]
    pb.TritonError = str  # type: ignore[attr-defined]
    pb.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    pb.get_input_tensor_by_name = lambda request, name: request.get(name)  # type: ignore[attr-defined]
    return pb


def load_model(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"model_{name}", MODELS / name / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def args_for(release: Path, kind: str, device_id: str) -> dict[str, str]:
    params = {
        "model_dir": {"string_value": str(release)},
        "engine_manifest": {"string_value": str(release / "no-manifest.json")},
        "plans_dir": {"string_value": str(release / "plans")},
    }
    return {
        "model_config": json.dumps({"parameters": params}),
        "model_instance_kind": kind,
        "model_instance_device_id": device_id,
        "model_instance_name": f"instance_{kind}_{device_id}",
    }


def request(values: dict[str, Any]) -> dict[str, FakeTensor]:
    return {k: FakeTensor(k, v) for k, v in values.items()}


def models(release: Path, prompt: dict[str, Any], tokens: Any) -> dict[str, Any]:
    sys.modules["triton_python_backend_utils"] = backend_module()
    token2wav, vocoder = load_model("token2wav"), load_model("vocoder")
    t2w = token2wav.TritonPythonModel()
    t2w.initialize(args_for(release, "CPU", "0"))
    voc = vocoder.TritonPythonModel()
    voc.initialize(args_for(release, "CPU", "0"))
    inputs = {
        "target_speech_tokens": tokens[None, :23].astype(np.int32),
        "prompt_speech_tokens": prompt["tokens"][None].astype(np.int32),
        "prompt_speech_feat": prompt["feat"][None].astype(np.float16),
        "prompt_spk_embedding": prompt["embedding"][None].astype(np.float16),
        "token_offset": np.array([[10]], dtype=np.int32),
        "finalize": np.array([[False]]),
    }
    without_prompt = {k: v for k, v in inputs.items() if k != "prompt_speech_feat"}
    mel_out, refused = t2w.execute([request(inputs), request(without_prompt)])
    mel = mel_out.outputs["mel"]
    speech_out, bad = voc.execute(
        [
            request({"mel": mel.astype(np.float32), "finalize": np.array([[True]])}),
            request({"mel": np.zeros((1, 79, 3), np.float32), "finalize": np.array([[True]])}),
        ]
    )
    direct = t2w.flow.mel(
        inputs["target_speech_tokens"],
        prompt["tokens"],
        inputs["prompt_speech_feat"],
        inputs["prompt_spk_embedding"],
        10,
        False,
    )
    # A KIND_GPU instance on device 3 runs on cuda:3 (a CUDA-less stand-in records it) ...
    given: list[str] = []
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.set_device = lambda device: given.append(str(device))  # type: ignore[assignment]
    import cosyvoice_serving_models.cosyvoice3_token2wav as cv3

    cv3.Token2Mel = lambda model_dir, device: given.append(f"flow {device}")  # type: ignore[assignment,misc]
    vocoder.Vocoder = lambda model_dir, device: given.append(f"hift {device}")
    token2wav.TritonPythonModel().initialize(args_for(release, "GPU", "3"))
    vocoder.TritonPythonModel().initialize(args_for(release, "GPU", "3"))
    # ... and one without CUDA is refused, not moved to the CPU.
    torch.cuda.is_available = lambda: False  # type: ignore[assignment]
    gpu_refused = []
    for module in (token2wav, vocoder):
        try:
            module.TritonPythonModel().initialize(args_for(release, "GPU", "1"))
        except RuntimeError as exc:
            gpu_refused.append("no CUDA" in str(exc))
    return {
        "mel_shape": list(mel.shape),
        "mel_equals_engine": bool(np.array_equal(mel[0], direct)),
        "refused_without_prompt": refused.error is not None and "prompt" in refused.error,
        "speech_shape": list(speech_out.outputs["tts_speech"].shape),
        "bad_mel_refused": bad.error is not None and "frames of 80" in bad.error,
        "variant": t2w.variant,
        "gpu_devices": given,
        "gpu_without_cuda_refused": gpu_refused,
    }


def main(work: Path) -> None:
    release = work / "model"
    cv3_fakes.write_release(release)
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, 6561, size=90).astype(np.int32)
    prompt = {
        "tokens": rng.integers(0, 6561, size=20).astype(np.int32),
        "feat": rng.standard_normal((40, 80)).astype(np.float16),
        "embedding": rng.standard_normal(192).astype(np.float16),
    }
    result = {
        "whole_yaml_refused": whole_yaml_refused(release),
        "flow": flow_calls(release, prompt, tokens),
        "vocoder": vocoder_tables(release),
        "stream": continuity(release, prompt, tokens),
        "models": models(release, prompt, tokens),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
