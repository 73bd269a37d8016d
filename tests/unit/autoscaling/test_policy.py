"""The autoscaling policy (cosyvoice_operator.autoscaling.policy), rule by rule.

Each row of a table is one evaluation: the spec, what Prometheus saw, the fleet, the recent
recommendations, and what the policy must decide and say. The plant in most rows is a pod of
10 slots (orchestrator instances / batch slots) whose requests take 2 s; its queue latency is
what an M/M/c queue shows at the load given, unless a row says otherwise.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from cosyvoice_operator.api.spec import AutoscalingSpec, ScaleRule, Schedule, SpecError
from cosyvoice_operator.autoscaling.policy import (
    Decision,
    Fleet,
    Observation,
    Recommendation,
    decide,
)
from cosyvoice_operator.autoscaling.queueing import queue_seconds
from cosyvoice_operator.autoscaling.schedules import schedule_floor

T0 = dt.datetime(2025, 1, 8, 12, 0, tzinfo=dt.UTC)  # a Wednesday
SLOTS = 10
SERVICE = 2.0
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri")


def autoscaling(**changes: Any) -> AutoscalingSpec:
    """The defaults of the CRD (min 1, target 50 ms, every 15 s, up: no window and +4, down:
    300 s and -1), with maxReplicas 10."""
    base = AutoscalingSpec(
        enabled=True,
        min_replicas=1,
        max_replicas=10,
        target_queue_latency_milliseconds=50.0,
        evaluation_interval_seconds=15,
        scale_up=ScaleRule(0, 4),
        scale_down=ScaleRule(300, 1),
    )
    return replace(base, **changes)


def serving(
    ready: int,
    busy: float,
    *,
    queue_ms: float | None = None,
    pending: float = 0.0,
    at: dt.datetime = T0,
) -> Observation:
    """`ready` pods with `busy` requests in service each, as Little's law reports them."""
    in_service = ready * busy
    completions = in_service / SERVICE
    if queue_ms is None:
        queue_ms = 1000.0 * queue_seconds(busy, SLOTS, SERVICE)
    return Observation(
        time=at,
        available=True,
        unavailable_reason="",
        message="",
        queue_latency_ms=queue_ms,
        pending_requests=pending,
        in_flight=completions * (queue_ms / 1000.0 + SERVICE),
        completion_rate=completions,
        no_traffic=False,
    )


def saturated(ready: int, waiting: float) -> Observation:
    """Every slot of `ready` pods busy and `waiting` requests in line."""
    completions = ready * SLOTS / SERVICE
    return serving(ready, SLOTS, queue_ms=1000.0 * waiting / completions, pending=waiting)


def latency_only(queue_ms: float, pending: float = 0.0) -> Observation:
    """A sample without in-flight or completion data."""
    return Observation(T0, True, "", "", queue_ms, pending, None, None, False)


def no_data(reason: str, message: str) -> Observation:
    return Observation(T0, False, reason, message, None, None, None, None, False)


NO_TRAFFIC = Observation(T0, True, "", "", 0.0, 0.0, 0.0, 0.0, True)


def rec(
    seconds_ago: int, replicas: int, *, slots: int | None = SLOTS, pending: float | None = 0.0
) -> Recommendation:
    return Recommendation(T0 - dt.timedelta(seconds=seconds_ago), replicas, slots, pending)


def watched(replicas: int, seconds: int = 300, **kw: Any) -> tuple[Recommendation, ...]:
    """A recommendation of `replicas` every 15 s over the last `seconds`."""
    return tuple(rec(ago, replicas, **kw) for ago in range(seconds, 0, -15))


def business_hours(min_replicas: int, name: str = "business-hours") -> Schedule:
    return Schedule(name, "09:00", "17:00", min_replicas, WEEKDAYS, "UTC")


@dataclass(frozen=True)
class Case:
    id: str
    obs: Observation
    fleet: Fleet
    replicas: int
    direction: str
    says: tuple[str, ...] = ()
    spec: AutoscalingSpec = field(default_factory=autoscaling)
    history: tuple[Recommendation, ...] = ()
    inputs: Mapping[str, float | int | str] = field(default_factory=dict)
    metrics_available: bool = True


def check(case: Case) -> Decision:
    d = decide(case.spec, case.obs, case.fleet, case.history, T0)
    assert (d.replicas, d.direction) == (case.replicas, case.direction), d.reason
    for phrase in case.says:
        assert phrase in d.reason, f"{phrase!r} not in {d.reason!r}"
    for name, value in case.inputs.items():
        assert d.inputs.get(name) == value, (name, d.inputs)
    assert d.metrics_available is case.metrics_available
    lower = max(case.spec.min_replicas, schedule_floor(case.spec.schedules, T0)[0])
    assert min(lower, case.spec.max_replicas) <= d.replicas <= case.spec.max_replicas
    return d


def table(*cases: Case) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", cases, ids=[c.id for c in cases])


# ---- rule 1: bounds -----------------------------------------------------------------------


