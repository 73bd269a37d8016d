"""The control loop: watch-fed caches, one work queue keyed by object, workers that carry out
what the pure planners decide.

Observe: one informer per kind (services, operator-made Jobs, engine records, build pods,
claims, GPU nodes; peering objects when several replicas run), each listed once and then
followed by its watch. Plan: :func:`service.plan_service` for a service,
:func:`cleanup.plan_cleanup` for a namespace's engines. Apply: only what the plan returns;
a pass that finds nothing to change makes no request at all.

Events route work: a Job, pod or record event wakes the services that want its engine; a
claim event the services of its namespace that use it; a node event (only when what the
operator reads of it changed) every service that picks its GPU products from the nodes; a
service event (only a spec change, a creation or a deletion) that service. Everything that
may leave an engine unused wakes its namespace's cleanup, at most every few seconds.

One writer: services' status is written only here, with a resourceVersion precondition, by
the one worker that holds the service's key.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosyvoice_operator.api import gpus
from cosyvoice_operator.api.effects import (
    ApplyObject,
    CreateObject,
    DeleteObject,
    PatchObject,
    PostEvent,
)
from cosyvoice_operator.api.labels import CLAIM_LABEL, KEY_LABEL, MANAGED, SERVICE_LABEL
from cosyvoice_operator.api.spec import SpecError, parse
from cosyvoice_operator.autoscaling import evaluation
from cosyvoice_operator.autoscaling.policy import Recommendation
from cosyvoice_operator.plan import cleanup, peering
from cosyvoice_operator.plan.service import EngineRef, Policy, plan_service
from cosyvoice_operator.render import triton, workloads
from cosyvoice_operator.shell import metrics
from cosyvoice_operator.shell.informer import Cache, Informer, Obj
from cosyvoice_operator.shell.kube import (
    CLAIMS,
    CLUSTER_PEERINGS,
    CONFIG_MAPS,
    CORE_SERVICES,
    DEPLOYMENTS,
    DISRUPTION_BUDGETS,
    HORIZONTAL_AUTOSCALERS,
    JOBS,
    KINDS_BY_NAME,
    NODES,
    PEERINGS,
    PODS,
    SERVICES,
    Kind,
    Kube,
    KubeError,
)
from cosyvoice_operator.shell.prometheus_source import PrometheusSource

log = logging.getLogger(__name__)

ENGINE_OBJECTS = f"{MANAGED},app.kubernetes.io/name=cosyvoice-engine"
# How long a namespace's cleanup waits after an event, so a burst runs it once.
CLEANUP_DEBOUNCE_SECONDS = 5.0
# A worker that has held one key this long is stuck: the liveness probe fails.
STUCK_SECONDS = 300.0

ServiceKey = tuple[str, str, str]  # ("svc", namespace, name) or ("gc", namespace, "")


# ---- what the caches keep of each object ------------------------------------------------


def _meta(obj: Mapping[str, Any], *extra: str) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "labels", "annotations", *extra)
    return {k: meta[k] for k in keep if k in meta}


def keep_service(obj: Obj) -> Obj:
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": _meta(obj, "generation", "deletionTimestamp", "creationTimestamp"),
        "spec": obj.get("spec") or {},
        "status": obj.get("status") or {},
    }


def keep_job(obj: Obj) -> Obj:
    st = obj.get("status") or {}
    return {
        "metadata": _meta(obj, "creationTimestamp"),
        "status": {"conditions": st.get("conditions") or []},
    }


def keep_pod(obj: Obj) -> Obj:
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


def keep_config_map(obj: Obj) -> Obj:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get("app.kubernetes.io/name") == "cosyvoice-engine":
        return {"metadata": _meta(obj, "creationTimestamp"), "data": obj.get("data") or {}}
    return {"metadata": _meta(obj)}  # a repository ConfigMap: its hash annotation says enough


def keep_deployment(obj: Obj) -> Obj:
    st = obj.get("status") or {}
    return {
        "metadata": _meta(obj, "generation"),
        "spec": {"replicas": (obj.get("spec") or {}).get("replicas")},
        "status": {
            k: st.get(k)
            for k in ("observedGeneration", "replicas", "readyReplicas", "updatedReplicas")
        },
    }


def keep_owned(obj: Obj) -> Obj:
    return {"metadata": _meta(obj)}


def keep_autoscaler(obj: Obj) -> Obj:
    return {
        "metadata": _meta(obj),
        "spec": {"scaleTargetRef": (obj.get("spec") or {}).get("scaleTargetRef") or {}},
    }


def is_record(obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/name") == "cosyvoice-engine"


def keep_claim(obj: Obj) -> Obj:
    return {"metadata": _meta(obj, "deletionTimestamp")}


def keep_node(obj: Obj) -> Obj:
    st = obj.get("status") or {}
    ready = [c for c in st.get("conditions") or [] if c.get("type") == "Ready"]
    return {
        "metadata": {
            "name": (obj.get("metadata") or {}).get("name"),
            "labels": (obj.get("metadata") or {}).get("labels") or {},
            "resourceVersion": (obj.get("metadata") or {}).get("resourceVersion"),
        },
        "spec": {
            "taints": (obj.get("spec") or {}).get("taints") or [],
            "unschedulable": (obj.get("spec") or {}).get("unschedulable", False),
        },
        "status": {
            "allocatable": {
                gpus.GPU_RESOURCE: (st.get("allocatable") or {}).get(gpus.GPU_RESOURCE)
            },
            "conditions": [{"type": "Ready", "status": c.get("status")} for c in ready],
        },
    }


def keep_peering(obj: Obj) -> Obj:
    return {"metadata": _meta(obj), "status": obj.get("status") or {}}


# ---- the caches as the planners read them -------------------------------------------------


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
        self._jobs_by_engine: dict[tuple[str, str, str], set[str]] = collections.defaultdict(set)
        self._pods_by_job: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
        # (namespace, service) -> names of its Deployments / serving pods
        self._by_service: dict[str, dict[tuple[str, str], set[str]]] = {
            "Deployment": collections.defaultdict(set),
            "Pod": collections.defaultdict(set),
        }
        self._gpu_nodes: list[gpus.GPUNode] | None = None

    # index upkeep, called from the informers' change handlers
    def job_changed(self, old: Obj | None, new: Obj | None) -> None:
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            labels = obj["metadata"].get("labels") or {}
            ref = (
                str(obj["metadata"].get("namespace")),
                str(labels.get(KEY_LABEL, "")),
                str(labels.get(CLAIM_LABEL, "")),
            )
            names = self._jobs_by_engine[ref]
            (names.add if add else names.discard)(str(obj["metadata"]["name"]))
            if not names:
                del self._jobs_by_engine[ref]

    def service_object_changed(self, kind: str, old: Obj | None, new: Obj | None) -> None:
        index = self._by_service[kind]
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            service = (obj["metadata"].get("labels") or {}).get(SERVICE_LABEL)
            if not service:
                continue
            ref = (str(obj["metadata"].get("namespace")), str(service))
            names = index[ref]
            (names.add if add else names.discard)(str(obj["metadata"]["name"]))
            if not names:
                del index[ref]

    def pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        self.service_object_changed("Pod", old, new)
        for obj, add in ((old, False), (new, True)):
            if obj is None:
                continue
            job = str((obj["metadata"].get("labels") or {}).get("job-name", ""))
            if not job:
                continue
            ref = (str(obj["metadata"].get("namespace")), job)
            names = self._pods_by_job[ref]
            (names.add if add else names.discard)(str(obj["metadata"]["name"]))
            if not names:
                del self._pods_by_job[ref]

    def nodes_changed(self) -> None:
        self._gpu_nodes = None

    # service.World
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
        names = self._jobs_by_engine.get((namespace, key, tag)) or ()
        found = (self.jobs_cache.get(namespace, n) for n in sorted(names))
        return [
            j
            for j in found
            if j is not None
            and (j["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
            == "engine-build"
        ]

    def pods(self, namespace: str, job: str) -> Sequence[Mapping[str, Any]]:
        names = self._pods_by_job.get((namespace, job)) or ()
        found = (self.pods_cache.get(namespace, n) for n in sorted(names))
        return [p for p in found if p is not None]

    def deployments(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]:
        names = self._by_service["Deployment"].get((namespace, service)) or ()
        cache = self.owned_caches["Deployment"]
        found = (cache.get(namespace, n) for n in sorted(names))
        return [d for d in found if d is not None]

    def owned(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.owned_caches[kind].get(namespace, name)

    def serving_pods(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]:
        names = self._by_service["Pod"].get((namespace, service)) or ()
        found = (self.pods_cache.get(namespace, n) for n in sorted(names))
        return [p for p in found if p is not None]


@dataclass(frozen=True)
class Settings:
    policy: Policy
    cleanup: cleanup.CleanupSettings
    workers: int = 4
    peering: tuple[str, int] | None = None  # (peering name, own priority)
    # Prometheus the autoscaler reads when a service names none, and its rate window.
    prometheus_url: str = ""
    metrics_window_seconds: int = 60


class Controller:
    def __init__(
        self,
        kube: Kube,
        namespaces: tuple[str, ...],
        settings: Settings,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        from cosyvoice_operator.shell.workqueue import WorkQueue

        self.kube = kube
        self.namespaces = namespaces
        self.settings = settings
        self.clock = clock
        self.queue: WorkQueue[ServiceKey] = WorkQueue()
        scopes: list[str | None] = list(namespaces) or [None]

        def informers(
            kind: Kind,
            handler: Callable[[Obj | None, Obj | None], None],
            selector: str,
            keep: Callable[[Obj], Obj],
        ) -> Cache:
            where = scopes if kind.namespaced else [None]
            return Cache([Informer(kube, kind, ns, handler, selector, keep) for ns in where])

        self.services = informers(SERVICES, self._on_service, "", keep_service)
        self.jobs = informers(JOBS, self._on_job, MANAGED, keep_job)
        # Engine records and the model repositories' ConfigMaps: both are the operator's.
        self.records = informers(CONFIG_MAPS, self._on_config_map, MANAGED, keep_config_map)
        self.pods = informers(PODS, self._on_pod, MANAGED, keep_pod)
        self.claims = informers(CLAIMS, self._on_claim, "", keep_claim)
        self.nodes = informers(NODES, self._on_node, gpus.GPU_PRODUCT_LABEL, keep_node)
        self.deployments = informers(DEPLOYMENTS, self._on_deployment, MANAGED, keep_deployment)
        self.core_services = informers(CORE_SERVICES, self._on_owned, MANAGED, keep_owned)
        self.budgets = informers(DISRUPTION_BUDGETS, self._on_owned, MANAGED, keep_owned)
        # Other autoscalers, to report (never fight) one that writes the same replica count.
        self.autoscalers = informers(
            HORIZONTAL_AUTOSCALERS, self._on_autoscaler, "", keep_autoscaler
        )
        self.caches = [
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
        ]
        self.peerings: Cache | None = None
        if settings.peering is not None:
            kind = PEERINGS if namespaces else CLUSTER_PEERINGS
            self.peerings = informers(kind, self._on_peering, "", keep_peering)
            self.caches.append(self.peerings)
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
            },
        )
        self.served: dict[ServiceKey, frozenset[str]] = {}
        # Per service: the autoscaler's recent recommendations (its stabilization windows).
        self.recommendations: dict[tuple[str, str], tuple[Recommendation, ...]] = {}
        self.sources: dict[str, PrometheusSource] = {}
        self.by_namespace: dict[str, set[str]] = collections.defaultdict(set)
        self.interest: dict[EngineRef, set[ServiceKey]] = collections.defaultdict(set)
        self.wants: dict[ServiceKey, frozenset[EngineRef]] = {}
        self.superseded_since: dict[str, dict[str, dt.datetime]] = {}
        self.active = asyncio.Event()
        self.standby_reason: str | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.started_at = time.monotonic()
        self.busy_since: dict[int, tuple[float, ServiceKey]] = {}
        self.passes = 0

    # ---- routing events to keys ----------------------------------------------------------

    def _svc_key(self, obj: Obj) -> ServiceKey:
        meta = obj["metadata"]
        return ("svc", str(meta.get("namespace")), str(meta.get("name")))

    def _gc(self, namespace: str) -> None:
        self.queue.add_after(("gc", namespace, ""), CLEANUP_DEBOUNCE_SECONDS)

    def _on_service(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        key = self._svc_key(obj)
        ns = key[1]
        if new is None:
            self.by_namespace[ns].discard(key[2])
            self._set_wants(key, frozenset())
            self.served.pop(key, None)
            self.queue.add(key)  # a pass in flight must not leave its wants behind
            self._gc(ns)
            return
        self.by_namespace[ns].add(key[2])
        if old is not None and _desired(old) != _desired(new):
            # The autoscaler's count reached the cache: size the Deployments to it now.
            self.queue.add(key)
        if old is None or _generation(old) != _generation(new) or _uid(old) != _uid(new):
            self.queue.add(key)
            self._gc(ns)
            if ((new.get("spec") or {}).get("autoscaling") or {}).get("enabled"):
                self.queue.add(("scale", ns, key[2]))

    def _wake_engine(self, obj: Obj) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        ref = EngineRef(
            str(meta.get("namespace")),
            str(labels.get(CLAIM_LABEL, "")),
            str(labels.get(KEY_LABEL, "")),
        )
        for key in self.interest.get(ref, ()):
            self.queue.add(key)

    def _on_job(self, old: Obj | None, new: Obj | None) -> None:
        self.world.job_changed(old, new)
        finished = metrics.build_finished(old, new)
        if finished is not None:
            metrics.record_build_finished(*finished)
        obj = new or old
        assert obj is not None
        self._wake_engine(obj)
        if old is None or new is None or _conditions(old) != _conditions(new):
            self._gc(str(obj["metadata"].get("namespace")))

    def _wake_owner(self, obj: Obj) -> None:
        service = (obj["metadata"].get("labels") or {}).get(SERVICE_LABEL)
        if service:
            self.queue.add(("svc", str(obj["metadata"].get("namespace")), str(service)))

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        self.world.pod_changed(old, new)
        obj = new or old
        assert obj is not None
        labels = obj["metadata"].get("labels") or {}
        if labels.get("app.kubernetes.io/component") == "serving":
            if old is None or new is None or _scheduled(old) != _scheduled(new):
                self._wake_owner(obj)
        elif KEY_LABEL in labels:
            self._wake_engine(obj)

    def _on_config_map(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if not is_record(obj):
            if (
                old is None
                or new is None
                or workloads.applied_hash(old) != workloads.applied_hash(new)
            ):
                self._wake_owner(obj)
            return
        self._wake_engine(obj)
        self._gc(str(obj["metadata"].get("namespace")))

    def _on_deployment(self, old: Obj | None, new: Obj | None) -> None:
        self.world.service_object_changed("Deployment", old, new)
        obj = new or old
        assert obj is not None
        self._wake_owner(obj)

    def _on_autoscaler(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if old is not None and new is not None and _target(old) == _target(new):
            return  # its status moved: nothing the operator reads
        ns = str(obj["metadata"].get("namespace"))
        for name in list(self.by_namespace.get(ns, ())):
            svc = self.services.get(ns, name)
            if svc and ((svc.get("spec") or {}).get("autoscaling") or {}).get("enabled"):
                self.queue.add(("scale", ns, name))

    def _on_owned(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if old is None or new is None or workloads.applied_hash(old) != workloads.applied_hash(new):
            self._wake_owner(obj)

    def _on_claim(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if (
            old is not None
            and new is not None
            and _uid(old) == _uid(new)
            and (
                bool(old["metadata"].get("deletionTimestamp"))
                == bool(new["metadata"].get("deletionTimestamp"))
            )
        ):
            return  # a status change of the claim: nothing the operator reads
        ns = str(obj["metadata"].get("namespace"))
        for name in list(self.by_namespace.get(ns, ())):
            self.queue.add(("svc", ns, name))
        self._gc(ns)

    def _on_node(self, old: Obj | None, new: Obj | None) -> None:
        before = gpus.GPUNode.from_node(old) if old else None
        after = gpus.GPUNode.from_node(new) if new else None
        if before == after:
            return  # a heartbeat: nothing the operator reads changed
        self.world.nodes_changed()
        for svc in self.services:
            if not ((svc.get("spec") or {}).get("engine") or {}).get("gpuProducts"):
                self.queue.add(self._svc_key(svc))
        for ns in list(self.by_namespace):
            self._gc(ns)

    def _on_peering(self, old: Obj | None, new: Obj | None) -> None:
        self._check_peering()

    def _check_peering(self) -> None:
        if self.peerings is None:
            return
        assert self.settings.peering is not None
        name, priority = self.settings.peering
        if self.namespaces:
            statuses = [
                (lambda o: dict(o.get("status") or {}) if o else None)(self.peerings.get(ns, name))
                for ns in self.namespaces
            ]
        else:
            found = self.peerings.get("", name)
            statuses = [dict(found.get("status") or {}) if found else None]
        why = peering.standby_reason(statuses, priority, self.clock())
        if why != self.standby_reason:
            log.info("standing by: %s" if why else "active: %s", why or f"priority {priority}")
        self.standby_reason = why
        metrics.ACTIVE.set(1 if why is None else 0)
        if why is None and not self.active.is_set():
            self.active.set()
            self._enqueue_everything()
        elif why is not None:
            self.active.clear()

    def _enqueue_everything(self) -> None:
        for svc in self.services:
            self.queue.add(self._svc_key(svc))
            if ((svc.get("spec") or {}).get("autoscaling") or {}).get("enabled"):
                _, ns, name = self._svc_key(svc)
                self.queue.add(("scale", ns, name))
        namespaces = {self._svc_key(s)[1] for s in self.services} | {
            str(r["metadata"].get("namespace")) for r in self.records if is_record(r)
        }
        for ns in namespaces:
            self._gc(ns)

    def _set_wants(self, key: ServiceKey, wants: frozenset[EngineRef]) -> None:
        before = self.wants.get(key, frozenset())
        if before == wants:
            return
        for ref in before - wants:
            self.interest[ref].discard(key)
            if not self.interest[ref]:
                del self.interest[ref]
        for ref in wants - before:
            self.interest[ref].add(key)
        if wants:
            self.wants[key] = wants
        else:
            self.wants.pop(key, None)

    # ---- running -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the informers, wait until every cache holds its first listing, then the
        workers (so nothing is decided on a half-filled cache)."""
        for cache in self.caches:
            for inf in cache.informers:
                self.tasks.append(asyncio.create_task(inf.run(), name=f"informer {inf.name}"))
        waited = time.monotonic()
        while not all(c.synced for c in self.caches):
            await asyncio.sleep(0.05)
            if time.monotonic() - waited > 30:
                missing = [
                    i.name for c in self.caches for i in c.informers if not i.synced.is_set()
                ]
                log.warning("still waiting for the first listing of %s", ", ".join(missing))
                waited = time.monotonic()
        log.info(
            "caches filled: %d services, %d Jobs, %d ConfigMaps, %d pods, %d claims, "
            "%d GPU nodes, %d Deployments",
            *(len(c) for c in self.caches[:7]),
        )
        if self.peerings is None:
            metrics.ACTIVE.set(1)
            self.active.set()
            self._enqueue_everything()
        else:
            self._check_peering()
            self.tasks.append(asyncio.create_task(self._peering_clock(), name="peering clock"))
        for i in range(self.settings.workers):
            self.tasks.append(asyncio.create_task(self._worker(i), name=f"worker {i}"))

    async def _peering_clock(self) -> None:
        # Peers lapse with time, not with events: look again every few seconds (no I/O).
        while True:
            await asyncio.sleep(2)
            self._check_peering()

    async def stop(self) -> None:
        self.queue.shutdown()
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def health(self) -> str | None:
        """Why the loop is not healthy, or None: a dead task, a worker stuck on one key."""
        for task in self.tasks:
            if task.done():
                return f"{task.get_name()} stopped"
        now = time.monotonic()
        for since, key in self.busy_since.values():
            if now - since > STUCK_SECONDS:
                return f"a worker has been on {key[0]} {key[1]}/{key[2]} for {now - since:.0f}s"
        return None

    async def _worker(self, number: int) -> None:
        while True:
            await self.active.wait()
            key = await self.queue.get()
            if not self.active.is_set():
                self.queue.done(key)
                self.queue.add(key)
                continue
            self.busy_since[number] = (time.monotonic(), key)
            outcome = "error"
            try:
                if key[0] == "svc":
                    requeue = await self._reconcile(key)
                elif key[0] == "scale":
                    requeue = await self._autoscale(key[1], key[2])
                else:
                    requeue = await self._cleanup(key[1])
            except asyncio.CancelledError:
                outcome = ""  # stopped midway: not a pass
                raise
            except Backoff:
                outcome = "retry"
                self.queue.add_rate_limited(key)
            except Exception:
                delay = self.queue.add_rate_limited(key)
                log.exception("reconciling %s %s/%s failed; again in %.1fs", *key, delay)
            else:
                outcome = "success"
                self.queue.forget(key)
                if requeue is not None:
                    self.queue.add_after(key, requeue)
            finally:
                since, _ = self.busy_since.pop(number, (time.monotonic(), key))
                if outcome:
                    metrics.record_pass(key[0], outcome, time.monotonic() - since)
                self.queue.done(key)
                self.passes += 1

    # ---- one service ---------------------------------------------------------------------

    async def _reconcile(self, key: ServiceKey) -> float | None:
        _, namespace, name = key
        body = self.services.get(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._set_wants(key, frozenset())
            self.served.pop(key, None)
            metrics.forget_service(namespace, name)
            return None
        policy = self.settings.policy
        step = plan_service(body, self.world, self.clock(), policy)
        refused: dict[str, str] = {}
        for create in step.creates:
            try:
                made = await self.kube.create(create.body)
            except KubeError as exc:
                if exc.status in (0, 429) or exc.status >= 500:
                    raise  # the API server is in trouble: retry the pass with backoff
                refused[create.name] = exc.api_message
                continue
            if made:
                log.info("%s/%s: created %s %s", namespace, name, create.body["kind"], create.name)
                if create.body["kind"] == "Job":
                    metrics.record_build_started()
        for effect in step.workloads:
            try:
                await self._carry_out(namespace, effect)
            except KubeError as exc:
                if exc.status in (0, 429) or exc.status >= 500:
                    raise
                refused[effect.name] = exc.api_message
        if refused:
            step = plan_service(body, self.world, self.clock(), policy, refused)
        self._set_wants(key, step.wants)
        if step.served_keys:
            self.served[key] = step.served_keys
        else:
            self.served.pop(key, None)
        if step.status is not None:
            patch = {
                "metadata": {"resourceVersion": step.status.resource_version},
                "status": dict(step.status.changes),
            }
            written = await self.kube.merge_patch(SERVICES, namespace, name, patch, "status")
            if not written:
                # The service changed since the cache saw it (or our last write is still on
                # its way back): look again, with backoff, on the newer copy.
                raise Backoff
            for event in step.events:
                await self._post(body, event)
        status = body.get("status") or {}
        metrics.record_engines(
            namespace, name, {**status, **step.status.changes} if step.status else status
        )
        if refused:
            raise Backoff
        return step.requeue_after

    async def _post(self, service: Mapping[str, Any], event: PostEvent) -> None:
        await self.kube.post_event(
            event.regarding or service, event.type, event.reason, event.message
        )

    # ---- one service's autoscaling evaluation ---------------------------------------------

    def _source(self, url: str) -> PrometheusSource:
        if url not in self.sources:
            self.sources[url] = PrometheusSource(
                url, window_seconds=self.settings.metrics_window_seconds
            )
        return self.sources[url]

    async def _autoscale(self, namespace: str, name: str) -> float | None:
        """One evaluation: sample, decide, write what changed; the next one after the
        service's evaluation interval. Stops (no requeue) when the service goes or turns its
        autoscaler off."""
        body = self.services.get(namespace, name)
        ref = (namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.recommendations.pop(ref, None)
            metrics.forget(namespace, name)
            return None
        try:
            svc = parse(body.get("spec") or {})
        except SpecError:
            return None
        if not svc.autoscaling.enabled:
            self.recommendations.pop(ref, None)
            metrics.forget(namespace, name)
            return None
        interval = float(svc.autoscaling.evaluation_interval_seconds)
        deployments = self.world.deployments(namespace, name)
        if not deployments:
            return interval  # nothing serves yet: nothing to scale
        pods = self.world.serving_pods(namespace, name)
        fleet = evaluation.fleet(deployments, pods)
        now = self.clock()
        url = svc.autoscaling.prometheus_url or self.settings.prometheus_url
        ready = evaluation.ready_pod_names(pods)
        if not url:
            obs = evaluation.unavailable(
                evaluation.NO_PROMETHEUS,
                "no Prometheus to read: set spec.autoscaling.prometheusUrl or the operator's "
                "COSYVOICE_PROMETHEUS_URL (chart value config.prometheusUrl)",
                now,
            )
        elif not ready:
            obs = evaluation.unavailable(
                evaluation.NO_PODS, "no serving pod is Ready yet: nothing to measure", now
            )
        else:
            sample = await self._source(url).sample(
                namespace, ready, triton.orchestrator(svc.model.variant)
            )
            obs = evaluation.observation(sample, now)
        decision = evaluation.decide(svc, obs, fleet, self.recommendations.get(ref, ()), now)
        metrics.record_evaluation(
            namespace,
            name,
            decision.direction,
            svc.autoscaling.mode,
            decision.replicas,
            fleet.ready,
            obs.queue_latency_ms,
            "" if obs.available else obs.unavailable_reason,
        )
        names = {str(d["metadata"]["name"]) for d in deployments}
        found = evaluation.conflicts(
            name,
            svc,
            [h for h in self.autoscalers if h["metadata"].get("namespace") == namespace],
            names,
        )
        a = svc.autoscaling
        metrics.record_autoscaling_spec(
            namespace,
            name,
            a.target_queue_latency_milliseconds,
            a.min_replicas,
            a.max_replicas,
            len(found),
        )
        generation = int(body["metadata"].get("generation") or 0)
        changes, events = evaluation.status_update(
            body.get("status") or {}, svc, decision, obs, found, generation, now
        )
        if changes:
            patch = {
                "metadata": {"resourceVersion": body["metadata"].get("resourceVersion")},
                "status": changes,
            }
            if not await self.kube.merge_patch(SERVICES, namespace, name, patch, "status"):
                raise Backoff  # the service changed meanwhile: evaluate again, newer copy
            for kind, reason, message in events:
                await self.kube.post_event(body, kind, reason, message)
            # The Deployments follow once the new count reaches the cache (_on_service).
        # Kept only once the evaluation counts (a conflict retried must not record twice).
        self.recommendations[ref] = decision.history
        return interval

    # ---- one namespace's cleanup ---------------------------------------------------------

    async def _cleanup(self, namespace: str) -> float | None:
        services = [s for s in self.services if s["metadata"].get("namespace") == namespace]
        jobs = [j for j in self.jobs if j["metadata"].get("namespace") == namespace]
        records = [
            r for r in self.records if r["metadata"].get("namespace") == namespace and is_record(r)
        ]
        served: frozenset[str] = frozenset().union(
            *(keys for (_, ns, _), keys in self.served.items() if ns == namespace)
        )
        plan = cleanup.plan_cleanup(
            namespace,
            services,
            jobs,
            records,
            self.world,
            self.clock(),
            self.settings.policy,
            self.settings.cleanup,
            self.superseded_since.get(namespace, {}),
            served,
        )
        self.superseded_since[namespace] = dict(plan.superseded)
        for effect in plan.effects:
            await self._carry_out(namespace, effect)
        return plan.requeue_after

    async def _carry_out(
        self, namespace: str, effect: CreateObject | ApplyObject | PatchObject | DeleteObject
    ) -> None:
        if isinstance(effect, CreateObject):
            if await self.kube.create(effect.body):
                log.info("%s: created %s %s", namespace, effect.body["kind"], effect.name)
        elif isinstance(effect, ApplyObject):
            await self.kube.apply(effect.body)
            log.info("%s: applied %s %s", namespace, effect.body["kind"], effect.name)
        elif isinstance(effect, DeleteObject):
            kind = KINDS_BY_NAME[effect.kind]
            if await self.kube.delete(kind, namespace, effect.name, effect.uid):
                log.info("%s: deleted %s %s: %s", namespace, effect.kind, effect.name, effect.why)
        elif isinstance(effect, PatchObject):
            kind = KINDS_BY_NAME[effect.kind]
            await self.kube.merge_patch(kind, namespace, effect.name, effect.patch)


def _scheduled(obj: Mapping[str, Any]) -> Any:
    st = obj.get("status") or {}
    return (
        st.get("phase"),
        [(c.get("type"), c.get("status"), c.get("message")) for c in st.get("conditions") or []],
    )


def _generation(obj: Mapping[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("generation")


def _desired(obj: Mapping[str, Any]) -> Any:
    return ((obj.get("status") or {}).get("autoscaling") or {}).get("desiredReplicas")


def _target(obj: Mapping[str, Any]) -> Any:
    return (obj.get("spec") or {}).get("scaleTargetRef")


class Backoff(Exception):
    """A pass that must be tried again with the key's growing backoff (a refused write, a
    conflict), without being logged as a failure."""


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _conditions(obj: Mapping[str, Any]) -> Any:
    return (obj.get("status") or {}).get("conditions")
