"""An in-memory API server for the shell's unit tests: the writes the operator makes, with
the API server's rules that matter to it (create-if-absent, delete by uid, a status merge
patch with a resourceVersion precondition), each change fed back to the loop's caches the
way a watch would feed it."""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
from collections.abc import Mapping
from typing import Any

from cosyvoice_operator.shell.caches import Caches
from cosyvoice_operator.shell.informer import Cache
from cosyvoice_operator.shell.kube import Kind, KubeError

Ref = tuple[str, str, str]  # (kind, namespace, name)


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class FakeCluster:
    """Quacks like shell.kube.Kube for the writes; `caches` get the watch events."""

    def __init__(self) -> None:
        self.objects: dict[Ref, dict[str, Any]] = {}
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.writes: list[tuple[str, str, str]] = []  # (verb, kind, name) in order
        self.events: list[tuple[str, str, str]] = []  # (object name, type, reason)
        self.refuse: dict[str, KubeError] = {}  # object name -> the error its write gets
        self.caches: Caches | None = None
        # False: changes land, the caches hear of them only at catch_up() (a watch behind).
        self.watching = True
        # True: the operator's own writes come back only at catch_up(), while other clients'
        # changes come at once (one informer's watch behind another's).
        self.echoes_lag = False
        self.backlog: list[tuple[str, str, dict[str, Any]]] = []  # (kind, event, object)
        self.held = 0  # how many changes were held back (delivered late)
        self.yields = False  # True: every write lets other tasks run first (a round trip)
        self._version = itertools.count(100)
        self._uid = itertools.count(1)

    # ---- the API server's side ----------------------------------------------------------

    def put(self, obj: Mapping[str, Any], kind: str = "", own: bool = False) -> dict[str, Any]:
        """Store an object (as another client would; `own`: as the operator's write) and tell
        the caches."""
        stored = copy.deepcopy(dict(obj))
        meta = stored.setdefault("metadata", {})
        meta.setdefault("namespace", "ml")
        meta.setdefault("uid", f"uid-{next(self._uid)}")
        meta["resourceVersion"] = str(next(self._version))
        ref = (kind or str(stored.get("kind")), str(meta["namespace"]), str(meta["name"]))
        existed = ref in self.objects
        self.objects[ref] = stored
        self._tell(ref[0], "MODIFIED" if existed else "ADDED", stored, own)
        return stored

    def get(self, kind: str, name: str, namespace: str = "ml") -> dict[str, Any]:
        return self.objects[(kind, namespace, name)]

    def resync(self) -> None:
        """Deliver the current copy of every object (a watch catching up)."""
        for (kind, _, _), obj in list(self.objects.items()):
            self._tell(kind, "MODIFIED", obj)

    def catch_up(self, count: int | None = None) -> None:
        """Deliver, in order, the changes held back (the first `count` of them)."""
        count = len(self.backlog) if count is None else count
        held, self.backlog = self.backlog[:count], self.backlog[count:]
        for kind, event, obj in held:
            self._deliver(kind, event, obj)

    def _tell(self, kind: str, event: str, obj: dict[str, Any], own: bool = False) -> None:
        if self.caches is None:
            return
        if not self.watching or (own and self.echoes_lag):
            self.backlog.append((kind, event, copy.deepcopy(obj)))
            self.held += 1
            return
        self._deliver(kind, event, obj)

    def _deliver(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        assert self.caches is not None
        cache = self._cache_of(kind)
        if cache is not None:
            cache.deliver({"type": event, "object": copy.deepcopy(obj)})

    def _cache_of(self, kind: str) -> Cache | None:
        assert self.caches is not None
        return {
            "CosyVoiceService": self.caches.services,
            "Job": self.caches.jobs,
            "ConfigMap": self.caches.records,
            "Pod": self.caches.pods,
            "PersistentVolumeClaim": self.caches.claims,
            "Node": self.caches.nodes,
            "Deployment": self.caches.deployments,
            "Service": self.caches.core_services,
            "PodDisruptionBudget": self.caches.budgets,
            "NetworkPolicy": self.caches.network_policies,
        }.get(kind)

    def _find(self, kind: Kind, namespace: str, name: str) -> Ref | None:
        found = (r for r in self.objects if r[1:] == (namespace, name))
        return next((r for r in found if r[0].lower() + "s" == kind.plural), None)

    async def _round_trip(self) -> None:
        if self.yields:
            await asyncio.sleep(0)

    def _count(self, verb: str, kind: str, name: str, resource: str = "") -> None:
        self.requests[(verb, resource or kind.lower() + "s")] += 1
        self.writes.append((verb, kind, name))
        if name in self.refuse:
            raise self.refuse[name]

    # ---- Kube's writes -------------------------------------------------------------------

    async def create_object(self, body: Mapping[str, Any]) -> dict[str, Any] | None:
        await self._round_trip()
        meta = body["metadata"]
        self._count("POST", str(body["kind"]), str(meta["name"]))
        if (str(body["kind"]), str(meta["namespace"]), str(meta["name"])) in self.objects:
            return None
        return copy.deepcopy(self.put(body, own=True))

    async def apply(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._count("PATCH", str(body["kind"]), str(body["metadata"]["name"]))
        return copy.deepcopy(self.put(body, own=True))

    async def delete(self, kind: Kind, namespace: str, name: str, uid: str) -> bool:
        ref = self._find(kind, namespace, name)
        self._count("DELETE", ref[0] if ref else kind.plural, name)
        if ref is None or self.objects[ref]["metadata"]["uid"] != uid:
            return False
        gone = self.objects.pop(ref)
        self._tell(ref[0], "DELETED", gone, own=True)
        return True

    async def merge_patch_object(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        subresource: str = "",
    ) -> dict[str, Any] | None:
        await self._round_trip()
        resource = kind.plural + (f"/{subresource}" if subresource else "")
        ref = self._find(kind, namespace, name)
        self._count("PATCH", ref[0] if ref else kind.plural, name, resource)
        if ref is None:
            return None
        current = self.objects[ref]
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            return None  # 409 Conflict
        changed = merge(copy.deepcopy(current), {k: v for k, v in patch.items() if k != "metadata"})
        return copy.deepcopy(self.put(changed, ref[0], own=True))

    async def merge_patch(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        subresource: str = "",
    ) -> bool:
        return await self.merge_patch_object(kind, namespace, name, patch, subresource) is not None

    async def post_event(
        self, regarding: Mapping[str, Any], kind: str, reason: str, message: str
    ) -> None:
        name = str((regarding.get("metadata") or {}).get("name"))
        self.requests[("POST", "events")] += 1
        self.writes.append(("POST", "Event", reason))
        self.events.append((name, kind, reason))
