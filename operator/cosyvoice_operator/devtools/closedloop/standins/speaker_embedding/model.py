"""CPU stand-in for upstream's ``speaker_embedding`` (CAM++ as a TensorRT plan upstream).

Same interface: ``reference_wav`` [1, N] FP32 in, a 192-value FP16 embedding [1, 192] out.
The embedding is the prompt's mean amplitude repeated: cheap and deterministic.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

EMBEDDING_SIZE = 192
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
            wav = host_array(pb_utils.get_input_tensor_by_name(request, "reference_wav"))
            time.sleep(WORK_SECONDS)
            value = float(np.abs(wav).mean()) if wav.size else 0.0
            embedding = np.full((1, EMBEDDING_SIZE), value, dtype=np.float16)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("prompt_spk_embedding", embedding)])
            )
        return responses
