"""The CosyVoiceService CRD as a real kube-apiserver enforces it.

Everything here is answered by the API server itself (schema, defaults, enums, ranges, CEL
`x-kubernetes-validations`, strict field validation, printer columns, subresources): no mocks.
The session fixture `cluster` (tests/conftest.py) starts the control plane and installs
crds/ before the tests run. Static checks of the CRD file, no cluster needed, are in
``tests/static/test_crd_schema.py``.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.api_defaults import stored_minimal_spec
from tests.conftest import Cluster
from tests.crd_cases import (
    API_VERSION,
    BASE_SPEC,
    CRD_NAME,
    EXAMPLES,
    INVALID_SPECS,
    KIND,
    Json,
    merge_patch,
    schedule,
)

# ---------------------------------------------------------------------------------------
# Against the API server


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> str:
    return cluster.namespace("crd-validation")


def _manifest(name: str, spec: Json) -> str:
    return json.dumps(
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}
    )


def _create(
    cluster: Cluster, namespace: str, name: str, spec: Json
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(
        "create",
        "--validate=strict",
        "-n",
        namespace,
        "-o",
        "json",
        "-f",
        "-",
        input=_manifest(name, spec),
        check=False,
    )


def _get(cluster: Cluster, namespace: str, name: str) -> Json:
    result = cluster.kubectl("get", "cosyvoiceservices", name, "-n", namespace, "-o", "json")
    obj = json.loads(result.stdout)
    assert isinstance(obj, dict)
    return obj


def _contains(actual: Any, expected: Any) -> bool:
    """Whether `expected` is `actual` minus defaults: dicts may gain keys, lists keep length."""
    if isinstance(expected, dict):
        return isinstance(actual, dict) and all(
            key in actual and _contains(actual[key], value) for key, value in expected.items()
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_contains(a, e) for a, e in zip(actual, expected, strict=True))
        )
    return bool(actual == expected)


def _eventually(
    check: Callable[[], subprocess.CompletedProcess[str]],
    *,
    timeout: float = 60.0,
    interval: float = 1.0,
) -> subprocess.CompletedProcess[str]:
    """Retry a kubectl call until it succeeds (the API server publishes OpenAPI lazily)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result.returncode == 0 or time.monotonic() > deadline:
            return result
        time.sleep(interval)


@pytest.mark.cluster
def test_crd_is_established_and_structural(cluster: Cluster) -> None:
    cluster.local.wait_established(CRD_NAME)
    crd = json.loads(cluster.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NamesAccepted") == "True"
    assert "NonStructuralSchema" not in conditions
    assert crd["status"]["acceptedNames"]["shortNames"] == ["cvs"]
    assert crd["status"]["acceptedNames"]["categories"] == ["cosyvoice"]


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("cosyvoiceservices.spec.engine.precision", ["Weight and compute precision", "fp8"]),
        ("cvs.spec.serving.gpusPerReplica", ["multiple of", "tensorParallelSize"]),
        ("cvs.spec.model.uri", ["hf://ORG/NAME", "pvc://CLAIM/PATH"]),
        ("cvs.spec.speakers.default", ["no reference audio", "engine identity"]),
        ("cvs.spec.speakers.default.audioUri", ["pvc://CLAIM/PATH", "WAV"]),
        ("cvs.spec.autoscaling.schedules.start", ["HH:MM"]),
        ("cvs.status.engines.gpuArch", ["sm_90"]),
    ],
)
@pytest.mark.cluster
def test_kubectl_explain_prints_the_description(
    cluster: Cluster, field: str, expected: list[str]
) -> None:
    result = _eventually(lambda: cluster.kubectl("explain", field, check=False))
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # explain wraps long lines
    for substring in expected:
        assert substring in text, f"{substring!r} not in `kubectl explain {field}`:\n{text}"


