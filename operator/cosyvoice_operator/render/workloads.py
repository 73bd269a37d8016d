"""The serving workloads of a service (pure): the Triton model repository ConfigMap, one
Deployment per GPU architecture whose engine is Ready, the Service, the
PodDisruptionBudget and (unless turned off) the NetworkPolicy.

The NetworkPolicy admits, to the serving pods, only pods of the same namespace labelled
``tts.cosyvoice.dev/client: <service name>`` on the inference ports (HTTP 8000, gRPC 8001),
and the metrics scraper on the metrics port (8002) and the health port (8003, the serving
entrypoint's stub-health counters) from the namespaces
``ServingSettings.scraper_namespace_labels`` selects (every namespace when empty). Other
clients get in with a NetworkPolicy of their own (policies add up).

Every object is owned by the CosyVoiceService (so the garbage collector removes it with the
service) and carries the hash of what the operator rendered (`applied-hash`): a pass whose
rendering did not change finds the same hash on the cached object and writes nothing.

How `spec.replicas` is split over architectures: the architectures whose engine is Ready are
ordered by how many eligible GPUs their nodes offer (most first, then by name) and the
replicas are dealt out in turn, so the counts differ by at most one and always add up to the
desired total (3 replicas over sm_89 and sm_90 with more sm_90 GPUs: sm_90 2, sm_89 1).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosyvoice_operator.api.gpus import GPU_PRODUCT_LABEL, GPU_RESOURCE, GPU_TOLERATION
from cosyvoice_operator.api.labels import (
    ARCH_LABEL,
    COMPONENT_LABEL,
    GROUP,
    HASH_ANNOTATION,
    INSTANCE_LABEL,
    KEY_LABEL,
    MANAGED_BY_LABEL,
    MANAGER,
    NAME_LABEL,
    REPO_HASH_ANNOTATION,
    SERVED_KEY_ANNOTATION,
    SERVICE_LABEL,
    SERVING_COMPONENT,
    SERVING_NAME,
)
from cosyvoice_operator.api.spec import ServiceSpec
from cosyvoice_operator.render import triton

ENGINES_MOUNT = "/engines"
REPO_MOUNT = "/etc/cosyvoice/repository"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
# cosyvoice-serve's own GET /ready (Triton ready and the pod not draining): the startup and
# readiness probes.
HEALTH_PORT = 8003
# The pod's stop, in order (the kubelet's grace period covers all of it):
# 1. preStop sleeps PRESTOP_SECONDS while the pod leaves the Service's endpoints (it is
#    Terminating); streams that still arrive on stale endpoints are served.
# 2. SIGTERM: cosyvoice-serve answers not-ready, the orchestrators refuse new streams, and
#    Triton serves the streams in flight until none is left, at most drain_seconds.
# 3. Triton is told to stop and gets TRITON_EXIT_SECONDS (--exit-timeout-seconds): no
#    stream is left, but Python instances unload one after the other (about a second each
#    on the CPU twin; 16 orchestrator instances by default), and Triton's own default is 30.
# 4. The LLM servers beside it get LLM_STOP_SECONDS (cosyvoice-serve's stop grace).
PRESTOP_SECONDS = 10
TRITON_EXIT_SECONDS = 30
LLM_STOP_SECONDS = 15
CONTAINER = "triton"


@dataclass(frozen=True)
class ServingSettings:
    """Operator-wide knobs of serving pods (from the operator's configuration)."""

    default_image: str = "ghcr.io/cosyvoice-operator/cosyvoice-triton:0.1.0-trtllm0.20.0"
    # The router's HAProxy (spec.routing.mode Router) when spec.routing.router.image is empty:
    # the official image of an LTS branch (3.2: fixes until about Q2 2030).
    router_image: str = "docker.io/library/haproxy:3.2"
    # Whether the operator may write Gateway API objects (spec.routing.mode GatewayAPI): its
    # GRPCRoute and Envoy Gateway's BackendTrafficPolicy (COSYVOICE_GATEWAY_API; their CRDs
    # must be installed and the operator allowed to write them).
    gateway_api: bool = False
    # How long a pod may take to load its engines before the startup probe gives up.
    startup_seconds: int = 900
    # How long in-flight streams may run on after a pod is told to stop.
    drain_seconds: int = 120
    shm_size: str = "2Gi"
    service_account: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    # A NetworkPolicy per service (see the module docstring); the namespaces the metrics
    # scraper (Prometheus) runs in, by namespace label (none: any namespace).
    network_policy: bool = True
    scraper_namespace_labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ArchServing:
    """One architecture's Deployment: the engine it serves and its share of the replicas."""

    gpu_arch: str
    key: str
    products: tuple[str, ...]
    replicas: int
    # The sha256 of the engine's manifest.json as its build wrote it (from the engine
    # record; "" for a record without one): the pods refuse any other manifest.
    manifest_sha256: str = ""


def short(arch: str) -> str:
    return arch.replace("_", "")


def _name(prefix: str, service: str, suffix: str = "", limit: int = 63) -> str:
    """A DNS label made of parts, shortened with a hash of the whole when too long."""
    full = f"{prefix}-{service}{'-' + suffix if suffix else ''}"
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:8]
    keep = limit - len(prefix) - len(suffix) - len(digest) - 3 - (1 if suffix else 0)
    return f"{prefix}-{service[:keep].rstrip('-')}-{digest}{'-' + suffix if suffix else ''}"