@table(
    Case(
        "never above maxReplicas",
        spec=autoscaling(max_replicas=4),
        obs=saturated(2, waiting=150),
        fleet=Fleet(2, 2, 0),
        history=(rec(15, 2),),
        replicas=4,
        direction="up",
        says=("scaling up 2 -> 4", "capped at maxReplicas 4"),
    ),
    Case(
        "a manual scale above maxReplicas comes back at once, even without data",
        spec=autoscaling(max_replicas=4),
        obs=no_data("Unreachable", "connection refused"),
        fleet=Fleet(9, 9, 0),
        replicas=4,
        direction="down",
        says=("scaling down 9 -> 4: no metrics (Unreachable: ", "capped at maxReplicas 4"),
        metrics_available=False,
    ),
    Case(
        "a manual scale below minReplicas comes back at once",
        spec=autoscaling(min_replicas=2),
        obs=serving(1, busy=5),
        fleet=Fleet(1, 1, 0),
        replicas=2,
        direction="up",
        says=("scaling up 1 -> 2", "raised to minReplicas 2"),
    ),
    Case(
        "minReplicas == maxReplicas pins the count under overload",
        spec=autoscaling(min_replicas=3, max_replicas=3),
        obs=saturated(3, waiting=60),
        fleet=Fleet(3, 3, 0),
        replicas=3,
        direction="hold",
        says=("holding at 3", "capped at maxReplicas 3"),
    ),
    Case(
        "minReplicas == maxReplicas pins the count without traffic",
        spec=autoscaling(min_replicas=3, max_replicas=3),
        obs=NO_TRAFFIC,
        fleet=Fleet(3, 3, 0),
        history=watched(0),
        replicas=3,
        direction="hold",
        says=("holding at 3: no traffic", "raised to minReplicas 3"),
    ),
    Case(
        "a schedule floor above maxReplicas is capped at it, and the reason says so",
        spec=autoscaling(max_replicas=4, schedules=(business_hours(6, "peak"),)),
        obs=NO_TRAFFIC,
        fleet=Fleet(2, 2, 0),
        replicas=4,
        direction="up",
        says=(
            "the schedule floor 6 (peak) is above maxReplicas 4 and capped at it",
            "raised to maxReplicas 4",
        ),
        inputs={"scheduleFloor": 6, "lowerBound": 4, "activeSchedules": "peak"},
    ),
    Case(
        "a schedule floor is raised to even without data",
        spec=autoscaling(schedules=(business_hours(3),)),
        obs=no_data("Stale", "newest sample is 95 s old"),
        fleet=Fleet(1, 1, 0),
        replicas=3,
        direction="up",
        says=(
            "scaling up 1 -> 3: no metrics (Stale: newest sample is 95 s old)",
            "raised to the schedule floor 3 (business-hours)",
        ),
        metrics_available=False,
    ),
)
def test_bounds(case: Case) -> None:
    check(case)


# ---- rule 2: no data, no decision ---------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("NoData", "no series for pods cvs-a-sm89-0, cvs-a-sm89-1"),
        ("Stale", "newest sample is 95 s old"),
        ("NotANumber", "queue latency is NaN"),
        ("QueryFailed", "Prometheus answered 503"),
        ("Unreachable", "connection refused"),
    ],
)
def test_missing_data_holds_even_when_everything_says_down(reason: str, message: str) -> None:
    d = check(
        Case(
            reason,
            obs=no_data(reason, message),
            fleet=Fleet(3, 3, 0),
            history=watched(1),  # five minutes of "one is enough"
            replicas=3,
            direction="hold",
            says=(f"holding at 3: no metrics ({reason}: {message})", "no scale-down without data"),
            metrics_available=False,
        )
    )
    assert (d.metrics_reason, d.metrics_message) == (reason, message)
    assert d.history == watched(1), "no recommendation is recorded without data"


@table(
    Case(
        "an available sample without a queue latency is no data",
        obs=replace(serving(3, busy=2), queue_latency_ms=None),
        fleet=Fleet(3, 3, 0),
        history=watched(1),
        replicas=3,
        direction="hold",
        says=("holding at 3: no metrics (NoData: the sample has no queue latency)",),
        metrics_available=False,
    ),
    Case(
        "a NaN in an available sample is no data",
        obs=replace(serving(3, busy=2), in_flight=math.nan),
        fleet=Fleet(3, 3, 0),
        history=watched(1),
        replicas=3,
        direction="hold",
        says=("holding at 3: no metrics (NotANumber: ",),
        metrics_available=False,
    ),
    Case(
        "an unavailable sample without a reason reads NoData",
        obs=no_data("", ""),
        fleet=Fleet(3, 3, 0),
        replicas=3,
        direction="hold",
        says=("holding at 3: no metrics (NoData: the metrics source gave no detail)",),
        metrics_available=False,
    ),
)
def test_malformed_samples_are_no_data(case: Case) -> None:
    check(case)


def test_after_an_outage_a_scale_down_waits_for_a_whole_fresh_window() -> None:
    # Five minutes of "2 is enough", except that nothing was recorded from 200 s to 75 s ago
    # (the metrics were unavailable): the window is watched from 60 s ago only.
    history = tuple(r for r in watched(2) if not 60 < (T0 - r.time).total_seconds() < 200)
    check(
        Case(
            "outage",
            obs=serving(5, busy=2),
            fleet=Fleet(5, 5, 0),
            history=history,
            replicas=5,
            direction="hold",
            says=("waits for the 300 s scale-down window, watched for 75 s so far",),
        )
    )


