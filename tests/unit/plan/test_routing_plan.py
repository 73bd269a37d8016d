"""The serving plan and spec.routing: the router's objects come and go with the mode, the
router's Deployment is never read as a Triton one, its image is checked against the
allowlist, and GatewayAPI without the operator's support says so."""

from __future__ import annotations

from cosyvoice_operator.api.effects import ApplyObject, DeleteObject
from cosyvoice_operator.plan import serving
from cosyvoice_operator.plan.service import plan_service
from cosyvoice_operator.render.workloads import ServingSettings
from tests.unit.objects import T0
from tests.unit.plan import test_hostile_input as hostile
from tests.unit.render.test_workloads import body, plan_of, settle
from tests.unit.world import FakeWorld


def test_a_settled_router_fleet_writes_nothing_and_scales_only_triton() -> None:
    world = FakeWorld()
    settle(world, plan_of(body(replicas=2), world, {}))
    assert ("Deployment", "cvs-tts-router") in world.objects
    again = plan_of(body(replicas=2), world, {})
    assert again.effects == () and again.ready
    # the router's Deployment is not an architecture's: it is neither scaled nor retired
    scaled = plan_of(body(replicas=3), world, {})
    [deployment] = [e.body for e in scaled.effects if isinstance(e, ApplyObject)]
    assert deployment["metadata"]["name"] == "cvs-tts-sm89"
    assert scaled.status["serving"][0]["desiredReplicas"] == 3


def test_leaving_mode_router_deletes_the_routers_objects_and_points_the_service_at_triton() -> None:
    world = FakeWorld()
    settle(world, plan_of(body(replicas=2), world, {}))
    plain = plan_of(body(replicas=2, routing={"mode": "Service"}), world, {})
    deleted = sorted((e.kind, e.name) for e in plain.effects if isinstance(e, DeleteObject))
    assert deleted == [
        ("ConfigMap", "cvs-tts-router"),
        ("Deployment", "cvs-tts-router"),
        ("NetworkPolicy", "cvs-tts-router"),
        ("PodDisruptionBudget", "cvs-tts-router"),
        ("Service", "cvs-tts-pods"),
    ]
    [svc] = [
        e.body
        for e in plain.effects
        if isinstance(e, ApplyObject)
        and e.body["metadata"]["name"] == "cvs-tts"
        and e.body["kind"] == "Service"
    ]
    assert svc["spec"]["selector"] == {"tts.cosyvoice.dev/service": "tts"}
    assert plain.status["selector"] == "tts.cosyvoice.dev/service=tts"


def test_gateway_api_without_the_operators_support_says_so() -> None:
    world = FakeWorld()
    routing = {"mode": "GatewayAPI", "gateway": {"parentRefs": [{"name": "edge"}]}}
    plan = plan_of(body(replicas=1, routing=routing), world, {})
    [progressing] = [c for c in plan.conditions if c["type"] == "Progressing"]
    assert progressing["reason"] == "GatewayAPIDisabled"
    assert "gatewayAPI.enabled" in progressing["message"]
    kinds = {e.body["kind"] for e in plan.effects if isinstance(e, ApplyObject)}
    assert "GRPCRoute" not in kinds and "BackendTrafficPolicy" not in kinds


def test_a_router_image_outside_the_allowlist_is_not_deployed() -> None:
    b = hostile.body()
    step = plan_service(b, hostile.built_world(b), T0, hostile.policy())
    deployments = [
        e.body
        for e in step.workloads
        if isinstance(e, ApplyObject) and e.body["kind"] == "Deployment"
    ]
    assert [serving.is_router(d) for d in deployments] == [False]
    assert step.status is not None
    [progressing] = [c for c in step.status.changes["conditions"] if c["type"] == "Progressing"]
    assert progressing["reason"] == "ImageNotAllowed"
    assert "the router image 'docker.io/library/haproxy:3.2'" in progressing["message"]
    # allowed, it is deployed
    mine = hostile.policy(
        serving=ServingSettings(
            default_image=hostile.IMAGES.default_image,
            router_image="registry.corp.example/haproxy:3.2",
        )
    )
    step = plan_service(b, hostile.built_world(b), T0, mine)
    routers = [
        e.body for e in step.workloads if isinstance(e, ApplyObject) and serving.is_router(e.body)
    ]
    assert "Deployment" in {r["kind"] for r in routers}
