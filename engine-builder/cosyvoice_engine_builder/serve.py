"""``cosyvoice-engine-builder serve``: the serving container's entry point.

It runs in the serving image, beside the same TensorRT and the same manifest code that
built the engine, and does four things in order:

1. **Compatibility gate.** Reads ``<engine-dir>/manifest.json`` and compares it with what
   this pod runs on: the key the operator expects, the variant, the architecture of every
   visible GPU, this image's TensorRT and TensorRT-LLM versions, the tensor-parallel size
   against the LLM GPU groups, and that every file the manifest lists is there with its
   recorded size (full digests are ``verify``'s job: hashing gigabytes at every start
   would delay every scale-up). Upstream CosyVoice has no such check; a plan loaded
   under another TensorRT or on another architecture gives serialisation errors or,
   worse, silent audio (upstream issues #1831, #954, #1686). Any mismatch is one message
   naming both sides and what to do, on stderr and in the termination message.
2. **Model repository.** Triton's repository is assembled in a writable directory: each
   ``<model>.pbtxt`` of the operator's ConfigMap becomes ``<model>/config.pbtxt``, and
   ``<model>/1`` links to upstream's Python model code baked into the image. Beside it,
   the **model view**: the engine's ``model/`` directory as upstream's models expect
   their ``model_dir``, with the engine's prebuilt plans under the names that code loads
   (it would otherwise build them again, into a read-only volume).
3. **LLM servers (cosyvoice3, or either variant on vLLM).** One ``trtllm-serve`` per GPU
   group, as upstream's ``run_cosyvoice3.sh`` starts it, or with ``--llm-runtime vllm`` one
   ``vllm serve`` per group on the fetched checkpoint (``--checkpoint-dir``), each on its own
   port; Triton starts only once every one answers ``/health``, so the orchestrator never
   sees a refused connection. With vLLM the engine directory holds only the TensorRT plans:
   the model directory (and the LLM's Hugging Face checkpoint) comes from the checkpoint,
   whose manifest is checked the same way, and the TensorRT-LLM version is not compared.
4. **Triton.** ``tritonserver`` runs as a child. SIGTERM and SIGINT go to Triton first,
   which drains in-flight streams for ``--exit-timeout-seconds``; the LLM servers those
   streams still need are stopped only after Triton has exited.

Exit codes:

- 0..255  tritonserver's own exit code, once it has started
- 1  a server could not be started, or an LLM server did not answer ``/health`` in time
- 2  invalid command line, or a repository configuration the image cannot serve (no
     ``*.pbtxt``, a model whose code is not in the image)
- 3  the engine is missing, incomplete, or was not built for this pod (the gate)
- N  a ``trtllm-serve``'s exit code when it exits first (1 if it exited with 0)
- 128+N  stopped by signal N before Triton started (143 for SIGTERM)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import FrameType
from typing import IO, Any

from cosyvoice_engine_builder import termination
from cosyvoice_engine_builder.commands import ToolPaths
from cosyvoice_engine_builder.layout import (
    ENGINE_LLM_DIR,
    ENGINE_MODEL_DIR,
    LLM_SUBDIR,
    MANIFEST_NAME,
)
from cosyvoice_engine_builder.manifest import SCHEMA_VERSION
from cosyvoice_engine_builder.progress import Console
from cosyvoice_engine_builder.redaction import without_secrets
from cosyvoice_engine_builder.request import InvalidRequest, Variant, validate_key
from cosyvoice_engine_builder.runner import Command, CommandFailed, Runner
from cosyvoice_engine_builder.toolchain import ToolchainError, find_executable, probe_versions

EXIT_SERVER_FAILED = 1
EXIT_CONFIG = 2
EXIT_INCOMPATIBLE = 3

DEFAULT_MODEL_CODE = Path("/opt/cosyvoice/models")
DEFAULT_MODEL_REPOSITORY = Path("/tmp/model_repository")
DEFAULT_MODEL_VIEW = Path("/tmp/model_view")
# Upstream's run_cosyvoice3.sh gives the LLM 40% of the free GPU memory for its KV cache;
# the rest is for the token2wav, vocoder and tokenizer models sharing the GPU.
DEFAULT_KV_CACHE_FRACTION = 0.4
DEFAULT_LLM_STARTUP_SECONDS = 600.0
# Triton's own default for --exit-timeout-secs.
DEFAULT_EXIT_TIMEOUT_SECONDS = 30

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
_GPU_INDEX_RE = re.compile(r"^[0-9]{1,3}$")

_HEALTH_POLL_SECONDS = 1.0
_PROGRESS_EVERY_SECONDS = 10.0
_LLM_STOP_GRACE_SECONDS = 15.0
# Beyond Triton's own exit timeout, before a Triton that ignores it is killed (only when
# serve itself stops Triton; after a forwarded signal the kubelet's grace period rules).
_TRITON_STOP_MARGIN_SECONDS = 15.0
_TAIL_LINES = 40
_MESSAGE_FILES_LISTED = 5


class ConfigError(Exception):
    """The repository configuration cannot be served by this image; exit 2."""


class ServerFailed(Exception):
    """A child server failed to start or to become healthy; carries the exit code."""

    def __init__(self, message: str, code: int, tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.tail = tuple(tail)


# --------------------------------------------------------------------------- arguments


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text}: not a TCP port")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be >= 0")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: must be > 0")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be between 0 and 1")
    return value


def parse_llm_groups(text: str) -> tuple[tuple[str, ...], ...]:
    """``"0,1;2,3"`` -> ``(("0", "1"), ("2", "3"))``: one group of GPU indices per LLM."""
    groups: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for raw in text.split(";"):
        group = tuple(part.strip() for part in raw.split(","))
        if not all(_GPU_INDEX_RE.match(index) for index in group):
            raise argparse.ArgumentTypeError(
                f"{text!r}: expected GPU indices, comma-separated within a group and "
                "';' between groups, e.g. '0,1;2,3'"
            )
        repeated = sorted(seen.intersection(group)) or sorted(
            i for i, n in Counter(group).items() if n > 1
        )
        if repeated:
            raise argparse.ArgumentTypeError(
                f"{text!r}: GPU {', '.join(repeated)} is in more than one place"
            )
        seen.update(group)
        groups.append(group)
    return tuple(groups)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine-dir", required=True, type=Path, help="the engine of one key, e.g. /engines/KEY"
    )
    parser.add_argument("--key", required=True, help="the engine key the operator expects there")
    parser.add_argument("--variant", required=True, choices=[v.value for v in Variant])
    parser.add_argument(
        "--repository-config",
        required=True,
        type=Path,
        help="directory of <model>.pbtxt files (each one model's config.pbtxt)",
    )
    parser.add_argument(
        "--model-code",
        type=Path,
        default=DEFAULT_MODEL_CODE,
        help="upstream's model code in the image: DIR/<variant>/<model>/1/model.py",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=DEFAULT_MODEL_REPOSITORY,
        help="writable directory where Triton's model repository is assembled",
    )
    parser.add_argument(
        "--model-view",
        type=Path,
        default=DEFAULT_MODEL_VIEW,
        help="writable directory presenting the engine's model directory, with its prebuilt "
        "plans under upstream's names; the models' model_dir parameter points here",
    )
    parser.add_argument("--http-port", type=_port, default=8000)
    parser.add_argument("--grpc-port", type=_port, default=8001)
    parser.add_argument("--metrics-port", type=_port, default=8002)
    parser.add_argument(
        "--llm-groups",
        type=parse_llm_groups,
        default=None,
        help="cosyvoice3: GPU groups, one trtllm-serve each, e.g. '0,1;2,3' "
        "(default: the first tensor-parallel-size GPUs)",
    )
    parser.add_argument(
        "--llm-base-port", type=_port, default=8010, help="trtllm-serve i listens on base+i"
    )
    parser.add_argument(
        "--llm-kv-cache-free-gpu-memory-fraction",
        type=_fraction,
        default=DEFAULT_KV_CACHE_FRACTION,
        help="trtllm-serve's --kv_cache_free_gpu_memory_fraction (upstream: 0.4)",
    )
    parser.add_argument(
        "--llm-startup-timeout-seconds",
        type=_positive_seconds,
        default=DEFAULT_LLM_STARTUP_SECONDS,
        help="how long every trtllm-serve may take to answer /health",
    )
    parser.add_argument(
        "--llm-runtime",
        choices=["tensorrt-llm", "vllm"],
        default="tensorrt-llm",
        help="vllm: run `vllm serve` per GPU group on --checkpoint-dir's LLM checkpoint",
    )
    parser.add_argument(
        "--checkpoint-dir", type=Path, default=None, help="vllm: the fetched checkpoint"
    )
    parser.add_argument("--checkpoint-key", default="", help="vllm: the checkpoint's key")
    parser.add_argument("--llm-dtype", default="bfloat16", help="vllm serve --dtype")
    parser.add_argument(
        "--llm-kv-cache-dtype", default="auto", help="vllm serve --kv-cache-dtype (auto, fp8)"
    )
    parser.add_argument(
        "--llm-max-batch-size", type=int, default=16, help="vllm serve --max-num-seqs"
    )
    parser.add_argument(
        "--llm-max-num-tokens",
        type=int,
        default=32768,
        help="vllm serve --max-num-batched-tokens",
    )
    parser.add_argument(
        "--llm-gpu-memory-utilization",
        type=_fraction,
        default=0.4,
        help="vllm serve --gpu-memory-utilization (the GPU is shared with token2wav)",
    )
    parser.add_argument(
        "--llm-served-model-name",
        default="cosyvoice-llm",
        help="vllm serve --served-model-name: the model name the orchestrator asks for",
    )
    parser.add_argument(
        "--exit-timeout-seconds",
        type=_non_negative_int,
        default=DEFAULT_EXIT_TIMEOUT_SECONDS,
        help="tritonserver --exit-timeout-secs: how long in-flight requests may finish",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the checks and the commands; start nothing"
    )


@dataclass(frozen=True)
class ServeOptions:
    engine_dir: Path
    key: str
    variant: Variant
    repository_config: Path
    model_code: Path
    model_repository: Path
    model_view: Path
    http_port: int
    grpc_port: int
    metrics_port: int
    llm_groups: tuple[tuple[str, ...], ...] | None
    llm_base_port: int
    kv_cache_fraction: float
    llm_startup_timeout: float
    exit_timeout_seconds: int
    dry_run: bool
    llm_runtime: str = "tensorrt-llm"
    checkpoint_dir: Path | None = None
    checkpoint_key: str = ""
    llm_dtype: str = "bfloat16"
    llm_kv_cache_dtype: str = "auto"
    llm_max_batch_size: int = 16
    llm_max_num_tokens: int = 32768
    llm_gpu_memory_utilization: float = 0.4
    llm_served_model_name: str = "cosyvoice-llm"

    @property
    def vllm(self) -> bool:
        return self.llm_runtime == "vllm"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        try:
            key = validate_key(args.key)
        except InvalidRequest as exc:
            raise ConfigError(str(exc)) from exc
        options = cls(
            engine_dir=args.engine_dir,
            key=key,
            variant=Variant(args.variant),
            repository_config=args.repository_config,
            model_code=args.model_code,
            model_repository=args.model_repository,
            model_view=args.model_view,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            llm_groups=args.llm_groups,
            llm_base_port=args.llm_base_port,
            kv_cache_fraction=args.llm_kv_cache_free_gpu_memory_fraction,
            llm_startup_timeout=args.llm_startup_timeout_seconds,
            exit_timeout_seconds=args.exit_timeout_seconds,
            dry_run=args.dry_run,
            llm_runtime=args.llm_runtime,
            checkpoint_dir=args.checkpoint_dir,
            checkpoint_key=args.checkpoint_key,
            llm_dtype=args.llm_dtype,
            llm_kv_cache_dtype=args.llm_kv_cache_dtype,
            llm_max_batch_size=args.llm_max_batch_size,
            llm_max_num_tokens=args.llm_max_num_tokens,
            llm_gpu_memory_utilization=args.llm_gpu_memory_utilization,
            llm_served_model_name=args.llm_served_model_name,
        )
        if options.vllm:
            if options.checkpoint_dir is None or not options.checkpoint_key:
                raise ConfigError("--llm-runtime vllm needs --checkpoint-dir and --checkpoint-key")
            try:
                validate_key(options.checkpoint_key)
            except InvalidRequest as exc:
                raise ConfigError(str(exc)) from exc
        options.check_ports()
        return options

    @property
    def serves_llm(self) -> bool:
        """cosyvoice3 runs its LLM beside Triton, and so does vLLM; cosyvoice2 on TensorRT-LLM
        has it in a Triton backend."""
        return self.variant is Variant.COSYVOICE3 or self.vllm

    def check_ports(self) -> None:
        triton = {
            "--http-port": self.http_port,
            "--grpc-port": self.grpc_port,
            "--metrics-port": self.metrics_port,
        }
        if len(set(triton.values())) < len(triton):
            raise ConfigError(f"Triton's ports must differ: {triton}")
        if self.serves_llm:
            llm = {self.llm_base_port + i for i in range(len(self.llm_groups or ((),)))}
            if max(llm) > 65535:
                raise ConfigError(f"--llm-base-port {self.llm_base_port}: ports run past 65535")
            clash = sorted(llm.intersection(triton.values()))
            if clash:
                raise ConfigError(
                    f"trtllm-serve ports {sorted(llm)} (--llm-base-port + group index) "
                    f"collide with Triton's port {clash[0]}"
                )


# ------------------------------------------------------------------- the pod, observed


@dataclass(frozen=True)
class Gpu:
    arch: str
    name: str


@dataclass(frozen=True)
class PodFacts:
    """What this pod runs on; ``None`` where it could not be found out (and why)."""

    gpus: tuple[Gpu, ...]
    gpu_note: str
    tensorrt: str | None
    tensorrt_llm: str | None
    version_note: str = ""

    def describe_gpus(self) -> str:
        if not self.gpus:
            return f"no visible GPU ({self.gpu_note})"
        counts = Counter(self.gpus)
        parts = []
        for gpu in dict.fromkeys(self.gpus):
            n = counts[gpu]
            parts.append(f"{gpu.arch} ({n}x {gpu.name})" if n > 1 else f"{gpu.arch} ({gpu.name})")
        return ", ".join(parts)


def _arch_of(compute_cap: str) -> str | None:
    major, dot, minor = compute_cap.strip().partition(".")
    if dot and major.isdigit() and minor.isdigit():
        return f"sm_{major}{minor}"
    return None


def query_gpus(runner: Runner, environ: Mapping[str, str]) -> tuple[tuple[Gpu, ...], str]:
    """The visible GPUs from ``nvidia-smi``; none, with the reason, if it cannot tell."""
    smi = environ.get("NVIDIA_SMI") or "nvidia-smi"
    if find_executable(smi, environ) is None:
        return (), f"{smi} not found in the image or on the PATH"
    command = Command(
        (smi, "--query-gpu=compute_cap,name", "--format=csv,noheader"),
        env=without_secrets(environ),
        timeout=60,
    )
    try:
        result = runner.run(command, echo_output=False)
    except CommandFailed as exc:
        detail = " ".join(exc.tail()[-3:])
        return (), f"{smi} failed: {exc}{': ' + detail if detail else ''}"
    gpus = []
    for line in result.stdout_tail:
        cap, _, name = line.partition(",")
        arch = _arch_of(cap)
        if arch is not None:
            gpus.append(Gpu(arch, name.strip() or "unknown GPU"))
    if not gpus:
        return (), f"{smi} listed no GPU"
    return tuple(gpus), ""


def observe_pod(runner: Runner, environ: Mapping[str, str]) -> PodFacts:
    """GPUs and versions, found out exactly as the builder found them out."""
    gpus, gpu_note = query_gpus(runner, environ)
    python = ToolPaths.from_environ(environ).python
    try:
        versions = probe_versions(runner, python, environ, without_secrets(environ))
    except ToolchainError as exc:
        return PodFacts(gpus, gpu_note, None, None, version_note=str(exc))
    return PodFacts(gpus, gpu_note, versions.tensorrt, versions.tensorrt_llm)


# ------------------------------------------------------------------ the gate, pure part


@dataclass(frozen=True)
class Mismatch:
    field: str
    detail: str
    remedy: str


@dataclass
class GateResult:
    ok: bool
    reason: str  # EngineMissing | EngineIncompatible | "" when ok
    message: str
    mismatches: list[Mismatch] = field(default_factory=list)
    manifest: dict[str, Any] | None = None


class _ManifestUnusable(Exception):
    def __init__(self, message: str, reason: str = "EngineMissing") -> None:
        super().__init__(message)
        self.reason = reason


def read_manifest(engine_dir: Path, key: str) -> dict[str, Any]:
    """The manifest, or :class:`_ManifestUnusable` with the whole explanation."""
    manifest_path = engine_dir / MANIFEST_NAME
    waiting = (
        "the operator starts serving pods only for engines that are Ready, so this pod is "
        "either older than a rebuild or mounts the wrong place: see the engine's state in "
        "`kubectl get cvs NAME -o yaml` (status.engines)"
    )
    if not engine_dir.is_dir():
        raise _ManifestUnusable(
            f"engine {key}: {engine_dir} does not exist: the engine cache is not mounted "
            f"there, or the engine was never built in it or has been removed; {waiting}"
        )
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _ManifestUnusable(
            f"engine {key}: {manifest_path} is missing: the engine's build never completed "
            f"in this cache (or it is being removed); {waiting}"
        ) from None
    except (OSError, ValueError) as exc:
        raise _ManifestUnusable(
            f"engine {key}: {manifest_path} is unreadable ({exc}); `cosyvoice-engine-builder "
            f"verify` says what is wrong, and deleting the engine's Jobs and record "
            f"(`kubectl delete jobs,configmaps -l tts.cosyvoice.dev/engine-key={key}`) "
            "makes the operator build it again",
            "EngineInvalid",
        ) from exc
    if not isinstance(data, dict) or data.get("schemaVersion") != SCHEMA_VERSION:
        found = data.get("schemaVersion") if isinstance(data, dict) else type(data).__name__
        raise _ManifestUnusable(
            f"engine {key}: {manifest_path} has schemaVersion {found!r}; this image reads "
            f"{SCHEMA_VERSION}: serve with the image that matches the builder which wrote it",
            "EngineIncompatible",
        )
    return data


def _member(rel: object) -> str | None:
    if not isinstance(rel, str) or not rel:
        return None
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        return None
    return rel


def check_file_sizes(engine_dir: Path, manifest: Mapping[str, Any]) -> list[str]:
    """Every listed file present with its recorded size (no hashing: that is ``verify``)."""
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return ["the manifest lists no files"]
    problems = []
    for entry in files:
        rel = _member(entry.get("path")) if isinstance(entry, dict) else None
        if rel is None or not isinstance(entry, dict):
            problems.append(f"invalid entry {entry!r}")
            continue
        path = engine_dir / rel
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError:
            size = None
        if size is None:
            problems.append(f"{rel} (missing)")
        elif size != entry.get("size"):
            problems.append(f"{rel} (size {size}, built as {entry.get('size')})")
    return problems


def _norm_arch(arch: str) -> str:
    # sm_90a and sm_90 are the same silicon; the suffix is a compilation target.
    return arch.rstrip("abcdefghijklmnopqrstuvwxyz")


def effective_llm_groups(
    options: ServeOptions, manifest: Mapping[str, Any]
) -> tuple[tuple[str, ...], ...] | None:
    """The GPU groups of the LLM servers; by default one, on the first tp GPUs."""
    if not options.serves_llm:
        return None
    if options.llm_groups is not None:
        return options.llm_groups
    tp = manifest.get("tensorParallelSize")
    size = tp if isinstance(tp, int) and tp > 0 else 1
    return (tuple(str(i) for i in range(size)),)


def compare(
    manifest: Mapping[str, Any],
    *,
    engine_dir: Path,
    key: str,
    variant: Variant,
    facts: PodFacts,
    llm_groups: tuple[tuple[str, ...], ...] | None,
    file_problems: Sequence[str],
    vllm: bool = False,
) -> list[Mismatch]:
    """Everything about this pod that keeps the engine from loading correctly in it."""
    found: list[Mismatch] = []
    built_key = manifest.get("key")
    if built_key != key:
        found.append(
            Mismatch(
                "key",
                f"{engine_dir} holds engine {built_key!r}, not {key!r}",
                "the Deployment mounts the wrong directory of the engine cache, or the cache "
                "entry was replaced; the pod's spec and the engine record disagree",
            )
        )
    built_variant = manifest.get("variant")
    if built_variant != variant.value:
        found.append(
            Mismatch(
                "variant",
                f"the engine is a {built_variant} engine, this pod serves {variant.value}",
                "the pod's --variant and its engine key come from different services",
            )
        )

    built_arch = str(manifest.get("gpuArch"))
    if not facts.gpus:
        found.append(
            Mismatch(
                "gpuArch",
                f"no GPU is visible to this pod ({facts.gpu_note})",
                f"the pod must request nvidia.com/gpu and run on a node with {built_arch} GPUs",
            )
        )
    else:
        wrong = sorted({g.arch for g in facts.gpus if _norm_arch(g.arch) != _norm_arch(built_arch)})
        if wrong:
            found.append(
                Mismatch(
                    "gpuArch",
                    f"GPU architecture {', '.join(wrong)} is not {built_arch}",
                    f"schedule this pod only on {built_arch} nodes (the operator runs one "
                    f"Deployment per architecture, pinned to its GPU products), or let the "
                    f"operator build an engine for {', '.join(wrong)}",
                )
            )

    versions = manifest.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    checked = [("TensorRT", "tensorrt", facts.tensorrt)]
    if not vllm:  # vLLM's pods load TensorRT plans, no TensorRT-LLM engine
        checked.append(("TensorRT-LLM", "tensorrtLlm", facts.tensorrt_llm))
    for name, field_name, have in checked:
        built = versions.get(field_name)
        if have is None:
            found.append(
                Mismatch(
                    field_name,
                    f"this image's {name} version cannot be determined ({facts.version_note})",
                    "the serving image must be built on the builder image's base, where "
                    "`python3 -c 'import tensorrt'` works",
                )
            )
        elif built != have:
            found.append(
                Mismatch(
                    field_name,
                    f"{name} {built} built it, this image has {name} {have}",
                    "an engine loads only under the TensorRT that built it: serve it with "
                    f"the serving image built on the same base as the builder image that "
                    f"built it ({name} {built}), or rebuild the engine with a builder image "
                    f"of {name} {have} (spec.engine.builderImage; it is part of the key)",
                )
            )

    if variant is Variant.COSYVOICE3 or vllm:
        # vLLM's tensor parallelism is the groups' size itself: nothing built to match.
        tp = None if vllm else manifest.get("tensorParallelSize")
        groups = llm_groups
        if isinstance(tp, int) and groups is not None:
            sizes = sorted({len(g) for g in groups})
            if sizes != [tp]:
                found.append(
                    Mismatch(
                        "llmGroups",
                        f"the LLM GPU groups have {', '.join(map(str, sizes))} GPU(s); the "
                        f"engine was built for tensor-parallel size {tp}",
                        f"each --llm-groups group must hold exactly {tp} GPU(s)",
                    )
                )
        if groups is not None and facts.gpus:
            absent = sorted({i for g in groups for i in g if int(i) >= len(facts.gpus)}, key=int)
            if absent:
                found.append(
                    Mismatch(
                        "llmGroups",
                        f"--llm-groups names GPU {', '.join(absent)}; this pod sees "
                        f"{len(facts.gpus)} GPU(s)",
                        "request as many GPUs as the groups use",
                    )
                )

    if file_problems:
        listed = ", ".join(file_problems[:_MESSAGE_FILES_LISTED])
        more = len(file_problems) - _MESSAGE_FILES_LISTED
        found.append(
            Mismatch(
                "files",
                f"{len(file_problems)} file(s) missing or changed since the build: {listed}"
                + (f" and {more} more" if more > 0 else ""),
                f"`cosyvoice-engine-builder verify --cache-dir {engine_dir.parent} --key "
                f"{key}` lists every problem; `kubectl delete jobs,configmaps -l "
                f"tts.cosyvoice.dev/engine-key={key}` makes the operator build it again",
            )
        )
    return found


def gate_message(
    key: str, manifest: Mapping[str, Any], facts: PodFacts, mismatches: Sequence[Mismatch]
) -> str:
    """One message: the engine's side, the pod's side, what differs, what to do."""
    versions = manifest.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    # The engine's own key: when the wrong directory is mounted, that is the one described.
    built = (
        f"engine {manifest.get('key') or key} was built for {manifest.get('gpuArch')} "
        f"with TensorRT {versions.get('tensorrt')} and TensorRT-LLM "
        f"{versions.get('tensorrtLlm')}"
    )
    pod = (
        f"this pod has {facts.describe_gpus()}, TensorRT {facts.tensorrt or 'unknown'} and "
        f"TensorRT-LLM {facts.tensorrt_llm or 'unknown'}"
    )
    details = "; ".join(m.detail for m in mismatches)
    remedies = " ".join(
        f"{remedy[0].upper()}{remedy[1:]}."
        for remedy in dict.fromkeys(m.remedy for m in mismatches)
    )
    return f"{built}; {pod}: {details}. {remedies}"


def run_gate(
    options: ServeOptions, observe: Callable[[], PodFacts]
) -> tuple[GateResult, PodFacts | None]:
    try:
        manifest = read_manifest(options.engine_dir, options.key)
    except _ManifestUnusable as exc:
        return GateResult(False, exc.reason, str(exc)), None
    facts = observe()
    mismatches = compare(
        manifest,
        engine_dir=options.engine_dir,
        key=options.key,
        variant=options.variant,
        facts=facts,
        llm_groups=effective_llm_groups(options, manifest),
        file_problems=check_file_sizes(options.engine_dir, manifest),
        vllm=options.vllm,
    )
    if options.vllm and options.checkpoint_dir is not None:
        try:
            checkpoint = read_manifest(options.checkpoint_dir, options.checkpoint_key)
        except _ManifestUnusable as exc:
            return GateResult(False, exc.reason, f"checkpoint: {exc}"), facts
        problems = check_file_sizes(options.checkpoint_dir, checkpoint)
        if problems:
            mismatches.append(
                Mismatch(
                    "files",
                    f"{len(problems)} file(s) of checkpoint {options.checkpoint_key} missing or "
                    f"changed since the fetch: {', '.join(problems[:_MESSAGE_FILES_LISTED])}",
                    f"`kubectl delete jobs,configmaps -l tts.cosyvoice.dev/engine-key="
                    f"{options.checkpoint_key}` makes the operator fetch it again",
                )
            )
        # The model view and the LLM servers read the checkpoint's layout.
        manifest = {**manifest, "checkpointLayout": checkpoint.get("layout") or {}}
    if mismatches:
        message = gate_message(options.key, manifest, facts, mismatches)
        return GateResult(False, "EngineIncompatible", message, mismatches, manifest), facts
    return GateResult(True, "", "", [], manifest), facts


# ------------------------------------------------------------------ the model repository


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
    model_dir = _model_dir(options, manifest)
    if not model_dir.is_dir():
        raise ConfigError(f"the engine's model directory {model_dir} does not exist")
    links = {entry.name: entry for entry in sorted(model_dir.iterdir())}
    flow = _layout_path(options.engine_dir, manifest, "flowEstimatorPlan", "")
    speaker = _layout_path(options.engine_dir, manifest, "speakerEmbeddingPlan", "")
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


# ----------------------------------------------------------------------------- commands


def _model_dir(options: ServeOptions, manifest: Mapping[str, Any]) -> Path:
    """The engine's model directory, or with vLLM the checkpoint's."""
    if options.vllm and options.checkpoint_dir is not None:
        layout = {"layout": manifest.get("checkpointLayout") or {}}
        return _layout_path(options.checkpoint_dir, layout, "modelDir", ENGINE_MODEL_DIR)
    return _layout_path(options.engine_dir, manifest, "modelDir", ENGINE_MODEL_DIR)


def vllm_serve_argv(
    options: ServeOptions,
    manifest: Mapping[str, Any],
    port: int,
    tensor_parallel_size: int,
    environ: Mapping[str, str],
) -> tuple[str, ...]:
    """One vLLM OpenAI server on the checkpoint's LLM (its Hugging Face directory)."""
    assert options.checkpoint_dir is not None
    layout = {"layout": manifest.get("checkpointLayout") or {}}
    llm = _layout_path(
        options.checkpoint_dir, layout, "tokenizerDir", f"{ENGINE_MODEL_DIR}/{LLM_SUBDIR}"
    )
    argv = [
        environ.get("VLLM") or "vllm",
        "serve",
        str(llm),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        options.llm_served_model_name,
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--dtype",
        options.llm_dtype,
        "--max-num-seqs",
        str(options.llm_max_batch_size),
        "--max-num-batched-tokens",
        str(options.llm_max_num_tokens),
        "--gpu-memory-utilization",
        f"{options.llm_gpu_memory_utilization:g}",
    ]
    if options.llm_kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", options.llm_kv_cache_dtype]
    return tuple(argv)