def service_name(service: str) -> str:
    return _name("cvs", service)


def deployment_name(service: str, arch: str) -> str:
    return _name("cvs", service, short(arch))


def repository_name(service: str, arch: str) -> str:
    return _name("cvs", service, f"{short(arch)}-repo", limit=253)


def selector_labels(service: str) -> dict[str, str]:
    return {SERVICE_LABEL: service}


def selector(service: str) -> str:
    """The label selector of every serving pod of the service (the scale subresource's)."""
    return f"{SERVICE_LABEL}={service}"


def common_labels(service: str) -> dict[str, str]:
    return {
        NAME_LABEL: SERVING_NAME,
        INSTANCE_LABEL: service,
        COMPONENT_LABEL: SERVING_COMPONENT,
        MANAGED_BY_LABEL: MANAGER,
        SERVICE_LABEL: service,
    }


def split_replicas(total: int, archs: Sequence[tuple[str, int]]) -> dict[str, int]:
    """Deal `total` replicas over (arch, eligible GPUs) pairs; see the module docstring.
    Arithmetic, not a loop over the replicas: a huge count costs nothing."""
    order = sorted(archs, key=lambda a: (-a[1], a[0]))
    if not order:
        return {}
    each, extra = divmod(max(0, total), len(order))
    return {arch: each + (1 if i < extra else 0) for i, (arch, _) in enumerate(order)}


def serving_image(svc: ServiceSpec, settings: ServingSettings) -> str:
    """The image of the service's serving pods: its own, or the operator's default."""
    return svc.serving.image or settings.default_image


def owner(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion", f"{GROUP}/v1alpha1"),
        "kind": body.get("kind", "CosyVoiceService"),
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def stamp(obj: dict[str, Any]) -> dict[str, Any]:
    """Record in the object the hash of everything rendered (see the module docstring)."""
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
    obj["metadata"].setdefault("annotations", {})[HASH_ANNOTATION] = digest
    return obj


def applied_hash(obj: Mapping[str, Any] | None) -> str:
    return str(
        (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION, "")
    )


def render_repository(
    body: Mapping[str, Any],
    svc: ServiceSpec,
    arch: str,
    key: str,
    namespace: str,
) -> dict[str, Any]:
    """The ConfigMap of one architecture's model repository: `<model>.pbtxt` per model."""
    name = str((body.get("metadata") or {}).get("name"))
    configs = triton.render_repository(svc, f"{ENGINES_MOUNT}/{key}")
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": repository_name(name, arch),
                "namespace": namespace,
                "labels": {**common_labels(name), ARCH_LABEL: arch},
                "ownerReferences": [owner(body)],
            },
            "data": {f"{model}.pbtxt": text for model, text in sorted(configs.items())},
        }
    )