# ---- rule 3: no traffic is data -----------------------------------------------------------


@table(
    Case(
        "no traffic: one step down once the window is watched",
        spec=autoscaling(min_replicas=0),
        obs=NO_TRAFFIC,
        fleet=Fleet(3, 3, 0),
        history=watched(0),
        replicas=2,
        direction="down",
        says=("scaling down 3 -> 2: no traffic",),
        inputs={"rawRecommendation": 0, "downRecommendation": 0},
    ),
    Case(
        "no traffic: nothing before the window is watched",
        spec=autoscaling(min_replicas=0),
        obs=NO_TRAFFIC,
        fleet=Fleet(3, 3, 0),
        history=watched(0, seconds=60),
        replicas=3,
        direction="hold",
        says=("waits for the 300 s scale-down window, watched for 75 s so far",),
    ),
    Case(
        "no traffic at zero replicas with a floor of 0 stays at 0",
        spec=autoscaling(min_replicas=0),
        obs=NO_TRAFFIC,
        fleet=Fleet(0, 0, 0),
        replicas=0,
        direction="hold",
        says=("holding at 0: no traffic",),
    ),
    Case(
        "no traffic goes down to minReplicas, not below",
        obs=NO_TRAFFIC,
        fleet=Fleet(1, 1, 0),
        history=watched(0),
        replicas=1,
        direction="hold",
        says=("raised to minReplicas 1",),
    ),
)
def test_no_traffic(case: Case) -> None:
    d = check(case)
    assert d.metrics_reason == "MetricsFresh"
    assert "no traffic" in d.metrics_message


# ---- rule 4: target tracking, tolerance, consolidation -------------------------------------


@table(
    Case(
        "1.1 x the target is inside the band: hold",
        obs=serving(3, busy=5, queue_ms=55.0),
        fleet=Fleet(3, 3, 0),
        history=watched(1),
        replicas=3,
        direction="hold",
        says=("holding at 3: queue latency 55.0 ms", "within the ±10% tolerance"),
        inputs={"regime": "WithinTolerance", "rawRecommendation": 3},
    ),
    Case(
        "just above 1.1 x the target: up, to what the fitted model needs",
        obs=serving(3, busy=5, queue_ms=55.1),
        fleet=Fleet(3, 3, 0),
        replicas=4,
        direction="up",
        says=("scaling up 3 -> 4", "4 replicas bring it under target"),
        # 5 busy slots and 55.1 ms are explained by 8 slots per pod (10 would give 14 ms)
        inputs={"regime": "AboveTarget", "slotsPerPod": 8, "slotsSource": "fitted"},
    ),
    Case(
        "0.9 x the target is inside the band: hold, whatever the window says",
        obs=serving(3, busy=5, queue_ms=45.0),
        fleet=Fleet(3, 3, 0),
        history=watched(1),
        replicas=3,
        direction="hold",
        says=("within the ±10% tolerance",),
    ),
    Case(
        "just below 0.9 x the target: the consolidation check decides",
        obs=serving(3, busy=5, queue_ms=44.9),
        fleet=Fleet(3, 3, 0),
        history=watched(1),
        replicas=3,
        direction="hold",
        says=("removing 1 of 3 would raise it to 245.3 ms, above 45 ms",),
        inputs={"regime": "BelowTarget", "slotsSource": "remembered"},
    ),
    Case(
        "consolidation: one fewer of 3 puts 6 busy of 10 slots on each pod, 50.6 ms: hold",
        obs=serving(3, busy=4),  # 2.9 ms: a ratio of 0.06, HPA would go to 1
        fleet=Fleet(3, 3, 0),
        history=watched(1),
        replicas=3,
        direction="hold",
        says=("removing 1 of 3 would raise it to 50.6 ms, above 45 ms (90% of the target)",),
        inputs={"predictedQueueLatencyWithOneFewerMilliseconds": 50.65},
    ),
    Case(
        "consolidation: with 3.3 busy per pod one fewer stays at 14.4 ms: one step down",
        obs=serving(3, busy=10 / 3),
        fleet=Fleet(3, 3, 0),
        history=watched(1),
        replicas=2,
        direction="down",
        says=("scaling down 3 -> 2", "2 replicas keep it under 45 ms (predicted 14.4 ms)"),
        inputs={"rawRecommendation": 2, "predictedQueueLatencyMilliseconds": 14.442},
    ),
    Case(
        "the knee: 6.5 of 10 slots busy is 88 ms: up to what Erlang C says, not 2x",
        obs=serving(4, busy=6.5),
        fleet=Fleet(4, 4, 0),
        replicas=5,
        direction="up",
        says=("scaling up 4 -> 5", "5 replicas bring it under target"),
        inputs={"rawRecommendation": 5, "slotsPerPod": 10},
    ),
    Case(
        "proportional, not bang-bang: a saturated pair at 300x the target asks for 7",
        obs=saturated(2, waiting=150),  # 150 more waiting than 15 s ago: 20 arrivals/s
        fleet=Fleet(2, 2, 0),
        history=(rec(15, 2),),
        replicas=6,
        direction="up",
        says=(
            "7 replicas bring it under target at 20.00 arrivals/s",
            "limited to +4 by scaleUp.maxStepReplicas",
        ),
        inputs={
            "rawRecommendation": 7,
            "arrivalRate": 20.0,
            "slotsPerPod": 10,
            "slotsSource": "saturation",
            "queueLatencyRatio": 300.0,
        },
    ),
    Case(
        "the pending gauge leads: a line of 45 under a latency still low scales up",
        obs=serving(3, busy=10, queue_ms=10.0, pending=45),
        fleet=Fleet(3, 3, 0),
        history=(rec(15, 3),),
        replicas=7,
        direction="up",
        says=("scaling up 3 -> 7", "7 replicas bring it under target at 18.00 arrivals/s"),
        inputs={"regime": "RequestsWaiting", "waitingLineMilliseconds": 3000.0},
    ),
    Case(
        "a latency above the band over a short line lags (the queue drained): hold",
        obs=serving(7, busy=40 / 7, queue_ms=5000.0, pending=0.7),
        fleet=Fleet(7, 7, 0),
        history=(rec(15, 7, pending=300.0),),
        replicas=7,
        direction="hold",
        says=("the line now is short (35 ms): the latency, counted when requests complete, lags",),
        inputs={"slotsPerPod": 10, "slotsSource": "remembered"},
    ),
    Case(
        "no concurrency signal: above the band at most doubles the Ready pods",
        obs=latency_only(queue_ms=150.0),
        fleet=Fleet(3, 3, 0),
        replicas=6,
        direction="up",
        says=("scaling up 3 -> 6", "no concurrency signal", "6 recommended (at most 2x"),
    ),
    Case(
        "no concurrency signal: a request waiting per Ready pod adds one",
        obs=latency_only(queue_ms=20.0, pending=3),
        fleet=Fleet(3, 3, 0),
        replicas=4,
        direction="up",
        says=("requests are waiting: one more replica",),
    ),
    Case(
        "no concurrency signal: below the band, one replica fewer per window at most",
        obs=latency_only(queue_ms=5.0),
        fleet=Fleet(4, 4, 0),
        history=watched(3, slots=None),
        replicas=3,
        direction="down",
        says=("scaling down 4 -> 3", "one replica fewer per window at most"),
    ),
    Case(
        "no concurrency signal: not when one fewer would be above the band",
        obs=latency_only(queue_ms=30.0),
        fleet=Fleet(2, 2, 0),
        history=watched(1, slots=None),
        replicas=2,
        direction="hold",
        says=("removing 1 of 2 would bring it above the band",),
    ),
    Case(
        "no Ready pod: hold, nothing to measure per pod",
        obs=Observation(T0, True, "", "", 0.0, 3.0, 0.0, 0.0, False),
        fleet=Fleet(2, 0, 2),
        replicas=2,
        direction="hold",
        says=("no replica is Ready",),
    ),
    Case(
        "zero replicas and requests arrive: one",
        spec=autoscaling(min_replicas=0),
        obs=Observation(T0, True, "", "", 0.0, 3.0, 0.0, 0.0, False),
        fleet=Fleet(0, 0, 0),
        replicas=1,
        direction="up",
        says=("scaling up 0 -> 1", "requests arrive and no replica runs"),
    ),
)
def test_target_tracking(case: Case) -> None:
    check(case)