def _layout_path(
    engine_dir: Path, manifest: Mapping[str, Any], field_name: str, default: str
) -> Path:
    layout = manifest.get("layout")
    value = layout.get(field_name) if isinstance(layout, dict) else None
    return engine_dir / (_member(value) or default)


def trtllm_serve_argv(
    options: ServeOptions,
    manifest: Mapping[str, Any],
    port: int,
    environ: Mapping[str, str],
) -> tuple[str, ...]:
    """One LLM server as upstream's run_cosyvoice3.sh starts it, on the engine's paths."""
    engine = _layout_path(options.engine_dir, manifest, "llmEngineDir", ENGINE_LLM_DIR)
    tokenizer = _layout_path(
        options.engine_dir, manifest, "tokenizerDir", f"{ENGINE_MODEL_DIR}/{LLM_SUBDIR}"
    )
    tp = manifest.get("tensorParallelSize", 1)
    argv: list[str] = []
    # Upstream runs it under `mpirun -np 1`: TensorRT-LLM's executor then spawns its
    # tensor-parallel workers inside that MPI job. MPIRUN="" runs it directly.
    mpirun = environ.get("MPIRUN", "mpirun")
    if mpirun and find_executable(mpirun, environ) is not None:
        argv += [mpirun, "-np", "1", "--allow-run-as-root", "--oversubscribe"]
    argv += [
        environ.get("TRTLLM_SERVE") or "trtllm-serve",
        "serve",
        str(engine),
        "--tokenizer",
        str(tokenizer),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max_batch_size",
        str(manifest.get("maxBatchSize")),
        "--tp_size",
        str(tp),
        "--kv_cache_free_gpu_memory_fraction",
        str(options.kv_cache_fraction),
    ]
    return tuple(argv)


