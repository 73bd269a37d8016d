"""The autoscaler around the policy (pure): what the fleet looks like from the caches, what a
metrics sample means to the policy, and what a decision writes to the status.

The policy itself is `policy.decide`; the controller fetches the sample (the only I/O)
and carries out what this module returns.

Status writes are kept few on purpose: an evaluation every 15 s for every service must not
become a status write every 15 s. Every evaluation recomputes everything; it is written when
something other than a live number changed: the desired count, the last decision, the
latest evaluation's reason (`lastEvaluation`, numbers masked), a condition's status, reason,
message (numbers outside URLs masked) or the generation it describes, spec.replicas, or when
the observed queue latency moved by more than 10% (and 1 ms) from the value last written. A
write carries the whole evaluation, live numbers included; between writes the QUEUE-MS
column shows the latency as of the last one, and `lastEvaluationTime` says when that was.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosyvoice_operator.api import conditions
from cosyvoice_operator.api.spec import ServiceSpec
from cosyvoice_operator.autoscaling import sample as samples
from cosyvoice_operator.autoscaling.policy import Decision, Fleet, Observation
from cosyvoice_operator.autoscaling.sample import RouterSample, Sample

# Unavailable reasons of our own, besides the metrics source's.
NO_PROMETHEUS = "NoPrometheusURL"
NO_PODS = "NoReadyPods"


def fleet(deployments: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> Fleet:
    """The replica count in force, the Ready pods, and the pods still starting."""
    current = sum(int((d.get("spec") or {}).get("replicas") or 0) for d in deployments)
    ready = starting = 0
    for pod in pods:
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        if is_ready(pod):
            ready += 1
        else:
            starting += 1
    return Fleet(current=current, ready=ready, starting=starting)


def is_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def ready_pod_names(pods: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted(
        str((p.get("metadata") or {}).get("name"))
        for p in pods
        if is_ready(p) and not (p.get("metadata") or {}).get("deletionTimestamp")
    )


def observation(
    sample: Sample, now: dt.datetime, router: RouterSample | None = None
) -> Observation:
    """What the policy reads of a sample. With a router reading (mode Router), the router
    decides whether the observation is usable; Triton's numbers, when Triton's sample has
    none, are None (the router path takes its service time elsewhere or holds)."""
    if router is not None:
        return Observation(
            time=now,
            available=router.available,
            unavailable_reason=router.unavailable_reason,
            message=router.message,
            queue_latency_ms=sample.queue_latency_ms if sample.available else None,
            pending_requests=sample.pending_requests if sample.available else None,
            in_flight=sample.in_flight if sample.available else None,
            completion_rate=sample.completion_rate if sample.available else None,
            no_traffic=False,
            router=router,
        )
    return Observation(
        time=now,
        available=sample.available,
        unavailable_reason=sample.unavailable_reason,
        message=sample.message,
        queue_latency_ms=sample.queue_latency_ms,
        pending_requests=sample.pending_requests,
        in_flight=sample.in_flight,
        completion_rate=sample.completion_rate,
        no_traffic=sample.no_traffic,
    )


# ---- one stream per utterance (issue 30 item 4) --------------------------------------------

# Utterances per stream above which a service's clients are warned, the fewest utterances in
# a window for the figure to count, and how often one service may be warned.
MANY_UTTERANCES_PER_STREAM = 1.5
MIN_UTTERANCES = 10.0
UTTERANCE_WARNING_EVERY = dt.timedelta(hours=1)
MANY_UTTERANCES_REASON = "ManyUtterancesPerStream"


def utterances_per_stream(
    completion_rate: float | None,
    stream_rate: float | None,
    streams_in_flight: float | None,
    window_seconds: float,
) -> float | None:
    """Utterances a client sends per gRPC stream, over the window: the orchestrator's
    completed requests (one per utterance; Triton's Python backend sees no stream
    boundaries, so they are counted here) over the streams the router saw end
    (``haproxy_backend_http_requests_total``; both count at completion). When no stream
    ended in the window but streams are open and utterances completed, the open streams
    carried them all (a lower bound). None without a figure (no traffic, or no
    router reading)."""
    values = (completion_rate, stream_rate, streams_in_flight)
    if any(v is None or not math.isfinite(v) or v < 0 for v in values):
        return None
    assert completion_rate is not None and stream_rate is not None
    assert streams_in_flight is not None
    if completion_rate == 0:
        return None
    if stream_rate > 0:
        return completion_rate / stream_rate
    if streams_in_flight >= 1:
        return completion_rate * window_seconds / streams_in_flight
    return None


def utterance_warning(
    per_stream: float | None,
    completion_rate: float | None,
    window_seconds: float,
    last_warned: dt.datetime | None,
    now: dt.datetime,
) -> tuple[str, str, str] | None:
    """The Warning Event (type, reason, message) when a service's clients send more than
    MANY_UTTERANCES_PER_STREAM utterances per stream over a window of at least MIN_UTTERANCES
    utterances, at most once per UTTERANCE_WARNING_EVERY; None otherwise."""
    if per_stream is None or per_stream <= MANY_UTTERANCES_PER_STREAM:
        return None
    if (completion_rate or 0.0) * window_seconds < MIN_UTTERANCES:
        return None
    if last_warned is not None and now - last_warned < UTTERANCE_WARNING_EVERY:
        return None
    return (
        "Warning",
        MANY_UTTERANCES_REASON,
        f"clients send {per_stream:.1f} utterances per gRPC stream over the last "
        f"{window_seconds:g} s: the router places each stream on one pod, so every utterance "
        "of a stream stays on the pod it first reached, queues behind the stream's earlier "
        "ones and never reaches a pod the autoscaler adds. Open one stream per utterance "
        "(one ModelStreamInfer call or one request per utterance) on the same channel.",
    )


def unavailable(reason: str, message: str, now: dt.datetime) -> Observation:
    """No data, for a reason of the autoscaler's own (no Prometheus URL, no Ready pod)."""
    return observation(samples.unavailable(reason, message), now)


