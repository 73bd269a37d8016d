"""The loop's caches: one informer-fed store per kind, what each keeps of its objects, and the
planners' World over them.

Every object is trimmed to the fields the operator reads before it is stored (a memory
policy: at a thousand services and their Jobs and pods, the rest would be most of the
operator's memory). The World keeps three secondary indexes (a build's Jobs, a Job's pods, a
service's Deployments and serving pods), updated from the same change events before they are
routed, so that a pass never scans a whole store.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from cosyvoice_operator.api import gpus, labels
from cosyvoice_operator.shell.informer import Cache, Handler, Informer, Obj
from cosyvoice_operator.shell.kube import (
    CLAIMS,
    CLUSTER_PEERINGS,
    CONFIG_MAPS,
    CORE_SERVICES,
    DEPLOYMENTS,
    DISRUPTION_BUDGETS,
    GRPC_ROUTES,
    HORIZONTAL_AUTOSCALERS,
    JOBS,
    NETWORK_POLICIES,
    NODES,
    PEERINGS,
    PODS,
    SERVICES,
    TRAFFIC_POLICIES,
    Kind,
    Kube,
)

# ---- what the caches keep of each object ------------------------------------------------


def _meta(obj: Mapping[str, Any], *extra: str) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", *extra)
    return {k: meta[k] for k in keep if k in meta}


def trim_service(obj: Obj) -> Obj:
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": _meta(obj, "generation", "deletionTimestamp", "creationTimestamp"),
        "spec": obj.get("spec") or {},
        "status": obj.get("status") or {},
    }


def trim_job(obj: Obj) -> Obj:
    st = obj.get("status") or {}
    return {
        "metadata": _meta(obj, "creationTimestamp"),
        "status": {"conditions": st.get("conditions") or []},
    }


def trim_pod(obj: Obj) -> Obj:
    st = obj.get("status") or {}
    return {
        "metadata": _meta(obj, "creationTimestamp", "deletionTimestamp"),
        "spec": {"nodeName": (obj.get("spec") or {}).get("nodeName")},
        "status": {
            "phase": st.get("phase"),
            "startTime": st.get("startTime"),
            "conditions": st.get("conditions") or [],
            "containerStatuses": st.get("containerStatuses") or [],
        },
    }


def trim_config_map(obj: Obj) -> Obj:
    if is_record(obj):
        return {"metadata": _meta(obj, "creationTimestamp"), "data": obj.get("data") or {}}
    return {"metadata": _meta(obj)}  # a repository ConfigMap: its hash annotation says enough


def trim_deployment(obj: Obj) -> Obj:
    st = obj.get("status") or {}
    return {
        "metadata": _meta(obj, "generation"),
        "spec": {"replicas": (obj.get("spec") or {}).get("replicas")},
        "status": {
            k: st.get(k)
            for k in ("observedGeneration", "replicas", "readyReplicas", "updatedReplicas")
        },
    }


def trim_owned(obj: Obj) -> Obj:
    return {"metadata": _meta(obj)}


def trim_autoscaler(obj: Obj) -> Obj:
    return {
        "metadata": _meta(obj),
        "spec": {"scaleTargetRef": (obj.get("spec") or {}).get("scaleTargetRef") or {}},
    }


def trim_claim(obj: Obj) -> Obj:
    return {"metadata": _meta(obj, "deletionTimestamp")}


def trim_node(obj: Obj) -> Obj:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    st = obj.get("status") or {}
    ready = [c for c in st.get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "metadata": {
            "name": meta.get("name"),
            "labels": meta.get("labels") or {},
            "resourceVersion": meta.get("resourceVersion"),
        },
        "spec": {
            "taints": spec.get("taints") or [],
            "unschedulable": spec.get("unschedulable", False),
        },
        "status": {
            "allocatable": {
                gpus.GPU_RESOURCE: (st.get("allocatable") or {}).get(gpus.GPU_RESOURCE)
            },
            "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
        },
    }


def trim_peering(obj: Obj) -> Obj:
    return {"metadata": _meta(obj), "status": obj.get("status") or {}}


def is_record(obj: Mapping[str, Any]) -> bool:
    """An engine record (and not a model repository ConfigMap)."""
    found = (obj.get("metadata") or {}).get("labels") or {}
    return found.get(labels.NAME_LABEL) == labels.ENGINE_NAME


def node_changed(old: Obj | None, new: Obj | None) -> bool:
    """Whether what the operator reads of a GPU node changed (not a heartbeat)."""
    before = gpus.GPUNode.from_node(old) if old else None
    after = gpus.GPUNode.from_node(new) if new else None
    return before != after


# ---- the caches as the planners read them -------------------------------------------------


class _Index:
    """(namespace, a value of the object) -> names of the objects of that value."""

    def __init__(self, value_of: Callable[[Obj], str]) -> None:
        self.value_of = value_of
        self.names: dict[tuple[str, str], set[str]] = collections.defaultdict(set)

    def changed(self, old: Obj | None, new: Obj | None) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            value = self.value_of(obj)
            if not value:
                continue
            ref = (str(obj["metadata"].get("namespace")), value)
            names = self.names[ref]
            (names.add if add else names.discard)(str(obj["metadata"]["name"]))
            if not names:
                del self.names[ref]

    def find(self, cache: Cache, namespace: str, value: str) -> list[Obj]:
        found = (cache.get(namespace, n) for n in sorted(self.names.get((namespace, value), ())))
        return [o for o in found if o is not None]


def _label(name: str) -> Callable[[Obj], str]:
    return lambda obj: str((obj["metadata"].get("labels") or {}).get(name) or "")


def _engine_of(obj: Obj) -> str:
    """A Job's engine as one index value: its key and cache-claim tag."""
    found = obj["metadata"].get("labels") or {}
    return f"{found.get(labels.KEY_LABEL, '')}/{found.get(labels.CLAIM_LABEL, '')}"


