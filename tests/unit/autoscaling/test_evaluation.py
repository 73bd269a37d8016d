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


def unavailable_decision(url: str, replicas: int = 2) -> Decision:
    return Decision(
        replicas=replicas,
        direction="hold",
        reason=f"holding at {replicas}: no metrics (Unreachable); no scale-down without data",
        inputs={"current": replicas},
        metrics_available=False,
        metrics_reason="Unreachable",
        metrics_message=f"Prometheus at {url} did not answer within 5.0s",
        history=(),
    )


def written(status: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """The status after a merge patch of `changes` (one level deep is enough here)."""
    merged = dict(status)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


def test_conditions_follow_a_changed_url_and_generation_without_writing_noise() -> None:
    """Issue 23: after prometheusUrl changed, MetricsAvailable named the old URL for 100 s
    with its observedGeneration behind the spec."""
    first, _ = evaluation.status_update(
        {}, svc(), unavailable_decision("http://old:9090"), obs(None), [], 1, T0
    )
    status = written({}, first)
    later = T0 + dt.timedelta(seconds=15)
    moved, events = evaluation.status_update(
        status, svc(), unavailable_decision("http://new:9091"), obs(None), [], 2, later
    )
    assert moved, "a new URL and a new generation must be written"
    status = written(status, moved)
    metrics = condition(status, "MetricsAvailable")
    assert "http://new:9091" in metrics["message"] and metrics["observedGeneration"] == 2
    assert all(c["observedGeneration"] == 2 for c in status["conditions"])
    assert events == []  # still unavailable: the Warning was posted when it began
    # The same again: nothing to write.
    again, _ = evaluation.status_update(
        status, svc(), unavailable_decision("http://new:9091"), obs(None), [], 2, later
    )
    assert again == {}


def test_the_latest_evaluations_reason_is_written_not_only_the_last_change() -> None:
    """Issue 23: lastDecision changes only when the count does, so 'why isn't it scaling
    now?' showed an old scale-up; lastEvaluation has the latest reason."""
    up, _ = evaluation.status_update({}, svc(), decision(4, "up"), obs(), [], 1, T0)
    status = written({}, up)
    assert status["autoscaling"]["lastEvaluation"]["reason"] == decision(4, "up").reason
    hold = Decision(
        replicas=4,
        direction="hold",
        reason="holding at 4: queue latency 40.0 ms within 10% of the 50 ms target",
        inputs={"current": 4},
        metrics_available=True,
        metrics_reason="MetricsFresh",
        metrics_message="fresh",
        history=(),
    )
    later = T0 + dt.timedelta(seconds=15)
    changes, events = evaluation.status_update(status, svc(), hold, obs(120.0), [], 1, later)
    assert changes["autoscaling"]["lastEvaluation"]["reason"].startswith("holding at 4")
    assert "lastDecision" not in changes["autoscaling"] or (
        changes["autoscaling"]["lastDecision"] == status["autoscaling"]["lastDecision"]
    )
    assert events == []
    status = written(status, changes)
    # The same hold with other numbers: no write (they are refreshed with the next one).
    other = Decision(**{**hold.__dict__, "reason": hold.reason.replace("40.0", "41.5")})
    quiet, _ = evaluation.status_update(status, svc(), other, obs(121.0), [], 1, later)
    assert quiet == {}


def test_kubectl_scale_on_an_autoscaled_service_is_a_warning_not_a_silent_no_op() -> None:
    first, _ = evaluation.status_update({}, svc(), decision(4, "up"), obs(), [], 1, T0)
    status = written({}, first)
    assert status["autoscaling"]["specReplicas"] == 2
    active = condition(status, "ScalingActive")["message"]
    assert "the autoscaler owns the replica count (4" in active
    assert "spec.replicas (2) is not used" in active
    scaled = parse(
        {
            "model": {"variant": "cosyvoice3", "uri": "hf://a/b"},
            "replicas": 7,
            "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 8},
        }
    )
    hold = decision(4, "hold", 4)
    later = T0 + dt.timedelta(seconds=15)
    changes, events = evaluation.status_update(status, scaled, hold, obs(), [], 2, later)
    [(kind, reason, message)] = events
    assert (kind, reason) == ("Warning", "ReplicasIgnored")
    assert "spec.replicas changed 2 -> 7" in message and "owns the replica count" in message
    assert changes["autoscaling"]["specReplicas"] == 7
    # Once: the next evaluation has nothing to say.
    status = written(status, changes)
    _, again = evaluation.status_update(status, scaled, hold, obs(), [], 2, later)
    assert again == []
    # In DryRun spec.replicas is what runs: a change of it is no warning.
    dry = svc(mode="DryRun")
    dry_first, _ = evaluation.status_update({}, dry, decision(4, "up"), obs(), [], 1, T0)
    dry_status = written({}, dry_first)
    dry_status["autoscaling"]["specReplicas"] = 1
    _, dry_events = evaluation.status_update(dry_status, dry, hold, obs(), [], 2, later)
    assert not [e for e in dry_events if e[1] == "ReplicasIgnored"]
    assert (
        "the Deployments run spec.replicas (2)"
        in condition(written(dry_status, dry_first), "ScalingActive")["message"]
    )
