"""Triton Python model ``cosyvoice3``: CosyVoice3's orchestrator (text in, streamed audio out).

The project's own model code (``serving-models/README.md``). Like ``cosyvoice2``'s: one
stream per instance (synchronous ``execute``, so Triton's queue time is the wait before
synthesis starts), no torch, every BLS response in host memory, the speaker cache on the
reference audio's hash plus its text, the default speaker for requests without reference
audio (``default_speaker``), the chunk schedule from ``token_hop_len`` and
``dynamic_chunk_strategy``, the ``cosyvoice_active_streams`` gauge. Specific to CosyVoice3:

- the LLM runs beside Triton, one OpenAI-compatible server per tensor-parallel group
  (``llm_api_bases``; ``llm_api_base`` alone when there is one); each stream goes to the
  group with the fewest streams in flight (``llm_groups.LeastLoaded``),
  never through a proxy (the servers are in the pod);
- each request names the served model (``llm_model_name``) and carries upstream's
  instruction before the reference text (``cosyvoice3_prompt``: what trtllm-serve's schema
  and CosyVoice3's LLM require);
- ``max_tokens`` is 20 speech tokens per token of the target text (upstream's
  ``max_token_text_ratio``), at most 750, counted with the LLM's tokenizer
  (``llm_tokenizer_dir``);
- ``token2wav`` returns the chunk's mel and ``vocoder`` turns all the mel so far into audio
  (both stateless); the part of the audio not sent yet is sent.
"""

from __future__ import annotations

import json
import os
import re
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

for _path in reversed(os.environ.get("COSYVOICE_MODELS_PATH", "").split(":")):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]  # noqa: E402

from cosyvoice_serving_models import contract, cosyvoice3_prompt, features  # noqa: E402
from cosyvoice_serving_models.chunking import LOOKAHEAD_TOKENS, Chunking  # noqa: E402
from cosyvoice_serving_models.llm_groups import LeastLoaded  # noqa: E402
from cosyvoice_serving_models.orchestration import OneStreamAtATime  # noqa: E402
from cosyvoice_serving_models.speakers import SpeakerCache, load_prompt  # noqa: E402
from cosyvoice_serving_models.triton_io import host_array as host  # noqa: E402

MODEL = "cosyvoice3"
MAX_TOKENS = 750
TOKENS_PER_TEXT_TOKEN = 20
SPEECH_TOKEN = re.compile(r"<\|s_(\d+)\|>")
LLM_TIMEOUT_SECONDS = 120
MEL_BINS = 80


