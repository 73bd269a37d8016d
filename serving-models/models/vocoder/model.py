"""Triton Python model ``vocoder`` (CosyVoice3): a stream's mel so far -> its 24 kHz audio.

The project's own model code (``serving-models/README.md``). Runs the causal HiFT of upstream's
library (:mod:`cosyvoice_serving_models.cosyvoice3_token2wav`), built alone from the release's
``cosyvoice3.yaml`` and ``hift.pt``, on the device Triton gives this instance
(``model_instance_kind`` / ``model_instance_device_id``). Stateless: each request carries the
stream's whole mel so far, and every instance draws the same excitation tables, so the chunks
of one stream may be served by any instances, in any mix.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# The Python-backend stub of some Triton builds runs an isolated interpreter that ignores
# PYTHONPATH (serving-audit C5): the package's location comes in this variable instead.
for _path in reversed(os.environ.get("COSYVOICE_MODELS_PATH", "").split(":")):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]  # noqa: E402

from cosyvoice_serving_models import contract  # noqa: E402
from cosyvoice_serving_models import device as devices  # noqa: E402
from cosyvoice_serving_models.cosyvoice3_token2wav import MEL_BINS, Vocoder  # noqa: E402
from cosyvoice_serving_models.triton_io import input_array  # noqa: E402

MODEL = "vocoder"


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import torch

        params = json.loads(args["model_config"]).get("parameters", {})
        model_dir = contract.parameter(params, MODEL, "model_dir")
        self.device = devices.assigned_device(args, torch.cuda.is_available())
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)
        self.vocoder = Vocoder(model_dir, self.device)
        devices.record(args, self.device)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                mel = input_array(request, "mel")
                if mel.size == 0 or mel.size % MEL_BINS:
                    raise ValueError(f"mel holds {mel.size} values, not frames of {MEL_BINS}")
                finalize = bool(input_array(request, "finalize").reshape(-1)[0])
                speech = self.vocoder.speech(mel, finalize)
                tensor = pb_utils.Tensor("tts_speech", speech.astype(np.float32).reshape(1, -1))
                responses.append(pb_utils.InferenceResponse([tensor]))
            except Exception as exc:  # the caller gets it as this request's error
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses
