"""The control loop: watch-fed caches, one work queue of typed keys, workers that carry out
what the pure planners decide.

Observe: one informer per kind (`caches.py`), each listed once and then followed by its
watch. Route: every change becomes keys on the queue (`routing.py`). Plan and apply, one
pass per key, dispatched by the key's kind:

- ``service``: :func:`service.plan_service`, its effects carried out by the applier
  (`apply.py`); a pass that finds nothing to change makes no request at all;
- ``scale``: one autoscaling evaluation (`autoscale_loop.py`);
- ``cleanup``: :func:`cleanup.plan_cleanup` for a namespace's engines.

Which replica works is `leader.py`'s: the workers wait while it stands by.

Two passes of one service. The queue never hands one key to two workers at once, but a
service has two keys (its ``service`` and ``scale`` passes), and both write its status. They
are not serialized: every status write carries the resourceVersion the pass planned from as
a precondition, so a pass that planned on a copy the other pass has since changed writes
nothing, posts none of its Events, and runs again with the key's backoff on the newer copy
(:class:`apply.Conflict`). Each writes only the status fields it owns (the service plan's, and
``autoscaling`` with the autoscaler's conditions), planned from the whole current copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.service import Policy, plan_service
from cosyvoice_operator.plan.serving import served_checkpoint, served_key
from cosyvoice_operator.shell import logs, metrics
from cosyvoice_operator.shell.apply import Applier, Backoff
from cosyvoice_operator.shell.autoscale_loop import Autoscaler
from cosyvoice_operator.shell.caches import Caches, is_record
from cosyvoice_operator.shell.kube import Kube
from cosyvoice_operator.shell.leader import Leader
from cosyvoice_operator.shell.routing import Key, KeyKind, Router
from cosyvoice_operator.shell.workqueue import WorkQueue

log = logging.getLogger(__name__)

# A worker that has held one key this long is stuck: the liveness probe fails.
STUCK_SECONDS = 300.0
# How long start() waits for the first listings before it says which are missing.
SYNC_WARNING_SECONDS = 30.0


@dataclass(frozen=True)
class Settings:
    policy: Policy
    cleanup: cleanup.CleanupSettings
    workers: int = 4
    peering: tuple[str, int] | None = None  # (peering name, own priority)
    # Prometheus the autoscaler reads when a service names none, and its rate window.
    prometheus_url: str = ""
    metrics_window_seconds: int = 60
    # Other Prometheus URLs a service may name (any other is refused without a request).
    allowed_prometheus_urls: tuple[str, ...] = ()


class Controller:
    def __init__(
        self,
        kube: Kube,
        namespaces: tuple[str, ...],
        settings: Settings,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.kube = kube
        self.namespaces = namespaces
        self.settings = settings
        self.clock = clock
        self.queue: WorkQueue[Key] = WorkQueue()
        self.caches = Caches(
            kube,
            namespaces,
            peering=settings.peering is not None,
            gateway_api=settings.policy.serving.gateway_api,
        )
        self.world = self.caches.world
        self.router = Router(self.queue, self.caches)
        self.leader = Leader(
            self.caches.peerings,
            namespaces,
            settings.peering,
            clock,
            self.router.enqueue_everything,
        )
        self.caches.route(self.router, self.leader.on_peering)
        self.applier = Applier(kube, self.caches)
        self.autoscaler = Autoscaler(
            self.caches,
            self.applier,
            settings.prometheus_url,
            settings.metrics_window_seconds,
            clock,
            settings.allowed_prometheus_urls,
        )
        self.passes_by_kind: dict[KeyKind, Callable[[Key], Awaitable[float | None]]] = {
            "service": self._reconcile,
            "scale": lambda key: self.autoscaler.evaluate(key.namespace, key.name),
            "cleanup": lambda key: self._cleanup(key.namespace),
        }
        # Per namespace: build Jobs found superseded (uid -> since when).
        self.superseded_since: dict[str, dict[str, dt.datetime]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.started_at = time.monotonic()
        self.busy_since: dict[int, tuple[float, Key]] = {}
        self.passes = 0

    @property
    def active(self) -> asyncio.Event:
        return self.leader.active

    @property
    def standby_reason(self) -> str | None:
        return self.leader.standby_reason

    # ---- running -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the informers, wait until every cache holds its first listing, then the
        workers (so nothing is decided on a half-filled cache)."""
        caches = self.caches.all()
        for cache in caches:
            for inf in cache.informers:
                self.tasks.append(asyncio.create_task(inf.run(), name=f"informer {inf.name}"))
        waited = time.monotonic()
        while not all(c.synced for c in caches):
            await asyncio.sleep(0.05)
            if time.monotonic() - waited > SYNC_WARNING_SECONDS:
                missing = [i.name for c in caches for i in c.informers if not i.synced.is_set()]
                log.warning("still waiting for the first listing of %s", ", ".join(missing))
                waited = time.monotonic()
        log.info(
            "caches filled: %d services, %d Jobs, %d ConfigMaps, %d pods, %d claims, "
            "%d GPU nodes, %d Deployments",
            *(len(c) for c in caches[:7]),
        )
        clock = self.leader.start()
        if clock is not None:
            self.tasks.append(clock)
        for i in range(self.settings.workers):
            self.tasks.append(asyncio.create_task(self._worker(i), name=f"worker {i}"))

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
                return f"a worker has been on {key} for {now - since:.0f}s"
        return None

    async def process(self, key: Key) -> float | None:
        """One pass of `key`; seconds until it must run again although nothing changes
        (None: only when something does). Raises Backoff to be retried with backoff."""
        return await self.passes_by_kind[key.kind](key)

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
                with logs.about(*_object_of(key)):
                    requeue = await self.process(key)
            except asyncio.CancelledError:
                outcome = ""  # stopped midway: not a pass
                raise
            except Backoff:
                outcome = "retry"
                self.queue.add_rate_limited(key)
            except Exception:
                delay = self.queue.add_rate_limited(key)
                log.exception("pass %s failed; again in %.1fs", key, delay)
            else:
                outcome = "success"
                self.queue.forget(key)
                if requeue is not None:
                    self.queue.add_after(key, requeue)
            finally:
                since, _ = self.busy_since.pop(number, (time.monotonic(), key))
                if outcome:
                    metrics.record_pass(key.kind, outcome, time.monotonic() - since)
                self.queue.done(key)
                self.passes += 1

    # ---- one service ---------------------------------------------------------------------

    async def _reconcile(self, key: Key) -> float | None:
        namespace, name = key.namespace, key.name
        body = self.caches.services.get(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            self.router.service_gone(key)
            metrics.forget_service(namespace, name)
            return None
        policy = self.settings.policy
        step = plan_service(body, self.world, self.clock(), policy)
        # The Jobs, records and serving objects of one pass depend on none of each other.
        refused = await self.applier.carry_out_all(
            namespace, (*step.creates, *step.workloads), body, together=True
        )
        if refused:
            step = plan_service(body, self.world, self.clock(), policy, refused)
        self.router.service_passed(key, step.wants, step.served_keys)
        await self.applier.report(body, step.status, step.events)
        status = body.get("status") or {}
        metrics.record_engines(
            namespace, name, {**status, **step.status.changes} if step.status else status
        )
        if refused:
            raise Backoff
        return step.requeue_after

    # ---- one namespace's cleanup ---------------------------------------------------------

    async def _cleanup(self, namespace: str) -> float | None:
        services = [s for s in self.caches.services if s["metadata"].get("namespace") == namespace]
        jobs = [j for j in self.caches.jobs if j["metadata"].get("namespace") == namespace]
        records = [
            r
            for r in self.caches.records
            if r["metadata"].get("namespace") == namespace and is_record(r)
        ]
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
            self.router.served_in(namespace) | self._deployed(namespace),
        )
        self.superseded_since[namespace] = dict(plan.superseded)
        # One effect the API server refuses (a 4xx) does not stop the others, nor fail the
        # namespace's pass for good: it is logged and the pass runs again later.
        refused = await self.applier.carry_out_all(namespace, plan.effects, None)
        for name, why in sorted(refused.items()):
            log.warning("%s: cleanup of %s refused by the API server: %s", namespace, name, why)
        return plan.requeue_after

    def _deployed(self, namespace: str) -> frozenset[str]:
        """The engine keys (and old vLLM checkpoints) the namespace's Deployments serve, as the
        cache holds them: what the cleanup keeps even before any service's pass has run
        since the operator started (the router learns them pass by pass)."""
        found: set[str] = set()
        for deployment in self.caches.deployments:
            if deployment["metadata"].get("namespace") == namespace:
                found.update(
                    k for k in (served_key(deployment), served_checkpoint(deployment)) if k
                )
        return frozenset(found)


def _object_of(key: Key) -> tuple[str, str, str, str]:
    """What a pass is about, as its log lines name it (kind, namespace, name, apiVersion)."""
    if key.kind == "cleanup":
        return ("Namespace", "", key.namespace, "v1")
    return ("CosyVoiceService", key.namespace, key.name, "tts.cosyvoice.dev/v1alpha1")
