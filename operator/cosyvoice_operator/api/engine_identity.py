"""Engine identity and the engine plan of a service (pure).

An engine is named by a content key: a digest over everything that changes its bytes (model
source and revision, variant, precision, KV-cache type, SmoothQuant options, parallelism,
limits, builder image, GPU architecture) and nothing else. Serving settings, replicas and
autoscaling never enter it, so changing them never rebuilds; changing any input does.
Services that resolve to the same key share one engine.

The fields added after the first release (KV-cache type, SmoothQuant, companion revisions,
the default speaker) enter the key only when they differ from their defaults: an existing spec
keeps its key (and its built engine) across the upgrade that introduced them.

The default speaker (``spec.speakers.default``, issue 19 item 5) changes no TensorRT engine,
but its prompt features are a file of the engine directory, listed with its SHA-256 in the
engine's manifest and checked by the serving pod's gate: the key names the directory's whole
content, so the speaker is in it while set. The price is that changing the default speaker
builds the engine again (on a GPU, minutes); a separate speaker artifact with its own key,
Job and record would avoid that and is left for when speakers change often (README).

Companion revisions: the commits the operator is configured to fetch an upstream release's
companion repositories at (COSYVOICE_COMPANION_REVISIONS, by release URI). They change the
bytes built, so they are in the key of that release's engines (and only of those); without
them a companion is fetched at its default branch, and the commit it resolved to is only in
the engine's manifest.

Every engine is the TensorRT-LLM engine and the TensorRT plans of the flow estimator and
speaker embedding, per GPU architecture (``spec.model.llmRuntime: vllm`` is refused, issue 19
item 9). Build Jobs and records of vLLM's artifacts made before that (``llmRuntime: vllm``
with ``artifact: plans`` or ``checkpoint`` in their identity) are read without those two
fields: their precision ``none`` is no engine any service wants, so the cleanup stops and
removes them like any other unwanted one (``plan/cleanup.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cosyvoice_operator.api import gpus
from cosyvoice_operator.api.spec import ServiceSpec

# Bump when the meaning of the fields (or the builder's output layout) changes: old engines
# then get new keys instead of being misread.
KEY_SCHEMA = "cosyvoice-engine/v1"
KEY_LENGTH = 40  # hex digits: fits a label value (<= 63) with room, 160 bits


@dataclass(frozen=True)
class EngineIdentity:
    """The inputs of one engine build."""

    model_uri: str
    revision: str
    variant: str
    precision: str
    tensor_parallel_size: int
    max_batch_size: int
    max_num_tokens: int
    builder_image: str
    gpu_arch: str
    # Added later: in the key only when not at these defaults (see the module docstring).
    kv_cache_type: str = "auto"
    # "alpha=0.5,per_token,per_channel" with precision int8-smoothquant, else "".
    smooth_quant: str = ""
    # "hf://ORG/NAME=COMMIT,..." (sorted): the pinned companions of an upstream release.
    companion_revisions: str = ""
    # spec.speakers.default: the builder computes its prompt features into the engine dir.
    speaker_audio_uri: str = ""
    speaker_transcript: str = ""

    def canonical(self) -> dict[str, Any]:
        """The fields the key is taken over: the new ones only where not at their default."""
        fields = asdict(self)
        for name, default in _KEY_NEUTRAL.items():
            if fields[name] == default:
                del fields[name]
        return fields

    @functools.cached_property  # asked many times a pass; the fields are frozen
    def key(self) -> str:
        canonical = json.dumps({"schema": KEY_SCHEMA, **self.canonical()}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]

    @property
    def short_name(self) -> str:
        """``sm90-<key prefix>``: readable and unique enough for object names."""
        return f"{self.gpu_arch.replace('_', '')}-{self.key[:20]}"


_KEY_NEUTRAL: dict[str, str] = {
    "kv_cache_type": "auto",
    "smooth_quant": "",
    "companion_revisions": "",
    "speaker_audio_uri": "",
    "speaker_transcript": "",
}
# (release URI, companion URI, commit) of every configured pin.
CompanionPins = tuple[tuple[str, str, str], ...]

# The identity's JSON form (build Job annotation, record data): camelCase, the later fields
# only where not at their default, so the records of existing engines read the same.
_DICT_NAMES: tuple[tuple[str, str], ...] = (
    ("model_uri", "modelUri"),
    ("revision", "revision"),
    ("variant", "variant"),
    ("precision", "precision"),
    ("tensor_parallel_size", "tensorParallelSize"),
    ("max_batch_size", "maxBatchSize"),
    ("max_num_tokens", "maxNumTokens"),
    ("builder_image", "builderImage"),
    ("gpu_arch", "gpuArch"),
    ("kv_cache_type", "kvCacheType"),
    ("smooth_quant", "smoothQuant"),
    ("companion_revisions", "companionRevisions"),
    ("speaker_audio_uri", "speakerAudioUri"),
    ("speaker_transcript", "speakerTranscript"),
)


def identity_to_dict(ident: EngineIdentity) -> dict[str, Any]:
    fields = ident.canonical()
    return {camel: fields[name] for name, camel in _DICT_NAMES if name in fields}


def identity_from_dict(data: Mapping[str, Any]) -> EngineIdentity:
    """The inverse of :func:`identity_to_dict`; KeyError, ValueError or TypeError if it is not
    one. An old vLLM artifact's ``llmRuntime`` and ``artifact`` are not read (module
    docstring)."""
    return EngineIdentity(
        model_uri=str(data["modelUri"]),
        revision=str(data["revision"]),
        variant=str(data["variant"]),
        precision=str(data["precision"]),
        tensor_parallel_size=int(data["tensorParallelSize"]),
        max_batch_size=int(data["maxBatchSize"]),
        max_num_tokens=int(data["maxNumTokens"]),
        builder_image=str(data["builderImage"]),
        gpu_arch=str(data["gpuArch"]),
        kv_cache_type=str(data.get("kvCacheType", "auto")),
        smooth_quant=str(data.get("smoothQuant", "")),
        companion_revisions=str(data.get("companionRevisions", "")),
        speaker_audio_uri=str(data.get("speakerAudioUri", "")),
        speaker_transcript=str(data.get("speakerTranscript", "")),
    )


def kv_cache_of(spec: ServiceSpec) -> str:
    """The KV-cache type as it changes the engine: an fp8 engine's is fp8 already."""
    kv = spec.engine.kv_cache_type
    return "auto" if spec.engine.precision == "fp8" and kv == "fp8" else kv


