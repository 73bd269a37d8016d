"""Triton Python model ``speaker_embedding`` (CosyVoice2 and CosyVoice3): reference audio ->
the speaker's 192-value embedding (float16).

The project's own model code (``serving-models/README.md``), computed as upstream does
(:mod:`cosyvoice_serving_models.speaker_embedding`: Kaldi fbank through the release's
``campplus.onnx``), with ONNX Runtime on the device Triton gives this instance
(``model_instance_kind`` / ``model_instance_device_id``). The engine's prebuilt TensorRT plan
of the network (``engine_manifest``, ``plans_dir``) is found, not loaded yet.
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

import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]  # noqa: E402

from cosyvoice_serving_models import contract, speaker_embedding  # noqa: E402
from cosyvoice_serving_models import device as devices  # noqa: E402
from cosyvoice_serving_models.triton_io import input_array  # noqa: E402

MODEL = "speaker_embedding"
NETWORK = "campplus.onnx"


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import torch

        torch.set_num_threads(1)
        params = json.loads(args["model_config"]).get("parameters", {})
        model_dir = Path(contract.parameter(params, MODEL, "model_dir"))
        self.plan = speaker_embedding.prebuilt_plan(
            contract.parameter(params, MODEL, "engine_manifest"),
            contract.parameter(params, MODEL, "plans_dir"),
        )
        self.device = devices.assigned_device(args, torch.cuda.is_available())
        self.network = speaker_embedding.session(str(model_dir / NETWORK), self.device)
        devices.record(args, self.device)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                wav = input_array(request, "reference_wav").reshape(-1)
                if wav.size == 0:
                    raise ValueError("reference_wav is empty")
                embedding = speaker_embedding.embed(self.network, wav).reshape(1, -1)
                tensor = pb_utils.Tensor("prompt_spk_embedding", embedding)
                responses.append(pb_utils.InferenceResponse([tensor]))
            except Exception as exc:  # the caller gets it as this request's error
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses
