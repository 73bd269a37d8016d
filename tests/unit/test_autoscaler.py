"""autoscaler: the fleet from the caches, conflicts, and what a decision writes (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from cosyvoice_operator.api.spec import parse
from cosyvoice_operator.autoscaling import evaluation
from cosyvoice_operator.autoscaling.policy import Decision, Fleet, Recommendation

T0 = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def svc(**autoscaling: Any) -> Any:
    return parse(
        {
            "model": {"variant": "cosyvoice3", "uri": "hf://a/b"},
            "replicas": 2,
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 8, **autoscaling},
        }
    )


def decision(replicas: int, direction: str, current: int = 2, available: bool = True) -> Decision:
    return Decision(
        replicas=replicas,
        direction=direction,
        reason=f"queue 120 ms over the 50 ms target: {current} -> {replicas}",
        inputs={"current": current, "queueLatencyMilliseconds": 120.0},
        metrics_available=available,
        metrics_reason="MetricsFresh" if available else "Unreachable",
        metrics_message="fresh" if available else "Prometheus at http://p:9090 did not answer",
        history=(Recommendation(T0, replicas),),
    )


def obs(latency: float | None = 120.0) -> Any:
    return evaluation.unavailable("x", "y", T0).__class__(
        time=T0, available=latency is not None, unavailable_reason="", message="",
        queue_latency_ms=latency, pending_requests=0.0, in_flight=1.0, completion_rate=1.0,
        no_traffic=False,
    )  # fmt: skip


def pod(name: str, ready: bool, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T12:00:00Z"
    return {
        "metadata": meta,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_the_fleet_counts_ready_and_starting_pods_and_the_replicas_in_force() -> None:
    deployments = [{"spec": {"replicas": 2}}, {"spec": {"replicas": 1}}]
    pods = [pod("a", True), pod("b", False), pod("c", True, deleting=True)]
    assert evaluation.fleet(deployments, pods) == Fleet(current=3, ready=1, starting=1)
    assert evaluation.ready_pod_names(pods) == ["a"]


def test_the_deployments_follow_the_autoscaler_only_in_active_mode() -> None:
    status = {"autoscaling": {"desiredReplicas": 5}}
    assert evaluation.desired_replicas(svc(), status) == 5
    assert evaluation.desired_replicas(svc(mode="DryRun"), status) == 2  # spec.replicas
    assert evaluation.desired_replicas(svc(), {}) == 2  # before the first decision
    assert evaluation.desired_replicas(svc(minReplicas=3), {}) == 3  # within the bounds


def test_a_scale_up_is_written_with_its_reason_and_one_event_then_a_hold_writes_nothing() -> None:
    changes, events = evaluation.status_update({}, svc(), decision(4, "up"), obs(), [], 1, T0)
    a = changes["autoscaling"]
    assert a["desiredReplicas"] == 4
    assert a["lastQueueLatencyMilliseconds"] == 120.0
    assert a["lastDecision"]["from"] == 2 and a["lastDecision"]["to"] == 4
    assert "120 ms" in a["lastDecision"]["reason"]
    assert events == [("Normal", "ScaledUp", a["lastDecision"]["reason"])]
    conds = {c["type"]: c for c in changes["conditions"]}
    assert conds["ScalingActive"]["status"] == "True"
    assert conds["MetricsAvailable"]["reason"] == "MetricsFresh"
    written = {"autoscaling": a, "conditions": changes["conditions"]}
    later = T0 + dt.timedelta(seconds=15)
    again, more = evaluation.status_update(
        written, svc(), decision(4, "hold", 4), obs(125.0), [], 1, later
    )
    assert again == {} and more == []  # 120 -> 125 ms is noise: no write


def test_dry_run_reports_and_never_applies() -> None:
    changes, events = evaluation.status_update(
        {}, svc(mode="DryRun"), decision(4, "up"), obs(), [], 1, T0
    )
    assert changes["autoscaling"]["desiredReplicas"] == 4
    assert events[0][1] == "DryRunScaledUp"
    conds = {c["type"]: c for c in changes["conditions"]}
    assert (conds["ScalingActive"]["status"], conds["ScalingActive"]["reason"]) == (
        "False",
        "DryRun",
    )
    # ... and the Deployments stay at spec.replicas.
    assert (
        evaluation.desired_replicas(svc(mode="DryRun"), {"autoscaling": changes["autoscaling"]})
        == 2
    )


def test_missing_metrics_hold_and_say_so_once() -> None:
    changes, events = evaluation.status_update(
        {}, svc(), decision(2, "hold", available=False), obs(None), [], 1, T0
    )
    conds = {c["type"]: c for c in changes["conditions"]}
    assert conds["MetricsAvailable"]["status"] == "False"
    assert conds["MetricsAvailable"]["reason"] == "Unreachable"
    assert ("Warning", "MetricsUnavailable", "Prometheus at http://p:9090 did not answer") in events


def test_an_hpa_on_the_same_workload_is_a_conflict_reported_not_fought() -> None:
    hpa = {
        "metadata": {"name": "h"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "cvs-tts-sm89"}},
    }
    on_service = {
        "metadata": {"name": "s"},
        "spec": {"scaleTargetRef": {"kind": "CosyVoiceService", "name": "tts"}},
    }
    other = {
        "metadata": {"name": "o"},
        "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}},
    }
    names = {"cvs-tts-sm89"}
    found = evaluation.conflicts("tts", svc(), [hpa, on_service, other], names)
    assert [c.name for c in found] == ["h", "s"]
    # With its own autoscaler off, an HPA on the service is the scale subresource's purpose.
    assert [
        c.name for c in evaluation.conflicts("tts", svc(enabled=False), [on_service], names)
    ] == []
    changes, events = evaluation.status_update({}, svc(), decision(4, "up"), obs(), found, 1, T0)
    assert "desiredReplicas" not in changes["autoscaling"]  # the operator holds
    conds = {c["type"]: c for c in changes["conditions"]}
    assert conds["ScalingConflict"]["status"] == "True"
    assert (
        "HorizontalPodAutoscaler h scales Deployment/cvs-tts-sm89"
        in conds["ScalingConflict"]["message"]
    )
    assert any(e[1] == "ScalingConflict" for e in events)


def test_an_evaluation_is_counted_and_its_gauges_follow_the_service() -> None:
    from prometheus_client import REGISTRY

    from cosyvoice_operator.shell import metrics

    def value(name: str, **labels: str) -> float | None:
        found: float | None = REGISTRY.get_sample_value(name, labels)
        return found

    before = value("cosyvoice_autoscaler_decisions_total", direction="up", mode="Active") or 0.0
    metrics.record_evaluation("ml", "tts", "up", "Active", 4, 2, 120.0, "")
    assert (
        value("cosyvoice_autoscaler_decisions_total", direction="up", mode="Active") == before + 1
    )
    assert value("cosyvoice_service_desired_replicas", namespace="ml", service="tts") == 4
    assert value("cosyvoice_service_ready_replicas", namespace="ml", service="tts") == 2
    assert value("cosyvoice_service_queue_latency_seconds", namespace="ml", service="tts") == 0.12
    metrics.record_evaluation("ml", "tts", "hold", "Active", 4, 2, None, "Unreachable")
    assert (value("cosyvoice_autoscaler_metrics_unavailable_total", reason="Unreachable") or 0) >= 1
    metrics.forget("ml", "tts")
    assert value("cosyvoice_service_desired_replicas", namespace="ml", service="tts") is None