def tritonserver_argv(options: ServeOptions, environ: Mapping[str, str]) -> tuple[str, ...]:
    return (
        environ.get("TRITONSERVER") or "tritonserver",
        f"--model-repository={options.model_repository}",
        f"--http-port={options.http_port}",
        f"--grpc-port={options.grpc_port}",
        f"--metrics-port={options.metrics_port}",
        "--allow-metrics=true",
        # Queue and compute latency summaries (quantiles) next to the counters: the
        # autoscaler reads queue time, and averages hide the tail that users hear.
        "--metrics-config=summary_latencies=true",
        f"--exit-timeout-secs={options.exit_timeout_seconds}",
    )


@dataclass(frozen=True)
class LlmServer:
    index: int
    gpus: tuple[str, ...]
    port: int
    argv: tuple[str, ...]
    program: str = "trtllm-serve"

    @property
    def name(self) -> str:
        return f"llm{self.index}"

    def describe(self) -> str:
        return f"{self.program} {self.name} (GPUs {','.join(self.gpus)}, port {self.port})"


def plan_llm_servers(
    options: ServeOptions, manifest: Mapping[str, Any], environ: Mapping[str, str]
) -> list[LlmServer]:
    servers = []
    for index, gpus in enumerate(effective_llm_groups(options, manifest) or ()):
        port = options.llm_base_port + index
        argv = (
            vllm_serve_argv(options, manifest, port, len(gpus), environ)
            if options.vllm
            else trtllm_serve_argv(options, manifest, port, environ)
        )
        program = "vllm serve" if options.vllm else "trtllm-serve"
        servers.append(LlmServer(index, gpus, port, argv, program))
    return servers