# ---- rule 5: capacity on its way is counted -----------------------------------------------


@table(
    Case(
        "current 4, ready 2, starting 2, recommendation 4: hold, not 6",
        obs=saturated(2, waiting=30),  # a steady line: 10 arrivals/s, 4 replicas needed
        fleet=Fleet(4, 2, 2),
        history=(rec(15, 4, pending=30.0),),
        replicas=4,
        direction="hold",
        says=("holding at 4", "2 replicas already on their way cover the 4 recommended"),
        inputs={"rawRecommendation": 4, "onTheirWay": 2},
    ),
    Case(
        "current 4, ready 2, starting 2, recommendation 7: asks for the 3 not on their way",
        obs=saturated(2, waiting=180),  # 150 more than 15 s ago: 20 arrivals/s
        fleet=Fleet(4, 2, 2),
        history=(rec(15, 4, pending=30.0),),
        replicas=7,
        direction="up",
        says=("scaling up 4 -> 7",),
        inputs={"rawRecommendation": 7},
    ),
    Case(
        "pods the Deployments have not created yet are on their way too",
        obs=saturated(2, waiting=30),
        fleet=Fleet(4, 2, 0),
        history=(rec(15, 4, pending=30.0),),
        replicas=4,
        direction="hold",
        says=("2 replicas already on their way cover the 4 recommended",),
    ),
    Case(
        "a backlog growing during a cold start does not ask again",
        obs=saturated(2, waiting=450),  # 150 more every 15 s while 5 pods start
        fleet=Fleet(7, 2, 5),
        history=(rec(15, 7, pending=300.0),),
        replicas=7,
        direction="hold",
        says=("5 replicas already on their way cover the 7 recommended",),
        inputs={"rawRecommendation": 7, "arrivalRate": 20.0},
    ),
)
def test_capacity_on_its_way(case: Case) -> None:
    check(case)


# ---- rules 6 and 7: stabilization windows and steps ---------------------------------------

RAW_7_ON_3 = serving(3, busy=10, queue_ms=10.0, pending=45)  # recommends 7 (see above)


