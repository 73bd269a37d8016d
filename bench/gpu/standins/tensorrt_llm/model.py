"""GPU stand-in for CosyVoice2's ``tensorrt_llm`` (the TensorRT-LLM backend upstream).

Same name, config and interface as the model the operator renders (the sweep changes only
``backend`` to ``python``, as the CPU twin does): ``input_ids`` in, ``output_ids`` [1, 1, n]
and ``sequence_length`` [1, 1] out, only new tokens, several responses when ``streaming``.
Like the backend's in-flight batching, one scheduler thread runs a decode step for every
admitted request at once and admits new ones between steps, up to ``max_batch_size`` slots;
the network is :class:`cv_shapes.Decoder` (Qwen2-0.5B-shaped, random weights, CUDA graphs).
The instance runs on the first GPU of its ``gpu_device_ids`` group.

Lengths follow the CPU twin's rule so load generators can ask for an audio length: 3 speech
tokens per text token of the prompt (at least 20, at most ``request_output_len``). A stream
gets a response every :data:`TOKENS_PER_RESPONSE` tokens (the backend sends every token; from
a Python backend that many responses would cost more than the decode steps they report).
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
import queue
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from cv_shapes import ORIGINAL_VOCAB_SIZE, Decoder

TOKENS_PER_TEXT_TOKEN = 3
MIN_TOKENS = 20
TOKENS_PER_RESPONSE = 5
MAX_LEN = 1280  # prompt and generated tokens of one stream (upstream: at most 750 generated)
FINAL = 0


@dataclass
class Stream:
    sender: Any
    ids: list[int]
    target: int
    streaming: bool
    tokens: list[int] = field(default_factory=list)
    sent: int = 0
    done: threading.Event = field(default_factory=threading.Event)
    response: Any = None


def host_array(tensor: Any) -> Any:
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


def error(message: str) -> Any:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        groups = params.get("gpu_device_ids", "0").split(";")
        name = args.get("model_instance_name", "")
        index = int(name.rsplit("_", 1)[-1]) if name.rsplit("_", 1)[-1].isdigit() else 0
        gpu = int(groups[index % len(groups)].split(",")[0])
        device = torch.device(f"cuda:{gpu}" if torch.cuda.is_available() else "cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.slots = max(1, int(config["max_batch_size"]))
        self.decoder = Decoder(device, self.slots, MAX_LEN)
        self.decoder.capture()
        self.final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self.pending: queue.Queue[Stream] = queue.Queue()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _parse(self, request: Any) -> Stream:
        ids = host_array(pb_utils.get_input_tensor_by_name(request, "input_ids")).reshape(-1)
        limit = int(scalar(request, "request_output_len", 750))
        text = int((ids < ORIGINAL_VOCAB_SIZE).sum())
        target = min(limit, max(MIN_TOKENS, TOKENS_PER_TEXT_TOKEN * text), MAX_LEN - len(ids))
        if target < 1:
            raise ValueError(f"a prompt of {len(ids)} tokens leaves no room in {MAX_LEN}")
        sender = request.get_response_sender() if self.decoupled else None
        streaming = bool(scalar(request, "streaming", False)) and self.decoupled
        return Stream(sender, [int(i) for i in ids], target, streaming)

    def execute(self, requests: list[Any]) -> list[Any] | None:
        streams: list[Stream | None] = []
        for request in requests:
            try:
                stream = self._parse(request)
            except Exception as exc:
                if self.decoupled:
                    request.get_response_sender().send(error(str(exc)), flags=self.final)
                streams.append(None)
                continue
            streams.append(stream)
            self.pending.put(stream)
        if self.decoupled:
            return None
        for stream in streams:
            if stream is not None:
                stream.done.wait()
        return [error("bad request") if s is None else s.response for s in streams]

    def _emit(self, stream: Stream, last: bool) -> None:
        if stream.streaming:
            new = stream.tokens[stream.sent :]
            stream.sent = len(stream.tokens)
            stream.sender.send(outputs(new), flags=self.final if last else 0)
        elif last:
            if stream.sender is not None:
                stream.sender.send(outputs(stream.tokens), flags=self.final)
            else:
                stream.response = outputs(stream.tokens)
        if last:
            stream.done.set()

    def _fail(self, stream: Stream, message: str) -> None:
        if stream.sender is not None:
            stream.sender.send(error(message), flags=self.final)
        else:
            stream.response = error(message)
        stream.done.set()

    def _loop(self) -> None:
        if self.decoder.device.type == "cuda":
            torch.cuda.set_device(self.decoder.device)  # the current device is per thread
        active: dict[int, Stream] = {}
        while not self.stopping.is_set():
            try:
                while len(active) < self.slots:
                    stream = (
                        self.pending.get(timeout=0.05) if not active else self.pending.get_nowait()
                    )
                    slot = min(set(range(self.slots)) - set(active))
                    try:
                        first = self.decoder.prefill(slot, stream.ids)
                    except Exception as exc:
                        self._fail(stream, f"prefill failed: {exc}")
                        continue
                    stream.tokens.append(ORIGINAL_VOCAB_SIZE + first)
                    active[slot] = stream
            except queue.Empty:
                pass
            if not active:
                continue
            try:
                step = self.decoder.step(max(active) + 1)
            except Exception:
                message = traceback.format_exc()
                for stream in active.values():
                    self._fail(stream, f"decode step failed: {message}")
                active.clear()
                continue
            for slot, stream in list(active.items()):
                stream.tokens.append(ORIGINAL_VOCAB_SIZE + step[slot])
                if len(stream.tokens) >= stream.target:
                    del stream.tokens[stream.target :]
                    self._emit(stream, last=True)
                    del active[slot]
                elif len(stream.tokens) - stream.sent >= TOKENS_PER_RESPONSE:
                    self._emit(stream, last=False)

    def finalize(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=10)
