"""The parameters each model's ``config.pbtxt`` carries: the renderer's side of the contract
between the rendered repository and the code that reads it (issue 19, item 3).

One declaration per (variant, model), read in three places:

- ``render/triton.py`` checks every configuration it renders against it (a key outside it,
  or a key it calls ``always`` missing, is a bug in the renderer and raises);
- a contract test of the model code (every parameter the renderer may write has a reader
  in the model code, every parameter the model code reads is declared here) reads
  :data:`MODEL_PARAMETERS` and :func:`read_by_model_code`;
- ``docs/concepts/triton-repository.md`` lists the same keys, with who reads each.

Who reads a key (``reader``):

- ``"model"``: this project's Python model code (the serving image's models, issue 19);
- ``"python_backend"``: Triton's Python backend itself, never the model code
  (``FORCE_CPU_ONLY_INPUT_TENSORS``);
- ``"tensorrtllm"``: the TensorRT-LLM backend (C++), for the ``tensorrt_llm`` model.

``always`` keys are in every rendered configuration of that model; ``sometimes`` keys only
where the spec asks for them (``token_hop_len`` when ``streamChunking.firstChunkTokens`` is
not upstream's 15; ``default_speaker`` with ``spec.speakers.default``; the LLM servers' URLs
where the LLM runs beside Triton).
"""

from __future__ import annotations

from dataclasses import dataclass

# The keys the TensorRT-LLM backend reads with no fallback: a missing one throws in the
# backend's ModelInstanceState constructor ("Cannot find parameter with name: ...",
# model_state.cc GetParameter<std::string>), Triton fails to load tensorrt_llm and
# tritonserver exits. Read in NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src/
# model_instance_state.cc: getBatchingTypeFromParams (gpt_model_type) and
# getGuidedDecodingConfigFromParams (the other three), the only GetParameter calls outside a
# try/catch (every other key has a default); the same in tensorrtllm_backend v0.19.0
# (serving-audit B1). docs/concepts/triton-repository.md has the list and its source.
TRTLLM_UNGUARDED_PARAMETERS: tuple[str, ...] = (
    "gpt_model_type",
    "tokenizer_dir",
    "xgrammar_tokenizer_info_path",
    "guided_decoding_backend",
)

MODEL_CODE = "model"
PYTHON_BACKEND = "python_backend"
TENSORRTLLM = "tensorrtllm"


@dataclass(frozen=True)
class ModelParameters:
    """The parameter keys of one model's configuration and who reads them."""

    always: tuple[str, ...]
    sometimes: tuple[str, ...] = ()
    reader: str = MODEL_CODE
    # Keys read by Triton's Python backend, not by the model code (Python models only).
    backend_keys: tuple[str, ...] = ()

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self.always) | frozenset(self.sometimes)

    def check(self, model: str, rendered: set[str] | frozenset[str]) -> None:
        """Raise when a rendered configuration strays from the declaration."""
        unknown = sorted(set(rendered) - self.keys)
        missing = sorted(set(self.always) - set(rendered))
        if unknown or missing:
            raise AssertionError(
                f"{model}: parameters {unknown} are not declared in render/model_parameters.py"
                if unknown
                else f"{model}: declared parameters {missing} were not rendered"
            )


_HOST_INPUTS = "FORCE_CPU_ONLY_INPUT_TENSORS"
_PLANS = ("engine_manifest", "plans_dir")


def _python(*always: str, sometimes: tuple[str, ...] = ()) -> ModelParameters:
    return ModelParameters(
        always=(_HOST_INPUTS, *always), sometimes=sometimes, backend_keys=(_HOST_INPUTS,)
    )


_TOKEN_HOP = "token_hop_len"
_SPEAKER = "default_speaker"
# The LLM servers' URLs and the model name they serve (CosyVoice3's trtllm-serve).
_LLM_SERVERS = ("llm_api_base", "llm_api_bases", "llm_model_name")

MODEL_PARAMETERS: dict[str, dict[str, ModelParameters]] = {
    "cosyvoice2": {
        "cosyvoice2": _python(
            "model_dir",
            "llm_tokenizer_dir",
            "dynamic_chunk_strategy",
            sometimes=(_TOKEN_HOP, _SPEAKER),
        ),
        "tensorrt_llm": ModelParameters(
            always=(
                *TRTLLM_UNGUARDED_PARAMETERS,
                "gpt_model_path",
                "gpu_device_ids",
                "max_beam_width",
                "max_attention_window_size",
                "max_tokens_in_paged_kv_cache",
                "kv_cache_free_gpu_mem_fraction",
                "exclude_input_in_output",
                "enable_kv_cache_reuse",
                "executor_worker_path",
            ),
            reader=TENSORRTLLM,
        ),
        "token2wav": _python("model_dir", *_PLANS),
        "audio_tokenizer": _python("model_dir"),
        "speaker_embedding": _python("model_dir", *_PLANS),
    },
    "cosyvoice3": {
        "cosyvoice3": _python(
            "model_dir",
            "llm_tokenizer_dir",
            "dynamic_chunk_strategy",
            *_LLM_SERVERS,
            sometimes=(_TOKEN_HOP, _SPEAKER),
        ),
        "token2wav": _python("model_dir", *_PLANS),
        "vocoder": _python("model_dir"),
        "audio_tokenizer": _python("model_dir"),
        "speaker_embedding": _python("model_dir", *_PLANS),
    },
}


def read_by_model_code(variant: str, model: str) -> frozenset[str]:
    """The keys of one model that this project's model code must read (every declared key
    but those Triton's backends read themselves); empty for ``tensorrt_llm``."""
    declared = MODEL_PARAMETERS[variant][model]
    if declared.reader != MODEL_CODE:
        return frozenset()
    return declared.keys - frozenset(declared.backend_keys)