def _affinity(user: Mapping[str, Any], products: Sequence[str]) -> dict[str, Any]:
    """The user's affinity with the architecture's products ANDed into every required node
    selector term (terms are ORed, so the expression must be in each)."""
    ours = {"key": GPU_PRODUCT_LABEL, "operator": "In", "values": sorted(products)}
    affinity = json.loads(json.dumps(dict(user or {})))
    node = affinity.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [
        {**t, "matchExpressions": [*(t.get("matchExpressions") or []), ours]} for t in terms
    ]
    return dict(affinity)


def _tolerations(svc: ServiceSpec) -> list[dict[str, Any]]:
    """The GPU taint's toleration and the service's own, each once."""
    found: list[dict[str, Any]] = []
    for t in (GPU_TOLERATION, *svc.serving.tolerations):
        if dict(t) not in found:
            found.append(dict(t))
    return found


def _resources(svc: ServiceSpec) -> dict[str, Any]:
    user = svc.serving.resources or {}
    requests = {**(user.get("requests") or {}), GPU_RESOURCE: str(svc.serving.gpus_per_replica)}
    limits = {**(user.get("limits") or {}), GPU_RESOURCE: str(svc.serving.gpus_per_replica)}
    return {"requests": requests, "limits": limits}


def serve_args(
    svc: ServiceSpec,
    key: str,
    settings: ServingSettings,
    manifest_sha256: str = "",
) -> list[str]:
    """The serving container's arguments (the serving image's entry point is `cosyvoice-serve`).

    The model view is passed explicitly: the Python models' ``model_dir`` parameter
    (`triton.MODEL_VIEW`) names the directory the pod assembles there. With the engine
    record's manifest digest, ``--manifest-sha256``: the pod then refuses an engine whose
    manifest, or any file it lists, changed after the build (issue 21 M6).
    """
    args = [
        "--engine-dir",
        f"{ENGINES_MOUNT}/{key}",
        "--key",
        key,
        "--variant",
        svc.model.variant,
        "--repository-config",
        REPO_MOUNT,
        "--model-repository",
        "/tmp/model_repository",
        "--model-view",
        triton.MODEL_VIEW,
        "--http-port",
        str(HTTP_PORT),
        "--grpc-port",
        str(GRPC_PORT),
        "--metrics-port",
        str(METRICS_PORT),
        "--health-port",
        str(HEALTH_PORT),
        "--drain-seconds",
        str(settings.drain_seconds),
        "--exit-timeout-seconds",
        str(TRITON_EXIT_SECONDS),
    ]
    if manifest_sha256:
        args += ["--manifest-sha256", manifest_sha256]
    if triton.llm_beside_triton(svc):
        groups = ";".join(",".join(str(g) for g in grp) for grp in triton.llm_groups(svc))
        args += ["--llm-groups", groups, "--llm-base-port", str(triton.LLM_BASE_PORT)]
    return args


