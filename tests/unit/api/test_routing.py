"""spec.routing: defaults (the CRD's), each field read, and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from cosyvoice_operator.api import spec
from cosyvoice_operator.api.spec import SpecError
from tests.unit.objects import raw_spec, service


def test_the_default_is_a_router_of_two_replicas() -> None:
    r = service().routing
    assert r.mode == spec.ROUTER == "Router"
    assert r.router == spec.RouterSpec(replicas=2, queue_timeout_seconds=0, image="", resources={})
    assert r.gateway.parent_refs == ()


def test_every_field_is_read() -> None:
    r = service(
        routing={
            "mode": "GatewayAPI",
            "router": {
                "replicas": 3,
                "queueTimeoutSeconds": 12,
                "image": "registry.example/haproxy:3.2.4",
                "resources": {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
            },
            "gateway": {
                "parentRefs": [
                    {"name": "edge", "namespace": "gateways", "sectionName": "grpc"},
                    {"name": "inner", "port": 8443},
                ]
            },
        }
    ).routing
    assert r.mode == spec.GATEWAY_API
    assert r.router.replicas == 3 and r.router.queue_timeout_seconds == 12
    assert r.router.image == "registry.example/haproxy:3.2.4"
    assert dict(r.router.resources) == {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}
    assert r.gateway.parent_refs == (
        {"name": "edge", "namespace": "gateways", "sectionName": "grpc"},
        {"name": "inner", "port": 8443},
    )
    assert service(routing={"mode": "Service"}).routing.mode == spec.SERVICE


@pytest.mark.parametrize(
    ("routing", "field", "says"),
    [
        ({"mode": "RoundRobin"}, "spec.routing.mode", "Router, Service, GatewayAPI"),
        ({"router": {"replicas": 0}}, "spec.routing.router.replicas", "between 1 and 16"),
        ({"router": {"replicas": 17}}, "spec.routing.router.replicas", "between 1 and 16"),
        (
            {"router": {"queueTimeoutSeconds": -1}},
            "spec.routing.router.queueTimeoutSeconds",
            "between 0 and 3600",
        ),
        ({"router": {"image": "a b"}}, "spec.routing.router.image", "image reference"),
        (
            {"router": {"resources": {"requests": {"cpu": ["1"]}}}},
            "spec.routing.router.resources.requests.cpu",
            "must be a quantity",
        ),
        (
            {"router": {"resources": {"spare": {}}}},
            "spec.routing.router.resources.spare",
            "not a field",
        ),
        ({"mode": "GatewayAPI"}, "spec.routing.gateway.parentRefs", "at least one Gateway"),
        (
            {"mode": "GatewayAPI", "gateway": {"parentRefs": [{"kind": "Gateway"}]}},
            "spec.routing.gateway.parentRefs[0].name",
            "required",
        ),
        (
            {"gateway": {"parentRefs": [{"name": "g", "port": 0}]}},
            "spec.routing.gateway.parentRefs[0].port",
            "between 1 and 65535",
        ),
        (
            {"gateway": {"parentRefs": [{"name": "g", "weight": 1}]}},
            "spec.routing.gateway.parentRefs[0].weight",
            "unknown field",
        ),
        ("Router", "spec.routing", "must be an object"),
    ],
)
def test_errors_name_the_field(routing: Any, field: str, says: str) -> None:
    with pytest.raises(SpecError, match=says) as err:
        spec.parse(raw_spec(routing=routing))
    assert err.value.field == field


def test_router_settings_are_kept_but_unused_in_other_modes() -> None:
    """The API server fills in router defaults whatever the mode: they must not be refused."""
    r = service(routing={"mode": "Service", "router": {"replicas": 4}}).routing
    assert r.mode == spec.SERVICE and r.router.replicas == 4