def desired_replicas(svc: ServiceSpec, status: Mapping[str, Any]) -> int:
    """What the serving Deployments are sized to in all: the autoscaler's count when it runs
    in Active mode, else spec.replicas."""
    a = svc.autoscaling
    if not a.enabled or a.mode != "Active":
        return svc.replicas
    decided = (status.get("autoscaling") or {}).get("desiredReplicas")
    if isinstance(decided, int) and not isinstance(decided, bool):
        # Status is written by whoever may patch cosyvoiceservices/status: read within the
        # spec's bounds (a huge count, or a negative one, is not taken as it is).
        return min(max(decided, a.min_replicas), a.max_replicas)
    return min(max(svc.replicas, a.min_replicas), a.max_replicas)


@dataclass(frozen=True)
class Conflict:
    """Another controller that writes the same replica count (an HPA, say)."""

    kind: str
    name: str
    target: str


def conflicts(
    service: str,
    svc: ServiceSpec,
    autoscalers: Sequence[Mapping[str, Any]],
    deployment_names: set[str],
) -> list[Conflict]:
    """HorizontalPodAutoscalers that would fight the operator: one on a serving Deployment
    (the operator owns their replicas), or one on the service itself while the operator's
    own autoscaler is on. (An HPA on the service with `autoscaling.enabled: false` is a user
    choice the scale subresource exists for.)"""
    found: list[Conflict] = []
    for hpa in autoscalers:
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        kind, name = str(ref.get("kind", "")), str(ref.get("name", ""))
        on_deployment = kind == "Deployment" and name in deployment_names
        on_service = kind == "CosyVoiceService" and name == service and svc.autoscaling.enabled
        if on_deployment or on_service:
            found.append(
                Conflict("HorizontalPodAutoscaler", str(hpa["metadata"]["name"]), f"{kind}/{name}")
            )
    return found


