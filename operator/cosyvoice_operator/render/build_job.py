"""Engine-build Jobs, engine records and engine cleanup Jobs: the objects (pure).

One Job per engine key and attempt, named from the key (``cvs-engine-sm90-<key>-a<N>``) and
created with create-if-absent semantics: concurrent reconciles, several services wanting the
same key and operator restarts all converge on the same Job. A finished engine is recorded in
a ConfigMap of the same base name (``cvs-engine-sm90-<key>``), which outlives the Job's TTL.
Neither has an owner reference to a service: engines are shared and outlive any one service.

Two levels of retry: the Job controller retries a failed pod (``backoffLimit``, its own
exponential back-off); when the Job itself fails the operator starts a new attempt after
``retry_base_seconds * 2**(attempt-1)``, up to ``max_attempts``, then stops and says so.
Deleting the failed Jobs of a key starts over at attempt 1. Reading those Jobs back into the
state of an engine is `plan.engine_state`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cosyvoice_operator.api.engine_identity import EngineIdentity, EngineTarget, identity_to_dict
from cosyvoice_operator.api.gpus import GPU_PRODUCT_LABEL, GPU_RESOURCE, GPU_TOLERATION
from cosyvoice_operator.api.labels import (
    ARCH_LABEL,
    ATTEMPT_LABEL,
    CLAIM_ANNOTATION,
    CLAIM_LABEL,
    CLAIM_UID_ANNOTATION,
    CLEANUP_COMPONENT,
    COMPONENT_LABEL,
    COMPONENT_LABELS,
    GPU_PRODUCTS_ANNOTATION,
    IDENTITY_ANNOTATION,
    KEY_LABEL,
    MODEL_URI_ANNOTATION,
)
from cosyvoice_operator.api.spec import ServiceSpec

CACHE_MOUNT = "/engines"
MODELS_MOUNT = "/models"
CONTAINER = "builder"
# The builder exits with this code for errors that retrying cannot fix (bad input, missing
# files); the Job then fails at once instead of burning its pod retries.
EXIT_CONFIG_ERROR = 2
TERMINATION_MESSAGE_LIMIT = 4096


@dataclass(frozen=True)
class BuildSettings:
    """Operator-wide knobs of engine builds (from the operator's configuration)."""

    default_builder_image: str = "ghcr.io/cosyvoice-operator/engine-builder:0.1.0-trtllm0.20.0"
    backoff_limit: int = 2
    active_deadline_seconds: int = 4 * 3600
    ttl_seconds_after_finished: int = 24 * 3600
    max_attempts: int = 3
    retry_base_seconds: float = 60.0
    cpu_request: str = "4"
    memory_request: str = "32Gi"
    memory_limit: str = "96Gi"
    service_account: str = ""
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    image_pull_secrets: tuple[str, ...] = ()
    # sizeLimit of the build pod's /tmp (HOME, HF_HOME): the root filesystem is read-only,
    # and the kubelet evicts a pod whose scratch outgrows this, instead of filling the node.
    scratch_size: str = "64Gi"
    # (release URI, companion URI, commit): the commits upstream releases' companion
    # repositories are fetched at (COSYVOICE_COMPANION_REVISIONS); in their engines' keys.
    companion_pins: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class CacheClaim:
    """The engine cache: a PersistentVolumeClaim, by name and by uid.

    The uid tells one claim from another of the same name: a claim deleted and created
    again is empty, and what was recorded as built in the old one must not count.
    """

    claim: str
    uid: str

    @property
    def tag(self) -> str:
        """A short, label-safe tag of this claim (claim names may be longer than a label)."""
        return hashlib.sha256(f"{self.claim}/{self.uid}".encode()).hexdigest()[:6]


def base_name(identity: EngineIdentity, cache: CacheClaim) -> str:
    """The engine's name in one cache: the same key in another claim is another build."""
    return f"cvs-engine-{identity.short_name}-{cache.tag}"


def job_name(identity: EngineIdentity, attempt: int, cache: CacheClaim) -> str:
    return f"{base_name(identity, cache)}-a{attempt}"


def record_name(identity: EngineIdentity, cache: CacheClaim) -> str:
    return base_name(identity, cache)


def builder_args(identity: EngineIdentity) -> list[str]:
    """The engine builder's command line (engine-builder/README.md documents it).

    ``build``: the TensorRT-LLM engine and its plans."""
    common = [
        "--key",
        identity.key,
        "--cache-dir",
        CACHE_MOUNT,
        "--variant",
        identity.variant,
        "--model-uri",
        identity.model_uri,
        "--revision",
        identity.revision,
    ]
    for pin in filter(None, identity.companion_revisions.split(",")):
        common += ["--companion-revision", pin]
    args = [
        "build",
        *common,
        "--precision",
        identity.precision,
        "--tensor-parallel-size",
        str(identity.tensor_parallel_size),
        "--max-batch-size",
        str(identity.max_batch_size),
        "--max-num-tokens",
        str(identity.max_num_tokens),
        "--gpu-arch",
        identity.gpu_arch,
        "--pvc-root",
        MODELS_MOUNT,
    ]
    # Only where not at their defaults: an existing engine's Job reads as it always did.
    if identity.kv_cache_type != "auto":
        args += ["--kv-cache-type", identity.kv_cache_type]
    if identity.smooth_quant:
        options = identity.smooth_quant.split(",")
        args += ["--smoothquant-alpha", options[0].removeprefix("alpha=")]
        if "per_token" in options:
            args.append("--smoothquant-per-token")
        if "per_channel" in options:
            args.append("--smoothquant-per-channel")
    if identity.speaker_audio_uri:
        # The kubelet expands $(VAR) in args and reduces $$ to $: doubling every $ keeps the
        # transcript as written.
        transcript = identity.speaker_transcript.replace("$", "$$")
        args += ["--default-speaker-audio", identity.speaker_audio_uri]
        args += ["--default-speaker-transcript", transcript]
    return args


def _claims(spec: ServiceSpec) -> list[str]:
    """The claims the build pod reads (read-only): a pvc:// model's, the default speaker's."""
    claims = [
        spec.model.pvc_claim or "",
        spec.speakers.default.pvc_claim if spec.speakers.default else "",
    ]
    return list(dict.fromkeys(c for c in claims if c))


# The Secret keys the builder reads, per model URI scheme (engine-builder/README.md): the
# required ones make a missing Secret or key show in the build pod's own status (the kubelet
# refuses to start the container: CreateContainerConfigError), the optional ones are passed
# when present. A pvc:// model needs no credentials, so no key of the Secret is passed.
CREDENTIAL_KEYS: Mapping[str, tuple[tuple[str, bool], ...]] = {
    "hf": (("HF_TOKEN", True),),
    "s3": (
        ("AWS_ACCESS_KEY_ID", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("AWS_SESSION_TOKEN", False),
        ("AWS_REGION", False),
        ("AWS_ENDPOINT_URL", False),
    ),
    "pvc": (),
}


def credential_env(scheme: str, secret: str) -> list[dict[str, Any]]:
    """The builder's environment entries taken from the credentials Secret.

    Only the keys the builder reads for this scheme, one by one (never the whole Secret):
    whatever else the Secret holds stays out of the pod. The operator never reads the
    values; the kubelet resolves them when it starts the container.
    """
    if not secret:
        return []
    entries: list[dict[str, Any]] = []
    for key, required in CREDENTIAL_KEYS[scheme]:
        ref: dict[str, Any] = {"name": secret, "key": key}
        if not required:
            ref["optional"] = True
        entries.append({"name": key, "valueFrom": {"secretKeyRef": ref}})
    return entries


def _container_security_context() -> dict[str, Any]:
    """The restricted Pod Security Standard, and nothing written outside volumes."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security_context() -> dict[str, Any]:
    # uid 1000: the builder image's user; fsGroup makes the cache claim writable for it.
    # OnRootMismatch: a volume whose root already has the group is not re-chowned file by
    # file at every pod start (an engine cache holds many GB; issue 21 L7).
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def render_job(
    target: EngineTarget,
    spec: ServiceSpec,
    namespace: str,
    attempt: int,
    settings: BuildSettings,
    cache: CacheClaim,
) -> dict[str, Any]:
    """The build Job of one engine attempt, into the service's cache claim."""
    ident = target.identity
    claim_name = cache.claim
    if claim_name != spec.engine.cache_claim_name:
        raise ValueError(
            f"cache {claim_name!r} is not the service's {spec.engine.cache_claim_name!r}"
        )
    labels = {
        **COMPONENT_LABELS,
        KEY_LABEL: ident.key,
        ARCH_LABEL: ident.gpu_arch,
        CLAIM_LABEL: cache.tag,
        ATTEMPT_LABEL: str(attempt),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(ident, attempt, cache),
            "namespace": namespace,
            "labels": labels,
            "annotations": {
                MODEL_URI_ANNOTATION: ident.model_uri,
                IDENTITY_ANNOTATION: json.dumps(_identity_dict(ident), sort_keys=True),
                GPU_PRODUCTS_ANNOTATION: ",".join(sorted(target.products)),
                CLAIM_ANNOTATION: claim_name,
                CLAIM_UID_ANNOTATION: cache.uid,
            },
        },
        "spec": {
            "backoffLimit": settings.backoff_limit,
            "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
            "podFailurePolicy": _pod_failure_policy(CONTAINER),
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        **dict(settings.pod_annotations),
                        MODEL_URI_ANNOTATION: ident.model_uri,
                    },
                },
                "spec": _build_pod_spec(target, spec, settings, cache),
            },
        },
    }


