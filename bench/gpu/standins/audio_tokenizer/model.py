"""GPU stand-in for ``audio_tokenizer`` (S3 tokenizer upstream): 25 speech tokens per second
of reference audio from :class:`cv_shapes.Encoder` on the instance's GPU, out by DLPack."""

# ruff: noqa: E402

from __future__ import annotations

import os
import sys

# The embedded Python of Triton's stub ignores PYTHONPATH: the sweep (and the CPU twin's
# test) name the stand-ins' directory and torch's site in COSYVOICE_STANDIN_PATH instead.
for _entry in os.environ.get("COSYVOICE_STANDIN_PATH", "").split(os.pathsep):
    if _entry and _entry not in sys.path:
        sys.path.append(_entry)

from typing import Any

import torch
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from cv_shapes import ORIGINAL_VOCAB_SIZE, SPEECH_VOCAB, Encoder, device_of
from torch.utils.dlpack import to_dlpack


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        self.net = Encoder(device_of(args), SPEECH_VOCAB - 3)

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            wav = pb_utils.get_input_tensor_by_name(request, "reference_wav").as_numpy()
            length = int(
                pb_utils.get_input_tensor_by_name(request, "reference_wav_len").as_numpy().item()
            )
            clip = torch.from_numpy(wav[:, : max(length, 640)].copy())
            tokens = (self.net.features(clip).argmax(-1) + ORIGINAL_VOCAB_SIZE).to(torch.int32)
            out = pb_utils.Tensor.from_dlpack(
                "prompt_speech_tokens", to_dlpack(tokens[None].contiguous())
            )
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
