"""Every model-config parameter this code reads, per model (the renderer's side of the contract).

``tests/serving_models/test_contract.py`` checks both ways against what the operator renders:
each key rendered for a model is in its set here, and each key here is rendered (the optional
ones may be absent: they have upstream's default). ``FORCE_CPU_ONLY_INPUT_TENSORS`` is read by
the Python backend itself, not by model code.
"""

from __future__ import annotations

BACKEND_KEYS = frozenset({"FORCE_CPU_ONLY_INPUT_TENSORS"})

# model -> (always rendered, rendered only when not upstream's default)
READS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "cosyvoice2": (
        frozenset({"model_dir", "llm_tokenizer_dir", "dynamic_chunk_strategy"}),
        frozenset({"token_hop_len", "default_speaker"}),
    ),
    "token2wav": (
        frozenset({"model_dir", "engine_manifest", "plans_dir"}),
        frozenset(),
    ),
    "cosyvoice3": (
        frozenset(
            {
                "model_dir",
                "llm_tokenizer_dir",
                "dynamic_chunk_strategy",
                "llm_api_base",
                "llm_api_bases",
                "llm_model_name",
            }
        ),
        frozenset({"token_hop_len", "default_speaker"}),
    ),
    "vocoder": (frozenset({"model_dir"}), frozenset()),
    "audio_tokenizer": (frozenset({"model_dir"}), frozenset()),
    "speaker_embedding": (
        frozenset({"model_dir", "engine_manifest", "plans_dir"}),
        frozenset(),
    ),
}

# The variants each model of models/ serves (token2wav: CosyVoice2's flow + HiFT or
# CosyVoice3's flow, by the release's yaml; the rendered parameters are the same).
VARIANTS_OF: dict[str, tuple[str, ...]] = {
    "cosyvoice2": ("cosyvoice2",),
    "token2wav": ("cosyvoice2", "cosyvoice3"),
    "vocoder": ("cosyvoice3",),
    "cosyvoice3": ("cosyvoice3",),
    "audio_tokenizer": ("cosyvoice2", "cosyvoice3"),
    "speaker_embedding": ("cosyvoice2", "cosyvoice3"),
}


def parameter(params: dict[str, dict[str, str]], model: str, key: str, default: str = "") -> str:
    """The string value of ``key`` from a Triton model config's ``parameters``; refuses a key
    this module does not declare for ``model`` (so a read cannot slip past the contract)."""
    required, optional = READS[model]
    if key not in required | optional:
        raise KeyError(f"{model} reads undeclared parameter {key!r}: add it to contract.READS")
    entry = params.get(key)
    if entry is None:
        if key in required:
            raise ValueError(f"{model}: parameter {key!r} is missing from config.pbtxt")
        return default
    return entry["string_value"]
