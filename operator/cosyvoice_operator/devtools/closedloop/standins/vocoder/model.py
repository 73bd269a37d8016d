"""CPU stand-in for upstream's CosyVoice3 ``vocoder`` (CausalHiFT on a GPU upstream).

Same interface: the mel spectrogram accumulated so far [1, 80, F] and ``finalize`` in, the
audio of all of it [1, S] FP32 at 24 kHz out (480 samples per mel frame); the orchestrator
keeps the part it has not sent yet. The audio is the 440 Hz sine of token2wav's stand-in,
starting at the sample of the first frame (its mel value).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = SAMPLE_RATE // 50
TONE_HZ = 440.0
WORK_SECONDS = 0.003


def host_array(tensor: Any) -> Any:
    """The tensor as NumPy; FORCE_CPU_ONLY_INPUT_TENSORS must have put it in host memory."""
    if not tensor.is_cpu():
        raise pb_utils.TritonModelException(f"input {tensor.name()} arrived in device memory")
    return tensor.as_numpy()


def tone(first_sample: int, count: int) -> Any:
    n = np.arange(first_sample, first_sample + count, dtype=np.float64)
    return np.sin(2.0 * np.pi * TONE_HZ * n / SAMPLE_RATE).astype(np.float32)


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            mel = host_array(pb_utils.get_input_tensor_by_name(request, "mel"))
            host_array(pb_utils.get_input_tensor_by_name(request, "finalize"))
            time.sleep(WORK_SECONDS)
            frames = mel.shape[-1]
            first_frame = int(mel.reshape(-1, frames)[0, 0]) if frames else 0
            speech = tone(first_frame * SAMPLES_PER_FRAME, frames * SAMPLES_PER_FRAME)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("tts_speech", speech.reshape(1, -1))])
            )
        return responses
