"""Triton Python model ``token2wav`` (CosyVoice2 and CosyVoice3), the release's variant
named by its yaml (``cosyvoice2.yaml`` / ``cosyvoice3.yaml``, as the rendered configs differ):

- CosyVoice2: speech tokens -> 24 kHz audio, flow + HiFT of upstream's library
  (:mod:`cosyvoice_serving_models.token2wav`). A streamed chunk comes with the vocoder state
  the previous chunk returned (``hift_cache_*`` in, ``hift_next_*`` out);
- CosyVoice3: speech tokens -> mel, its flow alone
  (:mod:`cosyvoice_serving_models.cosyvoice3_token2wav`); the ``vocoder`` model makes the
  audio. A streamed chunk comes with the stream's tokens so far and its offset.

The project's own model code (``serving-models/README.md``), on the device Triton gives this
instance (``model_instance_kind`` / ``model_instance_device_id``). Stateless either way, so the
chunks of one stream may be served by any instances, in any mix.
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
from cosyvoice_serving_models.token2wav import HiftState, Token2Wav, estimator_plan  # noqa: E402
from cosyvoice_serving_models.triton_io import input_array  # noqa: E402

MODEL = "token2wav"
STATE_IN = ("hift_cache_mel", "hift_cache_source", "hift_cache_speech")
STATE_OUT = ("hift_next_mel", "hift_next_source", "hift_next_speech")


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        import torch

        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        model_dir = contract.parameter(params, MODEL, "model_dir")
        # The prebuilt TensorRT plans (engine_manifest names them, plans_dir holds them): the
        # flow estimator's plan is what the GPU image runs; this code resolves it and says so,
        # the estimator itself runs in torch here (see README, "What remains").
        manifest = contract.parameter(params, MODEL, "engine_manifest")
        plans_dir = contract.parameter(params, MODEL, "plans_dir")
        self.estimator_plan = estimator_plan(manifest, plans_dir)
        self.variant = speech_tokenizer.release_variant(Path(model_dir))
        self.device = devices.assigned_device(args, torch.cuda.is_available())
        if self.device.startswith("cuda"):
            torch.cuda.set_device(self.device)
        if self.variant == "cosyvoice3":
            from cosyvoice_serving_models.cosyvoice3_token2wav import Token2Mel

            self.flow = Token2Mel(model_dir, self.device)
        else:
            self.engine = Token2Wav(model_dir, self.device)
        devices.record(args, self.device)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(self._one(request)))
            except Exception as exc:  # the caller gets it as this request's error
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses

    def _one(self, request: Any) -> list[Any]:
        tokens = input_array(request, "target_speech_tokens")
        prompt = [
            input_array(request, name, required=False)
            for name in ("prompt_speech_tokens", "prompt_speech_feat", "prompt_spk_embedding")
        ]
        if any(p is None for p in prompt):
            raise ValueError(
                "token2wav needs the prompt's speech tokens, mel and speaker embedding"
            )
        prompt_tokens, prompt_feat, embedding = prompt
        offset_in = input_array(request, "token_offset", required=False)
        finalize_in = input_array(request, "finalize", required=False)
        offset = None if offset_in is None else int(offset_in.reshape(-1)[0])
        finalize = True if finalize_in is None else bool(finalize_in.reshape(-1)[0])
        if self.variant == "cosyvoice3":
            mel = self.flow.mel(tokens, prompt_tokens, prompt_feat, embedding, offset, finalize)
            return [pb_utils.Tensor("mel", mel.astype(np.float32)[None])]
        cached = [input_array(request, name, required=False) for name in STATE_IN]
        state = None
        if all(c is not None for c in cached):
            mel, source, speech = (np.asarray(c, dtype=np.float32) for c in cached)
            state = HiftState(mel.reshape(80, -1), source.reshape(-1), speech.reshape(-1))
        elif any(c is not None for c in cached):
            raise ValueError(f"a chunk's state needs all of {', '.join(STATE_IN)}")
        if offset is None and state is not None:
            raise ValueError("vocoder state given to an offline request (no token_offset)")
        audio, following = self.engine.synthesize(
            tokens, prompt_tokens, prompt_feat, embedding, offset, finalize, state
        )
        out = [pb_utils.Tensor("waveform", audio.astype(np.float32).reshape(1, -1))]
        if following is not None:
            for name, value in zip(
                STATE_OUT, (following.mel, following.source, following.speech), strict=True
            ):
                out.append(pb_utils.Tensor(name, value.astype(np.float32)[None]))
        return out