@table(
    Case(
        "scale-up window: every evaluation in it must ask for more (the lowest counts)",
        spec=autoscaling(scale_up=ScaleRule(60, 4)),
        obs=RAW_7_ON_3,
        fleet=Fleet(3, 3, 0),
        history=(rec(60, 3), rec(45, 5), rec(30, 6), rec(15, 6)),
        replicas=3,
        direction="hold",
        says=("the 60 s scale-up window still holds a recommendation of 3",),
        inputs={"rawRecommendation": 7, "upRecommendation": 3},
    ),
    Case(
        "scale-up window: the lowest recommendation in it is what is asked",
        spec=autoscaling(scale_up=ScaleRule(60, 4)),
        obs=RAW_7_ON_3,
        fleet=Fleet(3, 3, 0),
        history=(rec(75, 3), rec(60, 5), rec(45, 6), rec(30, 6), rec(15, 6)),
        replicas=5,
        direction="up",
        says=("the lowest recommendation in the 60 s scale-up window is 5",),
    ),
    Case(
        "scale-up step: at most scaleUp.maxStepReplicas per evaluation",
        spec=autoscaling(scale_up=ScaleRule(0, 2)),
        obs=RAW_7_ON_3,
        fleet=Fleet(3, 3, 0),
        history=(rec(15, 3),),
        replicas=5,
        direction="up",
        says=("limited to +2 by scaleUp.maxStepReplicas",),
    ),
    Case(
        "scale-down: one step of scaleDown.maxStepReplicas once the window is watched",
        obs=serving(5, busy=2),  # 10 busy slots in all: 2 replicas would do
        fleet=Fleet(5, 5, 0),
        history=watched(2),
        replicas=4,
        direction="down",
        says=("scaling down 5 -> 4", "one step of 1 (scaleDown.maxStepReplicas)"),
        inputs={"downRecommendation": 2, "downWindowWatchedSeconds": 315.0},
    ),
    Case(
        "scale-down: a larger step when scaleDown.maxStepReplicas allows it",
        spec=autoscaling(scale_down=ScaleRule(300, 2)),
        obs=serving(5, busy=2),
        fleet=Fleet(5, 5, 0),
        history=watched(2),
        replicas=3,
        direction="down",
        says=("one step of 2",),
    ),
    Case(
        "scale-down window: the highest recommendation in it counts",
        obs=serving(5, busy=2),
        fleet=Fleet(5, 5, 0),
        history=tuple(rec(ago, 4 if ago == 195 else 2) for ago in range(300, 0, -15)),
        replicas=4,
        direction="down",
        says=("the highest recommendation in the 300 s scale-down window is 4",),
    ),
    Case(
        "scale-down window: one recommendation of the count in force in it holds",
        obs=serving(5, busy=2),
        fleet=Fleet(5, 5, 0),
        history=tuple(rec(ago, 5 if ago == 285 else 2) for ago in range(300, 0, -15)),
        replicas=5,
        direction="hold",
        says=("the 300 s scale-down window still holds a recommendation of 5",),
    ),
    Case(
        "scale-down window: a recommendation older than the window no longer counts",
        obs=serving(5, busy=2),
        fleet=Fleet(5, 5, 0),
        history=(rec(315, 5), *watched(2)),
        replicas=4,
        direction="down",
    ),
    Case(
        "an empty history (an operator restart) waits for a whole window",
        obs=serving(5, busy=2),
        fleet=Fleet(5, 5, 0),
        replicas=5,
        direction="hold",
        says=("watched for 15 s so far",),
    ),
    Case(
        "a scale-down window of 0 acts at once, still one step at a time",
        spec=autoscaling(scale_down=ScaleRule(0, 1)),
        obs=serving(5, busy=2),
        fleet=Fleet(5, 5, 0),
        replicas=4,
        direction="down",
    ),
)
def test_windows_and_steps(case: Case) -> None:
    check(case)


# ---- rule 8: the history ------------------------------------------------------------------


def test_history_is_pruned_sorted_and_ends_with_this_evaluation() -> None:
    # Longest window 300 s plus two 15 s intervals: 330 s are kept.
    history = [rec(15, 3), rec(600, 9), rec(330, 4), rec(-15, 8), rec(345, 5), rec(30, 3)]
    d = decide(autoscaling(), serving(3, busy=4), Fleet(3, 3, 0), history, T0)
    assert [(T0 - r.time).total_seconds() for r in d.history] == [330, 30, 15, 0]
    newest = d.history[-1]
    assert newest == Recommendation(T0, int(d.inputs["rawRecommendation"]), SLOTS, 0.0)


def test_slots_measured_at_saturation_replace_the_remembered_ones() -> None:
    d = decide(autoscaling(), saturated(2, waiting=60), Fleet(2, 2, 0), [rec(15, 2, slots=6)], T0)
    assert (d.inputs["slotsPerPod"], d.inputs["slotsSource"]) == (10, "saturation")
    assert d.history[-1].slots_per_pod == 10


def test_a_fit_above_the_band_is_not_remembered() -> None:
    """The latency above the band may lag a queue that has drained: its fit stays out."""
    d = decide(autoscaling(), serving(3, busy=5, queue_ms=55.1), Fleet(3, 3, 0), [], T0)
    assert d.inputs["slotsSource"] == "fitted"
    assert d.history[-1].slots_per_pod is None


