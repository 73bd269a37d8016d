"""The controller's event routing and health, without a cluster (no request is made)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

from cosyvoice_operator.api.labels import CLAIM_LABEL, KEY_LABEL
from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.service import EngineRef, Policy
from cosyvoice_operator.shell import controller
from cosyvoice_operator.shell.controller import Controller, Settings
from cosyvoice_operator.shell.kube import Kube

from .objects import node


def make() -> Controller:
    settings = Settings(Policy(), cleanup.CleanupSettings())
    return Controller(cast(Kube, object()), ("ml",), settings)


def svc(name: str, generation: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ml", "generation": generation},
        "spec": spec,
        "status": {},
    }


def drain(c: Controller) -> set[tuple[str, str, str]]:
    keys = set()
    while (key := c.queue.take_nowait()) is not None:
        keys.add(key)
        c.queue.done(key)
    return keys


def test_a_node_heartbeat_wakes_nobody_and_a_gpu_change_wakes_node_picked_services() -> None:
    async def run() -> None:
        c = make()
        c.services.informers[0].store[("ml", "auto")] = svc("auto")
        c.services.informers[0].store[("ml", "pinned")] = svc(
            "pinned", engine={"gpuProducts": ["NVIDIA-L20"]}
        )
        before = controller.keep_node(node("gpu-0"))
        beat = copy.deepcopy(node("gpu-0"))
        for cond in beat["status"]["conditions"]:
            cond["lastHeartbeatTime"] = "2026-12-03T12:00:10Z"
        beat["metadata"]["resourceVersion"] = "1001"
        c._on_node(before, controller.keep_node(beat))
        assert drain(c) == set()
        c._on_node(before, controller.keep_node(node("gpu-0", ready="False")))
        assert drain(c) == {("svc", "ml", "auto")}  # not the one with gpuProducts

    asyncio.run(run())


def test_only_spec_changes_of_a_service_wake_it() -> None:
    async def run() -> None:
        c = make()
        c._on_service(None, svc("a"))
        assert drain(c) == {("svc", "ml", "a")}
        written = svc("a")
        written["status"] = {"phase": "Ready"}  # our own status write coming back
        c._on_service(svc("a"), written)
        assert drain(c) == set()
        c._on_service(svc("a"), svc("a", generation=2))
        assert drain(c) == {("svc", "ml", "a")}

    asyncio.run(run())


def test_a_job_event_wakes_the_services_that_want_its_engine() -> None:
    async def run() -> None:
        c = make()
        ref = EngineRef("ml", "tag1", "k" * 40)
        c._set_wants(("svc", "ml", "a"), frozenset({ref}))
        c._set_wants(("svc", "ml", "b"), frozenset())
        job: dict[str, Any] = {
            "metadata": {
                "name": "j",
                "namespace": "ml",
                "labels": {KEY_LABEL: "k" * 40, CLAIM_LABEL: "tag1"},
            },
            "status": {},
        }
        c._on_job(None, job)
        assert drain(c) == {("svc", "ml", "a")}
        assert [j["metadata"]["name"] for j in c.world.jobs("ml", "k" * 40, "tag1")] == []
        job["metadata"]["labels"]["app.kubernetes.io/component"] = "engine-build"
        c.jobs.informers[0].store[("ml", "j")] = job
        c._on_job(None, job)
        assert drain(c) == {("svc", "ml", "a")}
        assert [j["metadata"]["name"] for j in c.world.jobs("ml", "k" * 40, "tag1")] == ["j"]
        c._set_wants(("svc", "ml", "a"), frozenset())
        c._on_job(job, job)
        assert drain(c) == set()

    asyncio.run(run())


def test_health_names_a_dead_task_and_a_stuck_worker() -> None:
    async def run() -> None:
        c = make()
        assert c.health() is None

        async def crash() -> None:
            raise RuntimeError("boom")

        task = asyncio.create_task(crash(), name="informer jobs in ml")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        c.tasks.append(task)
        assert c.health() == "informer jobs in ml stopped"
        c.tasks.clear()
        c.busy_since[0] = (0.0, ("svc", "ml", "a"))
        problem = c.health()
        assert problem is not None and "svc ml/a" in problem

    asyncio.run(run())
