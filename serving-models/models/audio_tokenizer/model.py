"""Triton Python model ``audio_tokenizer`` (CosyVoice2 and CosyVoice3): reference audio ->
the speech tokens of its prompt.

The project's own model code (``serving-models/README.md``), on the ``s3tokenizer`` library
(:mod:`cosyvoice_serving_models.speech_tokenizer`): the release's ``speech_tokenizer_v2.onnx``
or ``_v3.onnx``, whichever its yaml's variant uses, on the device Triton gives this instance
(``model_instance_kind`` / ``model_instance_device_id``). A batch of requests is tokenized in
one pass, as upstream's model does; the tokens are the speech tokens themselves (0..6560).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# The Python-backend stub of some Triton builds runs an isolated interpreter that ignores
# PYTHONPATH (serving-audit C5): the package's location comes in this variable instead.
for _path in reversed(os.environ.get("COSYVOICE_MODELS_PATH", "").split(":")):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]  # noqa: E402

from cosyvoice_serving_models import contract, speech_tokenizer  # noqa: E402
from cosyvoice_serving_models import device as devices  # noqa: E402
from cosyvoice_serving_models.triton_io import input_array  # noqa: E402

MODEL = "audio_tokenizer"


def reference(request: Any) -> Any:
    """The request's waveform, cut to ``reference_wav_len``."""
    wav = input_array(request, "reference_wav").reshape(-1)
    length = int(input_array(request, "reference_wav_len").reshape(-1)[0])
    if not 0 < length <= wav.size:
        raise ValueError(f"reference_wav_len {length} is outside 1..{wav.size}")
    return wav[:length]


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import torch

        torch.set_num_threads(1)
        params = json.loads(args["model_config"]).get("parameters", {})
        model_dir = Path(contract.parameter(params, MODEL, "model_dir"))
        variant = speech_tokenizer.release_variant(model_dir)
        self.device = devices.assigned_device(args, torch.cuda.is_available())
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)
        checkpoint = model_dir / speech_tokenizer.SPEECH_TOKENIZER[variant]
        self.tokenizer = speech_tokenizer.load(checkpoint, self.device)
        devices.record(args, self.device)

    def execute(self, requests: list[Any]) -> list[Any]:
        wavs: dict[int, Any] = {}
        errors: dict[int, str] = {}
        done: dict[int, Any] = {}
        for index, request in enumerate(requests):
            try:
                wavs[index] = reference(request)
            except Exception as exc:  # this request's error; the others are served
                errors[index] = str(exc)
        if wavs:
            try:
                tokens = speech_tokenizer.tokenize(self.tokenizer, list(wavs.values()), self.device)
                done = dict(zip(wavs, tokens, strict=True))
            except Exception as exc:
                errors.update({index: str(exc) for index in wavs})
        responses = []
        for index in range(len(requests)):
            if index in errors:
                error = pb_utils.TritonError(errors[index])
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            out = np.asarray(done[index], dtype=np.int32).reshape(1, -1)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("prompt_speech_tokens", out)])
            )
        return responses
