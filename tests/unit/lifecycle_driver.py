"""Drives one service through its whole life against the in-memory API server: the loop's
passes, and what the Job controller, the scheduler, the kubelet and the Deployment controller
would do in between. For counting what the operator writes at each stage.

The loop's clock is fixed (`now`: by default 3 s after the build pod started, a build as
short as kwok's; a real build runs for minutes). With a `lagging` watch, the operator's own
writes come back to the caches one pass late: after the pass that follows them has ended,
and other clients' changes (the build pod's, the Job's) overtake them, as happens when one
informer's watch is behind another's. (The pass that wrote them keeps its copy at once,
through Cache.wrote, as in production.)"""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any, cast

from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.service import Policy
from cosyvoice_operator.shell.apply import Backoff
from cosyvoice_operator.shell.controller import Controller, Settings
from cosyvoice_operator.shell.kube import Kube
from cosyvoice_operator.shell.routing import Key

from .fake_cluster import FakeCluster
from .objects import node

PRODUCT = "NVIDIA-H100-80GB-HBM3"
STARTED = dt.datetime(2026, 12, 3, 12, 0, 0, tzinfo=dt.UTC)  # when the build pod started
TS = STARTED.strftime("%Y-%m-%dT%H:%M:%SZ")
# The loop's clock by default: 3 s after the build pods started (a build as short as kwok's).
NOW = STARTED + dt.timedelta(seconds=3)


def service_body(name: str) -> dict[str, Any]:
    """As bench/control_loop.py applies them."""
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": name, "generation": 1},
        "spec": {
            "model": {
                "variant": "cosyvoice3",
                "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
                "revision": f"rev-{name}",
            },
            "serving": {"nodeSelector": {"nvidia.com/gpu.product": PRODUCT}},
        },
    }


class Driver:
    def __init__(self, now: dt.datetime = NOW, lagging: bool = False) -> None:
        self.cluster = FakeCluster()
        self.now = now
        settings = Settings(Policy(), cleanup.CleanupSettings())
        self.loop = Controller(cast(Kube, self.cluster), ("ml",), settings, lambda: self.now)
        self.cluster.caches = self.loop.caches
        self.cluster.echoes_lag = self.lagging = lagging
        self.statuses: dict[str, dict[str, Any]] = {}  # build(): the status after each stage
        self.cluster.put(node("gpu-0", PRODUCT), "Node")
        self.cluster.put(
            {"kind": "PersistentVolumeClaim", "metadata": {"name": "cosyvoice-engines"}}
        )

    async def settle(self) -> None:
        """Every pass that is due now, until none is (a Backoff is retried at once). A lagging
        watch delivers the operator's writes after the next pass has ended (the next call's,
        when this one has no pass left), or when no pass is due that could overtake them."""
        queue = self.loop.queue
        ran = False
        for _ in range(1000):
            key = queue.take_nowait()
            if key is None:
                if ran or not self.cluster.backlog:
                    return
                self.cluster.catch_up()  # nothing overtakes them: the watch catches up
                continue
            ran = True
            earlier = len(self.cluster.backlog)
            try:
                await self.loop.process(key)
            except Backoff:
                queue.add(key)
            finally:
                queue.done(key)
                self.cluster.catch_up(earlier)
        raise AssertionError("the loop does not settle")

    async def cleanup(self) -> None:
        await self.loop.process(Key("cleanup", "ml"))

    def status(self, name: str) -> dict[str, Any]:
        return dict(self.cluster.get("CosyVoiceService", name).get("status") or {})

    def engine_ready(self, name: str) -> bool:
        return any(
            c["type"] == "EngineReady" and c["status"] == "True"
            for c in self.status(name).get("conditions") or []
        )

    def writes(self) -> int:
        return sum(self.cluster.requests.values())

    # ---- the other controllers -------------------------------------------------------------

    def jobs(self) -> list[dict[str, Any]]:
        return [o for (k, _, _), o in self.cluster.objects.items() if k == "Job"]

    def build_pod(self, job: dict[str, Any], phase: str, node_name: str = "") -> None:
        template = job["spec"]["template"]
        pod: dict[str, Any] = {
            "kind": "Pod",
            "metadata": {
                "name": f"{job['metadata']['name']}-x",
                "labels": {**template["metadata"]["labels"], "job-name": job["metadata"]["name"]},
                "creationTimestamp": TS,
            },
            "spec": {"nodeName": node_name} if node_name else {},
            "status": {"phase": phase, "conditions": [], "containerStatuses": []},
        }
        if node_name:
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        if phase == "Running":
            pod["status"]["containerStatuses"] = [
                {"name": "builder", "state": {"running": {"startedAt": TS}}}
            ]
        if phase == "Succeeded":
            term = {"exitCode": 0, "message": '{"result": "engine built"}'}
            pod["status"]["containerStatuses"] = [
                {"name": "builder", "state": {"terminated": term}}
            ]
        self.cluster.put(pod)

    def complete(self, job: dict[str, Any]) -> None:
        done = copy.deepcopy(job)
        done["status"] = {
            "succeeded": 1,
            "conditions": [
                {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": TS},
                {"type": "Complete", "status": "True", "lastTransitionTime": TS},
            ],
        }
        self.cluster.put(done)

    def deployments_ready(self) -> None:
        for (kind, _, _), obj in list(self.cluster.objects.items()):
            if kind != "Deployment":
                continue
            ready = copy.deepcopy(obj)
            n = int(ready["spec"].get("replicas") or 0)
            ready["metadata"]["generation"] = 1
            ready["status"] = {
                "observedGeneration": 1,
                "replicas": n,
                "readyReplicas": n,
                "updatedReplicas": n,
            }
            self.cluster.put(ready)

    async def build(self, name: str) -> dict[str, int]:
        """A new service from apply to serving; the writes made by each stage."""
        stages: dict[str, int] = {}
        seen = self.writes()

        def mark(stage: str) -> None:
            nonlocal seen
            stages[stage] = self.writes() - seen
            seen = self.writes()
            self.statuses[stage] = self.status(name)

        self.cluster.put(service_body(name))
        await self.settle()
        mark("applied")
        [job] = [j for j in self.jobs() if j["metadata"]["name"].startswith("cvs-engine")][-1:]
        self.build_pod(job, "Pending")
        await self.settle()
        self.build_pod(job, "Pending", "gpu-0")
        await self.settle()
        self.build_pod(job, "Running", "gpu-0")
        await self.settle()
        mark("building")
        self.build_pod(job, "Succeeded", "gpu-0")
        self.complete(job)
        await self.settle()
        await self.cleanup()
        await self.settle()
        mark("built")
        assert self.engine_ready(name), self.status(name)
        self.deployments_ready()
        await self.settle()
        mark("serving")
        return stages
