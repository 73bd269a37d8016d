"""Watch-fed caches: list a kind once, then follow its watch stream.

The operator reads the world only from these caches. Each informer lists its kind (in
pages), then watches from the list's resourceVersion with bookmarks, reconnecting from the
last version it saw when the server ends a watch. Only when the server says that version is
too old (410 Gone) does it list again, and then it replaces its whole store, so an object
deleted while it was not looking is noticed as deleted rather than kept forever.

Every change is handed to a callback as (old, new), either being None for an add or a
delete. Objects are stored after a `transform` that keeps only the fields the operator
reads: at a thousand services and their Jobs and pods, the rest (managedFields, most of the
spec) would be most of the operator's memory.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from cosyvoice_operator.shell.kube import Kind, Kube, KubeError

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)
Handler = Callable[[Obj | None, Obj | None], None]
Transform = Callable[[Obj], Obj]

PAGE_SIZE = 500


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class Refusals:
    """Reads the API server refuses (401/403: missing RBAC, a revoked token), said in one line
    for every informer at once and once per backoff step, not once per informer and retry: a
    ServiceAccount without its rules would otherwise print a warning per kind, for ever.

    The informers start together and back off alike, so the refusals of one step arrive
    within moments of each other: the first one of a step waits ``gather`` seconds for the
    others, then one line names them all."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, gather: float = 0.5) -> None:
        self.clock = clock
        self.gather = gather
        self.refused: dict[str, str] = {}  # informer name -> the API server's words
        self._said_at: float | None = None
        self._pending: asyncio.TimerHandle | None = None
        self._delay = 0.0

    def refuse(self, name: str, exc: KubeError, delay: float) -> None:
        """An informer's read was refused; it retries in about ``delay`` seconds. Called
        from the informer's task (a running event loop)."""
        self.refused[name] = exc.api_message
        log.debug("reading %s refused (%s)", name, exc.api_message)
        self._delay = max(self._delay, delay) if self._pending else delay
        recent = self._said_at is not None and self.clock() - self._said_at < delay
        if self._pending is None and not recent:
            self._pending = asyncio.get_running_loop().call_later(self.gather, self._say)

    def _say(self) -> None:
        self._pending = None
        if not self.refused:
            return
        self._said_at = self.clock()
        example = next(iter(self.refused.values()))
        log.warning(
            "the API server refuses %d of the operator's reads (%s): %s. The operator needs its "
            "RBAC rules (the chart's, rbac.create=true; helm template shows them) or valid "
            "credentials; retrying, next in about %.0fs",
            len(self.refused),
            example,
            ", ".join(sorted(self.refused)),
            self._delay,
        )

    def granted(self, name: str) -> None:
        """An informer's read succeeded."""
        if self.refused.pop(name, None) is not None and not self.refused:
            self._said_at = None
            log.info("the API server grants the operator's reads again")


REFUSALS = Refusals()


def drop_managed_fields(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


class Informer:
    """One kind, in one namespace or cluster-wide, optionally narrowed by a label selector."""

    def __init__(
        self,
        kube: Kube,
        kind: Kind,
        namespace: str | None,
        on_change: Handler,
        label_selector: str = "",
        transform: Transform = drop_managed_fields,
        watch_timeout: int = 300,
        refusals: Refusals | None = None,
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.namespace = namespace
        self.on_change = on_change
        self.label_selector = label_selector
        self.transform = transform
        self.watch_timeout = watch_timeout
        self.refusals = REFUSALS if refusals is None else refusals
        self.store: dict[Key, Obj] = {}
        self.synced = asyncio.Event()
        self.lists = 0  # how many times the kind was listed (1 unless a watch expired)
        self.errors = 0
        self.last_error = ""
        self._resume: str | None = None  # the resourceVersion to watch from; None: list
        # Objects written through (Cache.wrote) whose own watch event has not come yet: key ->
        # the version written. The watch is in order, so until that event comes, any other
        # event of the object is older than what the store holds (see _apply).
        self._ahead: dict[Key, str] = {}

    @property
    def name(self) -> str:
        where = self.namespace or "all namespaces"
        sel = f" [{self.label_selector}]" if self.label_selector else ""
        return f"{self.kind.plural} in {where}{sel}"

    def get(self, namespace: str, name: str) -> Obj | None:
        return self.store.get((namespace, name))

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self.store.values()))

    def _emit(self, old: Obj | None, new: Obj | None) -> None:
        try:
            self.on_change(old, new)
        except Exception:
            # A handler's bug must not stop the stream: the cache would silently freeze.
            log.exception("handling a change of %s failed", self.name)

    async def _list(self) -> str:
        """List everything (in pages), replace the store, tell what changed; the version to
        watch from."""
        fresh: dict[Key, Obj] = {}
        query: dict[str, Any] = {"limit": PAGE_SIZE}
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        version = ""
        while True:
            page = await self.kube.request("GET", self.kind.path(self.namespace), query)
            for item in page.get("items") or []:
                obj = self.transform(item)
                fresh[key_of(obj)] = obj
            meta = page.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            token = meta.get("continue")
            if not token:
                break
            query = {**query, "continue": token}
        self.lists += 1
        self._ahead.clear()
        old_store, self.store = self.store, fresh
        for key, obj in fresh.items():
            before = old_store.get(key)
            if before is None or _version(before) != _version(obj):
                self._emit(before, obj)
        for key, before in old_store.items():
            if key not in fresh:
                self._emit(before, None)
        return version

    def _apply(self, event: Mapping[str, Any], written: bool = False) -> str | None:
        """Apply one watch event (`written`: a copy written through, from Cache.wrote); the
        resourceVersion to resume from, or None to relist."""
        kind = event.get("type")
        raw = event.get("object") or {}
        if kind == "ERROR":
            code = raw.get("code")
            if code == 410:
                return None
            raise KubeError(
                int(code or 0),
                str(raw.get("reason", "")),
                str(raw.get("message")),
                "WATCH",
                self.kind.path(self.namespace),
            )
        version = str((raw.get("metadata") or {}).get("resourceVersion") or "")
        if kind == "BOOKMARK":
            return version
        obj = self.transform(dict(raw))
        key = key_of(obj)
        before = self.store.get(key)
        ahead = None if written else self._ahead.get(key)
        if ahead is not None:
            if kind != "DELETED" and version != ahead:
                return version  # older than the copy written through: the store keeps that
            del self._ahead[key]  # the write's own event (or the object's end): caught up
        if kind == "DELETED":
            if before is not None:
                del self.store[key]
                self._emit(before, None)
        else:
            self.store[key] = obj
            if before is None or not version or _version(before) != version:
                self._emit(before, obj)  # else a copy written through already (Cache.wrote)
        return version

    async def _watch(self) -> None:
        """Follow the watch from the last version seen until the server says that version
        is gone (410: the resume point is dropped, so the next round lists); raises on
        errors, keeping the resume point."""
        while self._resume is not None:
            query: dict[str, Any] = {
                "watch": True,
                "resourceVersion": self._resume,
                "allowWatchBookmarks": True,
                "timeoutSeconds": self.watch_timeout,
            }
            if self.label_selector:
                query["labelSelector"] = self.label_selector
            async for event in self.kube.watch_lines(
                self.kind.path(self.namespace), query, self.watch_timeout
            ):
                resumed = self._apply(event)
                if resumed is None:
                    log.debug("watch of %s expired (410): listing again", self.name)
                    self._resume = None
                    return
                self._resume = resumed or self._resume

    async def run(self) -> None:
        """List, then watch, forever. A failed watch resumes from the last version seen; only
        an expired version lists again. Errors are retried with a capped, jittered backoff."""
        delay = 0.5
        while True:
            try:
                if self._resume is None:
                    self._resume = await self._list()
                    self.synced.set()
                    self.refusals.granted(self.name)
                await self._watch()
                delay = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if isinstance(exc, KubeError) and exc.status == 410:
                    self._resume = None  # too old to watch from: list again, at once
                    continue
                self.errors += 1
                self.last_error = str(exc)
                if isinstance(exc, KubeError) and exc.status in (401, 403):
                    self.refusals.refuse(self.name, exc, delay)
                else:
                    log.warning("watching %s failed (%s); again in %.1fs", self.name, exc, delay)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 30.0)


