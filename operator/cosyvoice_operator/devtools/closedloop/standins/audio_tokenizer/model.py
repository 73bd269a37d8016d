"""CPU stand-in for upstream's ``audio_tokenizer`` (s3tokenizer on a GPU upstream).

Same interface: ``reference_wav`` [1, N] FP32 at 16 kHz and its length in, the prompt's
speech tokens [1, T] INT32 out (25 per second, offset by the text vocabulary as upstream's).
The tokens are the positions 0, 1, 2, ... of the prompt: cheap and deterministic.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

ORIGINAL_VOCAB_SIZE = 151663  # upstream's speech tokens follow the text vocabulary
SAMPLES_PER_TOKEN = 16000 // 25
WORK_SECONDS = 0.002


def host_array(tensor: Any) -> Any:
    """The tensor as NumPy; FORCE_CPU_ONLY_INPUT_TENSORS must have put it in host memory."""
    if not tensor.is_cpu():
        raise pb_utils.TritonModelException(f"input {tensor.name()} arrived in device memory")
    return tensor.as_numpy()


class TritonPythonModel:
    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            wav_len = int(
                host_array(pb_utils.get_input_tensor_by_name(request, "reference_wav_len")).item()
            )
            host_array(pb_utils.get_input_tensor_by_name(request, "reference_wav"))
            time.sleep(WORK_SECONDS)
            count = max(1, wav_len // SAMPLES_PER_TOKEN)
            tokens = (ORIGINAL_VOCAB_SIZE + np.arange(count, dtype=np.int32)).reshape(1, count)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("prompt_speech_tokens", tokens)])
            )
        return responses