class TritonPythonModel(OneStreamAtATime):
    def initialize(self, args: dict[str, str]) -> None:
        from tokenizers import Tokenizer  # type: ignore[import-not-found]

        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        model_dir = Path(contract.parameter(params, MODEL, "model_dir"))
        self.f_max = features.check_release((model_dir / "cosyvoice3.yaml").read_text())
        tokenizer_dir = Path(contract.parameter(params, MODEL, "llm_tokenizer_dir"))
        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        first = contract.parameter(params, MODEL, "llm_api_base")
        every = contract.parameter(params, MODEL, "llm_api_bases")
        urls = [u for u in every.split(",") if u] or [first]
        if urls[0] != first:
            raise ValueError(f"llm_api_base {first} is not the first of llm_api_bases {urls}")
        self.groups = LeastLoaded(urls, args.get("model_repository", ""))
        # The name trtllm-serve serves (its engine directory's basename): its request schema
        # requires ``model`` (cosyvoice3_prompt says why).
        self.llm_model = contract.parameter(params, MODEL, "llm_model_name")
        self.http = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self.chunks = Chunking(
            first=int(contract.parameter(params, MODEL, "token_hop_len", "15")),
            strategy=contract.parameter(params, MODEL, "dynamic_chunk_strategy"),
        )
        self.speakers: SpeakerCache[tuple[Any, Any, Any]] = SpeakerCache()
        # spec.speakers.default, built by the engine builder and verified by the pod's gate:
        # requests without reference audio use it (absent: they get a per-request error).
        default = contract.parameter(params, MODEL, "default_speaker")
        self.default_speaker = None
        if default:
            prompt = load_prompt(Path(default))
            self.default_speaker = (prompt.text, prompt.as_request_inputs())
        self.host_memory = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0)
        self._start_gauge(args)

    def _call(self, model: str, inputs: dict[str, Any], output: str) -> Any:
        response = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=[output],
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
            preferred_memory=self.host_memory,
        ).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        return host(pb_utils.get_output_tensor_by_name(response, output))

    def _reference_features(self, wav: Any) -> tuple[Any, Any]:
        wav_len = np.array([[wav.shape[1]]], dtype=np.int32)
        tokens = self._call(
            "audio_tokenizer",
            {"reference_wav": wav, "reference_wav_len": wav_len},
            "prompt_speech_tokens",
        ).reshape(-1)
        embedding = self._call("speaker_embedding", {"reference_wav": wav}, "prompt_spk_embedding")
        return tokens, embedding

    def _llm(self, url: str, reference: str, target: str, prompt_tokens: Any) -> Iterator[int]:
        text_tokens = len(self.tokenizer.encode(target).ids)
        body = cosyvoice3_prompt.chat_body(
            self.llm_model,
            reference,
            target,
            prompt_tokens.reshape(-1),
            max(1, min(MAX_TOKENS, TOKENS_PER_TEXT_TOKEN * text_tokens)),
            self.decoupled,
        )
        call = urllib.request.Request(
            url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with self.http.open(call, timeout=LLM_TIMEOUT_SECONDS) as answer:
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

    def _mel(self, tokens: list[int], speaker: Any, offset: int | None, finalize: bool) -> Any:
        prompt_tokens, feat, embedding = speaker
        inputs = {
            "target_speech_tokens": np.array([tokens], dtype=np.int32),
            "prompt_speech_tokens": prompt_tokens,
            "prompt_speech_feat": feat,
            "prompt_spk_embedding": embedding,
        }
        if offset is not None:
            inputs["token_offset"] = np.array([[offset]], dtype=np.int32)
            inputs["finalize"] = np.array([[finalize]], dtype=np.bool_)
        return self._call("token2wav", inputs, "mel").reshape(1, MEL_BINS, -1)

    def _speech(self, mel: Any, finalize: bool) -> Any:
        inputs = {"mel": mel.astype(np.float32), "finalize": np.array([[finalize]], dtype=np.bool_)}
        return self._call("vocoder", inputs, "tts_speech")

    def _target(self, request: Any) -> str:
        text = host(pb_utils.get_input_tensor_by_name(request, "target_text"))
        return str(text.reshape(-1)[0].decode("utf-8"))

    def _stream(self, request: Any) -> None:
        sender = request.get_response_sender()
        reference, speaker = self._speaker(request)
        target = self._target(request)
        mel = np.zeros((1, MEL_BINS, 0), dtype=np.float32)
        sent = 0

        def chunk(window: list[int], offset: int, finalize: bool) -> None:
            nonlocal mel, sent
            mel = np.concatenate([mel, self._mel(window, speaker, offset, finalize)], axis=2)
            speech = self._speech(mel, finalize)
            if speech.shape[1] > sent:
                sender.send(
                    pb_utils.InferenceResponse([pb_utils.Tensor("waveform", speech[:, sent:])])
                )
                sent = speech.shape[1]

        tokens: list[int] = []
        offset, hop, index = 0, self.chunks.first, 0
        with self.groups.slot() as url:
            for token in self._llm(url, reference, target, speaker[0]):
                tokens.append(token)
                if self.chunks.cut(len(tokens), offset, index, hop):
                    chunk(tokens[: offset + hop + LOOKAHEAD_TOKENS], offset, False)
                    offset += hop
                    hop = self.chunks.hop_after(index)
                    index += 1
        if not tokens:
            raise ValueError("the LLM returned no speech tokens")
        chunk(tokens, offset, True)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _offline(self, request: Any) -> Any:
        reference, speaker = self._speaker(request)
        with self.groups.slot() as url:
            tokens = list(self._llm(url, reference, self._target(request), speaker[0]))
        if not tokens:
            raise ValueError("the LLM returned no speech tokens")
        speech = self._speech(self._mel(tokens, speaker, None, True), True)
        return pb_utils.InferenceResponse([pb_utils.Tensor("waveform", speech)])