class CacheWorld:
    """service.World over the informers' stores, with the indexes the planners need."""

    def __init__(
        self,
        claims: Cache,
        records: Cache,
        jobs: Cache,
        pods: Cache,
        nodes: Cache,
        owned: Mapping[str, Cache] | None = None,
    ):
        self.claims, self.records, self.jobs_cache, self.pods_cache = claims, records, jobs, pods
        self.nodes = nodes
        self.owned_caches = dict(owned or {})
        # (namespace, "key/claim tag") -> build Jobs; (namespace, Job) -> its pods
        self._jobs_by_engine = _Index(_engine_of)
        self._pods_by_job = _Index(_label("job-name"))
        # (namespace, service) -> names of its Deployments / serving pods
        self._deployments = _Index(_label(labels.SERVICE_LABEL))
        self._serving_pods = _Index(_label(labels.SERVICE_LABEL))
        self._gpu_nodes: list[gpus.GPUNode] | None = None

    # index upkeep, called with every change before it is routed
    def job_changed(self, old: Obj | None, new: Obj | None) -> None:
        self._jobs_by_engine.changed(old, new)

    def deployment_changed(self, old: Obj | None, new: Obj | None) -> None:
        self._deployments.changed(old, new)

    def pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        self._serving_pods.changed(old, new)
        self._pods_by_job.changed(old, new)

    def node_changed(self, old: Obj | None, new: Obj | None) -> None:
        if node_changed(old, new):
            self._gpu_nodes = None

    # lifecycle.World
    def gpu_nodes(self) -> Sequence[gpus.GPUNode]:
        if self._gpu_nodes is None:
            found = (gpus.GPUNode.from_node(n) for n in self.nodes)
            self._gpu_nodes = [n for n in found if n is not None]
        return self._gpu_nodes

    def claim_uid(self, namespace: str, name: str) -> str | None:
        claim = self.claims.get(namespace, name)
        if claim is None or claim["metadata"].get("deletionTimestamp"):
            return None
        return str(claim["metadata"].get("uid"))

    def record(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.records.get(namespace, name)

    def jobs(self, namespace: str, key: str, tag: str) -> Sequence[Mapping[str, Any]]:
        found = self._jobs_by_engine.find(self.jobs_cache, namespace, f"{key}/{tag}")
        return [
            j
            for j in found
            if (j["metadata"].get("labels") or {}).get(labels.COMPONENT_LABEL)
            == labels.BUILD_COMPONENT
        ]

    def pods(self, namespace: str, job: str) -> Sequence[Mapping[str, Any]]:
        return self._pods_by_job.find(self.pods_cache, namespace, job)

    def deployments(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]:
        return self._deployments.find(self.owned_caches["Deployment"], namespace, service)

    def owned(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.owned_caches[kind].get(namespace, name)

    def serving_pods(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]:
        return self._serving_pods.find(self.pods_cache, namespace, service)


# ---- building them ------------------------------------------------------------------------


class Routes(Protocol):
    """Where each kind's changes go once the indexes follow them (the Router)."""

    def on_service(self, old: Obj | None, new: Obj | None) -> None: ...

    def on_job(self, old: Obj | None, new: Obj | None) -> None: ...

    def on_config_map(self, old: Obj | None, new: Obj | None) -> None: ...

    def on_pod(self, old: Obj | None, new: Obj | None) -> None: ...

    def on_claim(self, old: Obj | None, new: Obj | None) -> None: ...

    def on_node(self, old: Obj | None, new: Obj | None) -> None: ...

    def on_deployment(self, old: Obj | None, new: Obj | None) -> None: ...

    def on_owned(self, old: Obj | None, new: Obj | None) -> None: ...

    def on_autoscaler(self, old: Obj | None, new: Obj | None) -> None: ...


def _ignore(old: Obj | None, new: Obj | None) -> None:
    """What an informer calls until `Caches.route` connects it."""


def _then(first: Handler, second: Handler) -> Handler:
    def both(old: Obj | None, new: Obj | None) -> None:
        first(old, new)
        second(old, new)

    return both


class Caches:
    """Every kind the loop reads, in the namespaces it serves (cluster-wide ones once), and
    the World over them. Nothing is listed until the informers run."""

    def __init__(
        self,
        kube: Kube,
        namespaces: tuple[str, ...],
        peering: bool = False,
        gateway_api: bool = False,
    ) -> None:
        scopes: list[str | None] = list(namespaces) or [None]

        def cache(kind: Kind, selector: str, trim: Callable[[Obj], Obj]) -> Cache:
            where = scopes if kind.namespaced else [None]
            return Cache([Informer(kube, kind, ns, _ignore, selector, trim) for ns in where])

        self.services = cache(SERVICES, "", trim_service)
        self.jobs = cache(JOBS, labels.MANAGED, trim_job)
        # Engine records and the model repositories' ConfigMaps: both are the operator's.
        self.records = cache(CONFIG_MAPS, labels.MANAGED, trim_config_map)
        self.pods = cache(PODS, labels.MANAGED, trim_pod)
        self.claims = cache(CLAIMS, "", trim_claim)
        self.nodes = cache(NODES, gpus.GPU_PRODUCT_LABEL, trim_node)
        self.deployments = cache(DEPLOYMENTS, labels.MANAGED, trim_deployment)
        self.core_services = cache(CORE_SERVICES, labels.MANAGED, trim_owned)
        self.budgets = cache(DISRUPTION_BUDGETS, labels.MANAGED, trim_owned)
        self.network_policies = cache(NETWORK_POLICIES, labels.MANAGED, trim_owned)
        # Other autoscalers, to report (never fight) one that writes the same replica count.
        self.autoscalers = cache(HORIZONTAL_AUTOSCALERS, "", trim_autoscaler)
        # spec.routing.mode GatewayAPI's objects, only when the operator writes them (their
        # CRDs may not exist otherwise).
        self.gateway: dict[str, Cache] = {}
        if gateway_api:
            self.gateway = {
                "GRPCRoute": cache(GRPC_ROUTES, labels.MANAGED, trim_owned),
                "BackendTrafficPolicy": cache(TRAFFIC_POLICIES, labels.MANAGED, trim_owned),
            }
        self.peerings: Cache | None = None
        if peering:
            self.peerings = cache(PEERINGS if namespaces else CLUSTER_PEERINGS, "", trim_peering)
        self.world = CacheWorld(
            self.claims,
            self.records,
            self.jobs,
            self.pods,
            self.nodes,
            {
                "ConfigMap": self.records,
                "Deployment": self.deployments,
                "Service": self.core_services,
                "PodDisruptionBudget": self.budgets,
                "NetworkPolicy": self.network_policies,
                **self.gateway,
            },
        )

    def all(self) -> list[Cache]:
        """Every cache, the first seven in the order the start-up log counts them."""
        found = [
            self.services,
            self.jobs,
            self.records,
            self.pods,
            self.claims,
            self.nodes,
            self.deployments,
            self.core_services,
            self.budgets,
            self.autoscalers,
            self.network_policies,
        ]
        found += self.gateway.values()
        return found + ([self.peerings] if self.peerings is not None else [])

    def of_kind(self, kind: str) -> Cache | None:
        """The cache of the objects of a kind the operator writes (None: not cached)."""
        return {
            "CosyVoiceService": self.services,
            "Job": self.jobs,
            "ConfigMap": self.records,
            "Deployment": self.deployments,
            "Service": self.core_services,
            "PodDisruptionBudget": self.budgets,
            "NetworkPolicy": self.network_policies,
            **self.gateway,
        }.get(kind)

    def version_of(self, kind: str, namespace: str, name: str) -> str | None:
        """The resourceVersion of the cached copy (None: none cached)."""
        cache = self.of_kind(kind)
        found = cache.get(namespace, name) if cache is not None else None
        return None if found is None else str(found["metadata"].get("resourceVersion") or "")

    def wrote(self, kind: str, obj: Mapping[str, Any], previous: str | None) -> None:
        """What the operator wrote, as the API server answered, over the cached copy of
        version `previous` (see Cache.wrote)."""
        cache = self.of_kind(kind)
        if cache is not None and obj.get("metadata"):
            cache.wrote(obj, previous)

    def route(self, routes: Routes, on_peering: Handler | None = None) -> None:
        """Send every change to its handler, once the World's indexes have followed it."""
        world = self.world
        wiring: list[tuple[Cache | None, Handler]] = [
            (self.services, routes.on_service),
            (self.jobs, _then(world.job_changed, routes.on_job)),
            (self.records, routes.on_config_map),
            (self.pods, _then(world.pod_changed, routes.on_pod)),
            (self.claims, routes.on_claim),
            (self.nodes, _then(world.node_changed, routes.on_node)),
            (self.deployments, _then(world.deployment_changed, routes.on_deployment)),
            (self.core_services, routes.on_owned),
            (self.budgets, routes.on_owned),
            (self.network_policies, routes.on_owned),
            (self.autoscalers, routes.on_autoscaler),
            (self.peerings, on_peering or _ignore),
            *((cache, routes.on_owned) for cache in self.gateway.values()),
        ]
        for cache, handler in wiring:
            for inf in cache.informers if cache is not None else ():
                inf.on_change = handler
