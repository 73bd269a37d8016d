"""What stands in front of a service's Triton pods (pure), per ``spec.routing.mode``.

Clients always connect to the Service ``cvs-<name>`` (gRPC 8001, HTTP 8000).

- **Router** (the default): ``cvs-<name>`` selects the router pods, a Deployment
  ``cvs-<name>-router`` of HAProxy whose configuration (ConfigMap ``cvs-<name>-router``,
  rendered by render/router.py) finds the Ready Triton pods through the DNS SRV records of
  the headless Service ``cvs-<name>-pods``. Each router pod gives each Triton pod at most
  floor(slots / router replicas) streams and queues the rest in one FIFO; the router has its
  own PodDisruptionBudget and NetworkPolicy, and the Triton pods' NetworkPolicy admits the
  router pods (inference ports and the health port HAProxy checks).
- **Service**: ``cvs-<name>`` selects the Triton pods (the objects of render/workloads.py,
  unchanged).
- **GatewayAPI**: the Service mode's objects, plus a ``GRPCRoute`` to ``cvs-<name>:8001``
  attached to ``spec.routing.gateway.parentRefs`` and an Envoy Gateway
  ``BackendTrafficPolicy`` (least request, no request timeout: streams are long), when the
  operator is configured for them (``ServingSettings.gateway_api``).

The router pods carry the service's labels with ``app.kubernetes.io/component: router``; in
mode Router the Triton pods' selectors add ``component: serving`` so that no Triton object
selects a router pod (the Triton Deployments' own selectors name the architecture already).

Scale-in and drain: a Triton pod told to stop answers 503 on cosyvoice-serve's ``/ready``
(after its preStop; render/workloads.py sizes its grace period for the drain), HAProxy's
health check takes it out of rotation within seconds (``inter 2s fall 1``), and its playing
streams go on; when it leaves the SRV records HAProxy puts it in maintenance and still lets
its streams finish. A router pod told to stop (SIGUSR1, the official image's stop signal)
stops accepting, lets its streams run up to ``hard-stop-after``, then exits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from cosyvoice_operator.api.labels import (
    COMPONENT_LABEL,
    GROUP,
    NAME_LABEL,
    ROUTER_COMPONENT,
    SERVICE_LABEL,
    SERVING_COMPONENT,
)
from cosyvoice_operator.api.spec import GATEWAY_API, ROUTER, ServiceSpec
from cosyvoice_operator.render import router, triton, workloads
from cosyvoice_operator.render.workloads import (
    CLIENT_LABEL,
    GRPC_PORT,
    HEALTH_PORT,
    HTTP_PORT,
    ServingSettings,
    _name,
    common_labels,
    owner,
    service_name,
    stamp,
)

ROUTER_NAME = "cosyvoice-router"
METRICS_PORT = router.METRICS_PORT
CONFIG_MOUNT = "/etc/cosyvoice/router"
CONFIG_KEY = "haproxy.cfg"
# The pod template's hash of haproxy.cfg: a new configuration rolls the router pods.
CONFIG_HASH_ANNOTATION = f"{GROUP}/router-config-hash"
# Without the first-audio SLO, how long a stream may wait in the router's queue.
DEFAULT_QUEUE_TIMEOUT_SECONDS = 30
# The router pod's stop: preStop while it leaves cvs-<name>'s endpoints, then SIGUSR1 (soft
# stop: no new connection, streams in flight go on) for at most the drain, then the kubelet.
ROUTER_PRESTOP_SECONDS = 5
ROUTER_EXIT_SECONDS = 10
# The official images run as user haproxy, uid and gid 99.
HAPROXY_UID = 99
DEFAULT_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


# ---- names, labels, sizes -------------------------------------------------------------------


def router_name(service: str) -> str:
    return _name("cvs", service, "router")


def pods_service_name(service: str) -> str:
    """The headless Service of the Triton pods (the router's DNS SRV discovery)."""
    return _name("cvs", service, "pods")


def router_labels(service: str) -> dict[str, str]:
    return {**common_labels(service), NAME_LABEL: ROUTER_NAME, COMPONENT_LABEL: ROUTER_COMPONENT}


def router_selector(service: str) -> dict[str, str]:
    return {SERVICE_LABEL: service, COMPONENT_LABEL: ROUTER_COMPONENT}


def triton_selector(svc: ServiceSpec, service: str) -> dict[str, str]:
    """The Triton pods: in mode Router, not the router pods (which carry the service label);
    otherwise today's selector (objects unchanged)."""
    if svc.routing.mode == ROUTER:
        return {SERVICE_LABEL: service, COMPONENT_LABEL: SERVING_COMPONENT}
    return workloads.selector_labels(service)


def slots_per_pod(svc: ServiceSpec) -> int:
    """Streams a Triton pod serves at once: spec.autoscaling.slo.slotsPerPod when set (the
    SLO sizing's figure), else the orchestrator's instance count (one stream each)."""
    return svc.autoscaling.slo.slots_per_pod or triton.orchestrator_instances(svc)


def slots_per_router(svc: ServiceSpec) -> int:
    """maxconn of each Triton pod in one router pod: the slots split over the routers."""
    return max(1, slots_per_pod(svc) // svc.routing.router.replicas)


def server_slots(svc: ServiceSpec) -> int:
    """The most Triton pods a router may know (server-template size): the autoscaler's
    maxReplicas; without autoscaling spec.replicas, but never below maxReplicas, so that a
    manual scale within it does not change the configuration (and roll the routers)."""
    a = svc.autoscaling
    return max(1, a.max_replicas if a.enabled else max(svc.replicas, a.max_replicas))


def queue_timeout_ms(svc: ServiceSpec) -> int:
    """spec.routing.router.queueTimeoutSeconds; 0: the SLO's wait budget (first audio minus
    the first chunk), without an SLO DEFAULT_QUEUE_TIMEOUT_SECONDS."""
    if svc.routing.router.queue_timeout_seconds:
        return svc.routing.router.queue_timeout_seconds * 1000
    slo = svc.autoscaling.slo
    if slo.enabled:
        return max(1, slo.first_audio_milliseconds - slo.first_chunk_milliseconds)
    return DEFAULT_QUEUE_TIMEOUT_SECONDS * 1000


def router_image(svc: ServiceSpec, settings: ServingSettings) -> str:
    return svc.routing.router.image or settings.router_image


def router_grace_seconds(settings: ServingSettings) -> int:
    return ROUTER_PRESTOP_SECONDS + settings.drain_seconds + ROUTER_EXIT_SECONDS


def router_config(
    svc: ServiceSpec, service: str, namespace: str, settings: ServingSettings
) -> router.RouterConfig:
    return router.RouterConfig(
        servers=router.ServerSource.dns(pods_service_name(service), namespace),
        slots_per_server=slots_per_router(svc),
        server_slots=server_slots(svc),
        queue_timeout_ms=queue_timeout_ms(svc),
        hard_stop_after_s=settings.drain_seconds,
    )


def endpoints(svc: ServiceSpec, service: str, namespace: str) -> dict[str, str]:
    """What status.endpoints says: cvs-<name>'s ports (the router's metrics in mode Router)."""
    found = workloads.endpoints(service, namespace)
    if svc.routing.mode == ROUTER:
        found["metrics"] = f"http://{service_name(service)}.{namespace}.svc:{METRICS_PORT}/metrics"
    return found


# ---- the objects ----------------------------------------------------------------------------


def front_objects(
    body: Mapping[str, Any],
    svc: ServiceSpec,
    namespace: str,
    settings: ServingSettings,
    router_allowed: bool = True,
) -> list[dict[str, Any]]:
    """Every object in front of the Triton pods, for the service's routing mode (see the
    module docstring). ``router_allowed`` False leaves the router Deployment out (its image
    is not allowed: the one there, if any, is kept)."""
    name = str((body.get("metadata") or {}).get("name"))
    if svc.routing.mode != ROUTER:
        out = [
            workloads.render_service(body, namespace),
            workloads.render_disruption_budget(body, namespace),
        ]
        if settings.network_policy:
            out.append(workloads.render_network_policy(body, namespace, settings))
        if svc.routing.mode == GATEWAY_API and settings.gateway_api:
            out += [render_grpc_route(body, svc, namespace), render_traffic_policy(body, namespace)]
        return out
    out = [
        render_client_service(body, namespace),
        render_pods_service(body, svc, namespace),
        _budget(body, service_name(name), triton_selector(svc, name), namespace),
        render_router_config(body, svc, namespace, settings),
    ]
    if router_allowed:
        out.append(render_router_deployment(body, svc, namespace, settings, out[-1]))
    out.append(_budget(body, router_name(name), router_selector(name), namespace, router=True))
    if settings.network_policy:
        out += [
            render_triton_network_policy(body, svc, namespace, settings),
            render_router_network_policy(body, namespace, settings),
        ]
    return out


def router_object_names(service: str) -> dict[str, tuple[str, ...]]:
    """kind -> names of the objects only mode Router has (to delete in the other modes)."""
    return {
        "Deployment": (router_name(service),),
        "ConfigMap": (router_name(service),),
        "PodDisruptionBudget": (router_name(service),),
        "NetworkPolicy": (router_name(service),),
        "Service": (pods_service_name(service),),
    }


def _meta(
    body: Mapping[str, Any], name: str, namespace: str, labels: dict[str, str]
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": labels,
        "ownerReferences": [owner(body)],
    }


def render_client_service(body: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """cvs-<name>, what clients connect to: the router pods."""
    name = str((body.get("metadata") or {}).get("name"))
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(body, service_name(name), namespace, common_labels(name)),
            "spec": {
                "type": "ClusterIP",
                "selector": router_selector(name),
                "ports": workloads.service_ports(METRICS_PORT),
            },
        }
    )


def render_pods_service(
    body: Mapping[str, Any], svc: ServiceSpec, namespace: str
) -> dict[str, Any]:
    """The headless Service of the Ready Triton pods: one SRV answer per pod and named port
    (_grpc._tcp and _http._tcp), read by the routers' resolvers."""
    name = str((body.get("metadata") or {}).get("name"))
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(body, pods_service_name(name), namespace, common_labels(name)),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": False,
                "selector": triton_selector(svc, name),
                "ports": workloads.service_ports(None),
            },
        }
    )


