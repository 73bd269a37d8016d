"""Plain-data builders for the Kubernetes objects and specs the pure core reads.

Each builder returns the smallest dict the core needs, shaped as the API server returns it,
so that a test states only what it is about.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from cosyvoice_operator.api import engine_identity, labels, spec
from cosyvoice_operator.render import build_job

MINIMAL_SPEC: dict[str, Any] = {
    "model": {"variant": "cosyvoice3", "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"},
}

# The engine cache claim of the tests, as the operator reads it (name and uid).
CACHE = build_job.CacheClaim("cosyvoice-engines", "0b7e51a0-claim-uid")
T0 = dt.datetime(2025, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def raw_spec(**sections: Any) -> dict[str, Any]:
    """The minimal spec with some sections merged in (one level deep: model, engine, ...)."""
    out = copy.deepcopy(MINIMAL_SPEC)
    for name, value in sections.items():
        if isinstance(value, Mapping) and isinstance(out.get(name), Mapping):
            out[name] = {**out[name], **value}
        else:
            out[name] = value
    return out


def service(**sections: Any) -> spec.ServiceSpec:
    return spec.parse(raw_spec(**sections))


def identity(**overrides: Any) -> engine_identity.EngineIdentity:
    fields: dict[str, Any] = {
        "model_uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
        "revision": "",
        "variant": "cosyvoice3",
        "precision": "bfloat16",
        "tensor_parallel_size": 1,
        "max_batch_size": 16,
        "max_num_tokens": 32768,
        "builder_image": build_job.BuildSettings().default_builder_image,
        "gpu_arch": "sm_89",
    }
    fields.update(overrides)
    return engine_identity.EngineIdentity(**fields)


def node(
    name: str = "gpu-0",
    product: str | None = "NVIDIA-L20",
    *,
    gpus: int | str | None = 8,
    ready: str = "True",
    unschedulable: bool = False,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if product is not None:
        all_labels["nvidia.com/gpu.product"] = product
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"taints": list(taints)},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": ready},
            ],
            "allocatable": {"cpu": "64", "memory": "512Gi"},
        },
    }
    if gpus is not None:
        body["status"]["allocatable"]["nvidia.com/gpu"] = str(gpus)
    if unschedulable:
        body["spec"]["unschedulable"] = True
    return body


def _ts(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(
    ident: engine_identity.EngineIdentity,
    attempt: int,
    *,
    complete_at: dt.datetime | None = None,
    failed_at: dt.datetime | None = None,
    failed_reason: str = "BackoffLimitExceeded",
    failed_message: str = "Job has reached the specified backoff limit",
    active: int = 1,
) -> dict[str, Any]:
    """A build Job as the Job controller reports it."""
    conditions: list[dict[str, Any]] = []
    status: dict[str, Any] = {"conditions": conditions}
    if complete_at is not None:
        conditions.append(
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": _ts(complete_at)}
        )
        conditions.append(
            {"type": "Complete", "status": "True", "lastTransitionTime": _ts(complete_at)}
        )
        status["succeeded"] = 1
    elif failed_at is not None:
        conditions.append(
            {
                "type": "FailureTarget",
                "status": "True",
                "reason": failed_reason,
                "lastTransitionTime": _ts(failed_at),
            }
        )
        conditions.append(
            {
                "type": "Failed",
                "status": "True",
                "reason": failed_reason,
                "message": failed_message,
                "lastTransitionTime": _ts(failed_at),
            }
        )
        status["failed"] = 1
    else:
        status["active"] = active
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": build_job.job_name(ident, attempt, CACHE),
            "labels": {
                labels.KEY_LABEL: ident.key,
                labels.ARCH_LABEL: ident.gpu_arch,
                labels.ATTEMPT_LABEL: str(attempt),
            },
        },
        "status": status,
    }


def pod(
    name: str = "builder-pod",
    *,
    created: dt.datetime = T0,
    phase: str = "Pending",
    node_name: str = "",
    unschedulable_message: str | None = None,
    termination_message: str | None = None,
    exit_code: int = 1,
) -> dict[str, Any]:
    """A build pod: pending (optionally unschedulable), running, or terminated with a message."""
    conditions: list[dict[str, Any]] = []
    if unschedulable_message is not None:
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable_message,
            }
        )
    elif node_name:
        conditions.append({"type": "PodScheduled", "status": "True"})
    container: dict[str, Any] = {"name": build_job.CONTAINER, "state": {}}
    if phase == "Running":
        container["state"] = {"running": {"startedAt": _ts(created)}}
    if termination_message is not None:
        container["state"] = {"terminated": {"exitCode": exit_code, "message": termination_message}}
    body: dict[str, Any] = {
        "metadata": {"name": name, "creationTimestamp": _ts(created)},
        "spec": {},
        "status": {"phase": phase, "conditions": conditions, "containerStatuses": [container]},
    }
    if node_name:
        body["spec"]["nodeName"] = node_name
    return body


def record(
    ident: engine_identity.EngineIdentity, job_name: str, built_at: dt.datetime
) -> dict[str, Any]:
    return build_job.render_record(ident, "ml", job_name, "", built_at, CACHE)