def _selects(selector: str, labels: Mapping[str, Any]) -> bool:
    """Whether a label selector of "key=value" and "key" terms selects these labels (any
    other form: no)."""
    for term in filter(None, selector.split(",")):
        key, equals, value = term.partition("=")
        if any(c in key for c in "!<>() "):
            return False
        if key not in labels or (equals and str(labels[key]) != value):
            return False
    return True


def _version(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Cache:
    """One kind over every namespace the operator serves: an informer per namespace, or one
    cluster-wide, read as one store."""

    def __init__(self, informers: list[Informer]) -> None:
        self.informers = informers

    def get(self, namespace: str, name: str) -> Obj | None:
        for inf in self.informers:
            if inf.namespace in (None, namespace) or not inf.kind.namespaced:
                found = inf.get(namespace if inf.kind.namespaced else "", name)
                if found is not None:
                    return found
        return None

    def __iter__(self) -> Iterator[Obj]:
        for inf in self.informers:
            yield from inf

    def __len__(self) -> int:
        return sum(len(inf.store) for inf in self.informers)

    def wrote(self, obj: Mapping[str, Any], previous: str | None) -> None:
        """An object the operator has just written, as the API server answered: stored and
        handed on now rather than when its watch event comes (that one is then a duplicate,
        not handed on again), so that the next pass plans on what was written, not on the
        copy before it. Only over the copy the write started from (`previous`: its
        resourceVersion, None when there was none): a newer one the watch brought meanwhile
        is kept. Until the write's own watch event comes, the watch's other events of the
        object are older (the watch is in order: earlier writes' events still on their way)
        and are not stored: the store would go back to a copy the API server has moved on
        from, and a pass planned on it would write again, or conflict. Objects outside the
        informer's label selector are not kept at all."""
        meta = obj.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        for inf in self.informers:
            if inf.kind.namespaced and inf.namespace not in (None, namespace):
                continue
            if not _selects(inf.label_selector, meta.get("labels") or {}):
                return
            before = inf.get(namespace if inf.kind.namespaced else "", name)
            if (None if before is None else _version(before)) == previous:
                event = {"type": "MODIFIED" if before else "ADDED", "object": dict(obj)}
                inf._apply(event, written=True)
                if _version(obj) and _version(obj) != previous:  # else no event will come
                    inf._ahead[(namespace if inf.kind.namespaced else "", name)] = _version(obj)
            return

    def deliver(self, event: Mapping[str, Any]) -> None:
        """Hand one watch event (``{"type": "ADDED", "object": {...}}``) to the informer of
        the object's namespace, as its watch stream would: stored, then handed on. How
        tests feed the caches without an API server."""
        namespace = str(((event.get("object") or {}).get("metadata") or {}).get("namespace"))
        for inf in self.informers:
            if inf.namespace in (None, namespace) or not inf.kind.namespaced:
                inf._apply(event)
                return
        raise KeyError(f"no informer of {namespace!r} in this cache")

    @property
    def synced(self) -> bool:
        return all(inf.synced.is_set() for inf in self.informers)

    @property
    def lists(self) -> int:
        return sum(inf.lists for inf in self.informers)