# ---- schedules ----------------------------------------------------------------------------


def at(text: str) -> dt.datetime:
    """A UTC instant, 'YYYY-MM-DD HH:MM'."""
    return dt.datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=dt.UTC)


BUSINESS = Schedule("business", "09:00", "17:00", 3, WEEKDAYS, "UTC")
FRIDAY_NIGHT = Schedule("friday-night", "22:00", "06:00", 4, ("Fri",), "UTC")
EVENING = Schedule("evening", "20:00", "00:00", 2, timezone="UTC")
SHANGHAI = Schedule("shanghai", "09:00", "18:00", 5, timezone="Asia/Shanghai")
BERLIN = Schedule("berlin", "09:00", "17:00", 2, WEEKDAYS, "Europe/Berlin")
NEW_YORK_NIGHT = Schedule("ny-night", "01:00", "04:00", 2, timezone="America/New_York")
NEW_YORK_FALLBACK = Schedule("ny-1am", "01:00", "02:00", 2, timezone="America/New_York")
AUCKLAND_MONDAY = Schedule("auckland", "08:00", "10:00", 6, ("Mon",), "Pacific/Auckland")
LUNCH = Schedule("lunch", "11:30", "13:30", 5, WEEKDAYS, "UTC")


# (what the row shows, the schedules, a UTC instant, the floor and the active names)
SCHEDULE_ROWS: list[tuple[str, tuple[Schedule, ...], str, tuple[int, str]]] = [
    ("no schedules: floor 0", (), "2025-01-08 12:00", (0, "")),
    # 2025-01-08 is a Wednesday, 2025-01-11 a Saturday.
    ("inside a window", (BUSINESS,), "2025-01-08 12:00", (3, "business")),
    ("start is inclusive", (BUSINESS,), "2025-01-08 09:00", (3, "business")),
    ("before the start", (BUSINESS,), "2025-01-08 08:59", (0, "")),
    ("end is exclusive", (BUSINESS,), "2025-01-08 17:00", (0, "")),
    ("a day not in daysOfWeek", (BUSINESS,), "2025-01-11 12:00", (0, "")),
    # 22:00-06:00 on Fridays: Fri 2025-01-10 22:00 to Sat 06:00.
    ("midnight: Fri evening", (FRIDAY_NIGHT,), "2025-01-10 23:00", (4, "friday-night")),
    ("midnight: Sat morning is Fri's", (FRIDAY_NIGHT,), "2025-01-11 05:59", (4, "friday-night")),
    ("midnight: ends Sat 06:00", (FRIDAY_NIGHT,), "2025-01-11 06:00", (0, "")),
    ("midnight: Fri morning is Thu's", (FRIDAY_NIGHT,), "2025-01-10 05:00", (0, "")),
    ("midnight: Sat evening is not Fri", (FRIDAY_NIGHT,), "2025-01-11 23:00", (0, "")),
    ("an end of 00:00 is midnight", (EVENING,), "2025-01-08 23:59", (2, "evening")),
    ("an end of 00:00 ends at midnight", (EVENING,), "2025-01-09 00:00", (0, "")),
    ("time zone: 09:30 in Shanghai", (SHANGHAI,), "2025-01-08 01:30", (5, "shanghai")),
    ("time zone: 08:30 in Shanghai", (SHANGHAI,), "2025-01-08 00:30", (0, "")),
    # Berlin: UTC+1 in winter, UTC+2 in summer; the window keeps its wall-clock hours.
    ("DST: 09:30 CET", (BERLIN,), "2025-01-08 08:30", (2, "berlin")),
    ("DST: 09:30 CEST", (BERLIN,), "2025-07-09 07:30", (2, "berlin")),
    ("DST: 08:30 CET", (BERLIN,), "2025-01-08 07:30", (0, "")),
    ("DST: 17:30 CEST", (BERLIN,), "2025-07-09 15:30", (0, "")),
    ("DST: 16:30 CET", (BERLIN,), "2025-01-08 15:30", (2, "berlin")),
    # New York springs forward on 2025-03-09 at 02:00 EST -> 03:00 EDT: 01:00-04:00 lasts
    # two hours that night (06:00-08:00 UTC).
    ("spring forward: 01:00 EST", (NEW_YORK_NIGHT,), "2025-03-09 06:00", (2, "ny-night")),
    ("spring forward: 03:30 EDT", (NEW_YORK_NIGHT,), "2025-03-09 07:30", (2, "ny-night")),
    ("spring forward: 04:00 EDT", (NEW_YORK_NIGHT,), "2025-03-09 08:00", (0, "")),
    # ... and falls back on 2025-11-02 at 02:00 EDT -> 01:00 EST: 01:00-02:00 happens twice.
    ("fall back: first 01:30, EDT", (NEW_YORK_FALLBACK,), "2025-11-02 05:30", (2, "ny-1am")),
    ("fall back: second 01:30, EST", (NEW_YORK_FALLBACK,), "2025-11-02 06:30", (2, "ny-1am")),
    ("fall back: 02:00 EST", (NEW_YORK_FALLBACK,), "2025-11-02 07:00", (0, "")),
    # The day of the week is the schedule's: Sunday 20:00 UTC is Monday 09:00 in Auckland.
    ("days of week in the zone", (AUCKLAND_MONDAY,), "2025-01-12 20:00", (6, "auckland")),
    ("days of week: Tue in Auckland", (AUCKLAND_MONDAY,), "2025-01-13 20:00", (0, "")),
    # Overlapping windows: the highest floor, and every active name.
    ("overlap: the max", (BUSINESS, LUNCH), "2025-01-08 12:00", (5, "business, lunch")),
    (
        "overlap: order does not matter",
        (LUNCH, BUSINESS),
        "2025-01-08 12:00",
        (5, "lunch, business"),
    ),
    ("overlap: one active", (BUSINESS, LUNCH), "2025-01-08 10:00", (3, "business")),
]


