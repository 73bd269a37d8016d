"""CPU stand-in for upstream's CosyVoice2 orchestrator (``model_repo/cosyvoice2/1/model.py``).

The same interface and the same work through BLS as upstream's: the reference audio through
``audio_tokenizer`` and ``speaker_embedding`` (or a built-in speaker without one), the prompt
through ``tensorrt_llm`` (streamed when decoupled), and the speech tokens through ``token2wav``
in chunks with upstream's schedule: the first after 15 + 3 look-ahead tokens, then hops of
25 x 2^k tokens, the rest with ``finalize``. The schedule follows the orchestrator's
parameters as rendered (:class:`Chunking`). Like the project's orchestrator (``serving-models/``,
which is what the operator deploys) and unlike upstream's, a stream's vocoder state travels
with its chunks: each streamed chunk asks ``token2wav`` for ``hift_next_*`` and the next chunk
sends it back as ``hift_cache_*``, with no request id, so any of the ``instancesPerGpu``
instances can serve any chunk (upstream's keys the state by request id in one instance, and
a chunk routed to another loses it). Decoupled,
it sends each chunk as a response as soon as it has it and ends with the final flag; otherwise
it answers once with the whole audio.

Unlike upstream's it has no tokenizer (a text token per UTF-8 byte) and no torch: it asks
every BLS response in host memory (``preferred_memory``) and keeps NumPy arrays, the pattern
the serving image's model code needs (see ``cosyvoice_operator.render.triton``).

Service time: see :class:`Pace` (the closed-loop harness sets it; unset, nothing changes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from orchestrator_streams import Draining, Streams, error_response  # type: ignore[import-not-found]

ORIGINAL_VOCAB_SIZE = 151663
FIRST_HOP_TOKENS = 15
LOOKAHEAD_TOKENS = 3
TOKEN_RATE = 25
MAX_TOKENS = 750
EMBEDDING_SIZE = 192
MEL_BINS = 80
# token2wav's vocoder state: what a streamed chunk returns -> what the next chunk sends.
STATE = {
    "hift_next_mel": "hift_cache_mel",
    "hift_next_source": "hift_cache_source",
    "hift_next_speech": "hift_cache_speech",
}


def host_array(tensor: Any) -> Any:
    """The tensor as NumPy; it must be in host memory (input policy or preferred_memory)."""
    if not tensor.is_cpu():
        raise pb_utils.TritonModelException(f"tensor {tensor.name()} is in device memory")
    return tensor.as_numpy()


def let_go_after_cleanup(caller: Any) -> None:
    """Return once the stub has run the cleanup of the decoupled BLS call just finished.

    The Python backend of the pytriton wheel's Triton (2.51, python_backend r24.10) keeps
    every response of a decoupled BLS call in its ``ResponseIterator``, which it also holds in
    a map. Reading the final response queues a cleanup, which the stub's stub-to-parent
    thread (a C++ thread, without the GIL) runs by erasing that map entry. When Python has let
    go of the iterator before then, the erase drops the last reference: every response's
    NumPy arrays are freed on that thread without the GIL while this model's Python runs on
    the main thread, and the stub's heap is corrupted (a segfault in ``pymalloc_alloc``,
    seen by the client as "Stub process 'cosyvoice2_0_N' is not healthy"). Upstream fixed
    it in r24.12 (python_backend #390: ``~PbTensor`` takes the GIL); the serving image's
    Triton has the fix.

    ``caller.is_cancelled()`` asks the parent through the same queue, first in first out,
    and waits for the answer: when it returns, the cleanup has run, so the caller's reference
    to the iterator, dropped after this, is the last one, and the arrays are freed under the
    GIL.
    """
    caller.is_cancelled()


class Pace:
    """The service time the closed-loop harness asks for (a test seam, read at load time).

    ``COSYVOICE_TWIN_SERVICE_SECONDS``: each request holds its orchestrator instance at least
    this long; ``COSYVOICE_TWIN_FIRST_CHUNK_SECONDS`` (default a quarter of it) of that
    passes before its first audio. Unset: as fast as the stand-ins go.

    ``COSYVOICE_TWIN_HOLD_FILE``: a stream, once its first audio is sent, goes on only when
    this file exists: a test that needs every instance busy (to fill the queue behind them)
    keeps them so for as long as it takes, on a machine of any speed.
    """

    def __init__(self) -> None:
        self.total = float(os.environ.get("COSYVOICE_TWIN_SERVICE_SECONDS") or 0)
        first = os.environ.get("COSYVOICE_TWIN_FIRST_CHUNK_SECONDS")
        self.first = min(self.total, float(first) if first else self.total / 4)
        self.hold = os.environ.get("COSYVOICE_TWIN_HOLD_FILE") or ""

    def until_released(self) -> None:
        """Wait for the hold file, if there is one to wait for."""
        while self.hold and not os.path.exists(self.hold):
            time.sleep(0.01)

    @staticmethod
    def wait(start: float, seconds: float) -> None:
        """Sleep until ``seconds`` after ``start`` (a ``time.monotonic()``), if not past."""
        left = start + seconds - time.monotonic()
        if left > 0:
            time.sleep(left)


class Chunking:
    """The chunk schedule from the orchestrator's parameters, as the operator renders them:
    ``token_hop_len`` (the first chunk's tokens; upstream's 15 when absent) and
    ``dynamic_chunk_strategy``: ``exponential`` (later hops 25 x 2^k), ``equal`` (every hop
    the first's). ``time_based`` sizes hops from measured synthesis speed upstream; on a CPU
    twin that speed means nothing, so the stand-in follows ``exponential`` for it.
    """

    def __init__(self, config: dict[str, Any]) -> None:
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.first = int(params.get("token_hop_len") or FIRST_HOP_TOKENS)
        self.strategy = params.get("dynamic_chunk_strategy") or "exponential"

    def next_hop(self, index: int) -> int:
        """The hop after chunk ``index`` (0 for the first)."""
        if self.strategy == "equal":
            return self.first
        return int(TOKEN_RATE * 2**index)  # upstream's "exponential" strategy


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.host = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
        self.pace = Pace()
        self.streams = Streams(args)
        self.chunks = Chunking(config)

    def _request(self, model: str, inputs: dict[str, Any], outputs: list[str], **kw: Any) -> Any:
        return pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=outputs,
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
            preferred_memory=self.host,
            **kw,
        )

    def _call(self, model: str, inputs: dict[str, Any], output: str, **kw: Any) -> Any:
        return self._call_many(model, inputs, [output], **kw)[output]

    def _call_many(
        self, model: str, inputs: dict[str, Any], outputs: list[str], **kw: Any
    ) -> dict[str, Any]:
        response = self._request(model, inputs, outputs, **kw).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        return {o: host_array(pb_utils.get_output_tensor_by_name(response, o)) for o in outputs}

    def _prompt(self, request: Any) -> tuple[str, Any, Any, Any]:
        """Reference text, prompt speech tokens [1, T], mel features [1, 2T, 80], embedding."""
        wav = pb_utils.get_input_tensor_by_name(request, "reference_wav")
        if wav is None:  # upstream: the cached speaker of spk2info.pt
            tokens = (ORIGINAL_VOCAB_SIZE + np.arange(50, dtype=np.int32)).reshape(1, -1)
            embedding = np.zeros((1, EMBEDDING_SIZE), dtype=np.float16)
            text = ""
        else:
            wav_array = host_array(wav)
            wav_len = host_array(pb_utils.get_input_tensor_by_name(request, "reference_wav_len"))
            tokens = self._call(
                "audio_tokenizer",
                {"reference_wav": wav_array, "reference_wav_len": wav_len},
                "prompt_speech_tokens",
            )
            embedding = self._call(
                "speaker_embedding",
                {"reference_wav": wav_array[:, : int(wav_len.item())]},
                "prompt_spk_embedding",
            )
            reference = pb_utils.get_input_tensor_by_name(request, "reference_text")
            text = host_array(reference).reshape(-1)[0].decode("utf-8")
        feat = np.zeros((1, 2 * tokens.shape[1], MEL_BINS), dtype=np.float16)
        return text, tokens, feat, embedding

    def _llm(self, caller: Any, text: str, prompt_tokens: Any) -> Iterator[list[int]]:
        """The speech tokens of ``tensorrt_llm`` for the prompt, as they stream in; ``caller``
        is the request being served (see :func:`let_go_after_cleanup`)."""
        text_ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
        input_ids = np.concatenate([text_ids.reshape(1, -1), prompt_tokens], axis=1)

        def one(value: Any, dtype: Any) -> Any:
            return np.array([[value]], dtype=dtype)

        inputs = {
            "input_ids": input_ids.astype(np.int32),
            "input_lengths": one(input_ids.shape[1], np.int32),
            "request_output_len": one(MAX_TOKENS, np.int32),
            "end_id": one(ORIGINAL_VOCAB_SIZE - 1, np.int32),
            "pad_id": one(ORIGINAL_VOCAB_SIZE - 1, np.int32),
            "streaming": one(self.decoupled, np.bool_),
            "runtime_top_p": one(0.95, np.float32),
            "runtime_top_k": one(50, np.int32),
            "temperature": one(0.8, np.float32),
            "repetition_penalty": one(1.1, np.float32),
            "random_seed": one(42, np.uint64),
        }
        request = self._request("tensorrt_llm", inputs, ["output_ids", "sequence_length"])
        responses = request.exec(decoupled=self.decoupled)
        for response in responses if self.decoupled else [responses]:
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
            if ids is None:  # an empty final response
                continue
            length = host_array(pb_utils.get_output_tensor_by_name(response, "sequence_length"))
            yield host_array(ids)[0][0][: int(length[0][0])].tolist()
        if self.decoupled:
            let_go_after_cleanup(caller)
        # Only now may ``responses`` go: its last reference is Python's (GIL held).

    def _token2wav(
        self,
        tokens: list[int],
        state: dict[str, Any],
        prompt: tuple[str, Any, Any, Any],
        offset: int | None,
        finalize: bool,
    ) -> tuple[Any, dict[str, Any]]:
        """One chunk's audio and the vocoder state the next chunk of the stream sends back
        (empty for the last chunk and offline)."""
        _, prompt_tokens, feat, embedding = prompt
        inputs = {
            "target_speech_tokens": np.array([tokens], dtype=np.int32),
            "prompt_speech_tokens": prompt_tokens,
            "prompt_speech_feat": feat,
            "prompt_spk_embedding": embedding,
        }
        if offset is not None:
            inputs["token_offset"] = np.array([[offset]], dtype=np.int32)
            inputs["finalize"] = np.array([[finalize]], dtype=np.bool_)
            inputs.update({STATE[out]: value for out, value in state.items()})
        wanted = ["waveform"] + ([] if finalize or offset is None else list(STATE))
        result = self._call_many("token2wav", inputs, wanted)
        return result.pop("waveform"), result

    def _target(self, request: Any) -> str:
        text = host_array(pb_utils.get_input_tensor_by_name(request, "target_text"))
        return str(text.reshape(-1)[0].decode("utf-8"))

    def _stream(self, request: Any) -> None:
        sender = request.get_response_sender()
        start, sent = time.monotonic(), 0

        def send(audio: Any) -> None:
            nonlocal sent
            if not sent:
                self.pace.wait(start, self.pace.first)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio)]))
            sent += 1
            if sent == 1:
                self.pace.until_released()

        prompt = self._prompt(request)
        tokens: list[int] = []
        offset, hop, chunk = 0, self.chunks.first, 0
        state: dict[str, Any] = {}
        for new in self._llm(request, prompt[0] + self._target(request), prompt[1]):
            tokens += new
            while len(tokens) - offset >= hop + LOOKAHEAD_TOKENS:
                window = tokens[: offset + hop + LOOKAHEAD_TOKENS]
                audio, state = self._token2wav(window, state, prompt, offset, False)
                send(audio)
                offset += hop
                hop = self.chunks.next_hop(chunk)
                chunk += 1
        last, _ = self._token2wav(tokens, state, prompt, offset, True)
        if sent:  # the last audio comes at the end of the service time
            self.pace.wait(start, self.pace.total)
        send(last)
        self.pace.wait(start, self.pace.total)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _offline(self, request: Any) -> Any:
        start = time.monotonic()
        prompt = self._prompt(request)
        target = prompt[0] + self._target(request)
        tokens = [t for new in self._llm(request, target, prompt[1]) for t in new]
        audio, _ = self._token2wav(tokens, {}, prompt, None, True)
        self.pace.wait(start, self.pace.total)
        return pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio)])

    def execute(self, requests: list[Any]) -> list[Any] | None:
        responses: list[Any] = []
        for request in requests:
            try:
                self.streams.admit()
            except Draining as exc:
                self._answer_error(request, exc, responses)
                continue
            try:
                if self.decoupled:
                    self._stream(request)
                else:
                    responses.append(self._offline(request))
            except Exception as exc:  # reported to the client
                self._answer_error(request, exc, responses)
            finally:
                self.streams.done()
        return None if self.decoupled else responses

    def _answer_error(self, request: Any, exc: Exception, responses: list[Any]) -> None:
        if self.decoupled:
            request.get_response_sender().send(
                error_response(exc), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
        else:
            responses.append(error_response(exc))