def _build_pod_spec(
    target: EngineTarget, spec: ServiceSpec, settings: BuildSettings, cache: CacheClaim
) -> dict[str, Any]:
    """The build pod: the builder on a node of one of the target's GPU products, the cache
    claim and the model's claim mounted."""
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # On the pod, not the Job: a Job's deadline also counts the time its pod waits for
        # a GPU node, so an engine built ahead of the fleet (spec.engine.gpuProducts) or on
        # a busy one would fail without having run. A pod's counts from when it starts.
        "activeDeadlineSeconds": settings.active_deadline_seconds,
        "containers": [_builder_container(target.identity, spec, settings)],
        "volumes": _build_volumes(spec, settings, cache),
        "securityContext": _pod_security_context(),
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": GPU_PRODUCT_LABEL,
                                    "operator": "In",
                                    "values": sorted(target.products),
                                }
                            ]
                        }
                    ]
                }
            }
        },
        # GPU nodes are commonly tainted nvidia.com/gpu; beyond that the build pod tolerates
        # what the service's pods tolerate, since the products were chosen from those nodes.
        "tolerations": [
            dict(GPU_TOLERATION),
            *[dict(t) for t in spec.serving.tolerations if dict(t) != GPU_TOLERATION],
        ],
        "automountServiceAccountToken": False,
    }
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    return pod_spec


