"""The applier's rule for each effect type, and what serializes two passes of one service."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from cosyvoice_operator.api import labels
from cosyvoice_operator.api.effects import (
    ApplyObject,
    CreateObject,
    DeleteObject,
    PatchObject,
    PatchStatus,
    PostEvent,
)
from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.service import Policy
from cosyvoice_operator.shell.apply import Applier, Backoff, Conflict
from cosyvoice_operator.shell.controller import Controller, Settings
from cosyvoice_operator.shell.kube import Kube, KubeError
from cosyvoice_operator.shell.routing import Key
from tests.unit.fake_cluster import FakeCluster
from tests.unit.objects import node

SERVICE: dict[str, Any] = {
    "apiVersion": "tts.cosyvoice.dev/v1alpha1",
    "kind": "CosyVoiceService",
    "metadata": {"name": "a", "namespace": "ml", "generation": 1},
    "spec": {
        "model": {"variant": "cosyvoice3", "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"},
        "autoscaling": {"enabled": True},
    },
}


def config_map(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "ml"}}


def applier() -> tuple[FakeCluster, Applier]:
    cluster = FakeCluster()
    return cluster, Applier(cast(Kube, cluster))


@pytest.mark.parametrize(
    ("status", "transient"),
    [(0, True), (429, True), (500, True), (503, True), (400, False), (403, False), (422, False)],
)
def test_a_transient_error_is_the_api_servers_trouble_not_a_refusal(
    status: int, transient: bool
) -> None:
    assert KubeError(status, "", "", "POST", "/x").transient is transient


def test_each_world_effect_is_carried_out_by_its_rule() -> None:
    cluster, apply = applier()

    async def run() -> None:
        await apply.carry_out("ml", CreateObject(config_map("r")))
        await apply.carry_out("ml", CreateObject(config_map("r")))  # there already: done
        assert cluster.get("ConfigMap", "r")["metadata"]["resourceVersion"] == "100"
        await apply.carry_out("ml", ApplyObject({**config_map("r"), "data": {"a": "1"}}))
        await apply.carry_out("ml", PatchObject("ConfigMap", "ml", "r", {"data": {"b": "2"}}))
        assert cluster.get("ConfigMap", "r")["data"] == {"a": "1", "b": "2"}
        # by uid: a namesake made since is not deleted
        await apply.carry_out("ml", DeleteObject("ConfigMap", "ml", "r", "another-uid", "why"))
        assert ("ConfigMap", "ml", "r") in cluster.objects
        uid = cluster.get("ConfigMap", "r")["metadata"]["uid"]
        await apply.carry_out("ml", DeleteObject("ConfigMap", "ml", "r", uid, "unused"))
        assert ("ConfigMap", "ml", "r") not in cluster.objects

    asyncio.run(run())
    assert [w[0] for w in cluster.writes] == ["POST", "POST", "PATCH", "PATCH", "DELETE", "DELETE"]


@pytest.mark.parametrize("together", [False, True])
def test_refusals_are_gathered_for_the_planner_and_trouble_fails_the_pass(together: bool) -> None:
    cluster, apply = applier()
    cluster.yields = True  # together: each write waits for a round trip, the others go on
    cluster.refuse["bad"] = KubeError(422, "Unprocessable Entity", "spec.x: invalid", "POST", "")

    async def run() -> dict[str, str]:
        effects = [CreateObject(config_map("bad")), CreateObject(config_map("good"))]
        return await apply.carry_out_all("ml", effects, None, together)

    assert asyncio.run(run()) == {"bad": "422 Unprocessable Entity: spec.x: invalid"}
    assert ("ConfigMap", "ml", "good") in cluster.objects  # the others still carried out
    cluster.refuse["good"] = KubeError(503, "Service Unavailable", "", "POST", "")
    with pytest.raises(KubeError):
        asyncio.run(run())


def test_events_follow_only_an_accepted_status() -> None:
    cluster, apply = applier()
    body = cluster.put(SERVICE)
    events = (PostEvent("Normal", "EngineReady", "built"),)

    async def run() -> None:
        stale = PatchStatus({"phase": "Ready"}, "1")
        with pytest.raises(Conflict):
            await apply.report(body, stale, events)
        assert cluster.events == []
        await apply.report(body, None, events)  # nothing written: nothing to announce
        assert cluster.events == []
        current = PatchStatus({"phase": "Ready"}, body["metadata"]["resourceVersion"])
        await apply.report(body, current, events)

    asyncio.run(run())
    assert cluster.get("CosyVoiceService", "a")["status"] == {"phase": "Ready"}
    assert cluster.events == [("a", "Normal", "EngineReady")]


def test_two_passes_of_one_service_are_serialized_by_the_status_precondition() -> None:
    """The service and scale passes of one service both write its status, from the copy the
    cache holds. The one that plans from a copy the other has changed writes nothing and
    posts nothing (Conflict, a Backoff: the worker retries it), and its retry on the newer
    copy keeps what the other wrote."""
    cluster = FakeCluster()
    loop = Controller(cast(Kube, cluster), ("ml",), Settings(Policy(), cleanup.CleanupSettings()))
    cluster.caches = loop.caches
    cluster.put(node("gpu-0"), "Node")
    cluster.put(SERVICE)
    cluster.put(
        {
            "kind": "Deployment",
            "metadata": {
                "name": "a-sm89",
                "labels": {labels.SERVICE_LABEL: "a", labels.ARCH_LABEL: "sm_89"},
            },
            "spec": {"replicas": 1},
        }
    )

    async def run() -> None:
        # Both passes plan on the same copy (two workers); the scale pass's write lands first.
        cluster.yields = True
        first, second = await asyncio.gather(
            loop.process(Key("scale", "ml", "a")),
            loop.process(Key("service", "ml", "a")),
            return_exceptions=True,
        )
        assert first == 15.0 and isinstance(second, Conflict) and isinstance(second, Backoff)
        assert cluster.events == [("a", "Warning", "MetricsUnavailable")]  # nothing posted
        await loop.process(Key("service", "ml", "a"))  # the retry, on the newer copy
        await loop.process(Key("scale", "ml", "a"))  # nothing new to say: no request

    asyncio.run(run())
    status = cluster.get("CosyVoiceService", "a")["status"]
    kinds = {c["type"] for c in status["conditions"]}
    assert {"MetricsAvailable", "ScalingActive", "EngineReady", "Available"} <= kinds
    assert status["autoscaling"]["lastDecision"]["reason"]
    assert [w for w in cluster.writes if w[1] == "CosyVoiceService"] == [
        ("PATCH", "CosyVoiceService", "a"),  # the scale pass
        ("PATCH", "CosyVoiceService", "a"),  # the service pass, refused: a conflict
        ("PATCH", "CosyVoiceService", "a"),  # the service pass on the newer copy
    ]
    assert cluster.events[1:] == [("a", "Warning", "CacheClaimMissing")]
