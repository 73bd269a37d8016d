"""spec.routing.mode GatewayAPI in the shell: with COSYVOICE_GATEWAY_API the caches follow the
operator's GRPCRoutes and BackendTrafficPolicies (the World answers for them, a change wakes
the service, the applier knows their API paths); without it no informer is made for CRDs that
may not exist."""

from __future__ import annotations

from typing import cast

from cosyvoice_operator.api import labels
from cosyvoice_operator.render import workloads
from cosyvoice_operator.shell.caches import Caches
from cosyvoice_operator.shell.kube import KINDS_BY_OBJECT, Kube
from cosyvoice_operator.shell.routing import Key, Router
from cosyvoice_operator.shell.workqueue import WorkQueue


def route(name: str) -> dict[str, object]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GRPCRoute",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": "r1",
            "resourceVersion": "1",
            "labels": workloads.common_labels("tts"),
        },
        "spec": {"parentRefs": [{"name": "edge"}]},
    }


def test_with_gateway_api_the_routes_and_policies_are_followed() -> None:
    caches = Caches(cast(Kube, object()), ("ml",), gateway_api=True)
    queue: WorkQueue[Key] = WorkQueue()
    caches.route(Router(queue, caches))
    assert caches.world.owned("GRPCRoute", "ml", "cvs-tts") is None
    assert caches.world.owned("BackendTrafficPolicy", "ml", "cvs-tts") is None
    cache = caches.of_kind("GRPCRoute")
    assert cache is not None and cache in caches.all()
    cache.deliver({"type": "ADDED", "object": route("cvs-tts")})
    seen = caches.world.owned("GRPCRoute", "ml", "cvs-tts")
    assert seen is not None and seen["metadata"]["labels"][labels.SERVICE_LABEL] == "tts"
    assert queue.take_nowait() == Key("service", "ml", "tts")
    assert KINDS_BY_OBJECT["gateway.networking.k8s.io/v1", "GRPCRoute"].plural == "grpcroutes"
    policies = KINDS_BY_OBJECT["gateway.envoyproxy.io/v1alpha1", "BackendTrafficPolicy"]
    assert policies.plural == "backendtrafficpolicies"


def test_without_it_no_informer_is_made() -> None:
    caches = Caches(cast(Kube, object()), ("ml",))
    assert caches.of_kind("GRPCRoute") is None and caches.of_kind("BackendTrafficPolicy") is None
    assert caches.gateway == {}