def _build_volumes(
    spec: ServiceSpec, settings: BuildSettings, cache: CacheClaim
) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "engines", "persistentVolumeClaim": {"claimName": cache.claim}},
        {"name": "scratch", "emptyDir": {"sizeLimit": settings.scratch_size}},
    ]
    for i, claim in enumerate(_claims(spec)):
        volumes.append(
            {
                "name": "model" if i == 0 else f"model-{i}",
                "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
            }
        )
    return volumes


def _builder_container(
    ident: EngineIdentity, spec: ServiceSpec, settings: BuildSettings
) -> dict[str, Any]:
    mounts: list[dict[str, Any]] = [
        {"name": "engines", "mountPath": CACHE_MOUNT},
        {"name": "scratch", "mountPath": "/tmp"},
    ]
    for i, claim in enumerate(_claims(spec)):
        name = "model" if i == 0 else f"model-{i}"
        mounts.append({"name": name, "mountPath": f"{MODELS_MOUNT}/{claim}", "readOnly": True})
    return {
        "name": CONTAINER,
        "image": ident.builder_image,
        "imagePullPolicy": "IfNotPresent",
        "args": builder_args(ident),
        "env": [
            {"name": "TERMINATION_MESSAGE_PATH", "value": "/dev/termination-log"},
            # The root filesystem is read-only: everything a tool may write goes to /tmp.
            {"name": "HOME", "value": "/tmp"},
            {"name": "HF_HOME", "value": "/tmp/hf"},
            *credential_env(spec.model.scheme, spec.model.credentials_secret),
        ],
        "resources": _build_resources(ident, settings),
        "volumeMounts": mounts,
        "terminationMessagePath": "/dev/termination-log",
        # A builder killed before it writes its message still leaves its last log lines.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security_context(),
    }


def _build_resources(ident: EngineIdentity, settings: BuildSettings) -> dict[str, Any]:
    return {
        "requests": {
            "cpu": settings.cpu_request,
            "memory": settings.memory_request,
            GPU_RESOURCE: str(ident.tensor_parallel_size),
        },
        "limits": {
            "memory": settings.memory_limit,
            GPU_RESOURCE: str(ident.tensor_parallel_size),
        },
    }


def _pod_failure_policy(container: str) -> dict[str, Any]:
    """Exit code 2 (the builder's and `remove`'s "bad input: a retry cannot fix it") fails the
    Job at once; an evicted or preempted pod is not the program's fault: retried freely."""
    return {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": container,
                    "operator": "In",
                    "values": [EXIT_CONFIG_ERROR],
                },
            },
            {
                "action": "Ignore",
                "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
            },
        ]
    }


