"""Upstream's published CosyVoice releases, and the companion repositories each needs.

The official model repositories hold the PyTorch LLM (``llm.pt``) and the ONNX files, but
TensorRT-LLM's Qwen converter reads a Hugging Face checkpoint, and CosyVoice3's estimator
plan is built from a mixed-precision ONNX export that lives apart. Upstream's scripts
(``runtime/triton_trtllm/run.sh`` and ``run_cosyvoice3.sh``) download those companions next
to the official model; the builder does the same for the releases below, so a service can
name the model users know (``hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512``) and get a
buildable directory. Any other source must already be assembled (LLM under ``llm/``).

The table is part of the builder image, whose tag is part of every engine key: changing it
means a new image and so new keys, never a silent change of what a key was built from.
"""

from __future__ import annotations

from dataclasses import dataclass

from cosyvoice_engine_builder.layout import LLM_SUBDIR
from cosyvoice_engine_builder.request import ModelSource, Variant, parse_model_uri


@dataclass(frozen=True)
class Companion:
    """A repository fetched beside the model: into its root ("") or a subdirectory, at the
    commit ``revision`` ("" for its default branch)."""

    uri: str
    into: str
    what: str
    revision: str = ""

    @property
    def source(self) -> ModelSource:
        return parse_model_uri(self.uri)


# Keyed by variant and the official repository's URI (hf:// only: these are published there).
# Revisions: a companion is fetched at its ``revision`` commit where the table pins one, or
# at the commit --companion-revision gives it (the operator's COSYVOICE_COMPANION_REVISIONS,
# part of the engine key), else at its default branch as upstream does. The model's own
# --revision applies to the official repository only. Whatever was asked, the commit each
# repository resolved to is in the manifest (model.resolvedRevision,
# model.companions[].resolvedRevision). The table's pins are empty: the commits could not be
# looked up where this was written (no network); pin them here, or per install.
RELEASES: dict[tuple[Variant, str], tuple[Companion, ...]] = {
    (Variant.COSYVOICE2, "hf://FunAudioLLM/CosyVoice2-0.5B"): (
        Companion(
            "hf://yuekai/cosyvoice2_llm",
            LLM_SUBDIR,
            "the CosyVoice2 LLM as a Hugging Face Qwen2 checkpoint (upstream run.sh)",
        ),
    ),
    (Variant.COSYVOICE3, "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"): (
        Companion(
            "hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF",
            LLM_SUBDIR,
            "the CosyVoice3 LLM as a Hugging Face Qwen2 checkpoint (upstream run_cosyvoice3.sh)",
        ),
        Companion(
            "hf://yuekai/Fun-CosyVoice3-0.5B-2512-FP16-ONNX",
            "",
            "flow.decoder.estimator.autocast_fp16.onnx, the mixed-precision estimator export "
            "(upstream run_cosyvoice3.sh)",
        ),
    ),
}


# Hugging Face repository names are case-insensitive.
_BY_URI = {(variant, uri.lower()): found for (variant, uri), found in RELEASES.items()}


def companions(variant: Variant, source: ModelSource) -> tuple[Companion, ...]:
    """What to fetch beside ``source`` for a known release; () for anything else."""
    return _BY_URI.get((variant, source.uri.lower()), ())


def pinned_revision(companion: Companion, overrides: tuple[tuple[str, str], ...]) -> str:
    """The commit to fetch ``companion`` at: the request's pin, the table's, or ""."""
    return dict(overrides).get(companion.uri.lower(), companion.revision)


def known_releases(variant: Variant) -> list[str]:
    return sorted(uri for v, uri in RELEASES if v is variant)