def smooth_quant_of(spec: ServiceSpec) -> str:
    sq = spec.engine.smooth_quant
    if spec.engine.precision != "int8-smoothquant" or sq is None:
        return ""
    parts = [f"alpha={sq.alpha:g}"]
    if sq.per_token:
        parts.append("per_token")
    if sq.per_channel:
        parts.append("per_channel")
    return ",".join(parts)


def companions_of(spec: ServiceSpec, pins: CompanionPins) -> str:
    """The pins of the service's release, in the identity's form ("" for none)."""
    release = spec.model.uri.lower()
    found = sorted(f"{c}={commit}" for rel, c, commit in pins if rel.lower() == release)
    return ",".join(found)


def identity(
    spec: ServiceSpec, gpu_arch: str, default_builder_image: str, pins: CompanionPins = ()
) -> EngineIdentity:
    """The per-architecture build: the TensorRT-LLM engine, the plans and the default
    speaker's prompt features."""
    speaker = spec.speakers.default
    return EngineIdentity(
        model_uri=spec.model.uri,
        revision=spec.model.revision,
        variant=spec.model.variant,
        precision=spec.engine.precision,
        tensor_parallel_size=spec.engine.tensor_parallel_size,
        max_batch_size=spec.engine.max_batch_size,
        max_num_tokens=spec.engine.max_num_tokens,
        builder_image=spec.engine.builder_image or default_builder_image,
        gpu_arch=gpu_arch,
        kv_cache_type=kv_cache_of(spec),
        smooth_quant=smooth_quant_of(spec),
        companion_revisions=companions_of(spec, pins),
        speaker_audio_uri=speaker.audio_uri if speaker else "",
        speaker_transcript=speaker.transcript if speaker else "",
    )


@dataclass(frozen=True)
class EngineTarget:
    """One architecture's engine and the GPU products of the service that use it."""

    identity: EngineIdentity
    products: tuple[str, ...]

    @property
    def key(self) -> str:
        return self.identity.key


@dataclass(frozen=True)
class RejectedProduct:
    """A GPU product no engine is built for, and why (each is reported, none is guessed)."""

    product: str
    arch: str  # "" when the product is unknown
    reason: str  # UnknownGPUProduct | PrecisionUnsupported | KVCacheUnsupported
    message: str


@dataclass(frozen=True)
class EnginePlan:
    targets: tuple[EngineTarget, ...]
    rejected: tuple[RejectedProduct, ...]
    # where the products came from: "spec" (spec.engine.gpuProducts) or "nodes"
    source: str

    @property
    def product_count(self) -> int:
        return sum(len(t.products) for t in self.targets) + len(self.rejected)


def eligible_products(spec: ServiceSpec, nodes: Iterable[gpus.GPUNode]) -> list[str]:
    """GPU products of the Ready nodes that the service's serving pods may be scheduled on."""
    s = spec.serving
    eligible = gpus.eligible_nodes(
        nodes, s.node_selector, s.tolerations, s.affinity, s.gpus_per_replica
    )
    return sorted({node.product for node in eligible})


def plan(
    spec: ServiceSpec,
    nodes: Sequence[gpus.GPUNode],
    default_builder_image: str,
    pins: CompanionPins = (),
) -> EnginePlan:
    """One engine per distinct architecture of the products the service may run on."""
    if spec.engine.gpu_products:
        products, source = list(spec.engine.gpu_products), "spec"
    else:
        products, source = eligible_products(spec, nodes), "nodes"
    by_arch: dict[str, list[str]] = {}
    rejected: list[RejectedProduct] = []
    precision = spec.engine.precision
    where = (
        "spec.engine.gpuProducts"
        if source == "spec"
        else "the serving pods' nodeSelector or affinity"
    )
    for product in products:
        try:
            arch = gpus.architecture(product)
        except gpus.UnknownGPUProduct as exc:
            rejected.append(RejectedProduct(product, "", "UnknownGPUProduct", str(exc)))
            continue
        # Building would burn a GPU for an engine that fails at load (or at build).
        why = gpus.precision_unsupported(precision, arch)
        if why:
            rejected.append(
                RejectedProduct(
                    product,
                    arch,
                    "PrecisionUnsupported",
                    f"spec.engine.precision {why}: {product} is {arch}. Choose another "
                    f"precision, or keep {product} out through {where}.",
                )
            )
            continue
        why = gpus.kv_cache_unsupported(spec.engine.kv_cache_type, arch)
        if why:
            rejected.append(
                RejectedProduct(
                    product,
                    arch,
                    "KVCacheUnsupported",
                    f"spec.engine.kvCacheType {why}: {product} is {arch}. Choose int8 or "
                    f"auto, or keep {product} out through {where}.",
                )
            )
            continue
        by_arch.setdefault(arch, []).append(product)
    targets = tuple(
        EngineTarget(identity(spec, arch, default_builder_image, pins), tuple(prods))
        for arch, prods in sorted(by_arch.items())
    )
    return EnginePlan(targets, tuple(rejected), source)
