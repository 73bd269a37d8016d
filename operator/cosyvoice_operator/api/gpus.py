"""GPU products and their architectures.

A TensorRT engine runs only on the compute capability (SM) it was built for, so every engine
is keyed by architecture, and the architecture is read off the node label
``nvidia.com/gpu.product`` that NVIDIA's GPU feature discovery sets (e.g. ``NVIDIA-L20``,
``NVIDIA-H100-80GB-HBM3``). An unknown product is reported, never guessed: a wrong guess
builds an engine that fails to deserialize or, worse, produces silent audio.
"""

from __future__ import annotations

import collections
import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
# GPU nodes are commonly tainted nvidia.com/gpu: every pod the operator makes tolerates it.
GPU_TOLERATION: dict[str, str] = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}

# Model families as they appear in the product label, mapped to their SM. The label carries
# memory size and form factor after the family (NVIDIA-A100-SXM4-80GB, NVIDIA-H100-80GB-HBM3,
# NVIDIA-H100-NVL), so matching is on the family token that follows the vendor prefix.
# Sources: NVIDIA CUDA GPU compute capability table.
_FAMILY_ARCH: dict[str, str] = {
    # Ampere
    "A100": "sm_80",
    "A30": "sm_80",
    "A800": "sm_80",
    "A10": "sm_86",
    "A10G": "sm_86",
    "A16": "sm_86",
    "A40": "sm_86",
    "A2": "sm_86",
    "RTX-A6000": "sm_86",
    # Ada Lovelace
    "L4": "sm_89",
    "L20": "sm_89",
    "L40": "sm_89",
    "L40S": "sm_89",
    "RTX-4090": "sm_89",
    "RTX-6000-Ada": "sm_89",
    # Hopper
    "H100": "sm_90",
    "H200": "sm_90",
    "H20": "sm_90",
    "H800": "sm_90",
    "GH200": "sm_90",
    # Blackwell
    "B200": "sm_100",
    "B100": "sm_100",
    "GB200": "sm_100",
    "B300": "sm_103",
    "GB300": "sm_103",
    "RTX-PRO-6000": "sm_120",
}

# The oldest architecture each precision runs on (TensorRT-LLM's support matrix): bfloat16
# needs Ampere (sm_80) tensor cores, FP8 needs Ada (sm_89) or Hopper. The weight-only modes
# (int8/int4 weights) run with bfloat16 activations in the builder, so they need sm_80 too,
# as does SmoothQuant (INT8 GEMMs, bfloat16 elsewhere; TensorRT-LLM's Qwen support matrix
# says Ampere+). float16 runs on every architecture of the table above.
PRECISION_MIN_SM: dict[str, int] = {
    "bfloat16": 80,
    "int8-weight-only": 80,
    "int4-weight-only": 80,
    "int8-smoothquant": 80,
    "fp8": 89,
}
# The KV cache's own needs on top of the precision's: FP8 needs the FP8 tensor cores of Ada
# or Hopper (TensorRT-LLM's fp8 KV cache; vLLM's fp8 KV cache is refused below sm_89 too,
# rather than left to its slower emulated path); int8 adds nothing.
KV_CACHE_MIN_SM: dict[str, int] = {"fp8": 89}

_PREFIXES = ("NVIDIA-", "Tesla-", "NVIDIA-Tesla-", "NVIDIA-GeForce-")


class UnknownGPUProduct(ValueError):
    """A GPU product the architecture table does not know."""

    def __init__(self, product: str) -> None:
        self.product = product
        super().__init__(
            f"GPU product {product!r} (node label {GPU_PRODUCT_LABEL}) has no known architecture; "
            f"known families: {', '.join(sorted(_FAMILY_ARCH))}. Set spec.engine.gpuProducts to "
            "products of known architecture, or ask for the product to be added."
        )


@functools.cache  # read for every node on every pass; a product's answer never changes
def family(product: str) -> str:
    """The model family of a GPU product label, e.g. ``NVIDIA-H100-80GB-HBM3`` -> ``H100``."""
    rest = product
    for prefix in sorted(_PREFIXES, key=len, reverse=True):
        if rest.startswith(prefix):
            rest = rest[len(prefix) :]
            break
    # Longest family first, so "L40S" wins over "L40" and "A100" over "A10".
    for name in sorted(_FAMILY_ARCH, key=len, reverse=True):
        if rest == name or re.match(re.escape(name) + r"(?:[-_ ]|$)", rest):
            return name
    raise UnknownGPUProduct(product)


def architecture(product: str) -> str:
    """SM architecture of a GPU product label, e.g. ``NVIDIA-L20`` -> ``sm_89``."""
    return _FAMILY_ARCH[family(product)]