def _budget(
    body: Mapping[str, Any],
    name: str,
    selector: dict[str, str],
    namespace: str,
    router: bool = False,
) -> dict[str, Any]:
    service = str((body.get("metadata") or {}).get("name"))
    labels = router_labels(service) if router else common_labels(service)
    return stamp(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _meta(body, name, namespace, labels),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
        }
    )


def render_router_config(
    body: Mapping[str, Any], svc: ServiceSpec, namespace: str, settings: ServingSettings
) -> dict[str, Any]:
    name = str((body.get("metadata") or {}).get("name"))
    text = router.haproxy_config(router_config(svc, name, namespace, settings))
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": _meta(body, router_name(name), namespace, router_labels(name)),
            "data": {CONFIG_KEY: text},
        }
    )


def render_router_deployment(
    body: Mapping[str, Any],
    svc: ServiceSpec,
    namespace: str,
    settings: ServingSettings,
    config: Mapping[str, Any],
) -> dict[str, Any]:
    """The router pods: HAProxy on the rendered configuration, a restricted pod (non-root,
    read-only root, no capability, RuntimeDefault seccomp), spread over nodes and zones."""
    name = str((body.get("metadata") or {}).get("name"))
    digest = hashlib.sha256(str(config["data"][CONFIG_KEY]).encode()).hexdigest()[:16]
    selector = router_selector(name)
    probe = {"httpGet": {"path": router.LIVENESS_PATH, "port": "metrics"}, "timeoutSeconds": 2}
    container = {
        "name": "haproxy",
        "image": router_image(svc, settings),
        "imagePullPolicy": "IfNotPresent",
        "command": ["haproxy", "-db", "-f", f"{CONFIG_MOUNT}/{CONFIG_KEY}"],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": dict(svc.routing.router.resources) or DEFAULT_RESOURCES,
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
            {"name": "run", "mountPath": router.RUNTIME_DIR},
        ],
        "readinessProbe": {**probe, "periodSeconds": 5, "failureThreshold": 2},
        "livenessProbe": {**probe, "periodSeconds": 10, "failureThreshold": 3},
        # Out of cvs-<name>'s endpoints first; then the image's stop signal (SIGUSR1).
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_PRESTOP_SECONDS}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    spread = [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
        }
        for key in ("kubernetes.io/hostname", "topology.kubernetes.io/zone")
    ]
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "terminationGracePeriodSeconds": router_grace_seconds(settings),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": HAPROXY_UID,
            "runAsGroup": HAPROXY_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": selector},
                        },
                    }
                ]
            }
        },
        "topologySpreadConstraints": spread,
        "volumes": [
            {"name": "config", "configMap": {"name": router_name(name)}},
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
        ],
    }
    if settings.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in settings.image_pull_secrets]
    return stamp(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": _meta(body, router_name(name), namespace, router_labels(name)),
            "spec": {
                "replicas": svc.routing.router.replicas,
                "selector": {"matchLabels": selector},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
                },
                "revisionHistoryLimit": 3,
                "template": {
                    "metadata": {
                        "labels": router_labels(name),
                        "annotations": {
                            CONFIG_HASH_ANNOTATION: digest,
                            "prometheus.io/scrape": "true",
                            "prometheus.io/port": str(METRICS_PORT),
                            "prometheus.io/path": "/metrics",
                        },
                    },
                    "spec": pod_spec,
                },
            },
        }
    )