@pytest.mark.parametrize("example", EXAMPLES, ids=[path.stem for path in EXAMPLES])
@pytest.mark.cluster
def test_example_is_accepted_as_written(cluster: Cluster, namespace: str, example: Path) -> None:
    result = cluster.kubectl(
        "create",
        "--validate=strict",
        "-n",
        namespace,
        "-o",
        "json",
        "-f",
        str(example),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load(example.read_text())
    stored = _get(cluster, namespace, written["metadata"]["name"])
    # Nothing pruned or rewritten: the stored spec contains the example's spec verbatim.
    assert _contains(stored["spec"], written["spec"]), json.dumps(stored["spec"], indent=2)


@pytest.mark.cluster
def test_base_spec_of_the_invalid_cases_is_valid(cluster: Cluster, namespace: str) -> None:
    result = _create(cluster, namespace, "valid-base", BASE_SPEC)
    assert result.returncode == 0, result.stderr


@pytest.mark.cluster
def test_minimal_spec_gets_every_default(cluster: Cluster, namespace: str) -> None:
    model = {"variant": "cosyvoice2", "uri": "hf://yuekai/cosyvoice2_llm"}
    result = _create(cluster, namespace, "minimal", {"model": model})
    assert result.returncode == 0, result.stderr
    assert _get(cluster, namespace, "minimal")["spec"] == stored_minimal_spec(model)


@pytest.mark.cluster
def test_schedule_defaults(cluster: Cluster, namespace: str) -> None:
    result = _create(cluster, namespace, "schedule-defaults", BASE_SPEC)
    assert result.returncode == 0, result.stderr
    stored = _get(cluster, namespace, "schedule-defaults")["spec"]["autoscaling"]["schedules"]
    assert stored == [
        {
            "name": "business-hours",
            "daysOfWeek": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"],
            "start": "08:00",
            "end": "18:00",
            "timezone": "UTC",
            "minReplicas": 2,
        }
    ]


# (id, merge patch applied to BASE_SPEC): values at the edge of what the schema allows.
VALID_SPECS: list[tuple[str, Json]] = [
    ("uri-s3", {"model": {"uri": "s3://tts-models/cosyvoice3/2512/"}}),
    ("uri-pvc", {"model": {"uri": "pvc://model-store/cosyvoice3"}}),
    ("uri-hf-dots", {"model": {"uri": "hf://yuekai/Fun-CosyVoice3-0.5B-2512-LLM-HF"}}),
    (
        "tensor-parallel-2-on-4-gpus",
        {"engine": {"tensorParallelSize": 2}, "serving": {"gpusPerReplica": 4}},
    ),
    (
        "small-engine-small-batches",
        {
            "engine": {"maxBatchSize": 4},
            "serving": {"dynamicBatching": {"preferredBatchSizes": [1, 2, 4]}},
        },
    ),
    ("no-preferred-batch-sizes", {"serving": {"dynamicBatching": {"preferredBatchSizes": []}}}),
    (
        "scale-to-zero-floor",
        {"autoscaling": {"minReplicas": 0, "maxReplicas": 1, "schedules": None}},
    ),
    (
        "schedule-past-midnight-at-max",
        {"autoscaling": {"schedules": schedule(start="22:00", end="06:00", minReplicas=4)}},
    ),
    ("fractional-target", {"autoscaling": {"targetQueueLatencyMilliseconds": 0.5}}),
    ("zero-replicas", {"replicas": 0}),
    (
        "fp8-kv-cache-on-four-gpus",
        {
            "engine": {"precision": "float16", "kvCacheType": "fp8", "tensorParallelSize": 2},
            "serving": {"gpusPerReplica": 4},
        },
    ),
    (
        "smoothquant-per-tensor-with-int8-kv-cache",
        {
            "engine": {
                "precision": "int8-smoothquant",
                "kvCacheType": "int8",
                "smoothQuant": {"alpha": 0.8, "perToken": False, "perChannel": False},
            }
        },
    ),
    ("fp8-engine-with-fp8-kv-cache", {"engine": {"precision": "fp8", "kvCacheType": "fp8"}}),
    (
        "queue-policy-with-priorities",
        {
            "serving": {
                "dynamicBatching": {"priorityLevels": 2},
                "queuePolicy": {
                    "maxQueueSize": 32,
                    "defaultTimeoutMicroseconds": 2000000,
                    "timeoutAction": "Reject",
                    "priorityPolicies": [
                        {"priorityLevel": 1, "defaultTimeoutMicroseconds": 0},
                        {"priorityLevel": 2, "maxQueueSize": 4, "timeoutAction": "Delay"},
                    ],
                },
            }
        },
    ),
    (
        "small-first-chunk-equal-hops",
        {"serving": {"streamChunking": {"firstChunkTokens": 5, "hopGrowth": "equal"}}},
    ),
    (
        "resources-and-scheduling",
        {
            "serving": {
                "resources": {
                    "requests": {"cpu": 8, "memory": "32Gi"},
                    "limits": {"memory": "48Gi"},
                },
                "nodeSelector": {"topology.kubernetes.io/zone": "zone-a"},
                "tolerations": [
                    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
                ],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "In", "values": ["tts"]}
                                    ]
                                }
                            ]
                        }
                    }
                },
            }
        },
    ),
    (
        "default-speaker",
        {
            "speakers": {
                "default": {
                    "audioUri": "pvc://voices/narrators/ann-2.wav",
                    "transcript": "Hello, this costs $5 (or $(five)) — 你好。",
                }
            }
        },
    ),
]


