"""What one build is asked to produce, parsed and validated from the command line.

Validation is strict on purpose: the key and the URI become file-system paths on a
volume shared by every service, so anything that could climb out of its directory or
collide with the builder's own bookkeeping (``<key>.partial``, ``.work``, ``.locks``)
is rejected before anything is touched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Literal


class InvalidRequest(ValueError):
    """An argument that cannot describe a build; the message says which and why."""


class Variant(StrEnum):
    COSYVOICE2 = "cosyvoice2"
    COSYVOICE3 = "cosyvoice3"


class Precision(StrEnum):
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    INT8_WEIGHT_ONLY = "int8-weight-only"
    INT4_WEIGHT_ONLY = "int4-weight-only"
    INT8_SMOOTHQUANT = "int8-smoothquant"
    FP8 = "fp8"


class KvCacheType(StrEnum):
    """The LLM's KV cache: ``auto`` is the engine's own (its activation type, fp8 for fp8)."""

    AUTO = "auto"
    INT8 = "int8"
    FP8 = "fp8"


@dataclass(frozen=True)
class SmoothQuant:
    """convert_checkpoint.py --smoothquant ALPHA [--per_token] [--per_channel]."""

    alpha: float = 0.5
    per_token: bool = True
    per_channel: bool = True


Scheme = Literal["hf", "s3", "pvc"]

# The operator derives keys from a digest (hex). Accepting a slightly wider, still
# dot-free alphabet costs nothing and keeps `<key>.partial` unambiguous.
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
_GPU_ARCH_RE = re.compile(r"^sm_[0-9]{2,3}[a-z]?$")
_HF_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_S3_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
# A Hugging Face branch, tag or commit, or an S3 version id: the CRD's character set.
_REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+=-]{0,255}$")
# A full git commit (what a pin must be: a branch or tag can move).
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class ModelSource:
    """Where the model comes from: ``hf://ORG/NAME``, ``s3://BUCKET/PATH``, ``pvc://CLAIM/PATH``."""

    scheme: Scheme
    # hf: "ORG/NAME"; s3: the bucket; pvc: the claim name.
    authority: str
    # hf: ""; s3: the key prefix; pvc: the path inside the claim. No leading slash.
    path: str

    @property
    def uri(self) -> str:
        if self.scheme == "hf":
            return f"hf://{self.authority}"
        return f"{self.scheme}://{self.authority}/{self.path}".rstrip("/")


def _safe_relative(path: str, what: str) -> str:
    parts = PurePosixPath(path).parts if path else ()
    if any(p in ("..", ".") for p in parts) or path.startswith("/"):
        raise InvalidRequest(f"{what} {path!r} must be a relative path without '.' or '..'")
    return "/".join(parts)


def parse_model_uri(uri: str) -> ModelSource:
    scheme, sep, rest = uri.partition("://")
    if not sep:
        raise InvalidRequest(
            f"--model-uri {uri!r}: expected hf://ORG/NAME, s3://BUCKET/PATH or pvc://CLAIM/PATH"
        )
    if scheme == "hf":
        parts = rest.strip("/").split("/")
        if len(parts) != 2 or not all(_HF_PART_RE.match(p) for p in parts):
            raise InvalidRequest(f"--model-uri {uri!r}: a Hugging Face URI is hf://ORG/NAME")
        return ModelSource("hf", "/".join(parts), "")
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not _S3_BUCKET_RE.match(bucket):
            raise InvalidRequest(f"--model-uri {uri!r}: {bucket!r} is not a valid S3 bucket name")
        return ModelSource("s3", bucket, _safe_relative(prefix.strip("/"), "S3 prefix"))
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if not _DNS_SUBDOMAIN_RE.match(claim):
            raise InvalidRequest(
                f"--model-uri {uri!r}: {claim!r} is not a valid PersistentVolumeClaim name"
            )
        return ModelSource("pvc", claim, _safe_relative(path.strip("/"), "path inside the claim"))
    raise InvalidRequest(
        f"--model-uri {uri!r}: unsupported scheme {scheme!r} (use hf://, s3:// or pvc://)"
    )


def validate_revision(revision: str) -> str:
    """ "" (the default branch) or a revision of the CRD's character set, without '..'."""
    if revision and (not _REVISION_RE.match(revision) or ".." in revision):
        raise InvalidRequest(
            f"--revision {revision!r}: expected a branch, tag, commit or version id (letters, "
            "digits and . _ - / + =, starting with a letter or digit, no '..')"
        )
    return revision


