"""The model directory the builder expects, and the engine directory it produces.

Expected model layout (one directory per model, whatever the source)::

    <model>/
      llm/                                   HF checkpoint of the CosyVoice LLM (Qwen2):
        config.json                            config.json, *.safetensors, tokenizer files
        ...                                    -- or the same files directly in <model>/
      flow.decoder.estimator.fp32.onnx       cosyvoice2: flow decoder estimator (fp32 export)
      flow.decoder.estimator.autocast_fp16.onnx
                                             cosyvoice3: mixed-precision estimator export
      campplus.onnx                          speaker embedding (both variants)
      ...                                    the rest of the upstream model directory
                                             (cosyvoice2.yaml / cosyvoice3.yaml, flow.pt,
                                             hift.pt, speech_tokenizer_v*.onnx, ...), copied
                                             as is for the serving pods

Upstream downloads the LLM and the rest from separate repositories; for its published
releases the builder fetches those companions into this layout itself
(:mod:`~cosyvoice_engine_builder.releases`). Any other source is expected pre-assembled
with the LLM under ``llm/``; a checkpoint at the root is accepted too, for a source that
holds the LLM next to the ONNX files.

Produced engine layout (``<cache-dir>/<key>/``)::

    manifest.json       written last; its presence and digests define "done"
    llm/                TensorRT-LLM engine dir: config.json, rank<i>.engine
    plans/              prebuilt TensorRT plans, names carry GPU arch and TensorRT version
    model/              the fetched model directory (hidden files dropped)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cosyvoice_engine_builder.request import Variant

LLM_SUBDIR = "llm"
CAMPPLUS_ONNX = "campplus.onnx"
FLOW_ESTIMATOR_ONNX: dict[Variant, str] = {
    Variant.COSYVOICE2: "flow.decoder.estimator.fp32.onnx",
    Variant.COSYVOICE3: "flow.decoder.estimator.autocast_fp16.onnx",
}

# What the serving pods' model code opens in the model directory (issue 19, item 8; serving
# audit D6): the LLM's tokenizer (the orchestrator; trtllm-serve --tokenizer), the variant's
# yaml and the flow and HiFT weights (token2wav / vocoder), and the speech tokenizer
# (audio_tokenizer). campplus.onnx and the estimator ONNX are checked above: the build turns
# them into plans. spk2info.pt is optional (SPEAKER_INFO).
TOKENIZER_FILE = "tokenizer.json"
SPEECH_TOKENIZER_ONNX: dict[Variant, str] = {
    Variant.COSYVOICE2: "speech_tokenizer_v2.onnx",
    Variant.COSYVOICE3: "speech_tokenizer_v3.onnx",
}
# Upstream's built-in speakers, for requests without reference audio: copied with the model
# directory when the release has it and recorded in the manifest (layout.speakerInfo); without
# it such a request fails on its own, with a message, and nothing fails at load.
SPEAKER_INFO = "spk2info.pt"


def serving_files(variant: Variant, llm_subpath: str) -> tuple[str, ...]:
    """The model directory's files the serving pods open, relative to it."""
    tokenizer = "/".join(p for p in (llm_subpath, TOKENIZER_FILE) if p)
    return (
        tokenizer,
        f"{variant.value}.yaml",
        "flow.pt",
        "hift.pt",
        SPEECH_TOKENIZER_ONNX[variant],
    )


ENGINE_LLM_DIR = "llm"
ENGINE_PLANS_DIR = "plans"
ENGINE_MODEL_DIR = "model"
MANIFEST_NAME = "manifest.json"


class LayoutError(Exception):
    """The fetched model lacks something the build needs; the message names it."""


@dataclass(frozen=True)
class ModelLayout:
    root: Path
    llm_dir: Path
    flow_estimator_onnx: Path
    campplus_onnx: Path

    @property
    def llm_subpath(self) -> str:
        """Where the LLM checkpoint (and so the tokenizer) sits inside the model dir."""
        rel = self.llm_dir.relative_to(self.root).as_posix()
        return "" if rel == "." else rel


def assumed_layout(root: Path, variant: Variant) -> ModelLayout:
    """The layout before the model is fetched (dry run): the documented default."""
    return ModelLayout(
        root=root,
        llm_dir=root / LLM_SUBDIR,
        flow_estimator_onnx=root / FLOW_ESTIMATOR_ONNX[variant],
        campplus_onnx=root / CAMPPLUS_ONNX,
    )


def resolve_layout(root: Path, variant: Variant) -> ModelLayout:
    """Find the LLM checkpoint and the ONNX files, or say exactly what is missing."""
    if not root.is_dir():
        raise LayoutError(f"model directory {root} does not exist")
    candidates = [root / LLM_SUBDIR, root]
    llm_dir = next((c for c in candidates if (c / "config.json").is_file()), None)
    if llm_dir is None:
        raise LayoutError(
            f"no HF LLM checkpoint in {root}: expected {root / LLM_SUBDIR / 'config.json'} "
            f"(or {root / 'config.json'}); see the expected layout in the builder's README"
        )
    try:
        json.loads((llm_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LayoutError(f"{llm_dir / 'config.json'} is not valid JSON: {exc}") from exc

    missing = [
        root / name
        for name in (FLOW_ESTIMATOR_ONNX[variant], CAMPPLUS_ONNX)
        if not (root / name).is_file()
    ]
    if missing:
        names = ", ".join(str(m) for m in missing)
        raise LayoutError(f"{variant.value} needs {names}: not found in the model directory")
    llm_rel = llm_dir.relative_to(root).as_posix()
    unserved = [
        rel
        for rel in serving_files(variant, "" if llm_rel == "." else llm_rel)
        if not (root / rel).is_file()
    ]
    if unserved:
        raise LayoutError(
            f"{variant.value}'s serving pods open {', '.join(unserved)}: not found in the model "
            f"directory {root} (an engine without them would fail at load)"
        )
    return ModelLayout(
        root=root,
        llm_dir=llm_dir,
        flow_estimator_onnx=root / FLOW_ESTIMATOR_ONNX[variant],
        campplus_onnx=root / CAMPPLUS_ONNX,
    )
