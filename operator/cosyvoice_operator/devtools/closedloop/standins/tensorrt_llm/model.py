"""CPU stand-in for CosyVoice2's ``tensorrt_llm`` (the TensorRT-LLM backend upstream).

The TensorRT-LLM backend is not in the pytriton wheel, so the CPU twin loads this Python
model under the same name and config (only ``backend`` changed, see ``cpu_twin.to_cpu``).
It answers the way the backend does for upstream's orchestrator: ``output_ids`` [1, 1, n] and
``sequence_length`` [1, 1] holding only the new tokens of each response when ``streaming``
(decoupled: several responses, the last flagged final), all of them at once otherwise. Like
in-flight batching, concurrent streams progress together (one thread each).

It "generates" 3 speech tokens per text token of the prompt (at least 20, at most
``request_output_len``): token i is ORIGINAL_VOCAB_SIZE + i, a few at a time: a step every
2 ms, or, when ``COSYVOICE_TWIN_STREAM_SECONDS`` is set (the closed loop running the
project's own orchestrator), its steps spread evenly over that many seconds.

``COSYVOICE_TWIN_LLM_PAUSE_FILE``: while this file exists, a streamed answer sends every step
but its last, then waits for the file to be gone. The orchestrator in front has its first
chunks out and its stream in flight for as long as a test needs (the drain and stall tests of
``cosyvoice-serve`` and the gauge test of ``serving-models/tests``, which run the project's
own orchestrator, whose code has no hold of its own); absent, nothing waits.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from trtllm_backend_params import config_problems  # type: ignore[import-not-found]

ORIGINAL_VOCAB_SIZE = 151663
TOKENS_PER_TEXT_TOKEN = 3
MIN_TOKENS = 20
TOKENS_PER_STEP = 3
STEP_SECONDS = 0.002


def host_array(tensor: Any) -> Any:
    """The tensor as NumPy; FORCE_CPU_ONLY_INPUT_TENSORS must have put it in host memory."""
    if not tensor.is_cpu():
        raise pb_utils.TritonModelException(f"input {tensor.name()} arrived in device memory")
    return tensor.as_numpy()


def scalar(request: Any, name: str, default: Any) -> Any:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else host_array(tensor).reshape(-1)[0].item()


def outputs(tokens: list[int]) -> Any:
    ids = np.array(tokens, dtype=np.int32).reshape(1, 1, -1)
    length = np.array([[len(tokens)]], dtype=np.int32)
    return pb_utils.InferenceResponse(
        [pb_utils.Tensor("output_ids", ids), pb_utils.Tensor("sequence_length", length)]
    )


def generate(request: Any) -> tuple[list[int], bool]:
    input_ids = host_array(pb_utils.get_input_tensor_by_name(request, "input_ids")).reshape(-1)
    limit = int(scalar(request, "request_output_len", 750))
    text_tokens = int((input_ids < ORIGINAL_VOCAB_SIZE).sum())
    count = min(limit, max(MIN_TOKENS, TOKENS_PER_TEXT_TOKEN * text_tokens))
    return [ORIGINAL_VOCAB_SIZE + i for i in range(count)], bool(
        scalar(request, "streaming", False)
    )


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        # As the real backend, refuse to load on parameters it refuses (trtllm_backend_params).
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        problems = config_problems(parameters)
        if problems:
            raise pb_utils.TritonModelException(
                "unexpected error when creating modelInstanceState: " + "; ".join(problems)
            )
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.streams: list[threading.Thread] = []

    def execute(self, requests: list[Any]) -> list[Any] | None:
        if not self.decoupled:
            return [outputs(generate(request)[0]) for request in requests]
        for request in requests:
            thread = threading.Thread(target=self._stream, args=(request,), daemon=True)
            thread.start()
            self.streams = [t for t in self.streams if t.is_alive()] + [thread]
        return None

    def _stream(self, request: Any) -> None:
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            tokens, streaming = generate(request)
            if not streaming:
                sender.send(outputs(tokens), flags=final)
                return
            steps = [
                tokens[i : i + TOKENS_PER_STEP] for i in range(0, len(tokens), TOKENS_PER_STEP)
            ]
            stream_seconds = float(os.environ.get("COSYVOICE_TWIN_STREAM_SECONDS") or 0)
            pause = stream_seconds / len(steps) if stream_seconds else STEP_SECONDS
            paused = os.environ.get("COSYVOICE_TWIN_LLM_PAUSE_FILE") or ""
            for i, step in enumerate(steps):
                time.sleep(pause)
                while paused and i == len(steps) - 1 and os.path.exists(paused):
                    time.sleep(0.01)
                sender.send(outputs(step), flags=final if i == len(steps) - 1 else 0)
        except Exception as exc:  # reported to the caller as a response
            sender.send(
                pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))), flags=final
            )

    def finalize(self) -> None:
        for thread in self.streams:
            thread.join(timeout=5)
