"""GPU products -> architectures, and whether a serving pod could land on a node."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from cosyvoice_operator.api import gpus
from cosyvoice_operator.api.gpus import GPUNode, UnknownGPUProduct, architecture
from tests.unit.objects import node

# Values of nvidia.com/gpu.product as GPU feature discovery writes them on real nodes.
PRODUCT_ARCH = [
    # Ampere
    ("NVIDIA-A100-SXM4-80GB", "sm_80"),
    ("NVIDIA-A100-SXM4-40GB", "sm_80"),
    ("NVIDIA-A100-PCIE-40GB", "sm_80"),
    ("NVIDIA-A100-80GB-PCIe", "sm_80"),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "sm_80"),
    ("NVIDIA-A800-SXM4-80GB", "sm_80"),
    ("NVIDIA-A30", "sm_80"),
    ("NVIDIA-A10", "sm_86"),
    ("NVIDIA-A10G", "sm_86"),
    ("NVIDIA-A40", "sm_86"),
    ("NVIDIA-A16", "sm_86"),
    ("NVIDIA-A2", "sm_86"),
    ("NVIDIA-RTX-A6000", "sm_86"),
    # Ada Lovelace
    ("NVIDIA-L20", "sm_89"),
    ("NVIDIA-L4", "sm_89"),
    ("NVIDIA-L40", "sm_89"),
    ("NVIDIA-L40S", "sm_89"),
    ("NVIDIA-GeForce-RTX-4090", "sm_89"),
    ("NVIDIA-RTX-6000-Ada-Generation", "sm_89"),
    # Hopper
    ("NVIDIA-H100-80GB-HBM3", "sm_90"),
    ("NVIDIA-H100-PCIe", "sm_90"),
    ("NVIDIA-H100-NVL", "sm_90"),
    ("NVIDIA-H200", "sm_90"),
    ("NVIDIA-H200-NVL", "sm_90"),
    ("NVIDIA-H20", "sm_90"),
    ("NVIDIA-H800", "sm_90"),
    ("NVIDIA-GH200-480GB", "sm_90"),
    # Blackwell
    ("NVIDIA-B200", "sm_100"),
    ("NVIDIA-GB200", "sm_100"),
    ("NVIDIA-B300-SXM6-AC", "sm_103"),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", "sm_120"),
]


@pytest.mark.parametrize(("product", "arch"), PRODUCT_ARCH)
def test_architecture_of_real_product_labels(product: str, arch: str) -> None:
    assert architecture(product) == arch


@pytest.mark.parametrize(
    ("product", "arch"),
    [
        # A family that is a prefix of another must not capture it, in either direction.
        ("NVIDIA-A10", "sm_86"),
        ("NVIDIA-A10G", "sm_86"),
        ("NVIDIA-A100-PCIE-40GB", "sm_80"),
        ("NVIDIA-L4", "sm_89"),
        ("NVIDIA-L40S", "sm_89"),
        ("NVIDIA-B200", "sm_100"),
        ("NVIDIA-GB200", "sm_100"),
        ("NVIDIA-B300", "sm_103"),
    ],
)
def test_families_sharing_a_prefix_are_told_apart(product: str, arch: str) -> None:
    assert architecture(product) == arch


@pytest.mark.parametrize(
    "product",
    [
        "Tesla-T4",  # Turing (sm_75): not supported, so not in the table
        "Tesla-V100-SXM2-16GB",
        "NVIDIA-Tesla-P100-PCIE-16GB",
        "NVIDIA-GeForce-RTX-3090",  # a real sm_86 part, but not in the table: never guessed
        "NVIDIA-A1000",  # "A100" followed by more digits is another product
        "NVIDIA-H2000",
        "NVIDIA-L400",
        "NVIDIA-X1",
        "AMD-MI300X",
        "nvidia-l20",  # labels are case-sensitive; no guessing
        "",
    ],
)
def test_unknown_products_raise_and_are_never_guessed(product: str) -> None:
    with pytest.raises(UnknownGPUProduct) as info:
        architecture(product)
    assert info.value.product == product
    message = str(info.value)
    assert repr(product) in message
    assert "nvidia.com/gpu.product" in message
    assert "spec.engine.gpuProducts" in message  # says what to do


def test_unknown_gpu_product_is_a_value_error() -> None:
    assert issubclass(UnknownGPUProduct, ValueError)


# ---- GPUNode.from_node ------------------------------------------------------------------


def test_from_node_reads_product_gpus_taints_and_readiness() -> None:
    taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    n = GPUNode.from_node(node("l20-a", "NVIDIA-L20", gpus=4, taints=[taint]))
    assert n is not None
    assert n.name == "l20-a"
    assert n.product == "NVIDIA-L20"
    assert n.gpus == 4
    assert n.ready is True
    assert n.taints == (taint,)
    assert n.labels["nvidia.com/gpu.product"] == "NVIDIA-L20"


def test_from_node_without_product_label_is_none() -> None:
    assert GPUNode.from_node(node("cpu-0", product=None)) is None
    assert GPUNode.from_node({"metadata": {"name": "bare"}}) is None
    assert GPUNode.from_node({}) is None


@pytest.mark.parametrize(
    ("ready", "unschedulable", "expected"),
    [
        ("True", False, True),
        ("False", False, False),
        ("Unknown", False, False),
        ("True", True, False),  # cordoned
    ],
)
def test_from_node_ready_means_ready_and_schedulable(
    ready: str, unschedulable: bool, expected: bool
) -> None:
    n = GPUNode.from_node(node(ready=ready, unschedulable=unschedulable))
    assert n is not None
    assert n.ready is expected


def test_from_node_without_ready_condition_is_not_ready() -> None:
    raw = node()
    raw["status"]["conditions"] = []
    n = GPUNode.from_node(raw)
    assert n is not None
    assert n.ready is False


@pytest.mark.parametrize(("allocatable", "expected"), [(None, 0), ("0", 0), ("8", 8), ("x", 0)])
def test_from_node_gpu_count_from_allocatable(allocatable: str | None, expected: int) -> None:
    n = GPUNode.from_node(node(gpus=allocatable))
    assert n is not None
    assert n.gpus == expected


# ---- eligible ---------------------------------------------------------------------------


def _eligible(
    raw: Mapping[str, Any],
    *,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
    affinity: Mapping[str, Any] | None = None,
    gpus_needed: int = 1,
) -> bool:
    n = GPUNode.from_node(raw)
    assert n is not None
    return gpus.eligible(n, node_selector or {}, tolerations, affinity or {}, gpus_needed)


def test_plain_ready_gpu_node_is_eligible() -> None:
    assert _eligible(node())


@pytest.mark.parametrize(
    ("raw", "gpus_needed", "expected"),
    [
        (node(ready="False"), 1, False),
        (node(unschedulable=True), 1, False),
        (node(gpus=2), 2, True),
        (node(gpus=2), 4, False),
        (node(gpus=0), 1, False),
        (node(gpus=None), 1, False),
    ],
    ids=["not-ready", "cordoned", "enough-gpus", "too-few-gpus", "zero-gpus", "no-gpu-resource"],
)
def test_eligible_needs_ready_node_with_enough_gpus(
    raw: dict[str, Any], gpus_needed: int, expected: bool
) -> None:
    assert _eligible(raw, gpus_needed=gpus_needed) is expected


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ({}, True),
        ({"pool": "tts"}, True),
        ({"pool": "tts", "nvidia.com/gpu.product": "NVIDIA-L20"}, True),
        ({"pool": "batch"}, False),
        ({"zone": "a"}, False),  # label absent
        ({"pool": "tts", "zone": "a"}, False),  # every entry must match
    ],
)
def test_eligible_node_selector(selector: dict[str, str], expected: bool) -> None:
    assert _eligible(node(labels={"pool": "tts"}), node_selector=selector) is expected


DEDICATED = {"key": "dedicated", "value": "tts", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("taint", "tolerations", "expected"),
    [
        (DEDICATED, [], False),
        (DEDICATED, [{"key": "dedicated", "operator": "Equal", "value": "tts"}], True),
        (DEDICATED, [{"key": "dedicated", "value": "tts"}], True),  # Equal is the default
        (DEDICATED, [{"key": "dedicated", "value": "other"}], False),
        (DEDICATED, [{"key": "dedicated", "operator": "Exists"}], True),
        (DEDICATED, [{"key": "other", "operator": "Exists"}], False),
        (
            DEDICATED,
            [{"key": "dedicated", "value": "tts", "effect": "NoSchedule"}],
            True,
        ),
        (
            DEDICATED,
            [{"key": "dedicated", "value": "tts", "effect": "NoExecute"}],
            False,  # a toleration of another effect does not count
        ),
        (DEDICATED, [{"operator": "Exists"}], True),  # empty key + Exists tolerates everything
        (DEDICATED, [{"key": "", "operator": "Exists"}], True),
        (DEDICATED, [{"operator": "Exists", "effect": "NoExecute"}], False),
        (DEDICATED, [{"key": "", "operator": "Equal", "value": "tts"}], False),
        (
            {"key": "maintenance", "effect": "NoExecute"},
            [],
            False,
        ),
        (
            {"key": "maintenance", "effect": "NoExecute"},
            [{"key": "maintenance", "operator": "Exists", "effect": "NoExecute"}],
            True,
        ),
        (
            {"key": "maintenance", "effect": "NoExecute"},
            [
                {
                    "key": "maintenance",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 30,
                }
            ],
            True,
        ),
        ({"key": "soft", "value": "x", "effect": "PreferNoSchedule"}, [], True),
        # a taint without value is matched by an Equal toleration without value
        ({"key": "gpu", "effect": "NoSchedule"}, [{"key": "gpu", "operator": "Equal"}], True),
    ],
)
def test_eligible_taints_and_tolerations(
    taint: dict[str, Any], tolerations: list[dict[str, Any]], expected: bool
) -> None:
    assert _eligible(node(taints=[taint]), tolerations=tolerations) is expected


def test_every_hard_taint_must_be_tolerated() -> None:
    taints = [DEDICATED, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    one = [{"key": "dedicated", "value": "tts"}]
    both = [*one, {"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert not _eligible(node(taints=taints), tolerations=one)
    assert _eligible(node(taints=taints), tolerations=both)


def _required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": exprs} for exprs in terms]
            }
        }
    }


LABELS = {"pool": "tts", "gpu-memory-gb": "48", "zone": "a"}


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ({"key": "pool", "operator": "In", "values": ["tts", "asr"]}, True),
        ({"key": "pool", "operator": "In", "values": ["asr"]}, False),
        ({"key": "absent", "operator": "In", "values": ["x"]}, False),
        ({"key": "pool", "operator": "NotIn", "values": ["asr"]}, True),
        ({"key": "pool", "operator": "NotIn", "values": ["tts"]}, False),
        ({"key": "absent", "operator": "NotIn", "values": ["x"]}, True),
        ({"key": "pool", "operator": "Exists"}, True),
        ({"key": "absent", "operator": "Exists"}, False),
        ({"key": "absent", "operator": "DoesNotExist"}, True),
        ({"key": "pool", "operator": "DoesNotExist"}, False),
        ({"key": "gpu-memory-gb", "operator": "Gt", "values": ["40"]}, True),
        ({"key": "gpu-memory-gb", "operator": "Gt", "values": ["48"]}, False),
        ({"key": "gpu-memory-gb", "operator": "Lt", "values": ["80"]}, True),
        ({"key": "gpu-memory-gb", "operator": "Lt", "values": ["48"]}, False),
        ({"key": "absent", "operator": "Gt", "values": ["1"]}, False),
        ({"key": "pool", "operator": "Gt", "values": ["1"]}, False),  # not an integer
        ({"key": "pool", "operator": "Bogus", "values": ["tts"]}, False),
    ],
)
def test_eligible_required_node_affinity_operators(expr: dict[str, Any], expected: bool) -> None:
    assert _eligible(node(labels=LABELS), affinity=_required([expr])) is expected


def test_required_affinity_expressions_are_anded_terms_ored() -> None:
    match = {"key": "pool", "operator": "In", "values": ["tts"]}
    miss = {"key": "zone", "operator": "In", "values": ["b"]}
    raw = node(labels=LABELS)
    assert not _eligible(raw, affinity=_required([match, miss]))
    assert _eligible(raw, affinity=_required([miss], [match]))
    assert not _eligible(raw, affinity=_required([miss], [miss]))


def test_preferred_affinity_and_pod_affinity_do_not_exclude() -> None:
    affinity = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 1,
                    "preference": {
                        "matchExpressions": [
                            {"key": "pool", "operator": "In", "values": ["nowhere"]}
                        ]
                    },
                }
            ]
        },
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []},
    }
    assert _eligible(node(labels=LABELS), affinity=affinity)


def test_empty_node_selector_term_matches_no_node() -> None:
    affinity: dict[str, Any] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}
        }
    }
    assert not _eligible(node(labels=LABELS), affinity=affinity)


def test_match_fields_on_node_name_is_honoured() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["other-node"]}
                        ]
                    }
                ]
            }
        }
    }
    assert not _eligible(node("gpu-0", labels=LABELS), affinity=affinity)


def test_eligible_nodes_is_eligible_of_each_and_answers_again_for_new_nodes() -> None:
    def nodes(*ready: str) -> list[GPUNode]:
        found = (GPUNode.from_node(node(f"gpu-{i}", ready=r)) for i, r in enumerate(ready))
        return [n for n in found if n is not None]

    first = nodes("True", "False", "True")
    want = [n for n in first if gpus.eligible(n, {}, (), {}, 1)]
    assert list(gpus.eligible_nodes(first, {}, (), {}, 1)) == want
    assert gpus.eligible_nodes(first, {}, (), {}, 1) is gpus.eligible_nodes(first, {}, (), {}, 1)
    assert gpus.eligible_nodes(first, {"zone": "a"}, (), {}, 1) == ()  # other constraints
    later = nodes("True", "True", "True")  # the same names, new objects: asked again
    assert len(gpus.eligible_nodes(later, {}, (), {}, 1)) == 3