def render_architecture(
    body: Mapping[str, Any],
    svc: ServiceSpec,
    target: ArchServing,
    namespace: str,
    settings: ServingSettings,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One architecture's repository ConfigMap and its Deployment, whose pod template carries
    the repository's hash (a new repository rolls the pods)."""
    repo = render_repository(body, svc, target.gpu_arch, target.key, namespace)
    digest = hashlib.sha256(json.dumps(repo["data"], sort_keys=True).encode()).hexdigest()[:16]
    return repo, render_deployment(body, svc, target, namespace, settings, digest)


def render_deployment(
    body: Mapping[str, Any],
    svc: ServiceSpec,
    target: ArchServing,
    namespace: str,
    settings: ServingSettings,
    repository_hash: str,
) -> dict[str, Any]:
    name = str((body.get("metadata") or {}).get("name"))
    labels = {**common_labels(name), ARCH_LABEL: target.gpu_arch}
    pod_labels = {**labels, KEY_LABEL: target.key}
    return stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": deployment_name(name, target.gpu_arch),
                "namespace": namespace,
                "labels": labels,
                "annotations": {SERVED_KEY_ANNOTATION: target.key},
                "ownerReferences": [owner(body)],
            },
            "spec": {
                "replicas": target.replicas,
                "selector": {"matchLabels": {SERVICE_LABEL: name, ARCH_LABEL: target.gpu_arch}},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
                },
                "revisionHistoryLimit": 3,
                "template": {
                    "metadata": {
                        "labels": pod_labels,
                        "annotations": {
                            # A batching change is a new repository: the pods roll.
                            REPO_HASH_ANNOTATION: repository_hash,
                            "prometheus.io/scrape": "true",
                            "prometheus.io/port": str(METRICS_PORT),
                            "prometheus.io/path": "/metrics",
                        },
                    },
                    "spec": _pod_spec(svc, name, target, settings),
                },
            },
        }
    )


def _pod_spec(
    svc: ServiceSpec, name: str, target: ArchServing, settings: ServingSettings
) -> dict[str, Any]:
    """A serving pod: the Triton container, the engine cache read-only, spread over nodes."""
    pod_spec: dict[str, Any] = {
        "containers": [_container(svc, target, settings)],
        "terminationGracePeriodSeconds": grace_seconds(settings),
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 1000,
            # The cache claim is not re-chowned at every start when its root has the group.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": _affinity(svc.serving.affinity, target.products),
        "tolerations": _tolerations(svc),
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "kubernetes.io/hostname",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {
                    "matchLabels": {SERVICE_LABEL: name, ARCH_LABEL: target.gpu_arch}
                },
            }
        ],
        "volumes": [
            {
                "name": "engines",
                "persistentVolumeClaim": {
                    "claimName": svc.engine.cache_claim_name,
                    "readOnly": True,
                },
            },
            {"name": "repository", "configMap": {"name": repository_name(name, target.gpu_arch)}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": settings.shm_size}},
        ],
    }
    if svc.serving.node_selector:
        pod_spec["nodeSelector"] = dict(svc.serving.node_selector)
    if settings.service_account:
        pod_spec["serviceAccountName"] = settings.service_account
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    return pod_spec


def grace_seconds(settings: ServingSettings) -> int:
    """preStop, then the drain, then Triton's and the LLM servers' stop (see PRESTOP_SECONDS)."""
    return PRESTOP_SECONDS + settings.drain_seconds + TRITON_EXIT_SECONDS + LLM_STOP_SECONDS