# ------------------------------------------------------------------------- supervision


def exit_code_of(returncode: int) -> int:
    """A child's status as a shell would report it: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def reap_orphans(known: set[int]) -> list[int]:
    """Collect exited processes that are not our own children (PID 1's duty).

    As the container's PID 1 this process inherits every orphan (an MPI daemon whose
    parent died, a Python backend stub's helpers). ``waitid(WNOWAIT)`` peeks without
    reaping, so the children that ``subprocess`` tracks keep their exit status.
    """
    reaped: list[int] = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid in known:
            return reaped
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
        reaped.append(info.si_pid)


@dataclass
class _Child:
    name: str
    process: subprocess.Popen[str]
    tail: deque[str]

    def poll(self) -> int | None:
        return self.process.poll()

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


class Supervisor:
    """Starts the servers, forwards signals, and decides the exit code."""

    def __init__(self, options: ServeOptions, console: Console, report: Callable[..., None]):
        self.options = options
        self.console = console
        self.report = report
        self.llms: list[tuple[LlmServer, _Child]] = []
        self.triton: _Child | None = None
        self.received: int | None = None
        # Once Triton is being started, signals are Triton's alone: the LLM servers must
        # outlive its drain.
        self.triton_phase = False
        self._lock = threading.Lock()

    # Signals: recorded and forwarded from the handler, acted upon by the main loop.
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if self.triton_phase:
            # Triton drains in-flight streams, which still need the LLM servers. A signal
            # that arrives while Triton is being started is passed on once it runs.
            if self.triton is not None:
                self.triton.signal(signum)
        else:
            for _, child in self.llms:
                child.signal(signum)

    def _start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], *, piped: bool
    ) -> _Child:
        tail: deque[str] = deque(maxlen=_TAIL_LINES)
        try:
            process = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if piped else None,
                stderr=subprocess.STDOUT if piped else None,
                text=True,
                errors="replace",
                # Own process group: a last-resort SIGKILL reaches its workers too.
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerFailed(
                f"{name}: cannot start {argv[0]}: {exc.strerror or exc}", EXIT_SERVER_FAILED
            ) from exc
        child = _Child(name, process, tail)
        if piped:
            assert process.stdout is not None
            threading.Thread(
                target=self._pump, args=(name, process.stdout, tail), daemon=True
            ).start()
        return child

    def _pump(self, name: str, stream: IO[str], tail: deque[str]) -> None:
        for raw in stream:
            line = raw.rstrip("\r\n")[:1000]
            with self._lock:
                tail.append(line)
            self.console.out(f"[{name}] {line}")

    def _known_pids(self) -> set[int]:
        pids = {c.process.pid for _, c in self.llms}
        if self.triton is not None:
            pids.add(self.triton.process.pid)
        return pids

    def _tick(self) -> None:
        if os.getpid() == 1:
            reap_orphans(self._known_pids())
        time.sleep(0.1)

    def stop_llms(self) -> None:
        running = [(s, c) for s, c in self.llms if c.poll() is None]
        for server, child in running:
            self.console.out(f"[serve] stopping {server.describe()}")
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + _LLM_STOP_GRACE_SECONDS
        for _, child in running:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill_group()
                child.process.wait()

    def _llm_exited(self) -> tuple[LlmServer, _Child, int] | None:
        for server, child in self.llms:
            code = child.poll()
            if code is not None:
                return server, child, code
        return None

    def _fail_llm(self, server: LlmServer, child: _Child, code: int, when: str) -> int:
        status = exit_code_of(code)
        message = f"{server.describe()} exited with code {status} {when}"
        self.console.err(f"error: {message}")
        self.report(step="llm", message=message, tail=list(child.tail))
        return status or EXIT_SERVER_FAILED

    def start_llms(self, servers: Sequence[LlmServer], environ: Mapping[str, str]) -> int | None:
        """Start every LLM server and wait for each /health; an exit code on failure."""
        for server in servers:
            env = {**environ, "CUDA_VISIBLE_DEVICES": ",".join(server.gpus)}
            self.console.out(
                f"[serve] starting {server.describe()}: CUDA_VISIBLE_DEVICES="
                f"{env['CUDA_VISIBLE_DEVICES']} {' '.join(server.argv)}"
            )
            self.llms.append((server, self._start(server.name, server.argv, env, piped=True)))
        started = time.monotonic()
        pending = {s.index for s in servers}
        next_progress = started + _PROGRESS_EVERY_SECONDS
        next_poll = started
        while pending:
            if self.received is not None:
                self.console.out(
                    f"[serve] {signal.Signals(self.received).name} before Triton started; "
                    "stopping the LLM servers"
                )
                self.stop_llms()
                return 128 + self.received
            exited = self._llm_exited()
            if exited is not None:
                server, child, code = exited
                result = self._fail_llm(server, child, code, "before it answered /health")
                self.stop_llms()
                return result
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + _HEALTH_POLL_SECONDS
                for server in servers:
                    if server.index in pending and _healthy(server.port):
                        pending.discard(server.index)
                        self.console.out(
                            f"[serve] {server.describe()} is healthy after {now - started:.1f}s"
                        )
            elapsed = now - started
            if pending and elapsed > self.options.llm_startup_timeout:
                names = ", ".join(s.describe() for s in servers if s.index in pending)
                message = (
                    f"{names} did not answer /health within "
                    f"{self.options.llm_startup_timeout:.0f}s (--llm-startup-timeout-seconds)"
                )
                self.console.err(f"error: {message}")
                tails = [line for _, c in self.llms for line in c.tail]
                self.report(step="llm", message=message, tail=tails)
                self.stop_llms()
                return EXIT_SERVER_FAILED
            if pending and now >= next_progress:
                next_progress = now + _PROGRESS_EVERY_SECONDS
                for server in servers:
                    if server.index in pending:
                        self.console.out(
                            f"[serve] waiting for {server.describe()} to answer /health: "
                            f"{elapsed:.0f}s of {self.options.llm_startup_timeout:.0f}s"
                        )
            if pending:
                self._tick()
        return None

    def run_triton(self, argv: Sequence[str], environ: Mapping[str, str]) -> int:
        self.console.out(f"[serve] starting Triton: {' '.join(argv)}")
        self.triton_phase = True
        triton = self._start("tritonserver", argv, environ, piped=False)
        self.triton = triton
        if self.received is not None:
            # A signal between the LLMs' health and Triton's start.
            triton.signal(self.received)
        while True:
            code = triton.poll()
            if code is not None:
                break
            exited = self._llm_exited() if self.received is None else None
            if exited is not None:
                server, child, llm_code = exited
                result = self._fail_llm(server, child, llm_code, "while Triton was serving")
                self.console.out("[serve] stopping Triton: the orchestrator needs every LLM")
                triton.signal(signal.SIGTERM)
                try:
                    triton.process.wait(
                        timeout=self.options.exit_timeout_seconds + _TRITON_STOP_MARGIN_SECONDS
                    )
                except subprocess.TimeoutExpired:
                    triton.kill_group()
                    triton.process.wait()
                self.stop_llms()
                return result
            self._tick()
        status = exit_code_of(code)
        cause = f"after {signal.Signals(self.received).name}" if self.received is not None else ""
        self.console.out(f"[serve] Triton exited with code {status} {cause}".rstrip())
        self.stop_llms()
        return status


# Straight to the loopback address: a cluster-wide HTTP_PROXY must not carry health probes.
_LOCAL_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _healthy(port: int) -> bool:
    try:
        with _LOCAL_OPENER.open(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


# --------------------------------------------------------------------------- the command


def _clip_head(text: str, limit: int) -> str:
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", errors="ignore")


def _describe_manifest(manifest: Mapping[str, Any]) -> str:
    versions = manifest.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    files = manifest.get("files")
    return (
        f"key {manifest.get('key')}, {manifest.get('variant')}, {manifest.get('precision')}, "
        f"tp {manifest.get('tensorParallelSize')}, max batch {manifest.get('maxBatchSize')}, "
        f"{manifest.get('gpuArch')}, TensorRT {versions.get('tensorrt')}, TensorRT-LLM "
        f"{versions.get('tensorrtLlm')}, {len(files) if isinstance(files, list) else 0} files"
    )


def serve(
    args: argparse.Namespace,
    environ: Mapping[str, str],
    console: Console,
    *,
    runner: Runner | None = None,
) -> int:
    def report(*, step: str, message: str, tail: Sequence[str] = (), **extra: object) -> None:
        text = _clip_head(message, termination.MESSAGE_MAX_BYTES)
        if tail:
            budget = termination.MESSAGE_MAX_BYTES - len(text.encode("utf-8")) - 1
            body = termination.tail_text(tail, max_lines=termination.MESSAGE_MAX_LINES - 1)
            if budget > 0:
                text = f"{text}\n{termination.clip_bytes(body, budget)}"
        payload: dict[str, object] = {"result": "failed", "step": step, **extra}
        payload["message"] = console.redact(text)
        termination.write(payload, environ)

    try:
        options = ServeOptions.from_args(args)
    except ConfigError as exc:
        console.err(f"error: {exc}")
        report(step="arguments", message=str(exc))
        return EXIT_CONFIG

    runner = runner or Runner(redactor=console.redact, echo=console.out)
    supervisor = Supervisor(options, console, report)
    with _signals_to(supervisor.on_signal):
        return _serve(options, environ, console, runner, supervisor, report)


def _serve(
    options: ServeOptions,
    environ: Mapping[str, str],
    console: Console,
    runner: Runner,
    supervisor: Supervisor,
    report: Callable[..., None],
) -> int:
    env = dict(environ)
    console.out(f"[gate] engine {options.key} at {options.engine_dir}")
    gate, facts = run_gate(options, lambda: observe_pod(runner, env))
    if gate.manifest is not None:
        console.out(f"[gate] engine: {_describe_manifest(gate.manifest)}")
    if facts is not None:
        console.out(
            f"[gate] pod: {facts.describe_gpus()}, TensorRT {facts.tensorrt or 'unknown'}, "
            f"TensorRT-LLM {facts.tensorrt_llm or 'unknown'}"
        )
    exit_code = 0
    if not gate.ok:
        console.err(f"error: {gate.message}")
        if not options.dry_run:
            report(
                step="compatibility",
                message=gate.message,
                key=options.key,
                reason=gate.reason,
                mismatches=sorted({m.field for m in gate.mismatches}),
            )
            return EXIT_INCOMPATIBLE
        exit_code = EXIT_INCOMPATIBLE
    else:
        console.out("[gate] ok: the engine was built for this GPU architecture and TensorRT")

    try:
        entries = plan_repository(options)
    except ConfigError as exc:
        console.err(f"error: {exc}")
        if not options.dry_run:
            report(step="repository", message=str(exc), key=options.key)
        return exit_code or EXIT_CONFIG

    if gate.manifest is None:
        # Dry run without a manifest: nothing more can be said about the commands.
        return exit_code
    try:
        view = plan_model_view(options, gate.manifest, len(facts.gpus) if facts else 0)
    except ConfigError as exc:
        console.err(f"error: {exc}")
        if not options.dry_run:
            report(step="repository", message=str(exc), key=options.key)
        return exit_code or EXIT_CONFIG
    servers = plan_llm_servers(options, gate.manifest, env)
    triton_argv = tritonserver_argv(options, env)
    if not options.serves_llm and options.llm_groups is not None:
        console.out("[serve] --llm-groups ignored: cosyvoice2's LLM runs inside Triton")

    if options.dry_run:
        for entry in entries:
            console.out(
                f"[repository] would assemble {options.model_repository / entry.name}: "
                f"config.pbtxt from {entry.config}, 1 -> {entry.code}"
            )
        console.out(
            f"[repository] would present {len(view)} entries of the engine's model directory "
            f"in {options.model_view}, with these plans:"
        )
        for name, source in view.items():
            if source.parent != _model_dir(options, gate.manifest):
                console.out(f"[repository]   {name} -> {source}")
        for server in servers:
            console.out(
                f"[llm] would start {server.describe()}: CUDA_VISIBLE_DEVICES="
                f"{','.join(server.gpus)} {' '.join(server.argv)}; then wait for "
                f"http://127.0.0.1:{server.port}/health"
            )
        console.out(f"[triton] would run: {' '.join(triton_argv)}")
        return exit_code

    try:
        assemble_repository(options.model_repository, entries)
        assemble_model_view(options.model_view, view)
    except (ConfigError, OSError) as exc:
        console.err(f"error: assembling the model repository: {exc}")
        report(step="repository", message=str(exc), key=options.key)
        return EXIT_CONFIG
    console.out(f"[repository] {options.model_repository}: {', '.join(e.name for e in entries)}")
    console.out(f"[repository] {options.model_view}: the engine's model directory and plans")

    if supervisor.received is not None:
        console.out(f"[serve] {signal.Signals(supervisor.received).name} before any server started")
        return 128 + supervisor.received
    try:
        failed = supervisor.start_llms(servers, env)
        if failed is not None:
            return failed
        return supervisor.run_triton(triton_argv, env)
    except ServerFailed as exc:
        console.err(f"error: {exc}")
        report(step="start", message=str(exc), tail=exc.tail)
        supervisor.stop_llms()
        return exc.code


@contextlib.contextmanager
def _signals_to(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Route SIGTERM and SIGINT to ``handler`` while serving.

    As the container's PID 1 this process would otherwise ignore SIGTERM altogether (the
    kernel drops default-action signals to a namespace's init), and the kubelet would
    wait out the grace period and SIGKILL Triton mid-stream.
    """
    if threading.current_thread() is not threading.main_thread():
        # Signal handlers can only be installed from the main thread (embedding, tests).
        yield
        return
    previous = {
        signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