def sm_number(arch: str) -> int:
    """``sm_90a`` -> 90, ``sm_100`` -> 100."""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    return int(digits) if digits else 0


def precision_unsupported(precision: str, arch: str) -> str | None:
    """Why an engine of this precision cannot run on this architecture, or None if it can."""
    needed = PRECISION_MIN_SM.get(precision)
    if needed is None or sm_number(arch) >= needed:
        return None
    return f"{precision} needs sm_{needed} or newer"


def kv_cache_unsupported(kv_cache_type: str, arch: str) -> str | None:
    """Why a KV cache of this type cannot run on this architecture, or None if it can."""
    needed = KV_CACHE_MIN_SM.get(kv_cache_type)
    if needed is None or sm_number(arch) >= needed:
        return None
    return f"{kv_cache_type} needs sm_{needed} or newer"


@dataclass(frozen=True)
class GPUNode:
    """What the operator needs to know of a node to place engines and serving pods."""

    name: str
    product: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    ready: bool
    gpus: int

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> GPUNode | None:
        """A GPUNode from a Node object (a dict), or None if the node has no GPU product label."""
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        product = labels.get(GPU_PRODUCT_LABEL)
        if not product:
            return None
        status = node.get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        spec = node.get("spec") or {}
        allocatable = status.get("allocatable") or {}
        try:
            gpus = int(str(allocatable.get(GPU_RESOURCE, "0")))
        except ValueError:
            gpus = 0
        return cls(
            name=meta.get("name", ""),
            product=product,
            labels=labels,
            taints=tuple(spec.get("taints") or ()),
            ready=conditions.get("Ready") == "True" and not spec.get("unschedulable", False),
            gpus=gpus,
        )


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True  # PreferNoSchedule does not keep pods off
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        op = tol.get("operator", "Equal")
        if not tol.get("key"):
            if op == "Exists":
                return True
            continue
        if tol.get("key") != taint.get("key"):
            continue
        if op == "Exists" or tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def _matches_expression(labels: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and values:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _term_matches(node: GPUNode, term: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # the API: an empty node selector term matches no objects
    node_fields = {"metadata.name": node.name}
    return all(_matches_expression(node.labels, e) for e in expressions) and all(
        _matches_expression(node_fields, f) for f in fields
    )


def _required_affinity_allows(node: GPUNode, affinity: Mapping[str, Any]) -> bool:
    node_affinity = (affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return True
    # Terms are ORed; requirements within a term are ANDed (as the scheduler reads them).
    return any(_term_matches(node, term) for term in terms)


def eligible(
    node: GPUNode,
    node_selector: Mapping[str, str],
    tolerations: Iterable[Mapping[str, Any]],
    affinity: Mapping[str, Any],
    gpus_needed: int,
) -> bool:
    """Could a serving pod with these constraints land on this node?"""
    if not node.ready or node.gpus < gpus_needed:
        return False
    if any(node.labels.get(k) != v for k, v in node_selector.items()):
        return False
    tolerations = list(tolerations)
    if not all(_tolerated(t, tolerations) for t in node.taints):
        return False
    return _required_affinity_allows(node, affinity)


# (ids of the nodes, the constraints) -> (those nodes, the eligible ones); the nodes are kept
# so that their ids stay theirs. Bounded: one entry per distinct placement of the services.
_ELIGIBLE: collections.OrderedDict[tuple[tuple[int, ...], str], tuple[tuple[GPUNode, ...], ...]]
_ELIGIBLE = collections.OrderedDict()
_ELIGIBLE_ENTRIES = 256


def eligible_nodes(
    nodes: Iterable[GPUNode],
    node_selector: Mapping[str, str],
    tolerations: Iterable[Mapping[str, Any]],
    affinity: Mapping[str, Any],
    gpus_needed: int,
) -> tuple[GPUNode, ...]:
    """The nodes a serving pod with these constraints could land on (:func:`eligible`),
    remembered for the same node objects and constraints: every pass of every service asks
    it of every node, and the nodes change far less often than passes run."""
    nodes = tuple(nodes)
    tolerations = list(tolerations)
    constraints = json.dumps(
        [dict(node_selector), tolerations, dict(affinity or {}), gpus_needed],
        sort_keys=True,
        default=str,
    )
    key = (tuple(map(id, nodes)), constraints)
    hit = _ELIGIBLE.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], nodes, strict=True)):
        _ELIGIBLE.move_to_end(key)
        return hit[1]
    found = tuple(
        n for n in nodes if eligible(n, node_selector, tolerations, affinity, gpus_needed)
    )
    _ELIGIBLE[key] = (nodes, found)
    while len(_ELIGIBLE) > _ELIGIBLE_ENTRIES:
        _ELIGIBLE.popitem(last=False)
    return found
