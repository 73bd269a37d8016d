"""Engine-build Jobs: what to create, and what the state of an engine is (pure).

One Job per engine key and attempt, named from the key (``cvs-engine-sm90-<key>-a<N>``) and
created with create-if-absent semantics: concurrent reconciles, several services wanting the
same key and operator restarts all converge on the same Job. A finished engine is recorded in
a ConfigMap of the same base name (``cvs-engine-sm90-<key>``), which outlives the Job's TTL.
Neither has an owner reference to a service: engines are shared and outlive any one service.

Two levels of retry: the Job controller retries a failed pod (``backoffLimit``, its own
exponential back-off); when the Job itself fails the operator starts a new attempt after
``retry_base_seconds * 2**(attempt-1)``, up to ``max_attempts``, then stops and says so.
Deleting the failed Jobs of a key starts over at attempt 1.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cosyvoice_operator.api.conditions import parse_time
from cosyvoice_operator.api.engine import EngineIdentity, EngineTarget, identity_to_dict
from cosyvoice_operator.api.gpus import GPU_PRODUCT_LABEL, GPU_RESOURCE, GPU_TOLERATION
from cosyvoice_operator.api.spec import ServiceSpec

GROUP = "tts.cosyvoice.dev"
KEY_LABEL = f"{GROUP}/engine-key"
CLAIM_LABEL = f"{GROUP}/cache-claim-hash"
CLAIM_ANNOTATION = f"{GROUP}/cache-claim"
CLAIM_UID_ANNOTATION = f"{GROUP}/cache-claim-uid"
ARCH_LABEL = f"{GROUP}/gpu-arch"
ATTEMPT_LABEL = f"{GROUP}/attempt"
MODEL_URI_ANNOTATION = f"{GROUP}/model-uri"
IDENTITY_ANNOTATION = f"{GROUP}/engine-identity"
COMPONENT_LABELS = {
    "app.kubernetes.io/name": "cosyvoice-engine",
    "app.kubernetes.io/component": "engine-build",
    "app.kubernetes.io/managed-by": "cosyvoice-operator",
}
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


@dataclass(frozen=True)
class Cache:
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


def base_name(identity: EngineIdentity, cache: Cache) -> str:
    """The engine's name in one cache: the same key in another claim is another build."""
    return f"cvs-engine-{identity.short_name}-{cache.tag}"


def job_name(identity: EngineIdentity, attempt: int, cache: Cache) -> str:
    return f"{base_name(identity, cache)}-a{attempt}"


def record_name(identity: EngineIdentity, cache: Cache) -> str:
    return base_name(identity, cache)


def selector(identity: EngineIdentity, cache: Cache) -> str:
    """Label selector of the build Jobs of one engine in one cache."""
    return f"{KEY_LABEL}={identity.key},{CLAIM_LABEL}={cache.tag}"


def builder_args(identity: EngineIdentity) -> list[str]:
    """The engine builder's command line (engine-builder/README.md documents it).

    ``build`` for a TensorRT-LLM engine (and its plans); ``build --llm-runtime vllm`` for the
    plans alone; ``prefetch`` for vLLM's architecture-free checkpoint."""
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
    if identity.artifact == "checkpoint":
        return ["prefetch", *common, "--pvc-root", MODELS_MOUNT]
    if identity.artifact == "plans":
        return [
            "build",
            *common,
            "--llm-runtime",
            identity.llm_runtime,
            "--gpu-arch",
            identity.gpu_arch,
            "--pvc-root",
            MODELS_MOUNT,
        ]
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
    return args


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
    return {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def render_job(
    target: EngineTarget,
    spec: ServiceSpec,
    namespace: str,
    attempt: int,
    settings: BuildSettings,
    cache: Cache,
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
    volumes: list[dict[str, Any]] = [
        {"name": "engines", "persistentVolumeClaim": {"claimName": claim_name}},
        {"name": "scratch", "emptyDir": {"sizeLimit": settings.scratch_size}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "engines", "mountPath": CACHE_MOUNT},
        {"name": "scratch", "mountPath": "/tmp"},
    ]
    claim = spec.model.pvc_claim
    if claim:
        volumes.append(
            {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        mounts.append({"name": "model", "mountPath": f"{MODELS_MOUNT}/{claim}", "readOnly": True})
    container: dict[str, Any] = {
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
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # On the pod, not the Job: a Job's deadline also counts the time its pod waits for
        # a GPU node, so an engine built ahead of the fleet (spec.engine.gpuProducts) or on
        # a busy one would fail without having run. A pod's counts from when it starts.
        "activeDeadlineSeconds": settings.active_deadline_seconds,
        "containers": [container],
        "volumes": volumes,
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
    if ident.artifact == "checkpoint":
        # A download: no GPU, so no GPU node either (any node that mounts the claim).
        del pod_spec["affinity"]
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
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
                f"{GROUP}/gpu-products": ",".join(sorted(target.products)),
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
                "spec": pod_spec,
            },
        },
    }


# vLLM's prefetch Job only downloads: a CPU and a little memory, no GPU.
PREFETCH_RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "1", "memory": "2Gi"},
    "limits": {"memory": "8Gi"},
}