@pytest.mark.parametrize(
    ("schedules", "now", "expected"),
    [pytest.param(*row[1:], id=row[0]) for row in SCHEDULE_ROWS],
)
def test_schedule_floor(
    schedules: tuple[Schedule, ...], now: str, expected: tuple[int, str]
) -> None:
    assert schedule_floor(schedules, at(now)) == expected


def test_schedule_floor_in_a_decision() -> None:
    spec = autoscaling(schedules=(business_hours(3),))
    d = decide(spec, NO_TRAFFIC, Fleet(1, 1, 0), watched(0), T0)
    assert (d.replicas, d.direction) == (3, "up")
    assert "raised to the schedule floor 3 (business-hours)" in d.reason
    assert (d.inputs["scheduleFloor"], d.inputs["lowerBound"]) == (3, 3)
    # At 18:00 the window is over: the floor is minReplicas again.
    evening = T0.replace(hour=18)
    assert schedule_floor(spec.schedules, evening) == (0, "")


@pytest.mark.parametrize(
    ("schedule", "field_path"),
    [
        (Schedule("x", "09:00", "17:00", 1, timezone="Mars/Olympus_Mons"), "timezone"),
        (Schedule("x", "9:00", "17:00", 1), "start"),
        (Schedule("x", "09:00", "24:00", 1), "end"),
        (Schedule("x", "09:00", "09:00", 1), "end"),
        (Schedule("x", "09:00", "17:00", 1, ("Monday",)), "daysOfWeek"),
    ],
)
def test_a_schedule_the_crd_would_refuse_is_a_spec_error(
    schedule: Schedule, field_path: str
) -> None:
    with pytest.raises(SpecError) as err:
        schedule_floor((BUSINESS, schedule), T0)
    assert err.value.field == f"spec.autoscaling.schedules[1].{field_path}"


def test_time_must_be_aware() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        decide(autoscaling(), NO_TRAFFIC, Fleet(1, 1, 0), (), T0.replace(tzinfo=None))


# ---- what the decision reports ------------------------------------------------------------


def test_inputs_name_every_number_and_are_plain_json() -> None:
    d = decide(autoscaling(), saturated(2, waiting=150), Fleet(2, 2, 0), [rec(15, 2)], T0)
    for name in (
        "mode",
        "current",
        "ready",
        "starting",
        "onTheirWay",
        "minReplicas",
        "maxReplicas",
        "scheduleFloor",
        "lowerBound",
        "upperBound",
        "targetQueueLatencyMilliseconds",
        "tolerance",
        "queueLatencyMilliseconds",
        "queueLatencyRatio",
        "pendingRequests",
        "inFlight",
        "completionRate",
        "inService",
        "serviceTimeSeconds",
        "slotsPerPod",
        "utilization",
        "arrivalRate",
        "rawRecommendation",
        "upRecommendation",
        "downRecommendation",
        "upWindowSeconds",
        "downWindowSeconds",
        "scaleUpMaxStep",
        "scaleDownMaxStep",
        "replicas",
    ):
        assert name in d.inputs, name
    assert all(isinstance(v, float | int | str) for v in d.inputs.values())
    assert json.loads(json.dumps(d.inputs)) == d.inputs
    assert d.inputs["current"] == 2 and d.inputs["replicas"] == d.replicas


def test_metrics_condition_of_a_fresh_sample() -> None:
    d = decide(autoscaling(), serving(2, busy=3), Fleet(2, 2, 0), (), T0)
    assert (d.metrics_available, d.metrics_reason) == (True, "MetricsFresh")
    assert d.metrics_message == (
        "queue latency 0.3 ms, 0 waiting, 6.0 in flight, 3.00 completions/s over 2 Ready pods"
    )


def test_mode_is_reported_and_changes_nothing_else() -> None:
    args = (saturated(2, waiting=150), Fleet(2, 2, 0), [rec(15, 2)], T0)
    active = decide(autoscaling(mode="Active"), *args)
    dry = decide(autoscaling(mode="DryRun"), *args)
    assert (active.inputs["mode"], dry.inputs["mode"]) == ("Active", "DryRun")
    assert replace(dry, inputs={**dry.inputs, "mode": "Active"}) == active


def test_same_inputs_same_decision() -> None:
    history = [*watched(2), rec(195, 4)]
    first = decide(autoscaling(), serving(5, busy=2), Fleet(5, 5, 0), history, T0)
    again = decide(autoscaling(), serving(5, busy=2), Fleet(5, 5, 0), history, T0)
    shuffled = history[:]
    random.Random(7).shuffle(shuffled)
    reordered = decide(autoscaling(), serving(5, busy=2), Fleet(5, 5, 0), shuffled, T0)
    assert first == again == reordered