def parse_companion_revisions(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--companion-revision hf://ORG/NAME=COMMIT``, each a full 40-hex commit."""
    pins: dict[str, str] = {}
    for value in values:
        uri, sep, commit = value.partition("=")
        source = parse_model_uri(uri) if sep else None
        if source is None or source.scheme != "hf" or not COMMIT_RE.match(commit):
            raise InvalidRequest(
                f"--companion-revision {value!r}: expected hf://ORG/NAME=COMMIT with the full "
                "40-character commit (a branch or tag can move)"
            )
        key = source.uri.lower()
        if pins.get(key, commit) != commit:
            raise InvalidRequest(f"--companion-revision: {uri} is pinned twice")
        pins[key] = commit
    return tuple(sorted(pins.items()))


def validate_key(key: str) -> str:
    if not _KEY_RE.match(key):
        raise InvalidRequest(
            f"--key {key!r}: expected the operator's content key "
            "(letters, digits, '-' or '_', at most 128 characters, no dots or slashes)"
        )
    return key


def validate_gpu_arch(arch: str) -> str:
    if not _GPU_ARCH_RE.match(arch):
        raise InvalidRequest(f"--gpu-arch {arch!r}: expected an SM architecture such as sm_90")
    return arch


# The oldest architecture each precision runs on (TensorRT-LLM's support matrix): bfloat16
# needs Ampere tensor cores, FP8 needs Ada or Hopper; the weight-only modes run with
# bfloat16 activations (see commands.py), so they need Ampere too. Checked before any
# download, so a mismatch costs no GPU time (the operator refuses these pairs too).
PRECISION_MIN_SM = {
    Precision.BFLOAT16: 80,
    Precision.INT8_WEIGHT_ONLY: 80,
    Precision.INT4_WEIGHT_ONLY: 80,
    Precision.INT8_SMOOTHQUANT: 80,
    Precision.FP8: 89,
}
# The KV cache's own needs on top of the precision's: FP8 needs Ada or Hopper.
KV_CACHE_MIN_SM = {KvCacheType.FP8: 89}


def _check_precision_arch(precision: Precision, arch: str) -> None:
    needed = PRECISION_MIN_SM.get(precision)
    have = int("".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit()))
    if needed is not None and have < needed:
        raise InvalidRequest(
            f"--precision {precision.value} needs sm_{needed} or newer; --gpu-arch is {arch}"
        )


def _check_kv_cache(kv: KvCacheType, precision: Precision, arch: str) -> None:
    needed = KV_CACHE_MIN_SM.get(kv)
    have = int("".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit()))
    if needed is not None and have < needed:
        raise InvalidRequest(
            f"--kv-cache-type {kv.value} needs sm_{needed} or newer; --gpu-arch is {arch}"
        )
    if kv is KvCacheType.INT8 and precision is Precision.FP8:
        raise InvalidRequest(
            "--kv-cache-type int8 cannot go with --precision fp8 (its KV cache is fp8)"
        )
    if kv is KvCacheType.FP8 and precision is Precision.INT8_SMOOTHQUANT:
        raise InvalidRequest(
            "--kv-cache-type fp8 cannot go with --precision int8-smoothquant (ModelOpt's "
            "SmoothQuant would ignore the --smoothquant-* options); use int8 or auto"
        )


def _smooth_quant(
    precision: Precision, alpha: float | None, per_token: bool, per_channel: bool
) -> SmoothQuant | None:
    if precision is not Precision.INT8_SMOOTHQUANT:
        if alpha is not None or per_token or per_channel:
            raise InvalidRequest(
                "--smoothquant-alpha, --smoothquant-per-token and --smoothquant-per-channel "
                f"need --precision int8-smoothquant, not {precision.value}"
            )
        return None
    alpha = 0.5 if alpha is None else alpha
    if not 0 <= alpha <= 1:
        raise InvalidRequest(f"--smoothquant-alpha must be between 0 and 1, got {alpha:g}")
    return SmoothQuant(alpha, per_token, per_channel)


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise InvalidRequest(f"{flag} must be a positive integer, got {value}")
    return value


@dataclass(frozen=True)
class DefaultSpeaker:
    """spec.speakers.default: a recording on a claim (``pvc://CLAIM/PATH``) and its text."""

    audio: ModelSource
    transcript: str


