"""Which work a cache event makes: watch events in, work-queue keys out (no I/O).

controller-runtime's handlers and predicates, for this operator's kinds:

- a service: its own pass on a creation, a deletion, a spec change (its generation) or a new
  uid, and when the autoscaler's count reaches the cache; its autoscaling pass too when its
  autoscaler is enabled. Our own status writes coming back wake nothing;
- a Job, a build pod or an engine record: the services that want its engine (as their last
  pass said, :meth:`Router.service_passed`);
- a serving pod (only when its scheduling changed), a Deployment, a repository ConfigMap, a
  core Service or a PodDisruptionBudget (only when what the operator applied changed): the
  service it belongs to;
- a claim (only a new uid or a deletion starting): every service of its namespace;
- a GPU node (only when what the operator reads of it changed, not a heartbeat): every
  service that picks its GPU products from the nodes;
- another autoscaler (only a new target): the autoscaling passes of its namespace.

Everything that may leave an engine unused also schedules its namespace's cleanup, at most
once every few seconds.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple

from cosyvoice_operator.api import labels
from cosyvoice_operator.plan import serving
from cosyvoice_operator.plan.service import EngineRef
from cosyvoice_operator.render import workloads
from cosyvoice_operator.shell import metrics
from cosyvoice_operator.shell.caches import Caches, is_record, node_changed
from cosyvoice_operator.shell.informer import Obj
from cosyvoice_operator.shell.workqueue import WorkQueue

# How long a namespace's cleanup waits after an event, so a burst runs it once.
CLEANUP_DEBOUNCE_SECONDS = 5.0

KeyKind = Literal["service", "scale", "cleanup"]


class Key(NamedTuple):
    """A unit of work: one service's pass, its autoscaling pass, or a namespace's cleanup
    (name "")."""

    kind: KeyKind
    namespace: str
    name: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def service_key(obj: Mapping[str, Any], kind: KeyKind = "service") -> Key:
    meta = obj["metadata"]
    return Key(kind, str(meta.get("namespace")), str(meta.get("name")))


def autoscaling_enabled(service: Mapping[str, Any]) -> bool:
    """Whether a service (as cached) asks for the operator's autoscaler."""
    return bool(((service.get("spec") or {}).get("autoscaling") or {}).get("enabled"))


# ---- the change predicates ---------------------------------------------------------------


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


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _conditions(obj: Mapping[str, Any]) -> Any:
    return (obj.get("status") or {}).get("conditions")


def _deleting(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("metadata") or {}).get("deletionTimestamp"))


def _applied_changed(old: Obj | None, new: Obj | None) -> bool:
    return old is None or new is None or workloads.applied_hash(old) != workloads.applied_hash(new)


