"""The loop's event routing, leadership and health, without a cluster (no request is made).

Events are fed the way the informers feed them (`Cache.deliver`: stored, trimmed, handed to
the World's indexes and then to the Router); what comes out is the set of keys on the queue,
the namespace cleanups (debounced) included.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from typing import Any, cast

from cosyvoice_operator.api import labels
from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.service import EngineRef, Policy
from cosyvoice_operator.shell.caches import Caches
from cosyvoice_operator.shell.controller import Controller, Settings
from cosyvoice_operator.shell.informer import Cache
from cosyvoice_operator.shell.kube import Kube
from cosyvoice_operator.shell.leader import Leader
from cosyvoice_operator.shell.routing import CLEANUP_DEBOUNCE_SECONDS, Key, Router
from cosyvoice_operator.shell.workqueue import WorkQueue
from tests.unit.objects import node

KEY = "k" * 40
TAG = "tag1"
NOW = dt.datetime(2026, 12, 3, 12, 0, 0, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Loop:
    """Caches, a Router and its queue, as the controller wires them."""

    def __init__(self, peering: bool = False) -> None:
        self.clock = Clock()
        self.queue: WorkQueue[Key] = WorkQueue(clock=self.clock)
        self.caches = Caches(cast(Kube, object()), ("ml",), peering=peering)
        self.router = Router(self.queue, self.caches)
        self.leader = Leader(
            self.caches.peerings,
            ("ml",),
            ("cosyvoice-operator", 500) if peering else None,
            lambda: NOW,
            self.router.enqueue_everything,
        )
        self.caches.route(self.router, self.leader.on_peering)

    def feed(self, cache: Cache | None, kind: str, obj: dict[str, Any]) -> None:
        assert cache is not None
        cache.deliver({"type": kind, "object": copy.deepcopy(obj)})

    def drain(self) -> set[Key]:
        """Every key queued, the debounced cleanups included."""
        self.clock.now += CLEANUP_DEBOUNCE_SECONDS
        keys = set()
        while (key := self.queue.take_nowait()) is not None:
            keys.add(key)
            self.queue.done(key)
        return keys


def svc(name: str, generation: int = 1, uid: str = "u1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": name, "namespace": "ml", "generation": generation, "uid": uid},
        "spec": spec,
        "status": {},
    }


def owned(kind: str, name: str, service: str = "a", hash_: str = "h1", **extra: Any) -> Any:
    return {
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": {labels.SERVICE_LABEL: service, **extra.pop("labels", {})},
            "annotations": {labels.HASH_ANNOTATION: hash_},
        },
        **extra,
    }


def engine_labels(**extra: str) -> dict[str, str]:
    return {labels.KEY_LABEL: KEY, labels.CLAIM_LABEL: TAG, **extra}


def service(name: str) -> Key:
    return Key("service", "ml", name)


CLEANUP = Key("cleanup", "ml")


def test_a_node_heartbeat_wakes_nobody_and_a_gpu_change_wakes_node_picked_services() -> None:
    loop = Loop()
    loop.feed(loop.caches.services, "ADDED", svc("auto"))
    loop.feed(loop.caches.services, "ADDED", svc("pinned", engine={"gpuProducts": ["L20"]}))
    loop.feed(loop.caches.nodes, "ADDED", node("gpu-0"))
    loop.drain()
    beat = node("gpu-0")
    for cond in beat["status"]["conditions"]:
        cond["lastHeartbeatTime"] = "2026-12-03T12:00:10Z"
    beat["metadata"]["resourceVersion"] = "1001"
    loop.feed(loop.caches.nodes, "MODIFIED", beat)
    assert loop.drain() == set()
    loop.feed(loop.caches.nodes, "MODIFIED", node("gpu-0", ready="False"))
    # not the one with gpuProducts; every namespace's cleanup
    assert loop.drain() == {service("auto"), CLEANUP}
    assert [n.ready for n in loop.caches.world.gpu_nodes()] == [False]


def test_only_spec_changes_of_a_service_wake_it() -> None:
    loop = Loop()
    loop.feed(loop.caches.services, "ADDED", svc("a"))
    assert loop.drain() == {service("a"), CLEANUP}
    written = svc("a")
    written["status"] = {"phase": "Ready"}  # our own status write coming back
    loop.feed(loop.caches.services, "MODIFIED", written)
    assert loop.drain() == set()
    loop.feed(loop.caches.services, "MODIFIED", svc("a", generation=2))
    assert loop.drain() == {service("a"), CLEANUP}
    loop.feed(loop.caches.services, "MODIFIED", svc("a", generation=2, uid="u2"))  # recreated
    assert loop.drain() == {service("a"), CLEANUP}


def test_a_service_with_its_autoscaler_gets_its_scale_pass_and_the_count_wakes_it() -> None:
    loop = Loop()
    auto = svc("a", autoscaling={"enabled": True})
    loop.feed(loop.caches.services, "ADDED", auto)
    assert loop.drain() == {service("a"), Key("scale", "ml", "a"), CLEANUP}
    scaled = copy.deepcopy(auto)
    scaled["status"] = {"autoscaling": {"desiredReplicas": 3}}
    loop.feed(loop.caches.services, "MODIFIED", scaled)
    assert loop.drain() == {service("a")}  # the Deployments follow the new count


def test_a_deleted_service_forgets_what_it_wanted_and_wakes_the_cleanup() -> None:
    loop = Loop()
    loop.feed(loop.caches.services, "ADDED", svc("a"))
    ref = EngineRef("ml", TAG, KEY)
    loop.router.service_passed(service("a"), frozenset({ref}), frozenset({KEY}))
    assert loop.router.served_in("ml") == {KEY}
    loop.drain()
    loop.feed(loop.caches.services, "DELETED", svc("a"))
    # its pass runs once more (one in flight must not leave its wants behind), then cleanup
    assert loop.drain() == {service("a"), CLEANUP}
    assert loop.router.served_in("ml") == frozenset()
    loop.feed(loop.caches.jobs, "ADDED", {"metadata": {"name": "j", "namespace": "ml",
                                                       "labels": engine_labels()}})  # fmt: skip
    assert loop.drain() == {CLEANUP}  # nobody wants its engine any more


def test_a_job_event_wakes_the_services_that_want_its_engine() -> None:
    loop = Loop()
    ref = EngineRef("ml", TAG, KEY)
    loop.router.service_passed(service("a"), frozenset({ref}), frozenset())
    loop.router.service_passed(service("b"), frozenset(), frozenset())
    job: dict[str, Any] = {
        "metadata": {"name": "j", "namespace": "ml", "labels": engine_labels()},
        "status": {},
    }
    loop.feed(loop.caches.jobs, "ADDED", job)
    assert loop.drain() == {service("a"), CLEANUP}
    assert [j["metadata"]["name"] for j in loop.caches.world.jobs("ml", KEY, TAG)] == []
    job["metadata"]["labels"][labels.COMPONENT_LABEL] = labels.BUILD_COMPONENT
    loop.feed(loop.caches.jobs, "MODIFIED", job)
    assert loop.drain() == {service("a")}  # its conditions did not change: no cleanup
    assert [j["metadata"]["name"] for j in loop.caches.world.jobs("ml", KEY, TAG)] == ["j"]
    loop.router.service_passed(service("a"), frozenset(), frozenset())
    loop.feed(loop.caches.jobs, "MODIFIED", job)
    assert loop.drain() == set()
    job["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    loop.feed(loop.caches.jobs, "MODIFIED", job)
    assert loop.drain() == {CLEANUP}  # a finished build may leave an engine unused


def test_a_build_pod_wakes_its_engine_and_a_serving_pod_its_service_when_scheduling_moves() -> None:
    loop = Loop()
    ref = EngineRef("ml", TAG, KEY)
    loop.router.service_passed(service("a"), frozenset({ref}), frozenset())
    build_pod = {
        "metadata": {
            "name": "j-x",
            "namespace": "ml",
            "labels": engine_labels(**{"job-name": "j"}),
        },
        "status": {"phase": "Pending"},
    }
    loop.feed(loop.caches.pods, "ADDED", build_pod)
    assert loop.drain() == {service("a")}
    assert [p["metadata"]["name"] for p in loop.caches.world.pods("ml", "j")] == ["j-x"]
    serving = owned(
        "Pod",
        "a-sm90-x",
        service="b",
        labels={labels.COMPONENT_LABEL: labels.SERVING_COMPONENT},
        status={"phase": "Pending", "conditions": []},
    )
    loop.feed(loop.caches.pods, "ADDED", serving)
    assert loop.drain() == {service("b")}
    assert [p["metadata"]["name"] for p in loop.caches.world.serving_pods("ml", "b")] == [
        "a-sm90-x"
    ]
    restarted = copy.deepcopy(serving)
    restarted["status"]["containerStatuses"] = [{"restartCount": 1}]
    loop.feed(loop.caches.pods, "MODIFIED", restarted)
    assert loop.drain() == set()  # nothing the service reports
    unschedulable = copy.deepcopy(restarted)
    unschedulable["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "message": "0/4 nodes are available"}
    ]
    loop.feed(loop.caches.pods, "MODIFIED", unschedulable)
    assert loop.drain() == {service("b")}
    loop.feed(loop.caches.pods, "DELETED", unschedulable)
    assert loop.drain() == {service("b")}
    assert loop.caches.world.serving_pods("ml", "b") == []


def test_a_record_wakes_its_engine_and_the_cleanup_and_a_repository_only_when_it_changed() -> None:
    loop = Loop()
    ref = EngineRef("ml", TAG, KEY)
    loop.router.service_passed(service("a"), frozenset({ref}), frozenset())
    record = {
        "metadata": {
            "name": "rec",
            "namespace": "ml",
            "labels": engine_labels(**{labels.NAME_LABEL: labels.ENGINE_NAME}),
        },
        "data": {"state": "Ready"},
    }
    loop.feed(loop.caches.records, "ADDED", record)
    assert loop.drain() == {service("a"), CLEANUP}
    repository = owned("ConfigMap", "a-sm90-repo", service="b", data={"config.pbtxt": "x"})
    loop.feed(loop.caches.records, "ADDED", repository)
    assert loop.drain() == {service("b")}
    loop.feed(loop.caches.records, "MODIFIED", repository)  # the same hash: a no-op update
    assert loop.drain() == set()
    changed = owned("ConfigMap", "a-sm90-repo", service="b", hash_="h2")
    loop.feed(loop.caches.records, "MODIFIED", changed)  # changed by hand
    assert loop.drain() == {service("b")}


def test_a_deployment_always_wakes_its_service() -> None:
    loop = Loop()
    deployment = owned("Deployment", "a-sm90", spec={"replicas": 1}, status={"readyReplicas": 0})
    loop.feed(loop.caches.deployments, "ADDED", deployment)
    assert loop.drain() == {service("a")}
    assert [d["metadata"]["name"] for d in loop.caches.world.deployments("ml", "a")] == ["a-sm90"]
    deployment["status"]["readyReplicas"] = 1  # its status is what the service reports
    loop.feed(loop.caches.deployments, "MODIFIED", deployment)
    assert loop.drain() == {service("a")}
    loop.feed(loop.caches.deployments, "DELETED", deployment)
    assert loop.drain() == {service("a")}
    assert loop.caches.world.deployments("ml", "a") == []


def test_a_deployment_that_stops_serving_an_engine_wakes_the_cleanup() -> None:
    # The cleanup run on a service's deletion keeps an engine its Deployment still serves;
    # the garbage collector deletes that Deployment later: that must run the cleanup again.
    loop = Loop()
    deployment = owned("Deployment", "a-sm90", spec={"replicas": 1}, status={})
    deployment["metadata"].setdefault("annotations", {})[labels.SERVED_KEY_ANNOTATION] = KEY
    loop.feed(loop.caches.deployments, "ADDED", deployment)
    assert loop.drain() == {service("a")}
    deployment["status"] = {"readyReplicas": 1}
    loop.feed(loop.caches.deployments, "MODIFIED", deployment)
    assert loop.drain() == {service("a")}  # still serving the same engine: no cleanup
    moved = copy.deepcopy(deployment)
    moved["metadata"]["annotations"][labels.SERVED_KEY_ANNOTATION] = "n" * 40
    loop.feed(loop.caches.deployments, "MODIFIED", moved)
    assert loop.drain() == {service("a"), CLEANUP}
    loop.feed(loop.caches.deployments, "DELETED", moved)
    assert loop.drain() == {service("a"), CLEANUP}


def test_a_core_service_or_budget_wakes_its_service_only_when_what_was_applied_changed() -> None:
    loop = Loop()
    for cache, kind in (
        (loop.caches.core_services, "Service"),
        (loop.caches.budgets, "PodDisruptionBudget"),
    ):
        loop.feed(cache, "ADDED", owned(kind, "a"))
        assert loop.drain() == {service("a")}
        loop.feed(cache, "MODIFIED", owned(kind, "a"))  # the same applied hash
        assert loop.drain() == set()
        loop.feed(cache, "MODIFIED", owned(kind, "a", hash_="edited"))
        assert loop.drain() == {service("a")}
        loop.feed(cache, "DELETED", owned(kind, "a", hash_="edited"))
        assert loop.drain() == {service("a")}


def test_another_autoscaler_wakes_the_scale_passes_of_its_namespace_when_its_target_moves() -> None:
    loop = Loop()
    loop.feed(loop.caches.services, "ADDED", svc("auto", autoscaling={"enabled": True}))
    loop.feed(loop.caches.services, "ADDED", svc("fixed"))
    loop.drain()
    hpa: dict[str, Any] = {
        "metadata": {"name": "hpa", "namespace": "ml"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "auto-sm90"}},
        "status": {"currentReplicas": 1},
    }
    loop.feed(loop.caches.autoscalers, "ADDED", hpa)
    assert loop.drain() == {Key("scale", "ml", "auto")}
    hpa["status"]["currentReplicas"] = 2
    loop.feed(loop.caches.autoscalers, "MODIFIED", hpa)
    assert loop.drain() == set()  # its status: nothing the operator reads
    hpa["spec"]["scaleTargetRef"]["name"] = "fixed-sm90"
    loop.feed(loop.caches.autoscalers, "MODIFIED", hpa)
    assert loop.drain() == {Key("scale", "ml", "auto")}


def test_a_claim_wakes_its_namespace_when_it_appears_goes_or_starts_going() -> None:
    loop = Loop()
    loop.feed(loop.caches.services, "ADDED", svc("a"))
    loop.feed(loop.caches.services, "ADDED", svc("b"))
    loop.drain()
    claim: dict[str, Any] = {
        "metadata": {"name": "cosyvoice-engines", "namespace": "ml", "uid": "c1"},
        "status": {"phase": "Pending"},
    }
    loop.feed(loop.caches.claims, "ADDED", claim)
    assert loop.drain() == {service("a"), service("b"), CLEANUP}
    assert loop.caches.world.claim_uid("ml", "cosyvoice-engines") == "c1"
    claim["status"]["phase"] = "Bound"
    loop.feed(loop.caches.claims, "MODIFIED", claim)
    assert loop.drain() == set()
    claim["metadata"]["deletionTimestamp"] = "2026-12-03T12:00:00Z"
    loop.feed(loop.caches.claims, "MODIFIED", claim)
    assert loop.drain() == {service("a"), service("b"), CLEANUP}
    assert loop.caches.world.claim_uid("ml", "cosyvoice-engines") is None


def test_peering_decides_acting_or_standing_by_and_acting_looks_at_everything() -> None:
    async def run() -> None:
        loop = Loop(peering=True)
        loop.feed(loop.caches.services, "ADDED", svc("a", autoscaling={"enabled": True}))
        loop.drain()
        seen = (NOW - dt.timedelta(seconds=5)).isoformat()

        def peering(**priorities: int) -> dict[str, Any]:
            return {
                "metadata": {"name": "cosyvoice-operator", "namespace": "ml"},
                "status": {
                    who: {"priority": p, "lifetime": 60, "lastseen": seen}
                    for who, p in priorities.items()
                },
            }

        loop.leader.start().cancel()  # type: ignore[union-attr]
        assert not loop.leader.active.is_set()
        assert loop.leader.standby_reason == "a peering object is missing (kopf waits for it)"
        loop.feed(loop.caches.peerings, "ADDED", peering(me=500, other=900))
        assert not loop.leader.active.is_set()
        assert loop.leader.standby_reason == "peer other has priority 900 (this operator: 500)"
        assert loop.drain() == set()
        loop.feed(loop.caches.peerings, "MODIFIED", peering(me=500))  # the other one left
        assert loop.leader.active.is_set() and loop.leader.standby_reason is None
        assert loop.drain() == {service("a"), Key("scale", "ml", "a"), CLEANUP}
        loop.feed(loop.caches.peerings, "MODIFIED", peering(me=500, third=700))
        assert not loop.leader.active.is_set()

    asyncio.run(run())


def test_health_names_a_dead_task_and_a_stuck_worker() -> None:
    async def run() -> None:
        settings = Settings(Policy(), cleanup.CleanupSettings())
        c = Controller(cast(Kube, object()), ("ml",), settings)
        assert c.health() is None

        async def crash() -> None:
            raise RuntimeError("boom")

        task = asyncio.create_task(crash(), name="informer jobs in ml")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        c.tasks.append(task)
        assert c.health() == "informer jobs in ml stopped"
        c.tasks.clear()
        c.busy_since[0] = (0.0, service("a"))
        problem = c.health()
        assert problem is not None and "service ml/a" in problem

    asyncio.run(run())
