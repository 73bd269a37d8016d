"""What the API server stores for a minimal CosyVoiceService: every CRD default filled in.

One constant for two tests, so the CRD's defaults and spec.py's cannot drift apart: the CRD
test checks the real API server stores exactly this for a spec of only `model`, and the spec
test checks that spec.parse reads it as it reads the minimal spec.
"""

from __future__ import annotations

import copy
from typing import Any

_DEFAULTS: dict[str, Any] = {
    "engine": {
        "precision": "bfloat16",
        "tensorParallelSize": 1,
        "maxBatchSize": 16,
        "maxNumTokens": 32768,
        "builderImage": "",
        "cacheClaimName": "cosyvoice-engines",
        "gpuProducts": [],
        "kvCacheType": "auto",
    },
    "serving": {
        "image": "",
        "gpusPerReplica": 1,
        "instancesPerGpu": 4,
        "streaming": True,
        "dynamicBatching": {
            "preferredBatchSizes": [4, 8, 16],
            "maxQueueDelayMicroseconds": 500,
            "priorityLevels": 2,
        },
        "resources": {},
        "streamChunking": {"firstChunkTokens": 15, "hopGrowth": "exponential"},
    },
    "replicas": 1,
    "autoscaling": {
        "enabled": False,
        "mode": "Active",
        "minReplicas": 1,
        "maxReplicas": 4,
        "targetQueueLatencyMilliseconds": 50,
        "evaluationIntervalSeconds": 15,
        "scaleUp": {"stabilizationWindowSeconds": 0, "maxStepReplicas": 4},
        "scaleDown": {"stabilizationWindowSeconds": 300, "maxStepReplicas": 1},
        "slo": {
            "firstAudioMilliseconds": 0,
            "attainmentPercent": 99,
            "firstChunkMilliseconds": 0,
            "coldStartSeconds": 180,
            "forecastStdDevs": 1,
            "variability": 1,
            "slotsPerPod": 0,
            "seasonalPeriodHours": 0,
            "seasonalBucketMinutes": 15,
            "seasonalFloorPercent": 100,
            "scaleDownHysteresisPercent": 10,
        },
        "prometheusUrl": "",
    },
    "routing": {
        "mode": "Router",
        "router": {"replicas": 2, "queueTimeoutSeconds": 0, "image": "", "resources": {}},
        "gateway": {},
    },
}


def stored_minimal_spec(model: dict[str, Any]) -> dict[str, Any]:
    """The stored spec of ``{"model": model}`` (model holding variant and uri)."""
    return {
        "model": {**model, "revision": "", "credentialsSecret": "", "llmRuntime": "tensorrt-llm"},
        **copy.deepcopy(_DEFAULTS),
    }