def _namespace(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"].get("namespace"))


# ---- the router -------------------------------------------------------------------------


class Router:
    """Turns cache events into keys on the queue. It also remembers, per service, what its
    last pass wanted (the engines whose events wake it) and served (the engines the
    namespace's cleanup keeps)."""

    def __init__(self, queue: WorkQueue[Key], caches: Caches) -> None:
        self.queue = queue
        self.caches = caches
        self.by_namespace: dict[str, set[str]] = collections.defaultdict(set)
        self.interest: dict[EngineRef, set[Key]] = collections.defaultdict(set)
        self.wants: dict[Key, frozenset[EngineRef]] = {}
        self.served: dict[Key, frozenset[str]] = {}

    # ---- what passes tell the router ------------------------------------------------------

    def service_passed(self, key: Key, wants: frozenset[EngineRef], served: frozenset[str]) -> None:
        """A service pass's outcome: the engines it wants and the ones its Deployments serve."""
        self._set_wants(key, wants)
        if served:
            self.served[key] = served
        else:
            self.served.pop(key, None)

    def service_gone(self, key: Key) -> None:
        self.service_passed(key, frozenset(), frozenset())

    def served_in(self, namespace: str) -> frozenset[str]:
        """The engine keys some service of the namespace serves now."""
        return frozenset().union(*(k for key, k in self.served.items() if key[1] == namespace))

    def cleanup(self, namespace: str) -> None:
        """The namespace's cleanup, after a short wait (a burst of events runs it once)."""
        self.queue.add_after(Key("cleanup", namespace), CLEANUP_DEBOUNCE_SECONDS)

    def enqueue_everything(self) -> None:
        """Every service's passes and every namespace's cleanup (on becoming active)."""
        namespaces: set[str] = set()
        for svc in self.caches.services:
            key = service_key(svc)
            self.queue.add(key)
            if autoscaling_enabled(svc):
                self.queue.add(service_key(svc, "scale"))
            namespaces.add(key.namespace)
        namespaces |= {_namespace(r) for r in self.caches.records if is_record(r)}
        for ns in namespaces:
            self.cleanup(ns)

    # ---- the handlers, one per kind ---------------------------------------------------------

    def on_service(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        key = service_key(obj)
        if new is None:
            self.by_namespace[key.namespace].discard(key.name)
            self.service_gone(key)
            self.queue.add(key)  # a pass in flight must not leave its wants behind
            self.cleanup(key.namespace)
            return
        self.by_namespace[key.namespace].add(key.name)
        if old is not None and _desired(old) != _desired(new):
            # The autoscaler's count reached the cache: size the Deployments to it now.
            self.queue.add(key)
        if old is None or _generation(old) != _generation(new) or _uid(old) != _uid(new):
            self.queue.add(key)
            self.cleanup(key.namespace)
            if autoscaling_enabled(new):
                self.queue.add(service_key(new, "scale"))

    def on_job(self, old: Obj | None, new: Obj | None) -> None:
        finished = metrics.build_finished(old, new)
        if finished is not None:
            metrics.record_build_finished(*finished)
        obj = new or old
        assert obj is not None
        self._wake_engine(obj)
        if old is None or new is None or _conditions(old) != _conditions(new):
            self.cleanup(_namespace(obj))

    def on_pod(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        found = obj["metadata"].get("labels") or {}
        if found.get(labels.COMPONENT_LABEL) == labels.SERVING_COMPONENT:
            if old is None or new is None or _scheduled(old) != _scheduled(new):
                self._wake_owner(obj)
        elif labels.KEY_LABEL in found:
            self._wake_engine(obj)

    def on_config_map(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if not is_record(obj):  # a model repository
            if _applied_changed(old, new):
                self._wake_owner(obj)
            return
        self._wake_engine(obj)
        self.cleanup(_namespace(obj))

    def on_deployment(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        self._wake_owner(obj)
        # A Deployment that stops serving an engine (deleted, by the garbage collector after
        # its service, or moved to another engine) may leave that engine unused: the cleanup
        # that ran on the service's deletion kept it while the Deployment still served it.
        was = serving.served_key(old) if old is not None else ""
        if was and (new is None or serving.served_key(new) != was):
            self.cleanup(_namespace(obj))

    def on_owned(self, old: Obj | None, new: Obj | None) -> None:
        """A core Service, PodDisruptionBudget or NetworkPolicy the operator applied."""
        obj = new or old
        assert obj is not None
        if _applied_changed(old, new):
            self._wake_owner(obj)

    def on_autoscaler(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if old is not None and new is not None and _target(old) == _target(new):
            return  # its status moved: nothing the operator reads
        ns = _namespace(obj)
        for name in sorted(self.by_namespace.get(ns, ())):
            svc = self.caches.services.get(ns, name)
            if svc and autoscaling_enabled(svc):
                self.queue.add(Key("scale", ns, name))

    def on_claim(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        assert obj is not None
        if (
            old is not None
            and new is not None
            and _uid(old) == _uid(new)
            and _deleting(old) == _deleting(new)
        ):
            return  # a status change of the claim: nothing the operator reads
        ns = _namespace(obj)
        for name in sorted(self.by_namespace.get(ns, ())):
            self.queue.add(Key("service", ns, name))
        self.cleanup(ns)

    def on_node(self, old: Obj | None, new: Obj | None) -> None:
        if not node_changed(old, new):
            return  # a heartbeat: nothing the operator reads changed
        for svc in self.caches.services:
            if not ((svc.get("spec") or {}).get("engine") or {}).get("gpuProducts"):
                self.queue.add(service_key(svc))
        for ns in list(self.by_namespace):
            self.cleanup(ns)

    # ---- helpers --------------------------------------------------------------------------

    def _wake_engine(self, obj: Obj) -> None:
        found = obj["metadata"].get("labels") or {}
        ref = EngineRef(
            _namespace(obj),
            str(found.get(labels.CLAIM_LABEL, "")),
            str(found.get(labels.KEY_LABEL, "")),
        )
        for key in self.interest.get(ref, ()):
            self.queue.add(key)

    def _wake_owner(self, obj: Obj) -> None:
        service = (obj["metadata"].get("labels") or {}).get(labels.SERVICE_LABEL)
        if service:
            self.queue.add(Key("service", _namespace(obj), str(service)))

    def _set_wants(self, key: Key, wants: frozenset[EngineRef]) -> None:
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
