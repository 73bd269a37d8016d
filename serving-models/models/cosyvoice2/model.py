"""Triton Python model ``cosyvoice2``: CosyVoice2's orchestrator (text in, streamed audio out).

The project's own model code (``serving-models/README.md``). One stream per instance:
``execute`` is synchronous and serves its one request (``max_batch_size: 1``) to the end, so a
request that finds every instance busy waits in Triton's queue, and
``nv_inference_queue_duration_us`` of this model is the time before its synthesis starts
(``docs/concepts/triton-repository.md``, "Queue latency"). No torch and no CUDA here: NumPy in,
NumPy out, every BLS response asked in host memory. Per request:

1. the speaker: reference audio -> ``audio_tokenizer`` (speech tokens) and
   ``speaker_embedding``, and its mel (:mod:`cosyvoice_serving_models.features`); cached on
   the audio's hash plus the reference text (``speakers.SpeakerCache``).
   without reference audio, the default speaker (``default_speaker``: the file the engine
   builder made from ``spec.speakers.default``), or a per-request error when there is none;
2. the prompt ``<|sos|>`` + reference text + target text + ``<|task_id|>`` + the reference's
   speech tokens, through ``tensorrt_llm`` (streamed when decoupled);
3. the speech tokens through ``token2wav`` in chunks (``chunking.Chunking`` from
   ``token_hop_len`` and ``dynamic_chunk_strategy``), each chunk carrying the vocoder
   state the previous one returned, so any ``token2wav`` instance can serve it.

Exports ``cosyvoice_active_streams`` (a gauge, per instance): the streams being served now.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

for _path in reversed(os.environ.get("COSYVOICE_MODELS_PATH", "").split(":")):
    if _path and _path not in sys.path:
        sys.path.insert(0, _path)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # type: ignore[import-not-found]  # noqa: E402

from cosyvoice_serving_models import contract, features  # noqa: E402
from cosyvoice_serving_models.chunking import LOOKAHEAD_TOKENS, Chunking  # noqa: E402
from cosyvoice_serving_models.orchestration import OneStreamAtATime  # noqa: E402
from cosyvoice_serving_models.speakers import SpeakerCache, load_prompt  # noqa: E402
from cosyvoice_serving_models.triton_io import host_array as host  # noqa: E402

MODEL = "cosyvoice2"
ORIGINAL_VOCAB_SIZE = 151663  # speech token t is LLM token ORIGINAL_VOCAB_SIZE + t
SPEECH_TOKENS = 6561
MAX_TOKENS = 750
STATE = (
    ("hift_next_mel", "hift_cache_mel"),
    ("hift_next_source", "hift_cache_source"),
    ("hift_next_speech", "hift_cache_speech"),
)


def speech_tokens(ids: Any) -> list[int]:
    """LLM output ids -> speech tokens (ids past the speech vocabulary end the stream)."""
    out = []
    for i in np.asarray(ids).reshape(-1).tolist():
        token = i - ORIGINAL_VOCAB_SIZE if i >= ORIGINAL_VOCAB_SIZE else i
        if 0 <= token < SPEECH_TOKENS:
            out.append(int(token))
    return out


class TritonPythonModel(OneStreamAtATime):
    def initialize(self, args: dict[str, str]) -> None:
        from tokenizers import Tokenizer  # type: ignore[import-not-found]

        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        # The release's yaml says how the flow's prompt mel is computed: refuse one that
        # features.prompt_mel would get wrong.
        model_dir = Path(contract.parameter(params, MODEL, "model_dir"))
        self.f_max = features.check_release((model_dir / "cosyvoice2.yaml").read_text())
        tokenizer_dir = Path(contract.parameter(params, MODEL, "llm_tokenizer_dir"))
        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        eos = self.tokenizer.token_to_id("<|eos1|>")
        if eos is None:
            raise ValueError(f"{tokenizer_dir}: the tokenizer has no <|eos1|> token")
        self.eos = int(eos)
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

    # -- BLS -----------------------------------------------------------------------------
    def _request(self, model: str, inputs: dict[str, Any], outputs: list[str], **kw: Any) -> Any:
        return pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=outputs,
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
            preferred_memory=self.host_memory,
            **kw,
        )

    def _call(self, model: str, inputs: dict[str, Any], outputs: list[str], **kw: Any) -> dict:
        response = self._request(model, inputs, outputs, **kw).exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        result = {}
        for name in outputs:
            tensor = pb_utils.get_output_tensor_by_name(response, name)
            if tensor is not None:
                result[name] = host(tensor)
        return result

    # -- the steps -----------------------------------------------------------------------
    def _reference_features(self, wav: Any) -> tuple[Any, Any]:
        wav_len = np.array([[wav.shape[1]]], dtype=np.int32)
        tokens = self._call(
            "audio_tokenizer",
            {"reference_wav": wav, "reference_wav_len": wav_len},
            ["prompt_speech_tokens"],
        )["prompt_speech_tokens"]
        embedding = self._call(
            "speaker_embedding", {"reference_wav": wav}, ["prompt_spk_embedding"]
        )["prompt_spk_embedding"]
        return np.array(speech_tokens(tokens), dtype=np.int32), embedding

    def _llm(self, caller: Any, text: str, prompt_tokens: Any) -> Iterator[list[int]]:
        ids = self.tokenizer.encode(f"<|sos|>{text}<|task_id|>").ids
        input_ids = np.concatenate(
            [np.array(ids, dtype=np.int32), prompt_tokens.reshape(-1) + ORIGINAL_VOCAB_SIZE]
        ).reshape(1, -1)

        def one(value: Any, dtype: Any) -> Any:
            return np.array([[value]], dtype=dtype)

        inputs = {
            "input_ids": input_ids.astype(np.int32),
            "input_lengths": one(input_ids.shape[1], np.int32),
            "request_output_len": one(MAX_TOKENS, np.int32),
            "end_id": one(self.eos, np.int32),
            "pad_id": one(self.eos, np.int32),
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
            ids_tensor = pb_utils.get_output_tensor_by_name(response, "output_ids")
            if ids_tensor is None:  # the empty final response
                continue
            length = host(pb_utils.get_output_tensor_by_name(response, "sequence_length"))
            yield speech_tokens(host(ids_tensor)[0][0][: int(length[0][0])])
        if self.decoupled:
            # Python backend r24.10 (the pytriton wheel's) frees a decoupled BLS call's
            # responses on a thread without the GIL unless the caller waits for its cleanup
            # (python_backend #390, fixed in r24.12): a round trip to the parent does.
            caller.is_cancelled()

    def _token2wav(
        self,
        tokens: list[int],
        speaker: tuple[Any, Any, Any],
        offset: int | None,
        finalize: bool,
        state: dict[str, Any],
    ) -> tuple[Any, dict[str, Any]]:
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
            for out_name, in_name in STATE:
                if out_name in state:
                    inputs[in_name] = state[out_name]
        wanted = ["waveform"] + ([] if finalize or offset is None else [s for s, _ in STATE])
        result = self._call("token2wav", inputs, wanted)
        return result.pop("waveform"), result

    def _target(self, request: Any) -> str:
        text = host(pb_utils.get_input_tensor_by_name(request, "target_text"))
        return str(text.reshape(-1)[0].decode("utf-8"))

    # -- serving -------------------------------------------------------------------------
    def _stream(self, request: Any) -> None:
        sender = request.get_response_sender()
        text, speaker = self._speaker(request)
        tokens: list[int] = []
        offset, hop, index, state = 0, self.chunks.first, 0, {}
        for new in self._llm(request, text + self._target(request), speaker[0]):
            tokens += new
            while self.chunks.cut(len(tokens), offset, index, hop):
                window = tokens[: offset + hop + LOOKAHEAD_TOKENS]
                audio, state = self._token2wav(window, speaker, offset, False, state)
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio)]))
                offset += hop
                hop = self.chunks.hop_after(index)
                index += 1
        if not tokens:
            raise ValueError("the LLM returned no speech tokens")
        audio, _ = self._token2wav(tokens, speaker, offset, True, state)
        sender.send(
            pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio)]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def _offline(self, request: Any) -> Any:
        text, speaker = self._speaker(request)
        tokens = [
            t for new in self._llm(request, text + self._target(request), speaker[0]) for t in new
        ]
        audio, _ = self._token2wav(tokens, speaker, None, True, {})
        return pb_utils.InferenceResponse([pb_utils.Tensor("waveform", audio)])
