"""Engine identity and the engine plan of a service (pure).

An engine is named by a content key: a digest over everything that changes its bytes (model
source and revision, variant, precision, parallelism, limits, builder image, GPU
architecture) and nothing else. Serving settings, replicas and autoscaling never enter it, so
changing them never rebuilds; changing any input does. Services that resolve to the same key
share one engine.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from . import gpus
from .spec import ServiceSpec

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

    @property
    def key(self) -> str:
        canonical = json.dumps({"schema": KEY_SCHEMA, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:KEY_LENGTH]

    @property
    def short_name(self) -> str:
        """``sm90-<key prefix>``: readable and unique enough for object names."""
        return f"{self.gpu_arch.replace('_', '')}-{self.key[:20]}"


def identity(spec: ServiceSpec, gpu_arch: str, default_builder_image: str) -> EngineIdentity:
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
    reason: str  # UnknownGPUProduct | PrecisionUnsupported
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
    found: dict[str, None] = {}
    for node in nodes:
        if gpus.eligible(
            node,
            spec.serving.node_selector,
            spec.serving.tolerations,
            spec.serving.affinity,
            spec.serving.gpus_per_replica,
        ):
            found.setdefault(node.product, None)
    return sorted(found)


def plan(
    spec: ServiceSpec, nodes: Sequence[gpus.GPUNode], default_builder_image: str
) -> EnginePlan:
    """One engine per distinct architecture of the products the service may run on."""
    if spec.engine.gpu_products:
        products, source = list(spec.engine.gpu_products), "spec"
    else:
        products, source = eligible_products(spec, nodes), "nodes"
    by_arch: dict[str, list[str]] = {}
    rejected: list[RejectedProduct] = []
    precision = spec.engine.precision
    for product in products:
        try:
            arch = gpus.architecture(product)
        except gpus.UnknownGPUProduct as exc:
            rejected.append(RejectedProduct(product, "", "UnknownGPUProduct", str(exc)))
            continue
        why = gpus.precision_unsupported(precision, arch)
        if why:
            # Building would burn a GPU for an engine that fails at load (or at build).
            where = (
                "spec.engine.gpuProducts"
                if source == "spec"
                else "the serving pods' nodeSelector or affinity"
            )
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
        by_arch.setdefault(arch, []).append(product)
    targets = tuple(
        EngineTarget(identity(spec, arch, default_builder_image), tuple(prods))
        for arch, prods in sorted(by_arch.items())
    )
    return EnginePlan(targets, tuple(rejected), source)