@pytest.mark.parametrize(
    ("case_id", "patch"), VALID_SPECS, ids=[case_id for case_id, _ in VALID_SPECS]
)
@pytest.mark.cluster
def test_edge_values_are_accepted(
    cluster: Cluster, namespace: str, case_id: str, patch: Json
) -> None:
    spec = merge_patch(BASE_SPEC, patch)
    result = _create(cluster, namespace, f"ok-{case_id}", spec)
    assert result.returncode == 0, result.stderr
    assert _contains(_get(cluster, namespace, f"ok-{case_id}")["spec"], spec)


def _assert_rejected(result: subprocess.CompletedProcess[str], expected: list[str]) -> None:
    assert result.returncode != 0, f"accepted, should have been rejected:\n{result.stdout}"
    # Both forms are the API server's answer (422 Invalid / 400 BadRequest), not a
    # client-side check of kubectl (those start with "error:").
    assert "is invalid" in result.stderr or "Error from server" in result.stderr, result.stderr
    for substring in expected:
        assert substring in result.stderr, f"{substring!r} not in:\n{result.stderr}"


@pytest.mark.parametrize(
    ("case_id", "patch", "expected"),
    INVALID_SPECS,
    ids=[case_id for case_id, _, _ in INVALID_SPECS],
)
@pytest.mark.cluster
def test_invalid_spec_is_rejected_by_the_api_server(
    cluster: Cluster, namespace: str, case_id: str, patch: Json, expected: list[str]
) -> None:
    name = f"bad-{case_id}"[:63]
    _assert_rejected(_create(cluster, namespace, name, merge_patch(BASE_SPEC, patch)), expected)


@pytest.mark.cluster
def test_name_must_be_a_dns_label(cluster: Cluster, namespace: str) -> None:
    # A valid Kubernetes object name (DNS subdomain) that cannot name a Service.
    _assert_rejected(
        _create(cluster, namespace, "zh.tts", BASE_SPEC), ["metadata.name must be a DNS-1035 label"]
    )


@pytest.mark.cluster
def test_missing_spec_is_rejected(cluster: Cluster, namespace: str) -> None:
    result = cluster.kubectl(
        "create",
        "--validate=strict",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps(
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "no-spec"}}
        ),
        check=False,
    )
    _assert_rejected(result, ["spec", "Required value"])


def _patch_status(
    cluster: Cluster, namespace: str, name: str, status: Json
) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl(
        "patch",
        "cosyvoiceservices",
        name,
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        check=False,
    )


STATUS: Json = {
    "observedGeneration": 1,
    "phase": "Ready",
    "replicas": 2,
    "readyReplicas": 2,
    "selector": "app.kubernetes.io/name=cosyvoice,app.kubernetes.io/instance=columns",
    "readySummary": "2/2",
    "engineSummary": "Ready",
    "conditions": [
        {
            "type": "Available",
            "status": "True",
            "reason": "ReplicasReady",
            "message": "2 of 2 replicas ready",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 1,
        }
    ],
    "engines": [
        {
            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            "gpuArch": "sm_90",
            "key": "0123456789abcdef",
            "state": "Ready",
            "job": "columns-engine-0123456789",
            "message": "",
            "attempts": 1,
        }
    ],
    "autoscaling": {
        "desiredReplicas": 2,
        "lastQueueLatencyMilliseconds": 12.5,
        "lastEvaluationTime": "2026-01-01T00:00:00Z",
        "lastEvaluation": {"time": "2026-01-01T00:00:00Z", "replicas": 2, "reason": "holding"},
        "specReplicas": 1,
        "lastDecision": {
            "time": "2026-01-01T00:00:00Z",
            "from": 1,
            "to": 2,
            "reason": "queue latency above target",
            "inputs": {"queueLatencyMilliseconds": 80.0, "pendingRequests": 6},
        },
    },
    "endpoints": {
        "grpc": "columns.ns.svc:8001",
        "http": "columns.ns.svc:8000",
        "metrics": "http://columns.ns.svc:8002/metrics",
    },
}