# ---- closed loop against a simulated fleet ------------------------------------------------


@dataclass
class Plant:
    """Pods of 10 slots, 2 s per request, ready `cold_start` seconds after being asked for.
    Queue latency is averaged over the last minute (as Prometheus' rate() does), so it lags."""

    ready: int
    cold_start: int = 60
    backlog: float = 0.0
    starting: list[dt.datetime] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)

    def sample(self, arrivals: float, now: dt.datetime, dt_s: float) -> Observation:
        self.ready += sum(1 for t in self.starting if t <= now)
        self.starting = [t for t in self.starting if t > now]
        capacity = SLOTS * self.ready / SERVICE
        self.backlog = max(0.0, self.backlog + (arrivals - capacity) * dt_s)
        if self.backlog > 0:  # saturated: every slot busy, the line drains at capacity
            completions, pending = capacity, self.backlog
            wait = self.backlog / capacity
        else:  # Erlang C, the line as Little's law has it
            completions = arrivals
            busy = arrivals * SERVICE / self.ready if self.ready else 0.0
            wait = queue_seconds(busy, SLOTS, SERVICE)
            pending = arrivals * wait
        self.waits = [*self.waits[-3:], wait]
        latency = sum(self.waits) / len(self.waits)
        return Observation(
            now,
            True,
            "",
            "",
            1000.0 * latency,
            pending,
            completions * (latency + SERVICE),
            completions,
            arrivals == 0,
        )

    def scale(self, current: int, desired: int, now: dt.datetime) -> None:
        if desired > current:
            self.starting += [now + dt.timedelta(seconds=self.cold_start)] * (desired - current)
        for _ in range(current - desired):
            if self.starting:
                self.starting.pop()
            else:
                self.ready -= 1


def run(
    spec: AutoscalingSpec, plant: Plant, arrivals: list[float]
) -> list[tuple[dt.datetime, Observation, Fleet, Decision]]:
    history: tuple[Recommendation, ...] = ()
    current = plant.ready
    trace = []
    for i, rate in enumerate(arrivals):
        now = T0 + dt.timedelta(seconds=i * spec.evaluation_interval_seconds)
        obs = plant.sample(rate, now, spec.evaluation_interval_seconds)
        fleet = Fleet(current, plant.ready, len(plant.starting))
        d = decide(spec, obs, fleet, history, now)
        trace.append((now, obs, fleet, d))
        history = d.history
        plant.scale(current, d.replicas, now)
        current = d.replicas
    return trace


def test_a_load_step_up_then_down_scales_without_oscillation() -> None:
    """5 req/s (2 replicas carry it at 14 ms), 20 req/s for 15 min (7 replicas: 36 ms; 6
    would be 105 ms), then 5 req/s again."""
    spec = autoscaling(max_replicas=12)
    arrivals = [5.0] * 20 + [20.0] * 60 + [5.0] * 60
    trace = run(spec, Plant(ready=2), arrivals)
    counts = [d.replicas for _, _, _, d in trace]
    changes = [(now, d) for now, _, _, d in trace if d.direction != "hold"]

    # Up within two evaluations of the step, straight to what the load needs, no further.
    first_up = next(i for i, (_, _, _, d) in enumerate(trace) if d.direction == "up")
    assert first_up <= 20 + 1
    assert max(counts) == 7
    # Latency back under the target once the new pods are Ready (cold start 60 s), and
    # for the rest of the peak.
    peak = [obs.queue_latency_ms or 0.0 for _, obs, _, _ in trace[32:80]]
    assert max(peak) < spec.target_queue_latency_milliseconds
    # Down to 2 in the end, one replica per decision, only after the window.
    assert counts[-1] == 2
    downs = [(now, d) for now, d in changes if d.direction == "down"]
    assert all(d.inputs["current"] == d.replicas + 1 for _, d in downs)
    assert (downs[0][0] - (T0 + dt.timedelta(seconds=80 * 15))).total_seconds() >= 300
    # No reversal of direction within the scale-down window.
    for (t1, d1), (t2, d2) in itertools.pairwise(changes):
        if d1.direction != d2.direction:
            assert (t2 - t1).total_seconds() >= spec.scale_down.stabilization_window_seconds


def test_a_burst_through_a_long_cold_start_does_not_stampede() -> None:
    """3 req/s, then 30 (11 replicas at 27 ms) while pods take 3 minutes to start: the backlog
    grows to minutes of queue, and the policy still asks for 11 in all, not for the backlog."""
    spec = autoscaling(max_replicas=40)
    trace = run(spec, Plant(ready=1, cold_start=180), [3.0] * 10 + [30.0] * 40)
    counts = [d.replicas for _, _, _, d in trace]
    assert max(counts) == 11
    assert counts[13] == 11  # asked for within four evaluations (steps of +4)
    assert max(obs.queue_latency_ms or 0.0 for _, obs, _, _ in trace) > 60_000
    assert all(d.direction != "down" for _, _, _, d in trace)
    assert trace[-1][2] == Fleet(11, 11, 0)
    assert (trace[-1][1].queue_latency_ms or 0.0) < spec.target_queue_latency_milliseconds
