"""Issue 21 in the shell: what leaves the operator is redacted, Prometheus is asked only at
allowed URLs, the cleanup keeps what Deployments serve from the first pass and survives a
refused effect, and NetworkPolicies are followed like the other objects the operator applies."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from cosyvoice_operator.api import labels
from cosyvoice_operator.api.effects import PatchStatus, PostEvent
from cosyvoice_operator.plan import cleanup
from cosyvoice_operator.plan.service import Policy
from cosyvoice_operator.shell.apply import Applier
from cosyvoice_operator.shell.controller import Controller, Settings
from cosyvoice_operator.shell.kube import KINDS_BY_NAME, Kube
from cosyvoice_operator.shell.prometheus_source import NOT_ALLOWED
from cosyvoice_operator.shell.routing import Key
from tests.unit.fake_cluster import FakeCluster
from tests.unit.objects import node

SERVICE: dict[str, Any] = {
    "apiVersion": "tts.cosyvoice.dev/v1alpha1",
    "kind": "CosyVoiceService",
    "metadata": {"name": "a", "namespace": "ml", "generation": 1},
    "spec": {
        "model": {"variant": "cosyvoice3", "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"},
    },
}
LEAK = "Prometheus at http://ops:hunter2@prom:9090 said token=ghp_abcdef0123456789"


def test_condition_and_event_messages_are_redacted_where_they_leave_the_operator() -> None:
    cluster = FakeCluster()
    apply = Applier(cast(Kube, cluster))
    body = cluster.put(SERVICE)
    changes = {
        "conditions": [{"type": "MetricsAvailable", "status": "False", "message": LEAK}],
        "engines": [{"key": "k", "message": f"builder said: {LEAK}"}],
    }
    status = PatchStatus(changes, body["metadata"]["resourceVersion"])
    event = PostEvent("Warning", "MetricsUnavailable", LEAK)
    posted: list[str] = []

    async def post(regarding: Any, kind: str, reason: str, message: str) -> None:
        posted.append(message)

    cluster.post_event = post  # type: ignore[method-assign]
    asyncio.run(apply.report(body, status, (event,)))
    stored = cluster.get("CosyVoiceService", "a")["status"]
    text = repr(stored) + repr(posted)
    assert "hunter2" not in text and "ghp_abcdef0123456789" not in text
    assert stored["conditions"][0]["message"] == (
        "Prometheus at http://***@prom:9090 said token=***"
    )
    assert posted == [stored["conditions"][0]["message"]]


def test_a_status_that_differs_only_by_what_redaction_takes_out_is_not_written_again() -> None:
    cluster = FakeCluster()
    apply = Applier(cast(Kube, cluster))
    body = cluster.put(SERVICE)
    changes = {"conditions": [{"type": "X", "status": "False", "message": LEAK}]}
    asyncio.run(apply.report(body, PatchStatus(changes, body["metadata"]["resourceVersion"]), ()))
    written = len(cluster.writes)
    # The planner compares its raw message with the stored, redacted one: a difference.
    again = cluster.get("CosyVoiceService", "a")
    event = PostEvent("Warning", "X", "again")
    asyncio.run(
        apply.report(again, PatchStatus(changes, again["metadata"]["resourceVersion"]), (event,))
    )
    assert len(cluster.writes) == written and cluster.events == []


def test_a_prometheus_url_the_operator_does_not_allow_is_never_asked() -> None:
    cluster = FakeCluster()
    settings = Settings(
        Policy(),
        cleanup.CleanupSettings(),
        prometheus_url="http://prometheus.monitoring:9090",
        allowed_prometheus_urls=("https://thanos.example/q",),
    )
    loop = Controller(cast(Kube, cluster), ("ml",), settings)
    sources = loop.autoscaler.sources
    assert sources.is_allowed("http://prometheus.monitoring:9090/")
    assert sources.is_allowed("https://thanos.example/q")
    assert not sources.is_allowed("http://169.254.169.254/latest/meta-data?x=")
    got = asyncio.run(sources.sample("http://169.254.169.254/x?y=", "ml", ["p-0"], "cosyvoice3"))
    assert got.unavailable_reason == NOT_ALLOWED and len(sources) == 0


def _deployment(name: str, key: str) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": {labels.SERVICE_LABEL: "gone", labels.MANAGED_BY_LABEL: "cosyvoice-operator"},
            "annotations": {labels.SERVED_KEY_ANNOTATION: key},
        },
        "spec": {"replicas": 1},
    }


def test_the_cleanup_keeps_what_deployments_serve_before_any_service_pass_has_run() -> None:
    """After a restart the router knows no served keys until each service's pass runs; the
    Deployments in the cache say them from the start."""
    cluster = FakeCluster()
    loop = Controller(
        cast(Kube, cluster), ("ml", "other"), Settings(Policy(), cleanup.CleanupSettings())
    )
    cluster.caches = loop.caches
    cluster.put(_deployment("cvs-x-sm89", "a" * 40))
    cluster.put(
        _deployment("cvs-y-sm90", "b" * 40)
        | {"metadata": {"name": "cvs-y-sm90", "namespace": "other"}}
    )
    assert loop.router.served_in("ml") == frozenset()
    assert loop._deployed("ml") == frozenset({"a" * 40})


def test_a_refused_cleanup_effect_does_not_stop_the_others() -> None:
    from cosyvoice_operator.shell.kube import KubeError

    cluster = FakeCluster()
    loop = Controller(
        cast(Kube, cluster),
        ("ml",),
        Settings(Policy(), cleanup.CleanupSettings(retention_seconds=0)),
    )
    cluster.caches = loop.caches
    cluster.put(node("gpu-0"), "Node")
    for name in ("rec-1", "rec-2"):
        cluster.put(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": name,
                    "labels": {
                        labels.MANAGED_BY_LABEL: "cosyvoice-operator",
                        labels.KEY_LABEL: (name[-1] * 40),
                        labels.COMPONENT_LABEL: labels.BUILD_COMPONENT,
                        labels.NAME_LABEL: labels.ENGINE_NAME,
                    },
                    "annotations": {},
                },
                "data": {"state": "Ready", "key": name[-1] * 40},
            }
        )
    cluster.refuse["rec-1"] = KubeError(422, "Invalid", "refused", "PATCH", "/x")
    asyncio.run(loop.process(Key("cleanup", "ml", "")))
    patched = [w for w in cluster.writes if w[0] == "PATCH" and w[1] == "ConfigMap"]
    assert [w[2] for w in patched] == ["rec-1", "rec-2"]  # the second after the refusal


def test_network_policies_are_a_kind_the_operator_applies_and_follows() -> None:
    assert KINDS_BY_NAME["NetworkPolicy"].plural == "networkpolicies"
    cluster = FakeCluster()
    loop = Controller(cast(Kube, cluster), ("ml",), Settings(Policy(), cleanup.CleanupSettings()))
    cluster.caches = loop.caches
    cluster.put(
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": "cvs-a",
                "labels": {labels.MANAGED_BY_LABEL: "cosyvoice-operator"},
            },
        }
    )
    assert loop.world.owned("NetworkPolicy", "ml", "cvs-a") is not None
