"""Triton's model repository and the model view, planned from the options and then assembled.

:func:`plan_repository` and :func:`plan_model_view` only read (the ConfigMap, the image's
model code, the engine's model directory) and say what would be written;
:func:`assemble_repository` and :func:`assemble_model_view` write it, into directories this
command marks as its own so that a restarted container clears its leftovers and nothing else.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosyvoice_engine_builder.layout import ENGINE_MODEL_DIR
from cosyvoice_engine_builder.request import Variant
from cosyvoice_engine_builder.serving.exit_codes import ConfigError
from cosyvoice_engine_builder.serving.gate import layout_path
from cosyvoice_engine_builder.serving.options import ServeOptions

# Marks a directory this command assembled, so a restarted container (an emptyDir
# outlives its containers) clears its own leftovers and nothing else.
REPOSITORY_MARKER = ".cosyvoice-serve"

# Upstream's Python models (runtime/triton_trtllm at ace7c47) load TensorRT plans from
# their model_dir under these names, and build them there, lazily, when absent: the
# speaker embedding as campplus.l20.fp32.trt ("l20" hard-coded), CosyVoice2's token2wav
# as flow.decoder.estimator.fp16.mygpu.plan, CosyVoice3's token2wav as
# flow.decoder.estimator.autocast_fp16.<CUDA device index>.plan. The builder prebuilt the
# same plans (same ONNX, shapes and precisions) under names carrying architecture and
# TensorRT version; the view links one to the other.
UPSTREAM_SPEAKER_PLAN = "campplus.l20.fp32.trt"
UPSTREAM_COSYVOICE2_FLOW_PLAN = "flow.decoder.estimator.fp16.mygpu.plan"
UPSTREAM_COSYVOICE3_FLOW_PLAN = "flow.decoder.estimator.autocast_fp16.{device}.plan"
_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class ModelEntry:
    name: str
    config: Path
    code: Path


def plan_repository(options: ServeOptions) -> list[ModelEntry]:
    """The models to assemble, or :class:`ConfigError` naming what is missing."""
    config_dir = options.repository_config
    if not config_dir.is_dir():
        raise ConfigError(
            f"--repository-config {config_dir} is not a directory: the repository ConfigMap "
            "is not mounted there"
        )
    # ConfigMap volumes hold each key as a link into a hidden ..data directory.
    configs = sorted(
        p for p in config_dir.iterdir() if p.suffix == ".pbtxt" and not p.name.startswith(".")
    )
    if not configs:
        raise ConfigError(
            f"no <model>.pbtxt in {config_dir}: the repository ConfigMap is empty or is "
            "not the one rendered for this service"
        )
    code_root = options.model_code / options.variant.value
    entries = []
    missing = []
    for config in configs:
        name = config.stem
        if not _MODEL_NAME_RE.match(name):
            raise ConfigError(f"{config}: {name!r} is not a usable Triton model name")
        code = code_root / name / "1"
        if not code.is_dir():
            missing.append(f"{name} (expected {code})")
        entries.append(ModelEntry(name, config, code))
    if missing:
        available = (
            sorted(p.name for p in code_root.iterdir() if (p / "1").is_dir())
            if code_root.is_dir()
            else []
        )
        raise ConfigError(
            f"the repository configuration names model(s) whose code is not in this image: "
            f"{', '.join(missing)}; the image has {options.variant.value} code for "
            f"{', '.join(available) or 'no model'}: the ConfigMap and the serving image do "
            "not belong together"
        )
    return entries


def _fresh_directory(target: Path, flag: str) -> None:
    """Empty ``target`` for assembly, if it is empty already or was assembled by serve."""
    target.mkdir(parents=True, exist_ok=True)
    marker = target / REPOSITORY_MARKER
    leftovers = [p for p in target.iterdir() if p != marker]
    if leftovers and not marker.exists():
        raise ConfigError(
            f"{flag} {target} is not empty and was not assembled by serve "
            f"(it holds {leftovers[0].name}); point it at an empty, writable directory"
        )
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    marker.write_text("assembled by cosyvoice-engine-builder serve\n", encoding="utf-8")


def assemble_repository(target: Path, entries: Sequence[ModelEntry]) -> None:
    """``target/<model>/config.pbtxt`` (copied) and ``target/<model>/1`` -> the image's code."""
    _fresh_directory(target, "--model-repository")
    for entry in entries:
        model_dir = target / entry.name
        model_dir.mkdir()
        shutil.copyfile(entry.config, model_dir / "config.pbtxt")
        (model_dir / "1").symlink_to(entry.code, target_is_directory=True)


def plan_model_view(
    options: ServeOptions, manifest: Mapping[str, Any], gpu_count: int
) -> dict[str, Path]:
    """Name in the view -> what it links to: the model directory's entries, then the plans."""
    model_dir = model_dir_of(options, manifest)
    if not model_dir.is_dir():
        raise ConfigError(f"the engine's model directory {model_dir} does not exist")
    links = {entry.name: entry for entry in sorted(model_dir.iterdir())}
    flow = layout_path(options.engine_dir, manifest, "flowEstimatorPlan", "")
    speaker = layout_path(options.engine_dir, manifest, "speakerEmbeddingPlan", "")
    for plan, what in ((flow, "flowEstimatorPlan"), (speaker, "speakerEmbeddingPlan")):
        if not plan.is_file():
            raise ConfigError(f"the manifest's layout.{what} ({plan}) is not a file")
    links[UPSTREAM_SPEAKER_PLAN] = speaker
    if options.variant is Variant.COSYVOICE2:
        links[UPSTREAM_COSYVOICE2_FLOW_PLAN] = flow
    else:
        # Named after the CUDA device the loading instance runs on: one per visible GPU.
        for device in range(max(gpu_count, 1)):
            links[UPSTREAM_COSYVOICE3_FLOW_PLAN.format(device=device)] = flow
    return links


def assemble_model_view(target: Path, links: Mapping[str, Path]) -> None:
    _fresh_directory(target, "--model-view")
    for name, source in links.items():
        (target / name).symlink_to(source, target_is_directory=source.is_dir())


def model_dir_of(options: ServeOptions, manifest: Mapping[str, Any]) -> Path:
    """The engine's model directory."""
    return layout_path(options.engine_dir, manifest, "modelDir", ENGINE_MODEL_DIR)