def _container(svc: ServiceSpec, target: ArchServing, settings: ServingSettings) -> dict[str, Any]:
    """The Triton container: `serve` with this architecture's engine; ready on serve's /ready
    (Triton ready and not draining), live on Triton's /v2/health/live."""
    ports = [
        {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
        {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
        {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
    ]
    for i, port in enumerate(triton.llm_ports(svc)):
        ports.append({"name": f"llm-{i}", "containerPort": port, "protocol": "TCP"})
    probe = {"httpGet": {"path": "/ready", "port": "health"}, "timeoutSeconds": 5}
    return {
        "name": CONTAINER,
        "image": serving_image(svc, settings),
        "imagePullPolicy": "IfNotPresent",
        "args": serve_args(svc, target.key, settings, target.manifest_sha256),
        "ports": ports,
        "env": [
            {"name": "HOME", "value": "/tmp"},
            *[{"name": k, "value": v} for k, v in sorted(triton.server_environment(svc).items())],
        ],
        "resources": _resources(svc),
        "volumeMounts": [
            *_engine_mounts(target),
            {"name": "repository", "mountPath": REPO_MOUNT, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "startupProbe": {
            **probe,
            "periodSeconds": 10,
            "failureThreshold": max(1, settings.startup_seconds // 10),
        },
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {
            "httpGet": {"path": "/v2/health/live", "port": "http"},
            "timeoutSeconds": 5,
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        # Out of the Service's endpoints first; then SIGTERM, and cosyvoice-serve drains
        # (see PRESTOP_SECONDS).
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }


def _engine_mounts(target: ArchServing) -> list[dict[str, Any]]:
    """Only this engine's directory, read-only: a pod cannot see or touch another."""
    mounts: list[dict[str, Any]] = [
        {
            "name": "engines",
            "mountPath": f"{ENGINES_MOUNT}/{target.key}",
            "subPath": target.key,
            "readOnly": True,
        },
    ]
    return mounts


def service_ports(metrics_port: int | None) -> list[dict[str, Any]]:
    """A Service's named ports to its pods' named container ports: gRPC and HTTP, and the
    metrics port (Triton's, or the router's) where the Service exposes one."""
    ports: list[dict[str, Any]] = [
        {
            "name": "grpc",
            "port": GRPC_PORT,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "grpc",
        },
        {"name": "http", "port": HTTP_PORT, "targetPort": "http", "protocol": "TCP"},
    ]
    if metrics_port is not None:
        ports.append(
            {"name": "metrics", "port": metrics_port, "targetPort": "metrics", "protocol": "TCP"}
        )
    return ports


def render_service(body: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    name = str((body.get("metadata") or {}).get("name"))
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": service_name(name),
                "namespace": namespace,
                "labels": common_labels(name),
                "ownerReferences": [owner(body)],
            },
            "spec": {
                "type": "ClusterIP",
                "selector": selector_labels(name),
                "ports": service_ports(METRICS_PORT),
            },
        }
    )


def render_disruption_budget(body: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    name = str((body.get("metadata") or {}).get("name"))
    return stamp(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {
                "name": service_name(name),
                "namespace": namespace,
                "labels": common_labels(name),
                "ownerReferences": [owner(body)],
            },
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(name)}},
        }
    )


def endpoints(service: str, namespace: str) -> dict[str, str]:
    host = f"{service_name(service)}.{namespace}.svc"
    return {
        "grpc": f"{host}:{GRPC_PORT}",
        "http": f"{host}:{HTTP_PORT}",
        "metrics": f"http://{host}:{METRICS_PORT}/metrics",
    }


# The label a client pod carries to reach a service's Triton (value: the service's name).
CLIENT_LABEL = f"{GROUP}/client"


def render_network_policy(
    body: Mapping[str, Any], namespace: str, settings: ServingSettings
) -> dict[str, Any]:
    """Ingress to the service's pods: labelled clients of the namespace on HTTP and gRPC, the
    metrics scraper on the metrics and health ports; nothing else (see the module docstring)."""
    name = str((body.get("metadata") or {}).get("name"))
    scraper: dict[str, Any] = {"namespaceSelector": {}}
    if settings.scraper_namespace_labels:
        scraper["namespaceSelector"] = {"matchLabels": dict(settings.scraper_namespace_labels)}
    return stamp(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": service_name(name),
                "namespace": namespace,
                "labels": common_labels(name),
                "ownerReferences": [owner(body)],
            },
            "spec": {
                "podSelector": {"matchLabels": selector_labels(name)},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": {CLIENT_LABEL: name}}}],
                        "ports": [
                            {"port": HTTP_PORT, "protocol": "TCP"},
                            {"port": GRPC_PORT, "protocol": "TCP"},
                        ],
                    },
                    {
                        "from": [scraper],
                        "ports": [
                            {"port": METRICS_PORT, "protocol": "TCP"},
                            # cosyvoice-serve's stub-health counters (its GET /metrics).
                            {"port": HEALTH_PORT, "protocol": "TCP"},
                        ],
                    },
                ],
            },
        }
    )