def _moved(old: Any, new: float | None) -> bool:
    if new is None:
        return old is not None
    if not isinstance(old, (int, float)):
        return True
    return abs(new - old) > max(1.0, 0.1 * abs(old))


def status_update(
    previous: Mapping[str, Any],
    svc: ServiceSpec,
    decision: Decision,
    obs: Observation,
    found_conflicts: Sequence[Conflict],
    generation: int,
    now: dt.datetime,
) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """The status changes of one evaluation (empty when nothing worth writing changed), and
    the Events to post (type, reason, message) once they are written."""
    prev = dict(previous.get("autoscaling") or {})
    new = dict(prev)
    mode = svc.autoscaling.mode
    if mode == "DryRun" or (mode == "Active" and not found_conflicts):
        # DryRun: reported, never applied (the Deployments follow spec.replicas).
        new["desiredReplicas"] = decision.replicas
    if obs.queue_latency_ms is not None and _moved(
        prev.get("lastQueueLatencyMilliseconds"), obs.queue_latency_ms
    ):
        new["lastQueueLatencyMilliseconds"] = round(obs.queue_latency_ms, 2)
    events: list[tuple[str, str, str]] = []
    _note_spec_replicas(prev, new, svc, decision, found_conflicts, events)
    evaluated = {
        "time": conditions.timestamp(now),
        "replicas": decision.replicas,
        "reason": decision.reason,
    }
    if _masked_evaluation(prev.get("lastEvaluation")) != _masked_evaluation(evaluated):
        new["lastEvaluation"] = evaluated
    record = _decision_record(prev, decision, now)
    if record is not None:
        new["lastDecision"] = record
        if decision.direction != "hold":
            verb = "ScaledUp" if decision.direction == "up" else "ScaledDown"
            events.append(
                ("Normal", f"DryRun{verb}" if mode == "DryRun" else verb, decision.reason)
            )
    updates = _autoscaling_conditions(svc, decision, found_conflicts)
    prev_conds = previous.get("conditions") or []
    merged = conditions.merge(prev_conds, updates, generation, now)
    before = {c["type"]: _essence(c) for c in prev_conds}
    changes: dict[str, Any] = {}
    if {c["type"]: _essence(c) for c in merged} != before:
        changes["conditions"] = merged
        old_conflict = before.get("ScalingConflict", ("False",))[0]
        if found_conflicts and old_conflict != "True":
            events.append(("Warning", "ScalingConflict", updates[-1]["message"]))
        if (
            not decision.metrics_available
            and before.get("MetricsAvailable", ("True",))[0] != "False"
        ):
            events.append(("Warning", "MetricsUnavailable", decision.metrics_message))
    if new != prev or changes:
        # A write carries everything of this evaluation, live numbers included.
        new["lastEvaluationTime"] = conditions.timestamp(now)
        new["lastEvaluation"] = evaluated
        changes["autoscaling"] = new
        changes["conditions"] = merged
    return changes, events


def _note_spec_replicas(
    prev: Mapping[str, Any],
    new: dict[str, Any],
    svc: ServiceSpec,
    decision: Decision,
    found_conflicts: Sequence[Conflict],
    events: list[tuple[str, str, str]],
) -> None:
    """Records spec.replicas as this evaluation saw it; a change of it while the autoscaler
    owns the count (`kubectl scale`, an edit) is a Warning Event, not a silent no-op."""
    new["specReplicas"] = svc.replicas
    before = prev.get("specReplicas")
    active = svc.autoscaling.mode == "Active" and not found_conflicts
    if isinstance(before, int) and before != svc.replicas and active:
        events.append(
            (
                "Warning",
                "ReplicasIgnored",
                f"spec.replicas changed {before} -> {svc.replicas} (kubectl scale, or an edit), "
                "but spec.autoscaling is enabled in Active mode: the autoscaler owns the replica "
                f"count (now {decision.replicas}) and spec.replicas is not used. To size the "
                "service by hand, set spec.autoscaling.enabled=false (or mode DryRun) first.",
            )
        )