@pytest.mark.cluster
def test_printer_columns_and_status_subresource(cluster: Cluster, namespace: str) -> None:
    assert _create(cluster, namespace, "columns", BASE_SPEC).returncode == 0

    header = cluster.kubectl("get", "cvs", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "VARIANT", "PHASE", "READY", "QUEUE-MS", "ENGINE", "AGE"]
    wide = cluster.kubectl("get", "cvs", "-n", namespace, "-o", "wide").stdout.splitlines()[0]
    assert wide.split() == [
        "NAME",
        "VARIANT",
        "PHASE",
        "READY",
        "QUEUE-MS",
        "ENGINE",
        "PRECISION",
        "GPUS",
        "MIN",
        "MAX",
        "AUTOSCALER",
        "AGE",
    ]

    # status is a subresource: the main resource ignores it, /status accepts the full shape.
    cluster.kubectl(
        "patch",
        "cvs",
        "columns",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Failed"}}),
    )
    assert "status" not in _get(cluster, namespace, "columns")
    result = _patch_status(cluster, namespace, "columns", STATUS)
    assert result.returncode == 0, result.stderr
    assert _get(cluster, namespace, "columns")["status"] == STATUS

    row = cluster.kubectl(
        "get", "cvs", "columns", "-n", namespace, "-o", "wide", "--no-headers"
    ).stdout.split()
    assert row[:-1] == [
        "columns",
        "cosyvoice3",
        "Ready",
        "2/2",
        "12.5",
        "Ready",
        "bfloat16",
        "1",
        "1",
        "4",
        "holding",
    ]


INVALID_STATUSES: list[tuple[str, Json, list[str]]] = [
    ("phase", {"phase": "Running"}, ["status.phase", "Unsupported value"]),
    (
        "engine-state",
        {"engines": [{"gpuProduct": "NVIDIA-L20", "state": "Done"}]},
        ["status.engines[0].state", "Unsupported value"],
    ),
    (
        "condition-status",
        {"conditions": [{"type": "Available", "status": "Yes"}]},
        ["status.conditions[0].status", "Unsupported value"],
    ),
    # Issue 21 L3: a desired count that would have the operator loop for minutes.
    (
        "desired-replicas-huge",
        {"autoscaling": {"desiredReplicas": 2**31 - 1}},
        ["status.autoscaling.desiredReplicas", "less than or equal to 10000"],
    ),
    (
        "desired-replicas-negative",
        {"autoscaling": {"desiredReplicas": -5}},
        ["status.autoscaling.desiredReplicas", "greater than or equal to 0"],
    ),
]


@pytest.mark.parametrize(
    ("case_id", "status", "expected"),
    INVALID_STATUSES,
    ids=[case_id for case_id, _, _ in INVALID_STATUSES],
)
@pytest.mark.cluster
def test_invalid_status_is_rejected(
    cluster: Cluster, namespace: str, case_id: str, status: Json, expected: list[str]
) -> None:
    name = f"status-{case_id}"
    assert _create(cluster, namespace, name, BASE_SPEC).returncode == 0
    _assert_rejected(_patch_status(cluster, namespace, name, status), expected)


@pytest.mark.cluster
def test_scale_subresource(cluster: Cluster, namespace: str) -> None:
    assert _create(cluster, namespace, "scalable", BASE_SPEC).returncode == 0
    selector = "app.kubernetes.io/instance=scalable"
    assert (
        _patch_status(
            cluster, namespace, "scalable", {"replicas": 1, "selector": selector}
        ).returncode
        == 0
    )

    cluster.kubectl("scale", "cvs", "scalable", "-n", namespace, "--replicas=3")
    assert _get(cluster, namespace, "scalable")["spec"]["replicas"] == 3

    scale = json.loads(
        cluster.kubectl(
            "get",
            "--raw",
            f"/apis/{API_VERSION}/namespaces/{namespace}/cosyvoiceservices/scalable/scale",
        ).stdout
    )
    assert scale["kind"] == "Scale"
    assert scale["spec"]["replicas"] == 3
    assert scale["status"] == {"replicas": 1, "selector": selector}

    # Writes through /scale are validated against the same schema: a negative count is
    # refused by the server (kubectl scale itself would refuse it client-side).
    result = cluster.kubectl(
        "patch",
        "cvs",
        "scalable",
        "-n",
        namespace,
        "--subresource=scale",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"replicas": -1}}),
        check=False,
    )
    _assert_rejected(result, ["spec.replicas"])
    assert _get(cluster, namespace, "scalable")["spec"]["replicas"] == 3