def _scraper(settings: ServingSettings) -> dict[str, Any]:
    if settings.scraper_namespace_labels:
        return {"namespaceSelector": {"matchLabels": dict(settings.scraper_namespace_labels)}}
    return {"namespaceSelector": {}}


def render_router_network_policy(
    body: Mapping[str, Any], namespace: str, settings: ServingSettings
) -> dict[str, Any]:
    """Ingress to the router pods: labelled clients on gRPC and HTTP (as the Triton pods'
    policy admits them in mode Service), the metrics scraper on 8404."""
    name = str((body.get("metadata") or {}).get("name"))
    return stamp(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": _meta(body, router_name(name), namespace, router_labels(name)),
            "spec": {
                "podSelector": {"matchLabels": router_selector(name)},
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
                        "from": [_scraper(settings)],
                        "ports": [{"port": METRICS_PORT, "protocol": "TCP"}],
                    },
                ],
            },
        }
    )


def render_triton_network_policy(
    body: Mapping[str, Any], svc: ServiceSpec, namespace: str, settings: ServingSettings
) -> dict[str, Any]:
    """Mode Router: the Triton pods' policy of render/workloads.py, selecting only the Triton
    pods, and admitting the router pods on the inference ports and the health port."""
    name = str((body.get("metadata") or {}).get("name"))
    policy = workloads.render_network_policy(body, namespace, settings)
    spec = policy["spec"]
    spec["podSelector"] = {"matchLabels": triton_selector(svc, name)}
    spec["ingress"].append(
        {
            "from": [{"podSelector": {"matchLabels": router_selector(name)}}],
            "ports": [
                {"port": HTTP_PORT, "protocol": "TCP"},
                {"port": GRPC_PORT, "protocol": "TCP"},
                {"port": HEALTH_PORT, "protocol": "TCP"},
            ],
        }
    )
    policy["metadata"].pop("annotations", None)
    return stamp(policy)


