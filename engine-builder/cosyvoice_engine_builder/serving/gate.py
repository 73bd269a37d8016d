"""The compatibility gate: what this pod runs on, what the engine was built for, and if they fit.

The observed half (:func:`observe_pod`) asks ``nvidia-smi`` and the image's Python for the
GPUs and the TensorRT and TensorRT-LLM versions, exactly as the builder found them out. The
rest reads the engine's manifest (:func:`read_manifest`, :func:`layout_path`), checks its
files' sizes, and compares both sides (:func:`compare`), so a refusal is one message that
names the engine's side, the pod's side, and what to do (:func:`gate_message`).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from cosyvoice_engine_builder.commands import ToolPaths
from cosyvoice_engine_builder.layout import LLM_SUBDIR, MANIFEST_NAME, serving_files
from cosyvoice_engine_builder.manifest import SCHEMA_VERSION
from cosyvoice_engine_builder.redaction import without_secrets
from cosyvoice_engine_builder.request import Variant
from cosyvoice_engine_builder.runner import Command, CommandFailed, Runner
from cosyvoice_engine_builder.serving.options import ServeOptions
from cosyvoice_engine_builder.toolchain import ToolchainError, find_executable, probe_versions

_MESSAGE_FILES_LISTED = 5
_HASH_CHUNK = 8 * 1024 * 1024


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
    reason: str  # EngineMissing | EngineInvalid | EngineModified | EngineIncompatible | ""
    message: str
    mismatches: list[Mismatch] = field(default_factory=list)
    manifest: dict[str, Any] | None = None


class _ManifestUnusable(Exception):
    def __init__(self, message: str, reason: str = "EngineMissing") -> None:
        super().__init__(message)
        self.reason = reason


def read_manifest(engine_dir: Path, key: str, expected_sha256: str = "") -> dict[str, Any]:
    """The manifest, or :class:`_ManifestUnusable` with the whole explanation.

    ``expected_sha256`` (``--manifest-sha256``, from the operator's engine record: the digest
    the builder reported for the manifest it wrote) must be the sha256 of the file's bytes;
    any other manifest is refused with reason ``EngineModified`` (issue 21 M6)."""
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
        raw = manifest_path.read_bytes()
        data = json.loads(raw.decode("utf-8"))
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
    found_sha256 = hashlib.sha256(raw).hexdigest()
    if expected_sha256 and found_sha256 != expected_sha256:
        raise _ManifestUnusable(
            f"engine {key}: {manifest_path} has sha256 {found_sha256}, but its build wrote "
            f"one of sha256 {expected_sha256} (the engine record's manifestSha256): the "
            "manifest was changed after the build (another build on the same cache claim, or "
            "by hand), so nothing it lists can be trusted and this pod will not load it. "
            f"Rebuild it: `kubectl delete jobs,configmaps -l tts.cosyvoice.dev/engine-key={key}`"
            "; and give services that do not trust each other their own cache claims",
            "EngineModified",
        )
    if not isinstance(data, dict) or data.get("schemaVersion") != SCHEMA_VERSION:
        found = data.get("schemaVersion") if isinstance(data, dict) else type(data).__name__
        raise _ManifestUnusable(
            f"engine {key}: {manifest_path} has schemaVersion {found!r}; this image reads "
            f"{SCHEMA_VERSION}: serve with the image that matches the builder which wrote it",
            "EngineIncompatible",
        )
    return data


def member(rel: object) -> str | None:
    if not isinstance(rel, str) or not rel:
        return None
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        return None
    return rel


def layout_path(
    engine_dir: Path, manifest: Mapping[str, Any], field_name: str, default: str
) -> Path:
    layout = manifest.get("layout")
    value = layout.get(field_name) if isinstance(layout, dict) else None
    return engine_dir / (member(value) or default)


def check_file_sizes(
    engine_dir: Path, manifest: Mapping[str, Any], *, hashes: bool = False
) -> list[str]:
    """Every listed file present with its recorded size; with ``hashes`` (the manifest's own
    digest was checked: ``--manifest-sha256``) also with its recorded sha256, so a file
    changed after the build is found even at the same size."""
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        return ["the manifest lists no files"]
    problems = []
    for entry in files:
        rel = member(entry.get("path")) if isinstance(entry, dict) else None
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
        elif hashes and _sha256_of(path) != entry.get("sha256"):
            problems.append(f"{rel} (sha256 differs from the build's)")
    return problems


def _sha256_of(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


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
) -> list[Mismatch]:
    """Everything about this pod that keeps the engine from loading correctly in it."""
    found = [
        *_check_key(manifest, engine_dir, key),
        *_check_variant(manifest, variant),
        *_check_gpu_arch(manifest, facts),
        *_check_versions(manifest, facts),
    ]
    if variant is Variant.COSYVOICE3:
        found += _check_llm_groups(manifest, facts, llm_groups)
    if manifest.get("variant") == variant.value:  # else the variant's mismatch says it all
        found += _check_model_files(manifest, engine_dir, variant)
    found += _check_default_speaker(manifest, engine_dir)
    found += _check_files(engine_dir, key, file_problems)
    return found


def _check_default_speaker(manifest: Mapping[str, Any], engine_dir: Path) -> list[Mismatch]:
    """spec.speakers.default's file (``layout.defaultSpeaker``), which the orchestrator opens
    at load: listed among the manifest's files (so its size, or with --manifest-sha256 its
    SHA-256, is checked with theirs) and present."""
    layout = manifest.get("layout")
    value = layout.get("defaultSpeaker") if isinstance(layout, dict) else None
    if value is None:
        return []
    rel = member(value)
    files = manifest.get("files")
    listed = isinstance(files, list) and any(
        isinstance(f, dict) and f.get("path") == rel for f in files
    )
    if rel is not None and listed and (engine_dir / rel).is_file():
        return []
    return [
        Mismatch(
            "default-speaker",
            f"the default speaker's file {value!r} (layout.defaultSpeaker) is "
            + ("not listed among the manifest's files" if not listed else "missing"),
            "rebuild the engine: its speaker step publishes and lists the file",
        )
    ]


def _check_model_files(
    manifest: Mapping[str, Any], engine_dir: Path, variant: Variant
) -> list[Mismatch]:
    """The files of the engine's model directory the model code opens (layout.serving_files):
    an engine built before the builder checked them may lack one, which would otherwise be a
    Triton load error. A manifest without a model directory has nothing to check here (its
    files are still checked)."""
    layout = manifest.get("layout")
    if not isinstance(layout, dict) or member(layout.get("modelDir")) is None:
        return []
    model_rel = str(layout["modelDir"])
    tokenizer_rel = member(layout.get("tokenizerDir")) or f"{model_rel}/{LLM_SUBDIR}"
    if tokenizer_rel == model_rel:
        llm_sub = ""
    elif tokenizer_rel.startswith(model_rel + "/"):
        llm_sub = tokenizer_rel[len(model_rel) + 1 :]
    else:
        llm_sub = LLM_SUBDIR
    model_dir = engine_dir / model_rel
    missing = [rel for rel in serving_files(variant, llm_sub) if not (model_dir / rel).is_file()]
    if not missing:
        return []
    return [
        Mismatch(
            "model-files",
            f"the model directory {model_dir} lacks {', '.join(missing)}, which the serving "
            "models open",
            "the release it was built from lacks them, or an older builder published it "
            "without checking; rebuild it from a release that has them (the builder now "
            "refuses one that does not)",
        )
    ]


def _check_key(manifest: Mapping[str, Any], engine_dir: Path, key: str) -> list[Mismatch]:
    built_key = manifest.get("key")
    if built_key == key:
        return []
    return [
        Mismatch(
            "key",
            f"{engine_dir} holds engine {built_key!r}, not {key!r}",
            "the Deployment mounts the wrong directory of the engine cache, or the cache "
            "entry was replaced; the pod's spec and the engine record disagree",
        )
    ]


def _check_variant(manifest: Mapping[str, Any], variant: Variant) -> list[Mismatch]:
    built_variant = manifest.get("variant")
    if built_variant == variant.value:
        return []
    return [
        Mismatch(
            "variant",
            f"the engine is a {built_variant} engine, this pod serves {variant.value}",
            "the pod's --variant and its engine key come from different services",
        )
    ]


def _check_gpu_arch(manifest: Mapping[str, Any], facts: PodFacts) -> list[Mismatch]:
    built_arch = str(manifest.get("gpuArch"))
    if not facts.gpus:
        return [
            Mismatch(
                "gpuArch",
                f"no GPU is visible to this pod ({facts.gpu_note})",
                f"the pod must request nvidia.com/gpu and run on a node with {built_arch} GPUs",
            )
        ]
    wrong = sorted({g.arch for g in facts.gpus if _norm_arch(g.arch) != _norm_arch(built_arch)})
    if not wrong:
        return []
    return [
        Mismatch(
            "gpuArch",
            f"GPU architecture {', '.join(wrong)} is not {built_arch}",
            f"schedule this pod only on {built_arch} nodes (the operator runs one "
            f"Deployment per architecture, pinned to its GPU products), or let the "
            f"operator build an engine for {', '.join(wrong)}",
        )
    ]


def _check_versions(manifest: Mapping[str, Any], facts: PodFacts) -> list[Mismatch]:
    versions = manifest.get("versions")
    versions = versions if isinstance(versions, dict) else {}
    checked = [
        ("TensorRT", "tensorrt", facts.tensorrt),
        ("TensorRT-LLM", "tensorrtLlm", facts.tensorrt_llm),
    ]
    found: list[Mismatch] = []
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
    return found


def _check_llm_groups(
    manifest: Mapping[str, Any],
    facts: PodFacts,
    groups: tuple[tuple[str, ...], ...] | None,
) -> list[Mismatch]:
    """The LLM servers' GPU groups: the engine's tensor-parallel size, and GPUs that exist."""
    found: list[Mismatch] = []
    tp = manifest.get("tensorParallelSize")
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
    return found


def _check_files(engine_dir: Path, key: str, file_problems: Sequence[str]) -> list[Mismatch]:
    if not file_problems:
        return []
    listed = ", ".join(file_problems[:_MESSAGE_FILES_LISTED])
    more = len(file_problems) - _MESSAGE_FILES_LISTED
    return [
        Mismatch(
            "files",
            f"{len(file_problems)} file(s) missing or changed since the build: {listed}"
            + (f" and {more} more" if more > 0 else ""),
            f"`cosyvoice-engine-builder verify --cache-dir {engine_dir.parent} --key "
            f"{key}` lists every problem; `kubectl delete jobs,configmaps -l "
            f"tts.cosyvoice.dev/engine-key={key}` makes the operator build it again",
        )
    ]


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
        manifest = read_manifest(options.engine_dir, options.key, options.manifest_sha256)
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
        file_problems=check_file_sizes(
            options.engine_dir, manifest, hashes=bool(options.manifest_sha256)
        ),
    )
    if mismatches:
        message = gate_message(options.key, manifest, facts, mismatches)
        return GateResult(False, "EngineIncompatible", message, mismatches, manifest), facts
    return GateResult(True, "", "", [], manifest), facts
