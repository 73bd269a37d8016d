"""Policy rule 4c (issue 30 item 3): behind the router the autoscaler reads the router's
streams in flight and queued, sizes the fleet as one pooled M/M/(n x c) queue, scales up on a
router queue that stays above 0, and holds (never scales down) without the router's figures.
And item 4's figure: utterances per stream, and when it warns."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import replace

import pytest

from cosyvoice_operator.api.spec import AutoscalingSpec, ScaleRule, SloSpec
from cosyvoice_operator.autoscaling import evaluation
from cosyvoice_operator.autoscaling.assessment import ROUTER_QUEUE_EVALUATIONS
from cosyvoice_operator.autoscaling.policy import (
    Fleet,
    Observation,
    Recommendation,
    decide,
)
from cosyvoice_operator.autoscaling.queueing import (
    miss_probability,
    pooled_replicas_for,
    pooled_replicas_for_miss,
    queue_seconds,
    replicas_for_miss,
)
from cosyvoice_operator.autoscaling.sample import (
    RouterSample,
    Sample,
    router_unavailable,
    unavailable,
)

T0 = dt.datetime(2026, 12, 6, 12, 0, tzinfo=dt.UTC)
SERVICE = 10.0  # seconds a stream holds a slot
SLOTS = 16


def slo_spec(**slo: float) -> AutoscalingSpec:
    values: dict[str, float] = {
        "first_audio_milliseconds": 1500,
        "first_chunk_milliseconds": 500,
        "variability": 1.0,
        "forecast_std_devs": 0.0,
    }
    values.update(slo)
    return AutoscalingSpec(
        enabled=True,
        min_replicas=1,
        max_replicas=100,
        target_queue_latency_milliseconds=50.0,
        evaluation_interval_seconds=15,
        scale_up=ScaleRule(0, 100),
        scale_down=ScaleRule(300, 100),
        slo=SloSpec(**values),  # type: ignore[arg-type]
    )


def target_spec() -> AutoscalingSpec:
    return replace(slo_spec(), slo=SloSpec(), target_queue_latency_milliseconds=500.0)


def router(
    in_flight: float, queued: float, rate: float | None = None, slots: float | None = SLOTS
) -> RouterSample:
    """A fresh router reading; the arrival rate by default what the pods carry (Little)."""
    return RouterSample(
        available=True,
        unavailable_reason="",
        message="1 of 1 router pod(s) reporting",
        in_flight=in_flight,
        queued=queued,
        stream_rate=in_flight / SERVICE if rate is None else rate,
        slots_per_pod=slots,
        active_servers=None,
        routers_seen=1,
    )


def observe(
    r: RouterSample, at: dt.datetime = T0, triton_in_flight: float | None = None
) -> Observation:
    """The router's reading with Triton's: nothing waits at Triton (the router keeps it
    empty), each request takes SERVICE seconds."""
    busy = r.in_flight or 0.0 if triton_in_flight is None else triton_in_flight
    return Observation(
        at, True, "", "", 0.0, 0.0, busy, busy / SERVICE if busy else 0.0, False, router=r
    )


def test_pooling_needs_fewer_pods_than_separate_queues() -> None:
    """Erlang C: one queue over 48 slots waits less than 3 queues of 16 at the same load, and
    the pooled search is the smallest n whose n x c servers meet the miss, checked directly."""
    load, budget, miss = 40.0, 1.0, 0.01
    assert queue_seconds(load, 3 * SLOTS, SERVICE) < queue_seconds(load / 3, SLOTS, SERVICE)
    pooled = pooled_replicas_for_miss(load, SLOTS, SERVICE, budget, miss)
    separate = replicas_for_miss(load, SLOTS, SERVICE, budget, miss)
    assert pooled < separate, (pooled, separate)
    assert miss_probability(load, pooled * SLOTS, SERVICE, budget) <= miss
    assert miss_probability(load, (pooled - 1) * SLOTS, SERVICE, budget) > miss
    target = pooled_replicas_for(load, SLOTS, SERVICE, 0.05)
    assert queue_seconds(load, target * SLOTS, SERVICE) <= 0.05
    assert queue_seconds(load, (target - 1) * SLOTS, SERVICE) > 0.05
    assert pooled_replicas_for_miss(0.0, SLOTS, SERVICE, budget, miss) == 0
    # Absurd loads end (the search is capped), they do not hang.
    assert pooled_replicas_for_miss(1e6, 1, SERVICE, budget, miss) >= 1e6


def test_slo_sizing_pools_the_fleet_on_in_flight_plus_queued_and_names_the_router() -> None:
    spec = slo_spec()
    r = router(37, 5)
    d = decide(spec, observe(r), Fleet(3, 3, 0), (), T0)
    budget = (1500 - 500) / 1000
    expected = pooled_replicas_for_miss(42 * 1.0, SLOTS, SERVICE, budget, 0.01)
    # 42 streams on a 10 s service: 4.2 streams/s, 42 Erlangs; the queue of 5 has held only
    # once, so the model alone decides.
    assert d.inputs["load"] == pytest.approx(42.0)
    assert d.inputs["sloReplicas"] == expected == d.replicas, d.reason
    assert d.direction == "up"
    assert d.reason.startswith(
        "scaling up 3 -> 4: router: 37 streams in flight + 5 queued over 3 pods x 16 slots (48)"
    ), d.reason
    assert "pooled behind the router" in d.reason
    assert d.inputs["signal"] == "router" and d.inputs["slotsSource"] == "router maxconn"
    assert d.inputs["serviceTimeSource"] == "triton"
    assert d.metrics_available and d.metrics_message.startswith("router: 37 streams")
    assert d.history[-1].router_queued == 5


def test_arrivals_over_the_window_count_when_they_exceed_what_is_on_the_pods() -> None:
    """A fleet full for the whole window: HAProxy counted 9 streams/s arriving, the pods hold
    48 and 2 wait: the demand is 9 x 10 s = 90 Erlangs, not 50."""
    d = decide(slo_spec(), observe(router(48, 2, rate=9.0)), Fleet(3, 3, 0), (), T0)
    assert d.inputs["load"] == pytest.approx(90.0)
    assert d.replicas == pooled_replicas_for_miss(90.0, SLOTS, SERVICE, 1.0, 0.01)


def test_target_sizing_pools_the_fleet() -> None:
    spec = target_spec()
    d = decide(spec, observe(router(60, 0)), Fleet(3, 3, 0), (), T0)
    assert d.replicas == pooled_replicas_for(60.0, SLOTS, SERVICE, 0.5) > 3
    assert d.inputs["regime"] == "RouterSizing"
    # Light load below the count in force: fewer, with the 90 % margin, after the window.
    history = tuple(Recommendation(T0 - dt.timedelta(seconds=s), 1) for s in range(300, 0, -15))
    down = decide(spec, observe(router(5, 0)), Fleet(6, 6, 0), history, T0)
    assert down.direction == "down"
    assert down.replicas == max(1, pooled_replicas_for(5.0, SLOTS, SERVICE, 0.45))


def queue_history(count: int, queued: float = 5.0) -> tuple[Recommendation, ...]:
    """`count` earlier evaluations, 15 s apart, that saw `queued` streams in the router."""
    return tuple(
        Recommendation(T0 - dt.timedelta(seconds=15 * i), 3, SLOTS, 0.0, router_queued=queued)
        for i in range(count, 0, -1)
    )


def test_a_router_queue_that_stays_asks_for_more_pods_on_its_own() -> None:
    """The model thinks 3 pods (48 slots) suffice for 20 streams, but 20 more wait in the
    router for three evaluations in a row (pods the router cannot reach: the model's figures
    are not the router's): the queue asks for 3 + ceil(20 / 16) = 5."""
    spec = target_spec()
    r = router(20, 20, rate=2.0)
    first = decide(spec, observe(r), Fleet(3, 3, 0), queue_history(1), T0)
    assert first.inputs["routerQueueEvaluations"] == 2
    assert first.inputs["regime"] != "RouterQueue"
    third = decide(
        spec, observe(r), Fleet(3, 3, 0), queue_history(ROUTER_QUEUE_EVALUATIONS - 1), T0
    )
    assert third.inputs["regime"] == "RouterQueue"
    assert third.inputs["routerQueueReplicas"] == 5
    assert third.replicas >= 5
    assert "the router's queue has held for 3 evaluations" in third.reason
    assert "3 Ready + ceil(20 queued / 16 slots) = 5" in third.reason
    # A gap (an outage) or an evaluation without a router queue starts the count again.
    gap = tuple(
        replace(r_, time=r_.time - dt.timedelta(seconds=60))
        for r_ in queue_history(ROUTER_QUEUE_EVALUATIONS - 1)
    )
    assert decide(spec, observe(r), Fleet(3, 3, 0), gap, T0).inputs["routerQueueEvaluations"] == 1
    empty = queue_history(ROUTER_QUEUE_EVALUATIONS - 1, queued=0.0)
    assert decide(spec, observe(r), Fleet(3, 3, 0), empty, T0).inputs["regime"] != "RouterQueue"


def test_no_scale_down_while_streams_wait_in_the_router() -> None:
    spec = target_spec()
    history = tuple(
        Recommendation(T0 - dt.timedelta(seconds=s), 1, router_queued=0.0)
        for s in range(300, 0, -15)
    )
    # 1 stream in flight would need one pod; one waits in the router: hold at 6.
    d = decide(spec, observe(router(1, 1, rate=0.1)), Fleet(6, 6, 0), history, T0)
    assert d.replicas == 6 and d.direction == "hold", d.reason
    assert "1 streams wait in the router: no fewer than in force" in d.reason


@pytest.mark.parametrize(
    ("reading", "code"),
    [
        (router_unavailable("Stale", "the newest sample is 300s old"), "Stale"),
        (router_unavailable("NoReadyRouter", "no router pod is Ready"), "NoReadyRouter"),
        (replace(router(1, 0), in_flight=None), "NoData"),
        (replace(router(1, 0), queued=math.nan), "NotANumber"),
    ],
)
def test_missing_or_stale_router_data_holds_never_scales_down(
    reading: RouterSample, code: str
) -> None:
    """Triton alone would say 'idle' (the router keeps its queue empty): without the
    router's figures the autoscaler holds, after a full window of low recommendations."""
    spec = target_spec()
    history = tuple(Recommendation(T0 - dt.timedelta(seconds=s), 1) for s in range(300, 0, -15))
    obs = evaluation.observation(idle_triton(), T0, reading)
    d = decide(spec, obs, Fleet(6, 6, 0), history, T0)
    assert d.replicas == 6 and d.direction == "hold"
    assert not d.metrics_available and d.metrics_reason == code
    assert d.reason.startswith("holding at 6: no metrics (") and "router" in d.reason
    assert "no scale-down without data" in d.reason


def idle_triton() -> Sample:
    return Sample(True, "", "no traffic on 6 pod(s)", 0.0, 0.0, 0.0, 0.0, True, None, 6)


def test_triton_idle_but_streams_at_the_router_is_not_no_traffic() -> None:
    """Streams longer than the rate window complete nothing in it: Triton reads 'no traffic'
    while the router holds 30 streams. The router decides: no scale to 0."""
    spec = target_spec()
    obs = evaluation.observation(idle_triton(), T0, router(30, 0, rate=0.0))
    d = decide(spec, obs, Fleet(3, 3, 0), (), T0)
    assert d.inputs["regime"] != "NoTraffic"
    assert d.inputs["regime"] == "RouterNoServiceTime" or d.replicas >= 2
    # And truly nothing at the router: no traffic, 0 recommended.
    quiet = decide(
        spec, evaluation.observation(idle_triton(), T0, router(0, 0, 0.0)), Fleet(3, 3, 0), (), T0
    )
    assert quiet.inputs["regime"] == "NoTraffic" and quiet.inputs["rawRecommendation"] == 0


def test_service_time_from_the_router_when_triton_completed_nothing() -> None:
    spec = target_spec()
    obs = evaluation.observation(idle_triton(), T0, router(30, 0, rate=3.0))
    d = decide(spec, obs, Fleet(3, 3, 0), (), T0)
    assert d.inputs["serviceTimeSource"] == "router"
    assert d.inputs["serviceTimeSeconds"] == pytest.approx(10.0)
    # With streams queued, in flight / arriving is not the service time: hold on it, and say so.
    waiting = evaluation.observation(idle_triton(), T0, router(30, 4, rate=3.0))
    held = decide(spec, waiting, Fleet(3, 3, 0), (), T0)
    assert held.inputs["regime"] == "RouterNoServiceTime" and held.replicas == 3
    assert "no service time yet" in held.reason
    # ... unless the queue has held: then it sizes on the queue alone.
    history = queue_history(ROUTER_QUEUE_EVALUATIONS - 1, queued=4.0)
    queued = decide(spec, waiting, Fleet(3, 3, 0), history, T0)
    assert queued.inputs["regime"] == "RouterQueue" and queued.replicas == 4, queued.reason


def test_a_fleet_at_zero_wakes_up_on_streams_at_the_router() -> None:
    spec = replace(target_spec(), min_replicas=0)
    no_pods = unavailable("NoReadyPods", "no serving pod is Ready yet")
    d = decide(spec, evaluation.observation(no_pods, T0, router(0, 3, 0.2)), Fleet(0, 0, 0), (), T0)
    assert d.replicas == 1 and d.inputs["regime"] == "WakeUp", d.reason


def test_spec_slots_win_over_the_router_limit_and_the_router_limit_over_memory() -> None:
    spec = slo_spec(slots_per_pod=8)
    d = decide(spec, observe(router(20, 0)), Fleet(3, 3, 0), (), T0)
    assert d.inputs["slotsPerPod"] == 8 and d.inputs["slotsSource"] == "slo.slotsPerPod"
    remembered = (Recommendation(T0 - dt.timedelta(seconds=15), 3, 12),)
    d = decide(slo_spec(), observe(router(20, 0, slots=None)), Fleet(3, 3, 0), remembered, T0)
    assert d.inputs["slotsPerPod"] == 12 and d.inputs["slotsSource"] == "remembered"


# ---- item 4: utterances per stream ----------------------------------------------------------


def test_utterances_per_stream() -> None:
    per = evaluation.utterances_per_stream
    assert per(2.0, 2.0, 10.0, 60) == pytest.approx(1.0)
    assert per(6.0, 2.0, 10.0, 60) == pytest.approx(3.0)
    # No stream started in the window, 2 open ones carried 0.5 utterances/s: 15 each.
    assert per(0.5, 0.0, 2.0, 60) == pytest.approx(15.0)
    assert per(0.0, 1.0, 1.0, 60) is None  # nothing completed: no figure
    assert per(1.0, None, 1.0, 60) is None and per(math.nan, 1.0, 1.0, 60) is None
    assert per(1.0, 0.0, 0.0, 60) is None


def test_the_warning_fires_above_one_and_a_half_once_an_hour() -> None:
    warn = evaluation.utterance_warning
    assert warn(1.0, 2.0, 60, None, T0) is None
    assert warn(1.5, 2.0, 60, None, T0) is None
    event = warn(3.0, 2.0, 60, None, T0)
    assert event is not None
    kind, reason, message = event
    assert (kind, reason) == ("Warning", "ManyUtterancesPerStream")
    assert "3.0 utterances per gRPC stream" in message and "one stream per utterance" in message
    # Too few utterances in the window to tell.
    assert warn(3.0, 0.1, 60, None, T0) is None
    # Rate-limited: not again within the hour, again after it.
    assert warn(3.0, 2.0, 60, T0, T0 + dt.timedelta(minutes=59)) is None
    assert warn(3.0, 2.0, 60, T0, T0 + dt.timedelta(minutes=60)) is not None