# Numbers outside URLs: what changes at every evaluation (latencies, rates, counts) and is
# refreshed with the next write rather than causing one.
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _masked(text: str) -> str:
    return " ".join(
        word if "://" in word else _NUMBER.sub("#", word) for word in str(text).split(" ")
    )


def _masked_evaluation(evaluated: Any) -> tuple[Any, str]:
    if not isinstance(evaluated, Mapping):
        return (None, "")
    return (evaluated.get("replicas"), _masked(str(evaluated.get("reason", ""))))


def _decision_record(
    prev: Mapping[str, Any], decision: Decision, now: dt.datetime
) -> dict[str, Any] | None:
    """`lastDecision` when this decision is one to report (a scale, or the first one) and
    differs from the one reported; None otherwise."""
    if decision.direction == "hold" and "lastDecision" in prev:
        return None
    inputs: dict[str, Any] = dict(decision.inputs)
    record: dict[str, Any] = {
        "time": conditions.timestamp(now),
        "from": int(decision.inputs.get("current", 0) or 0),
        "to": decision.replicas,
        "reason": decision.reason,
        "inputs": inputs,
    }
    old = prev.get("lastDecision") or {}
    if (old.get("from"), old.get("to"), old.get("reason")) == (
        record["from"],
        record["to"],
        record["reason"],
    ):
        return None
    # A merge patch merges maps: inputs the new decision lacks are removed explicitly.
    stale = {k: None for k in (old.get("inputs") or {}) if k not in decision.inputs}
    record["inputs"] = {**stale, **inputs}
    return record


def _autoscaling_conditions(
    svc: ServiceSpec, decision: Decision, found_conflicts: Sequence[Conflict]
) -> list[dict[str, str]]:
    """MetricsAvailable, ScalingActive and ScalingConflict (last: its message is the
    ScalingConflict Event's)."""
    mode = svc.autoscaling.mode
    active = mode == "Active" and not found_conflicts
    if active:
        scaling = (
            "True",
            "Active",
            f"the autoscaler owns the replica count ({decision.replicas}, within "
            f"spec.autoscaling's bounds); spec.replicas ({svc.replicas}) is not used while it "
            "runs in Active mode, so kubectl scale changes nothing",
        )
    elif mode == "DryRun":
        scaling = (
            "False",
            "DryRun",
            "decisions are computed and reported in status.autoscaling and as DryRun Events; "
            f"the Deployments run spec.replicas ({svc.replicas}) (spec.autoscaling.mode: DryRun)",
        )
    else:
        scaling = (
            "False",
            "ScalingConflict",
            "another autoscaler writes this replica count; the operator holds",
        )
    if found_conflicts:
        conflict = (
            "True",
            "AnotherAutoscaler",
            "; ".join(
                f"{c.kind} {c.name} scales {c.target}, which the operator's autoscaler scales: "
                "delete it, or set spec.autoscaling.enabled=false to let it scale the service"
                for c in found_conflicts
            ),
        )
    else:
        conflict = (
            "False",
            "NoConflict",
            "no other autoscaler targets this service or its Deployments",
        )
    metrics = (
        "True" if decision.metrics_available else "False",
        decision.metrics_reason,
        decision.metrics_message,
    )
    return [
        _condition("MetricsAvailable", *metrics),
        _condition("ScalingActive", *scaling),
        _condition("ScalingConflict", *conflict),
    ]


def _condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _essence(c: Mapping[str, Any]) -> tuple[str, str, str, Any]:
    """What counts as a change of a condition: its status, reason, message (with its live
    numbers masked: MetricsAvailable's carries the latest latency) and the generation it
    describes. A message that names another URL, or a spec changed since, is written at the
    next evaluation; a new latency alone is not."""
    return (
        str(c["status"]),
        str(c["reason"]),
        _masked(str(c.get("message", ""))),
        c.get("observedGeneration"),
    )
