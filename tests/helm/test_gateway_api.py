"""gatewayAPI.enabled (issue 30, spec.routing.mode GatewayAPI): the operator is told to write
GRPCRoutes and BackendTrafficPolicies and may; off (the default), neither."""

from __future__ import annotations

from pathlib import Path

from tests.chart_tools import CLUSTER_RULES, NAMESPACED_RULES, env_of, of_kind, render, rules_of

GATEWAY_RULES = {
    ("gateway.networking.k8s.io", "grpcroutes", frozenset({"list", "watch", "create", "patch"})),
    (
        "gateway.envoyproxy.io",
        "backendtrafficpolicies",
        frozenset({"list", "watch", "create", "patch"}),
    ),
}


def test_on_it_grants_the_routes_and_tells_the_operator(helm: Path) -> None:
    docs = render(helm, 'gatewayAPI={"enabled":true}')
    [role] = of_kind(docs, "ClusterRole")
    assert rules_of(role) == CLUSTER_RULES | NAMESPACED_RULES | GATEWAY_RULES
    assert env_of(docs)["COSYVOICE_GATEWAY_API"] == "true"
    served = render(helm, 'gatewayAPI={"enabled":true}', 'watchNamespaces=["tts-a"]')
    [namespaced] = of_kind(served, "Role")
    assert rules_of(namespaced) >= GATEWAY_RULES


def test_off_by_default(helm: Path) -> None:
    docs = render(helm)
    [role] = of_kind(docs, "ClusterRole")
    assert not GATEWAY_RULES & rules_of(role)
    assert "COSYVOICE_GATEWAY_API" not in env_of(docs)