def _identity_dict(ident: EngineIdentity) -> dict[str, Any]:
    return identity_to_dict(ident)


def render_record(
    identity: EngineIdentity,
    namespace: str,
    job: str,
    result: str,
    now: dt.datetime,
    cache: CacheClaim,
    state: str = "Ready",
    manifest_sha256: str = "",
) -> dict[str, Any]:
    """The ConfigMap that records an engine's outcome, built or given up (it outlives Jobs).

    ``manifestSha256`` (when the builder reported it) is the digest of the manifest the
    build wrote; the serving pods get it (``--manifest-sha256``) and refuse any other."""
    record: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": record_name(identity, cache),
            "namespace": namespace,
            "labels": {
                **COMPONENT_LABELS,
                KEY_LABEL: identity.key,
                ARCH_LABEL: identity.gpu_arch,
                CLAIM_LABEL: cache.tag,
            },
            "annotations": {CLAIM_ANNOTATION: cache.claim, CLAIM_UID_ANNOTATION: cache.uid},
        },
        "data": {
            "state": state,
            "key": identity.key,
            "identity": json.dumps(_identity_dict(identity), sort_keys=True),
            "engineDir": f"{CACHE_MOUNT}/{identity.key}",
            "job": job,
            "builtAt": now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "result": result[:TERMINATION_MESSAGE_LIMIT],
        },
    }
    if manifest_sha256:
        record["data"]["manifestSha256"] = manifest_sha256
    return record


# ---- engine cleanup -------------------------------------------------------------------------

CLEANUP_CONTAINER = "cleanup"
CLEANUP_BACKOFF_LIMIT = 3
CLEANUP_DEADLINE_SECONDS = 600
# The builder's `remove` accepts only a content key as the operator makes them.
_CONTENT_KEY = re.compile(r"^[0-9a-f]{40}$")


def cleanup_job_name(key: str, gpu_arch: str, cache: CacheClaim) -> str:
    """``cvs-engine-gc-sm90-<key prefix>-<claim tag>``: the build's base name, marked gc
    (``ckpt`` for a record without architecture: a vLLM checkpoint fetched before vLLM was
    refused, which the cleanup still removes, plan/cleanup.py)."""
    return f"cvs-engine-gc-{gpu_arch.replace('_', '') or 'ckpt'}-{key[:20]}-{cache.tag}"


def render_cleanup_job(
    key: str,
    gpu_arch: str,
    builder_image: str,
    namespace: str,
    cache: CacheClaim,
    settings: BuildSettings,
) -> dict[str, Any]:
    """The Job that removes one engine (and its build leftovers) from a cache claim.

    It runs the builder image's ``remove`` command, which takes the key's build lock first,
    so it never removes an engine while a builder of the same key writes it. It needs no GPU
    and may run on any node that can mount the claim (GPU nodes included, hence the
    toleration of their usual taint).
    """
    if not _CONTENT_KEY.match(key):
        raise ValueError(f"engine key {key!r} is not 40 lowercase hex digits")
    labels = {
        **COMPONENT_LABELS,
        COMPONENT_LABEL: CLEANUP_COMPONENT,
        KEY_LABEL: key,
        ARCH_LABEL: gpu_arch,
        CLAIM_LABEL: cache.tag,
    }
    container: dict[str, Any] = {
        "name": CLEANUP_CONTAINER,
        "image": builder_image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["remove", "--key", key, "--cache-dir", CACHE_MOUNT],
        "env": [{"name": "TERMINATION_MESSAGE_PATH", "value": "/dev/termination-log"}],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "256Mi"},
        },
        "volumeMounts": [{"name": "engines", "mountPath": CACHE_MOUNT}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security_context(),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": CLEANUP_DEADLINE_SECONDS,
        "containers": [container],
        "volumes": [{"name": "engines", "persistentVolumeClaim": {"claimName": cache.claim}}],
        "securityContext": _pod_security_context(),
        "tolerations": [dict(GPU_TOLERATION)],
        "automountServiceAccountToken": False,
    }
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    claim_annotations = {CLAIM_ANNOTATION: cache.claim, CLAIM_UID_ANNOTATION: cache.uid}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": cleanup_job_name(key, gpu_arch, cache),
            "namespace": namespace,
            "labels": labels,
            "annotations": claim_annotations,
        },
        "spec": {
            "backoffLimit": CLEANUP_BACKOFF_LIMIT,
            "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
            "podFailurePolicy": _pod_failure_policy(CLEANUP_CONTAINER),
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {**dict(settings.pod_annotations), **claim_annotations},
                },
                "spec": pod_spec,
            },
        },
    }
