"""GPU stand-in for CosyVoice2's ``token2wav`` (flow matching and HiFT upstream).

Same config and interface as the model the operator renders: speech tokens in, audio
[1, S] FP32 at 24 kHz out, 960 samples per new token. The requests Triton batches are run as
one padded batch through :class:`cv_shapes.Token2Wav` on the instance's own GPU (Triton's
``model_instance_device_id``); outputs leave as torch tensors by DLPack (NumPy outputs fail
on GPU instances, ``../shared/docs/gpu.md``), copied to host memory first. It keeps no
state between chunks (upstream's keeps a vocoder cache per stream in the instance, see
``cosyvoice_operator.render.triton``): it
measures compute, not that hazard. A streamed chunk that is not the last also answers the
vocoder state outputs the rendered config declares (``hift_next_*``, zeros here; the
project's token2wav returns the real state), which the orchestrator sends back with the
stream's next chunk.
"""

# ruff: noqa: E402

from __future__ import annotations

import os
import sys

# The embedded Python of Triton's stub ignores PYTHONPATH: the sweep (and the CPU twin's
# test) name the stand-ins' directory and torch's site in COSYVOICE_STANDIN_PATH instead.
for _entry in os.environ.get("COSYVOICE_STANDIN_PATH", "").split(os.pathsep):
    if _entry and _entry not in sys.path:
        sys.path.append(_entry)

import json
from typing import Any

import torch
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from cv_shapes import ORIGINAL_VOCAB_SIZE, Token2Wav, device_of
from torch.utils.dlpack import to_dlpack

LOOKAHEAD_TOKENS = 3
MEL_BINS = 80


def host_array(tensor: Any) -> Any:
    if not tensor.is_cpu():
        raise pb_utils.TritonModelException(f"input {tensor.name()} arrived in device memory")
    return tensor.as_numpy()


def optional(request: Any, name: str) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else host_array(tensor)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.net = Token2Wav(device_of(args))
        self.net.capture(max(1, int(config["max_batch_size"])))
        self.net.run([(list(range(60)), 40, 20)])  # warm up (allocator, kernels)

    def _chunk(self, request: Any) -> tuple[list[int], int, int]:
        target = host_array(pb_utils.get_input_tensor_by_name(request, "target_speech_tokens"))
        prompt = optional(request, "prompt_speech_tokens")
        offset = optional(request, "token_offset")
        finalize = optional(request, "finalize")
        start = 0 if offset is None else int(offset.item())
        last = True if finalize is None else bool(finalize.item())
        prompt_ids = (
            [] if prompt is None else [int(t) - ORIGINAL_VOCAB_SIZE for t in prompt.reshape(-1)]
        )
        ids = [int(t) - ORIGINAL_VOCAB_SIZE for t in target.reshape(-1)]
        count = len(ids) - start - (0 if last else LOOKAHEAD_TOKENS)
        if count <= 0:
            raise ValueError(f"no tokens to synthesise: {len(ids)} from offset {start}")
        return prompt_ids + ids, len(prompt_ids) + start, count

    @staticmethod
    def _carries_state(request: Any) -> bool:
        """A streamed chunk that is not the stream's last: the next chunk needs its state."""
        finalize = optional(request, "finalize")
        streamed = pb_utils.get_input_tensor_by_name(request, "token_offset") is not None
        return streamed and finalize is not None and not bool(finalize.item())

    @staticmethod
    def _state() -> list[Any]:
        shapes = {"hift_next_mel": (1, MEL_BINS, 1), "hift_next_source": (1, 1)}
        shapes["hift_next_speech"] = (1, 1)
        return [
            pb_utils.Tensor.from_dlpack(name, to_dlpack(torch.zeros(shape, dtype=torch.float32)))
            for name, shape in shapes.items()
        ]

    def execute(self, requests: list[Any]) -> list[Any]:
        chunks: list[tuple[list[int], int, int] | str] = []
        for request in requests:
            try:
                chunks.append(self._chunk(request))
            except Exception as exc:
                chunks.append(str(exc))
        good = [c for c in chunks if not isinstance(c, str)]
        audio = iter(self.net.run(good) if good else [])
        responses = []
        for request, chunk in zip(requests, chunks, strict=True):
            if isinstance(chunk, str):
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(chunk)))
            else:
                # In host memory, as upstream's CosyVoice3 token2wav answers ("otherwise,
                # dlpack bug"): BLS callers on the CPU received device outputs unreliably.
                wave = pb_utils.Tensor.from_dlpack("waveform", to_dlpack(next(audio).cpu()))
                state = self._state() if self._carries_state(request) else []
                responses.append(pb_utils.InferenceResponse([wave, *state]))
        return responses
