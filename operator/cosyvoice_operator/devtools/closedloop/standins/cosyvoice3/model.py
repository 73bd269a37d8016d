"""CPU stand-in for upstream's CosyVoice3 orchestrator (``model_repo_cosyvoice3/cosyvoice3``).

The same interface and the same work as upstream's: the reference audio through
``audio_tokenizer`` and ``speaker_embedding`` (BLS), the LLM over HTTP as an OpenAI
chat-completions call to trtllm-serve (``stream: true`` when decoupled; speech tokens come as
``<|s_N|>`` in the content), then per chunk (15 + 3 look-ahead tokens, then hops of
25 x 2^k, or as the rendered parameters say: :class:`Chunking`) ``token2wav`` for the
chunk's mel, sent with upstream's priority (chunk index + 1) and the request's id, and
``vocoder`` for the audio of all the mel so far, of which it sends the part not sent yet;
the rest with ``finalize``, then the final flag.

Ours, as the operator renders it: ``llm_api_bases`` lists one trtllm-serve per
tensor-parallel group and requests go round-robin over them, each instance starting at its
own index (upstream reads one ``llm_api_base``). Unlike upstream's it has no torch and asks
every BLS response in host memory. One seam for the test only, outside the repository:
``COSYVOICE_TWIN_LLM_REMAP`` (JSON, URL -> URL) points the rendered localhost URLs at the
test's stand-in servers, which listen on free ports. Service time: see :class:`Pace` (the
closed-loop harness sets it; unset, nothing changes).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]
from orchestrator_streams import Draining, Streams, error_response  # type: ignore[import-not-found]

FIRST_HOP_TOKENS = 15
LOOKAHEAD_TOKENS = 3
TOKEN_RATE = 25
MAX_TOKENS = 750
MEL_BINS = 80
SPEECH_TOKEN = re.compile(r"<\|s_(\d+)\|>")
LLM_TIMEOUT_SECONDS = 30
# Upstream's instruction (ace7c47 model_repo_cosyvoice3/cosyvoice3/1/model.py:260-261),
# prepended to a reference text without <|endofprompt|>, as our orchestrator does.
END_OF_PROMPT = "<|endofprompt|>"
INSTRUCTION = "You are a helpful assistant." + END_OF_PROMPT


def host_array(tensor: Any) -> Any:
    """The tensor as NumPy; it must be in host memory (input policy or preferred_memory)."""
    if not tensor.is_cpu():
        raise pb_utils.TritonModelException(f"tensor {tensor.name()} is in device memory")
    return tensor.as_numpy()


class Pace:
    """The service time the closed-loop harness asks for (a test seam, read at load time).

    ``COSYVOICE_TWIN_SERVICE_SECONDS``: each request holds its orchestrator instance at least
    this long; ``COSYVOICE_TWIN_FIRST_CHUNK_SECONDS`` (default a quarter of it) of that
    passes before its first audio. Unset: as fast as the stand-ins go.
    """

    def __init__(self) -> None:
        self.total = float(os.environ.get("COSYVOICE_TWIN_SERVICE_SECONDS") or 0)
        first = os.environ.get("COSYVOICE_TWIN_FIRST_CHUNK_SECONDS")
        self.first = min(self.total, float(first) if first else self.total / 4)

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


class SharedTurn:
    """A counter shared by the processes of one model: a file under the temporary directory
    (an emptyDir in the pod) named by the model's directory, taken under an exclusive lock
    for each turn."""

    def __init__(self, model_directory: str) -> None:
        digest = hashlib.sha256(model_directory.encode()).hexdigest()[:16]
        self.path = os.path.join(tempfile.gettempdir(), f"cosyvoice-turn-{digest}")

    def next(self) -> int:
        with open(self.path, "a+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            f.seek(0)
            turn = int(f.read() or b"0")
            f.seek(0)
            f.truncate()
            f.write(str(turn + 1).encode())
            return turn


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config["parameters"].items()}
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.host = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
        remap = json.loads(os.environ.get("COSYVOICE_TWIN_LLM_REMAP", "{}"))
        urls = (params.get("llm_api_bases") or params["llm_api_base"]).split(",")
        self.urls = [remap.get(url, url) for url in urls]
        # Round-robin over the groups, one turn counter for every instance of this model in
        # this server (each instance is its own process): which instances Triton's scheduler
        # hands requests to must not decide which groups work. A per-instance counter did:
        # four streams given to instances whose own turns all began at the same group.
        self.turn = SharedTurn(args["model_repository"])
        self.pace = Pace()
        self.streams = Streams(args)
        self.chunks = Chunking(config)
        # trtllm-serve's request schema requires a model name: the one it serves, rendered.
        self.model_name = params["llm_model_name"]

    def _call(self, model: str, inputs: dict[str, Any], output: str, **kw: Any) -> Any:
        response = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=[output],
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
            preferred_memory=self.host,
            **kw,
        ).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        return host_array(pb_utils.get_output_tensor_by_name(response, output))

    def _prompt(self, request: Any) -> tuple[str, Any, Any, Any]:
        """Reference text, prompt speech tokens [1, T], mel features [1, 2T, 80], embedding."""
        wav = pb_utils.get_input_tensor_by_name(request, "reference_wav")
        if wav is None:
            raise ValueError("CosyVoice3 needs reference_wav (it has no cached speaker)")
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
        text = "" if reference is None else host_array(reference).reshape(-1)[0].decode("utf-8")
        feat = np.zeros((1, 2 * tokens.shape[1], MEL_BINS), dtype=np.float16)
        return text, tokens, feat, embedding

    def _llm(self, text: str, prompt_tokens: Any) -> Iterator[int]:
        """Speech tokens from trtllm-serve, as they arrive."""
        prompt = "".join(f"<|s_{int(t)}|>" for t in prompt_tokens.reshape(-1))
        if END_OF_PROMPT not in text:
            text = INSTRUCTION + text
        body = {
            "model": self.model_name,
            "messages": [
                {"role": "user", "content": text},
                {"role": "assistant", "content": prompt},
            ],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.8,
            "top_p": 0.95,
            "top_k": 50,
            "repetition_penalty": 1.1,
            "stop": ["<|eos1|>", "<|eos|>"],
            "stream": self.decoupled,
        }
        url = self.urls[self.turn.next() % len(self.urls)]
        call = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(call, timeout=LLM_TIMEOUT_SECONDS) as answer:
            if not self.decoupled:
                content = json.loads(answer.read())["choices"][0]["message"]["content"]
                yield from (int(m) for m in SPEECH_TOKEN.findall(content))
                return
            for raw in answer:
                line = raw.decode("utf-8").strip()
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    break
                delta = json.loads(data)["choices"][0].get("delta", {})
                yield from (int(m) for m in SPEECH_TOKEN.findall(delta.get("content") or ""))

    def _mel(
        self,
        tokens: list[int],
        request_id: str,
        prompt: tuple[str, Any, Any, Any],
        offset: int | None,
        finalize: bool,
        priority: int,
    ) -> Any:
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
        mel = self._call(
            "token2wav",
            inputs,
            "mel",
            request_id=request_id,
            parameters={"priority": priority},  # as upstream sends it
        )
        return mel.reshape(1, MEL_BINS, -1)

    def _speech(self, mel: Any, finalize: bool) -> Any:
        inputs = {"mel": mel.astype(np.float32), "finalize": np.array([[finalize]], dtype=np.bool_)}
        return self._call("vocoder", inputs, "tts_speech")

    def _stream(self, request: Any) -> None:
        sender = request.get_response_sender()
        request_id = request.request_id() or str(uuid.uuid4())
        start = time.monotonic()
        prompt = self._prompt(request)
        target = host_array(pb_utils.get_input_tensor_by_name(request, "target_text"))
        mel = np.zeros((1, MEL_BINS, 0), dtype=np.float32)
        sent = 0

        def chunk(tokens: list[int], offset: int, finalize: bool, index: int) -> None:
            nonlocal mel, sent
            part = self._mel(tokens, request_id, prompt, offset, finalize, index + 1)
            mel = np.concatenate([mel, part], axis=2)
            speech = self._speech(mel, finalize)
            if speech.shape[1] > sent:
                # The first audio after its share of the service time, the last at its end.
                self.pace.wait(start, self.pace.total if finalize and sent else self.pace.first)
                new = speech[:, sent:]
                sent = speech.shape[1]
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("waveform", new)]))

        tokens: list[int] = []
        offset, hop, index = 0, self.chunks.first, 0
        for token in self._llm(prompt[0] + target.reshape(-1)[0].decode("utf-8"), prompt[1]):
            tokens.append(token)
            if len(tokens) - offset >= hop + LOOKAHEAD_TOKENS:
                chunk(tokens[: offset + hop + LOOKAHEAD_TOKENS], offset, False, index)
                offset += hop
                hop = self.chunks.next_hop(index)
                index += 1
        if tokens:
            chunk(tokens, offset, True, index)
        self.pace.wait(start, self.pace.total)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _offline(self, request: Any) -> Any:
        start = time.monotonic()
        prompt = self._prompt(request)
        target = host_array(pb_utils.get_input_tensor_by_name(request, "target_text"))
        tokens = list(self._llm(prompt[0] + target.reshape(-1)[0].decode("utf-8"), prompt[1]))
        if not tokens:
            raise ValueError("the LLM generated no speech tokens")
        request_id = request.request_id() or str(uuid.uuid4())
        speech = self._speech(self._mel(tokens, request_id, prompt, None, True, 1), True)
        self.pace.wait(start, self.pace.total)
        return pb_utils.InferenceResponse([pb_utils.Tensor("waveform", speech)])

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