# ---- Gateway API ----------------------------------------------------------------------------


def render_grpc_route(body: Mapping[str, Any], svc: ServiceSpec, namespace: str) -> dict[str, Any]:
    """A GRPCRoute from the chosen Gateways to cvs-<name>'s gRPC port."""
    name = str((body.get("metadata") or {}).get("name"))
    return stamp(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GRPCRoute",
            "metadata": _meta(body, service_name(name), namespace, common_labels(name)),
            "spec": {
                "parentRefs": [dict(ref) for ref in svc.routing.gateway.parent_refs],
                "rules": [
                    {"backendRefs": [{"name": service_name(name), "port": GRPC_PORT}]},
                ],
            },
        }
    )


def render_traffic_policy(body: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """Envoy Gateway's policy of that route: least request (power of two choices on active
    requests) and no request timeout (Envoy's default 15 s would cut long streams)."""
    name = str((body.get("metadata") or {}).get("name"))
    return stamp(
        {
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "BackendTrafficPolicy",
            "metadata": _meta(body, service_name(name), namespace, common_labels(name)),
            "spec": {
                "targetRefs": [
                    {
                        "group": "gateway.networking.k8s.io",
                        "kind": "GRPCRoute",
                        "name": service_name(name),
                    }
                ],
                "loadBalancer": {"type": "LeastRequest"},
                "timeout": {"http": {"requestTimeout": "0s"}},
            },
        }
    )
