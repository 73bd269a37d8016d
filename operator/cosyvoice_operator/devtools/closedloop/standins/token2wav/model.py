"""CPU stand-in for upstream's ``token2wav`` of both variants (flow + HiFT on a GPU upstream).

Which variant it stands in for is read from the config it is loaded with:

- output ``waveform`` (CosyVoice2): speech tokens in, audio [1, S] FP32 at 24 kHz out. Like
  upstream's it keeps per-stream state keyed by the request id (upstream: the vocoder cache)
  and so needs the chunks of one stream in order and a unique id per stream: a chunk whose
  ``token_offset`` is not where the stream's previous chunk ended is an error here. A chunk
  without a request id (the project's own orchestrator, ``serving-models/``) is served as
  the project's token2wav serves it, keeping nothing: the stream's state comes in
  ``hift_cache_*`` and goes out in ``hift_next_*`` (here ``hift_next_speech`` carries the
  token the next chunk must start at; mel and source are placeholders), with the same
  ordering check against it.
- output ``mel`` (CosyVoice3): speech tokens in, a mel spectrogram [80, F] out (2 frames per
  token), stateless as upstream's.

A chunk covers the tokens from ``token_offset`` on, less the 3 look-ahead tokens unless
``finalize`` (the orchestrator sends them again with the next chunk); without
``token_offset`` (offline) it covers every token. The audio is a 440 Hz sine whose phase
continues across chunks (sample n of the stream is sin(2 pi 440 n / 24000)), and mel frame f
carries the value f: the test rebuilds the whole stream and so sees any chunk out of order.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]

SAMPLE_RATE = 24000
SAMPLES_PER_TOKEN = SAMPLE_RATE // 25
MEL_FRAMES_PER_TOKEN = 2
MEL_BINS = 80
LOOKAHEAD_TOKENS = 3
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
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.mel = [o["name"] for o in config["output"]] == ["mel"]
        # request id -> the token offset its next chunk must start at (CosyVoice2 only).
        self.next_offset: dict[str, int] = {}
        self.lock = threading.Lock()

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(self._one(request)))
            except Exception as exc:  # reported to the caller as a response
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses

    def _one(self, request: Any) -> Any:
        tokens = host_array(pb_utils.get_input_tensor_by_name(request, "target_speech_tokens"))
        for name in ("prompt_speech_tokens", "prompt_speech_feat", "prompt_spk_embedding"):
            prompt = pb_utils.get_input_tensor_by_name(request, name)
            if prompt is not None:
                host_array(prompt)
            elif self.mel:
                raise ValueError(f"{name} is required for CosyVoice3 token2wav")
        offset_tensor = pb_utils.get_input_tensor_by_name(request, "token_offset")
        finalize_tensor = pb_utils.get_input_tensor_by_name(request, "finalize")
        offset = 0 if offset_tensor is None else int(host_array(offset_tensor).item())
        finalize = True if finalize_tensor is None else bool(host_array(finalize_tensor).item())
        count = tokens.shape[-1] - offset - (0 if finalize else LOOKAHEAD_TOKENS)
        if count <= 0:
            raise ValueError(f"no tokens to synthesise: {tokens.shape[-1]} from offset {offset}")
        carried = offset_tensor is not None and not self.mel and not request.request_id()
        if carried:
            self._check_carried(request, offset)
        elif offset_tensor is not None and not self.mel:
            self._advance(request.request_id(), offset, count, finalize)
        time.sleep(WORK_SECONDS)
        if self.mel:
            first = offset * MEL_FRAMES_PER_TOKEN
            frames = np.arange(first, first + count * MEL_FRAMES_PER_TOKEN, dtype=np.float32)
            return [pb_utils.Tensor("mel", np.tile(frames, (1, MEL_BINS, 1)))]
        audio = tone(offset * SAMPLES_PER_TOKEN, count * SAMPLES_PER_TOKEN)
        out = [pb_utils.Tensor("waveform", audio.reshape(1, -1))]
        if carried and not finalize:
            out += [
                pb_utils.Tensor("hift_next_mel", np.zeros((1, MEL_BINS, 1), dtype=np.float32)),
                pb_utils.Tensor("hift_next_source", np.zeros((1, 1), dtype=np.float32)),
                pb_utils.Tensor("hift_next_speech", np.array([[offset + count]], np.float32)),
            ]
        return out

    @staticmethod
    def _check_carried(request: Any, offset: int) -> None:
        """A chunk of a stream whose state travels with it: it starts where the state says."""
        state = pb_utils.get_input_tensor_by_name(request, "hift_cache_speech")
        expected = 0 if state is None else int(host_array(state).reshape(-1)[0])
        if offset != expected:
            raise ValueError(
                f"chunk at token {offset}, but its vocoder state is for token {expected} "
                "(chunks out of order, or a stream's state lost)"
            )

    def _advance(self, request_id: str, offset: int, count: int, finalize: bool) -> None:
        if not request_id:
            raise ValueError("a streamed chunk needs the stream's request id")
        with self.lock:
            expected = self.next_offset.get(request_id, 0)
            if offset != expected:
                raise ValueError(
                    f"stream {request_id!r}: chunk at token {offset}, expected {expected} "
                    "(chunks out of order, or two streams sharing one request id)"
                )
            if finalize:
                self.next_offset.pop(request_id, None)
            else:
                self.next_offset[request_id] = offset + count