def _build_resources(ident: EngineIdentity, settings: BuildSettings) -> dict[str, Any]:
    if ident.artifact == "checkpoint":
        return {key: dict(value) for key, value in PREFETCH_RESOURCES.items()}
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
    cache: Cache,
    state: str = "Ready",
) -> dict[str, Any]:
    """The ConfigMap that records an engine's outcome, built or given up (it outlives Jobs)."""
    return {
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


# ---- engine cleanup -------------------------------------------------------------------------

CLEANUP_COMPONENT = "engine-cleanup"
CLEANUP_CONTAINER = "cleanup"
CLEANUP_BACKOFF_LIMIT = 3
CLEANUP_DEADLINE_SECONDS = 600
# The builder's `remove` accepts only a content key as the operator makes them.
_CONTENT_KEY = re.compile(r"^[0-9a-f]{40}$")


def cleanup_job_name(key: str, gpu_arch: str, cache: Cache) -> str:
    """``cvs-engine-gc-sm90-<key prefix>-<claim tag>``: the build's base name, marked gc."""
    return f"cvs-engine-gc-{gpu_arch.replace('_', '') or 'ckpt'}-{key[:20]}-{cache.tag}"


def render_cleanup_job(
    key: str,
    gpu_arch: str,
    builder_image: str,
    namespace: str,
    cache: Cache,
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
        "app.kubernetes.io/component": CLEANUP_COMPONENT,
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


# ---- the state of one engine ---------------------------------------------------------------


@dataclass(frozen=True)
class EngineState:
    """What an engine is doing and what the operator should do about it."""

    state: str  # Pending | Building | Ready | Failed
    message: str
    job: str = ""
    attempts: int = 0
    # "none" | "create" (create attempt `next_attempt`) | "record" (record `job` as built)
    # | "record-failure" (record that the builds of this key gave up)
    action: str = "none"
    next_attempt: int = 0
    next_retry: dt.datetime | None = None
    result: str = ""
    # The EngineReady reason while this engine is not ready, when "Building" would mislead
    # (the API server refused the build Job, say).
    reason: str = ""


def _attempt(job: Mapping[str, Any]) -> int:
    try:
        return int(job["metadata"]["labels"][ATTEMPT_LABEL])
    except (KeyError, ValueError, TypeError):
        return 0


def latest_job(jobs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Job of the highest attempt (the one whose outcome counts)."""
    return max(jobs, key=_attempt) if jobs else None


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def termination_message(pods: Sequence[Mapping[str, Any]]) -> str:
    """The builder's own last words: its termination message, newest pod first.

    The builder writes one line of JSON ({"result", "step", "message"}); anything else (the
    log tail Kubernetes falls back to) is taken as it is.
    """

    def started(pod: Mapping[str, Any]) -> str:
        return str((pod.get("metadata") or {}).get("creationTimestamp") or "")

    for pod in sorted(pods, key=started, reverse=True):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            text = (term.get("message") or "").strip()
            if not text:
                continue
            try:
                data = json.loads(text)
            except ValueError:
                return text[-1000:]
            if isinstance(data, dict):
                parts = [str(data[k]) for k in ("step", "message") if data.get(k)]
                if data.get("step"):
                    parts[0] = f"step {parts[0]}:"
                return " ".join(parts)[-1000:] or text[-1000:]
            return text[-1000:]
    return ""


def pending_reason(pods: Sequence[Mapping[str, Any]]) -> str:
    """Why a build pod is not running yet (the scheduler's message), if it says."""
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                return str(cond.get("message") or cond.get("reason") or "")
    return ""


# What the kubelet says when it cannot resolve a secretKeyRef (CreateContainerConfigError):
# its secret manager's NotFound error, and its own text for a key the Secret lacks.
_SECRET_NOT_FOUND = re.compile(r'\bsecrets? "(?P<name>[^"]+)" not found', re.IGNORECASE)
_SECRET_KEY_MISSING = re.compile(
    r"couldn't find key (?P<key>\S+) in Secret (?P<namespace>[^/\s]+)/(?P<name>[^\s:;,]+)",
    re.IGNORECASE,
)


def _required_secret_keys(pod: Mapping[str, Any], container: str, secret: str) -> list[str]:
    """The keys of ``secret`` that a container of the pod requires (not ``optional``)."""
    keys: list[str] = []
    spec = pod.get("spec") or {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if c.get("name") != container:
            continue
        for env in c.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
            if ref.get("name") == secret and not ref.get("optional") and ref.get("key"):
                keys.append(str(ref["key"]))
    return keys


def credentials_problem(pods: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) when a build pod cannot start for its credentials Secret.

    The build pod names only the keys the builder needs (``credential_env``), the required
    ones without ``optional``, so the kubelet itself reports a missing Secret or key: the
    container waits with reason CreateContainerConfigError. ``CredentialsSecretMissing`` is
    a Secret that does not exist, ``CredentialsSecretInvalid`` one without a required key;
    the message is the kubelet's, then what to do. Other CreateContainerConfigErrors (a
    secret cache that has not synced yet, a ConfigMap) are not credentials problems: None.
    """

    def started(pod: Mapping[str, Any]) -> str:
        return str((pod.get("metadata") or {}).get("creationTimestamp") or "")

    for pod in sorted(pods, key=started, reverse=True):
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        status = pod.get("status") or {}
        for cs in [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") != "CreateContainerConfigError":
                continue
            text = str(waiting.get("message") or "").strip()
            missing_key = _SECRET_KEY_MISSING.search(text)
            if missing_key:
                key, name = missing_key.group("key"), missing_key.group("name")
                ns = missing_key.group("namespace")
                return (
                    "CredentialsSecretInvalid",
                    f"{text}. Add the key {key} to the Secret {ns}/{name} "
                    "(spec.model.credentialsSecret); the build pod waits and starts once "
                    "the key is there.",
                )
            not_found = _SECRET_NOT_FOUND.search(text)
            if not_found:
                name = not_found.group("name")
                keys = _required_secret_keys(pod, str(cs.get("name") or ""), name)
                where = f"{namespace}/{name}" if namespace else name
                with_keys = f" with the key{'s' if len(keys) > 1 else ''} {', '.join(keys)}"
                return (
                    "CredentialsSecretMissing",
                    f"{text}. Create the Secret {where}{with_keys if keys else ''} "
                    "(spec.model.credentialsSecret), or name an existing Secret there; the "
                    "build pod waits and starts once it exists.",
                )
    return None


def assess(
    identity: EngineIdentity,
    record: Mapping[str, Any] | None,
    jobs: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    now: dt.datetime,
    settings: BuildSettings,
) -> EngineState:
    """The state of one engine from its record, its Jobs and the pods of its latest Job."""
    latest = latest_job(jobs)
    if record is not None:
        data = record.get("data") or {}
        built_by = str(data.get("job", ""))
        attempt_suffix = built_by.rpartition("-a")[2]
        attempts = int(attempt_suffix) if attempt_suffix.isdigit() else 0
        if data.get("state") == "Failed":
            return EngineState(
                "Failed", str(data.get("result") or "gave up"), job=built_by, attempts=attempts
            )
        return EngineState(
            "Ready",
            f"built by {built_by or '?'} at {data.get('builtAt', '?')}",
            job=built_by,
            attempts=attempts,
        )
    if latest is None:
        return EngineState("Pending", "build Job to be created", action="create", next_attempt=1)
    name = latest["metadata"]["name"]
    attempt = _attempt(latest)
    if _condition(latest, "Complete") or _condition(latest, "SuccessCriteriaMet"):
        result = termination_message(pods)
        return EngineState(
            "Ready", f"built by {name}", job=name, attempts=attempt, action="record", result=result
        )
    failed = _condition(latest, "Failed")
    if failed:
        why = termination_message(pods) or str(failed.get("message") or failed.get("reason") or "")
        base = (
            f"attempt {attempt}/{settings.max_attempts} failed ({failed.get('reason', 'Failed')})"
        )
        if why:
            base += f": {why}"
        if attempt >= settings.max_attempts:
            # Recorded, so that giving up outlives the Jobs' TTL instead of starting over.
            return EngineState(
                "Failed",
                f"{base}. Gave up; change the engine spec, or run `kubectl delete "
                f"jobs,configmaps -l {KEY_LABEL}={identity.key}` to retry.",
                job=name,
                attempts=attempt,
                action="record-failure",
            )
        failed_at = parse_time(failed.get("lastTransitionTime")) or now
        retry_at = failed_at + dt.timedelta(
            seconds=settings.retry_base_seconds * 2 ** (attempt - 1)
        )
        if now >= retry_at:
            return EngineState(
                "Failed",
                f"{base}. Retrying as attempt {attempt + 1}.",
                job=name,
                attempts=attempt,
                action="create",
                next_attempt=attempt + 1,
            )
        return EngineState(
            "Failed",
            f"{base}. Retry at {retry_at.strftime('%Y-%m-%dT%H:%M:%SZ')}.",
            job=name,
            attempts=attempt,
            next_retry=retry_at,
        )
    waiting = pending_reason(pods)
    if waiting:
        return EngineState(
            "Pending", f"{name} waits for a GPU node: {waiting}", job=name, attempts=attempt
        )
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if running:
        pod = running[0]
        node = (pod.get("spec") or {}).get("nodeName") or "?"
        msg = f"{name} running on {node}"
        since = _running_since(pod)
        if since is not None:
            # A fixed start time, not an elapsed one: the status does not change every resync.
            msg += f" since {since.strftime('%Y-%m-%dT%H:%M:%SZ')}"
    else:
        msg = f"{name} started"
    return EngineState("Building", f"{msg} (attempt {attempt})", job=name, attempts=attempt)


def _running_since(pod: Mapping[str, Any]) -> dt.datetime | None:
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        started = parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
        if started is not None:
            return started.astimezone(dt.UTC)
    started = parse_time(status.get("startTime"))
    return started.astimezone(dt.UTC) if started else None