def parse_default_speaker(audio: str, transcript: str) -> DefaultSpeaker | None:
    if not audio and not transcript:
        return None
    if not audio or not transcript.strip():
        raise InvalidRequest("--default-speaker-audio and --default-speaker-transcript go together")
    source = parse_model_uri(audio)
    if source.scheme != "pvc" or not source.path:
        raise InvalidRequest(
            f"--default-speaker-audio {audio!r}: expected pvc://CLAIM/PATH of a WAV file"
        )
    return DefaultSpeaker(source, transcript)


@dataclass(frozen=True)
class BuildRequest:
    key: str
    cache_dir: Path
    variant: Variant
    source: ModelSource
    revision: str
    precision: Precision
    tensor_parallel_size: int
    max_batch_size: int
    max_num_tokens: int
    gpu_arch: str
    work_dir: Path
    pvc_root: Path
    kv_cache_type: KvCacheType = KvCacheType.AUTO
    smooth_quant: SmoothQuant | None = None
    # Commits the companion repositories of a known release are fetched at, by lower-case
    # hf:// URI, over the release table's own pins (releases.py).
    companion_revisions: tuple[tuple[str, str], ...] = ()
    # A sha256sum-format list of files (relative to the fetched model directory) that the
    # fetched model must match, byte for byte.
    sha256_list: Path | None = None
    default_speaker: DefaultSpeaker | None = None

    @classmethod
    def create(
        cls,
        *,
        key: str,
        cache_dir: Path,
        variant: str,
        model_uri: str,
        revision: str,
        precision: str,
        tensor_parallel_size: int,
        max_batch_size: int,
        max_num_tokens: int,
        gpu_arch: str,
        work_dir: Path | None,
        pvc_root: Path,
        kv_cache_type: str = "auto",
        smoothquant_alpha: float | None = None,
        smoothquant_per_token: bool = False,
        smoothquant_per_channel: bool = False,
        companion_revisions: Sequence[str] = (),
        sha256_list: Path | None = None,
        default_speaker_audio: str = "",
        default_speaker_transcript: str = "",
    ) -> BuildRequest:
        key = validate_key(key)
        try:
            variant_value = Variant(variant)
        except ValueError:
            raise InvalidRequest(
                f"--variant {variant!r}: expected one of {', '.join(v.value for v in Variant)}"
            ) from None
        try:
            precision_value = Precision(precision)
        except ValueError:
            raise InvalidRequest(
                f"--precision {precision!r}: expected one of "
                f"{', '.join(p.value for p in Precision)}"
            ) from None
        try:
            kv = KvCacheType(kv_cache_type)
        except ValueError:
            raise InvalidRequest(
                f"--kv-cache-type {kv_cache_type!r}: expected one of "
                f"{', '.join(k.value for k in KvCacheType)}"
            ) from None
        _check_precision_arch(precision_value, validate_gpu_arch(gpu_arch))
        _check_kv_cache(kv, precision_value, gpu_arch)
        smooth_quant = _smooth_quant(
            precision_value, smoothquant_alpha, smoothquant_per_token, smoothquant_per_channel
        )
        return cls(
            key=key,
            cache_dir=cache_dir,
            variant=variant_value,
            source=parse_model_uri(model_uri),
            revision=validate_revision(revision),
            precision=precision_value,
            tensor_parallel_size=_positive(tensor_parallel_size, "--tensor-parallel-size"),
            max_batch_size=_positive(max_batch_size, "--max-batch-size"),
            max_num_tokens=_positive(max_num_tokens, "--max-num-tokens"),
            gpu_arch=validate_gpu_arch(gpu_arch),
            work_dir=work_dir if work_dir is not None else cache_dir / ".work" / key,
            pvc_root=pvc_root,
            companion_revisions=parse_companion_revisions(companion_revisions),
            sha256_list=sha256_list,
            kv_cache_type=kv,
            smooth_quant=smooth_quant,
            default_speaker=parse_default_speaker(
                default_speaker_audio, default_speaker_transcript
            ),
        )

    @property
    def engine_dir(self) -> Path:
        return self.cache_dir / self.key

    @property
    def partial_dir(self) -> Path:
        return self.cache_dir / f"{self.key}.partial"

    @property
    def lock_path(self) -> Path:
        return self.cache_dir / ".locks" / f"{self.key}.lock"

    @property
    def uses_default_work_dir(self) -> bool:
        return self.work_dir == self.cache_dir / ".work" / self.key
