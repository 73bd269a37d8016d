"""The autoscaling policy: from one metrics sample, the fleet, and the recommendations of the
last few minutes, to one replica decision with its reason and every number it used.

Pure and deterministic: no I/O, no clock (``now`` is an argument), the same arguments give the
same `Decision`. The shell (with `evaluation`) reads Prometheus and the caches, keeps
``Decision.history`` in memory for the next evaluation, and writes the count; in ``DryRun``
it writes nothing but the report, and ``enabled: false`` never gets here.

This module states every rule and applies 1, 2 and 5-8; what one sample asks for (rules 3
and 4) is `assessment`, the Erlang C model `queueing`, the schedule floors `schedules`.

The model behind the numbers
----------------------------
Triton's queue time is bang-bang: about 0 until a pod's slots (orchestrator instances, batch
slots) are all busy, then it grows without bound. Scaling on its ratio to the target
(Kubernetes HPA's ``ceil(ready * metric / target)``) therefore swings between "remove
everything" and "add everything". The proportional quantities are elsewhere, and the sample
has them: by Little's law, requests in service = ``in_flight - completion_rate * queue_time``
and the mean service time ``s = in_service / completion_rate``. The policy models each pod as
an M/M/c queue (Poisson arrivals spread evenly over the Ready pods, ``c`` slots per pod, mean
service time ``s``) and uses the Erlang C formula for the mean queue time, ``Wq(a, c, s)``
with ``a`` the load per pod in Erlangs (requests in service). Erlang C gives what the ratio
cannot: how far below the knee a fleet is, and the queue time *predicted* on a different
number of replicas (the knee of a pod with 10 slots is at about 6 busy ones for a 50 ms
target and 2 s requests, not at 10).

The slots per pod ``c`` are measured, never configured:
- at saturation every slot is busy, and ``c = round(in service per pod)``. Saturation is a
  waiting line at least as long as what is in service (``pending >= in_service``): near
  the knee, with slots to spare, the line stays short; only arrivals that outrun every slot
  build one that long. The measurement replaces what was remembered (the latest wins:
  slots change with the serving configuration);
- otherwise the remembered ``c`` is used while it still exceeds the load per pod; above the
  band, if the observed latency needs fewer slots to be explained, the fitted count below is
  used for that evaluation only, unless the line now is short (at most the target, fewer
  than one request waiting per Ready pod): then the latency, counted when requests
  complete, still describes a queue that has drained;
- with nothing remembered (or a load the remembered ``c`` could not carry), ``c`` is fitted:
  the most slots whose Erlang C queue time is still at least the observed one, so that the
  model never finds the fleet better off than it was seen. A wait the model does not know
  (Triton's batching delay) only lowers the fit; too few slots means more replicas, never
  fewer. A fit is remembered until a saturation measurement replaces it (except one made
  above the band, where the latency may lag).
``c`` travels in the history (`Recommendation.slots_per_pod`), with the pending count
(`Recommendation.pending_requests`). From the pending count, the arrival rate of a
saturated fleet is estimated: arrivals = completions + growth of the waiting line per
second. The completions of a saturated fleet are its capacity, not the demand, and its
backlog keeps growing while new pods start; the arrival rate does not. So sizing on it
never asks twice for what is already on its way. Unsaturated, the load is what is in
service plus what waits.

The leading signal is the pending gauge (Triton's queue-time counters move only when a
request completes, a whole stream later): the line waiting now, drained at the completion
rate, is a wait of ``pending / completion_rate`` (Little's law). A line longer than the band
allows (``> 1.1 * target``) is pressure, whatever the lagging latency says.

Rules, in the order they apply (each has rows in tests/unit/autoscaling/test_policy.py)
------------------------------------------------------------------------------
1. Bounds. The result is always within ``[max(minReplicas, schedule floor), maxReplicas]``;
   a count outside them (a manual scale) is brought back at once, whatever the data and the
   windows. A schedule floor above maxReplicas is capped at maxReplicas, and the reason says
   so. Schedule floors: `schedules.schedule_floor`.
2. No data, no decision. A sample that is not available (NoData, Stale, NotANumber,
   QueryFailed, Unreachable, or an available one without a queue latency) holds the count:
   it never scales down, ``metrics_available`` is False with the source's reason and message,
   and the reason reads "holding at N: no metrics (...)"; only rule 1 may move the count
   (raising it to a floor, or lowering it to maxReplicas). No recommendation is recorded, so
   a scale-down after an outage waits for a whole fresh window (rule 7).
3. No traffic is data: fresh series whose rates are 0 recommend 0 replicas, which rule 7
   applies after the scale-down window, one step at a time, down to the lower bound.
4. Target tracking with HPA's tolerance 0.1. With ``q = queue latency / target``:
   - above the band (``q > 1.1``) or under pressure (the line above): the raw
     recommendation is the fewest replicas whose predicted queue time (Erlang C on the load)
     is at most the target. It is at least one more than the Ready pods under pressure
     when the line is not already shrinking, and never below the count in force;
   - within the band (``0.9 <= q <= 1.1``): the count in force;
   - below the band: the fewest replicas whose predicted queue time stays at most
     ``(1 - 0.1) * target``, never above the count in force. This is the consolidation check.
     Removing k of N puts ``N/(N-k)`` of the load on each remaining pod, and Erlang C says
     what that does to the queue time. If even one fewer would exceed 90 % of the target,
     the recommendation is to hold, and the reason gives the predicted latency.
   Without in-flight or completion data the ratio alone is used. Above the band:
   ``ceil(ready * min(q, 2))`` (at most doubling, HPA's default 100 % scale-up policy: the
   ratio of a bang-bang signal says *whether*, not *how much*). With a request waiting per
   Ready pod: one more. Below the band: one replica fewer per window at most, and only if
   ``q * ready / (N - 1)`` stays under the band.
   No Ready pod: hold (nothing to measure per pod), except a fleet at 0 replicas that sees
   requests, which gets 1.
4b. SLO sizing (``spec.autoscaling.slo.firstAudioMilliseconds`` > 0, issue 22), in place of
   rule 4's targets when there is a concurrency signal (`assessment.slo_sizing`): the raw
   recommendation is the fewest replicas whose predicted share of requests waiting longer
   than ``SLO - firstChunk`` (Erlang C's tail, scaled by the variability factor: the larger
   of ``slo.variability`` and the queue latency seen over the M/M/c mean wait, capped at 1)
   is at most ``100 - attainmentPercent`` %, at the demand forecast over
   ``coldStartSeconds`` (a least-squares trend over two cold starts, extended when its rise
   is significant, its standard error widened for the correlation of rates over overlapping
   windows, plus ``forecastStdDevs`` robust spreads), on ``slotsPerPod`` slots when
   set. Above the band it is never below the count in force; under pressure at least one
   more than the Ready pods. Rule 7 then waits a whole scale-down window after the last
   change before a step down (one event per window).
5. Scale-up counts capacity already on its way: what is asked for is
   ``up recommendation - max(current, ready + starting)``; if the pods starting (or not yet
   created) cover it, hold. E.g. current 4, ready 2, starting 2, recommendation 4: hold, not 6.
6. Scale-up stabilization and step (HPA semantics): the up recommendation is the *lowest*
   raw recommendation within ``scaleUp.stabilizationWindowSeconds`` (this one included),
   and one evaluation adds at most ``scaleUp.maxStepReplicas``. With SLO sizing the window
   says *whether* and the newest recommendation *how much*: once the window's lowest is above
   what is in force or on its way (a rise held for the whole window), the newest raw
   recommendation is used (one scale event per rise, not one per evaluation while the rate
   windows fill).
7. Scale-down stabilization and step: the down recommendation is the *highest* raw
   recommendation within ``scaleDown.stabilizationWindowSeconds``; a scale-down happens only
   once the window has been watched in full (recommendations kept reach back over it, with
   no gap of more than two evaluation intervals: after an operator restart or an outage the
   window starts again), and removes at most ``scaleDown.maxStepReplicas``. The raw
   recommendations are already consolidation-checked (rule 4), so every step down is one the
   model predicts stays under 90 % of the target. Each evaluation after that may take one
   more step, for as long as the window's highest recommendation stays below the count.
   With SLO sizing, a scale-down that would remove fewer than
   ``slo.scaleDownHysteresisPercent`` % of the count in force (rounded up) holds instead
   (hysteresis: fewer, larger steps), unless it is to 0 replicas (no traffic).
8. Memory: `Decision.history` is the history to pass to the next call: the recommendations
   within the longest window plus two evaluation intervals, the newest last.
9. Seasonal foresight (``slo.seasonalPeriodHours`` > 0, with SLO sizing): the demand of
   every usable sample (0 with no traffic) is averaged into the profile's buckets
   (`seasonal`), carried by the newest recommendation (``Recommendation.season``) and kept
   for one period; a sample without data records nothing and keeps the profile (the
   recommendation carrying it stays in the history, however old). One period later, rule
   4b sizes for at least the seasonal forecast and floor (`assessment.seasonal_demand`):
   today's demand times the rise the last period had from this time of day over the cold
   start, and ``seasonalFloorPercent`` % of the most it saw then. Below the count in force,
   4b recommends the fewest replicas whose predicted miss is at most 90 % of the allowed
   one, and rule 7 removes them in one step per window (``scaleDown.maxStepReplicas``
   permitting).

4c. Behind the router (``spec.routing.mode: Router``; the observation carries the router's
   reading, `assessment.router_assessment`): the signal is the router's, not Triton's queue
   (which the router keeps empty by never giving a pod more streams than its slots). Demand
   = streams in flight on the pods + streams queued in the router, in Erlangs, or the
   arrival rate (HAProxy's session counter, counted as streams arrive) x the service time
   when that is more. The fleet is one pooled M/M/(n x c) queue (`queueing.pooled_*`): with
   SLO sizing, the fewest replicas whose predicted miss of the first-audio budget is within
   the SLO at the forecast demand; else the fewest whose predicted mean wait in the router
   is at most the target (90 % of it below the count in force). While streams wait in the
   router, no fewer than in force; a router queue that stays above 0 for
   ``ROUTER_QUEUE_EVALUATIONS`` consecutive evaluations asks, on its own, for the Ready
   pods plus ``ceil(queued / slots per pod)``. No traffic through the router recommends 0;
   no Ready pod with streams at the router wakes a fleet at 0 with 1. A router reading that
   is missing or stale is rule 2 (hold, never down). Without a router (modes Service and
   GatewayAPI) rules 4 and 4b read Triton's queue as above.

``mode`` (Active / DryRun) changes nothing here; it is reported in ``inputs``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import dataclass

from cosyvoice_operator.api.spec import AutoscalingSpec
from cosyvoice_operator.autoscaling.assessment import (
    TOLERANCE,
    assess,
    count_text,
    nonnegative,
    router_text,
)
from cosyvoice_operator.autoscaling.sample import RouterSample
from cosyvoice_operator.autoscaling.schedules import require_aware, schedule_floor
from cosyvoice_operator.autoscaling.seasonal import Season, record

# Condition reason of MetricsAvailable=True.
METRICS_FRESH = "MetricsFresh"
NO_DATA = "NoData"
NOT_A_NUMBER = "NotANumber"

Number = float | int | str


@dataclass(frozen=True)
class Observation:
    """One sample of the metrics source, over the service's Ready pods."""

    time: dt.datetime  # aware, UTC
    available: bool  # False: no usable data
    unavailable_reason: str  # "" or NoData | Stale | NotANumber | QueryFailed | Unreachable
    message: str  # human detail of the reason ("" when available)
    queue_latency_ms: float | None  # mean queue time per completed request (orchestrator)
    pending_requests: float | None  # nv_inference_pending_request_count, summed over pods
    in_flight: float | None  # requests in the system on average (Little's law), all pods
    completion_rate: float | None  # completed requests per second, all pods
    no_traffic: bool  # fresh series, every rate 0 (data, not missing data)
    # Behind the router (mode Router): the router's reading, the signal of rule 4c; None
    # without a router. When set, the Triton numbers above may be None (no Ready pod, or
    # Triton's series missing): the router's alone decide whether the sample is usable.
    router: RouterSample | None = None


@dataclass(frozen=True)
class Fleet:
    current: int  # the replica count in force (the Deployments' replicas, summed)
    ready: int  # pods Ready
    starting: int  # pods created, not Ready yet (capacity on its way)


@dataclass(frozen=True)
class Recommendation:
    """One evaluation's raw recommendation, and what the policy carries to the next one."""

    time: dt.datetime
    replicas: int
    slots_per_pod: int | None = None  # the M/M/c model's c, as last measured or fitted
    pending_requests: float | None = None  # to estimate how fast the waiting line grows
    arrivals: float | None = None  # the demand seen (requests/s), for the SLO forecast
    in_force: int | None = None  # the replica count in force then (the SLO's cooldown)
    season: Season | None = None  # the seasonal profile (rule 9), on the newest one only
    router_queued: float | None = None  # streams queued in the router (rule 4c's queue rule)


@dataclass(frozen=True)
class Decision:
    replicas: int  # what to set (== fleet.current when holding)
    direction: str  # "up" | "down" | "hold"
    reason: str  # one sentence: what was seen, what was decided, which rule limited it
    inputs: dict[str, Number]  # every number used, by name
    metrics_available: bool
    metrics_reason: str  # MetricsAvailable's reason: MetricsFresh, or the unavailable reason
    metrics_message: str
    history: tuple[Recommendation, ...]  # pass back on the next call


# ---- one evaluation -----------------------------------------------------------------------


def decide(
    spec: AutoscalingSpec,
    obs: Observation,
    fleet: Fleet,
    history: Sequence[Recommendation],
    now: dt.datetime,
) -> Decision:
    """The replica count to set now (the rules are in the module docstring)."""
    require_aware(now, "now")
    floor, active = schedule_floor(spec.schedules, now)
    upper = spec.max_replicas
    bounds = _Bounds(
        min(max(spec.min_replicas, floor), upper), upper, spec.min_replicas, floor, active
    )
    interval = spec.evaluation_interval_seconds
    up_window = spec.scale_up.stabilization_window_seconds
    down_window = spec.scale_down.stabilization_window_seconds
    horizon = dt.timedelta(seconds=max(up_window, down_window) + 2 * interval)
    kept = tuple(
        sorted((r for r in history if now - horizon <= r.time <= now), key=lambda r: r.time)
    )
    current = fleet.current
    inputs = _inputs(spec, fleet, bounds)
    carrier = next((r for r in reversed(history) if r.season is not None), None)
    season = carrier.season if carrier is not None and carrier.season is not None else ()
    problem = _unusable(obs)
    if problem is not None:
        if carrier is not None and all(r is not carrier for r in kept):  # rule 9: kept
            kept = (carrier, *kept)
        return _hold_without_data(problem, current, bounds, inputs, kept)

    a = assess(spec, obs, fleet, kept, now, season)
    inputs.update(a.numbers)
    inputs["regime"] = a.regime
    inputs["rawRecommendation"] = a.raw
    slo = spec.slo.enabled  # only SLO sizing keeps the demand and the count in force
    seasonal = slo and spec.slo.seasonal_period_hours > 0
    demand = 0.0 if a.regime == "NoTraffic" else a.arrivals
    if seasonal and demand is not None:
        season = record(
            season,
            now,
            demand,
            3600 * spec.slo.seasonal_period_hours,
            60 * spec.slo.seasonal_bucket_minutes,
        )
    latest = (
        *kept,
        Recommendation(
            now,
            a.raw,
            a.slots,
            a.pending,
            a.arrivals if slo else None,
            current if slo else None,
            season if seasonal else None,
            a.router_queued,
        ),
    )
    desired, notes = _stabilized(spec, fleet, a.raw, latest, now, inputs)
    desired, bounded_notes = bounds.apply(desired)
    notes.extend(bounded_notes)
    if a.predict_ms is not None and desired != current and desired > 0:
        predicted = a.predict_ms(desired)
        if math.isfinite(predicted):
            inputs["predictedQueueLatencyMilliseconds"] = round(predicted, 3)
    inputs["replicas"] = desired
    return Decision(
        replicas=desired,
        direction=_direction(current, desired),
        reason=_join(f"{_verb(current, desired)}: {a.seen}; {a.why}", notes),
        inputs=inputs,
        metrics_available=True,
        metrics_reason=METRICS_FRESH,
        metrics_message=_metrics_message(obs, fleet),
        history=latest,
    )


def _inputs(spec: AutoscalingSpec, fleet: Fleet, bounds: _Bounds) -> dict[str, Number]:
    """The numbers every decision reports, whatever the sample."""
    return {
        "mode": spec.mode,
        "current": fleet.current,
        "ready": fleet.ready,
        "starting": fleet.starting,
        "minReplicas": spec.min_replicas,
        "maxReplicas": spec.max_replicas,
        "scheduleFloor": bounds.floor,
        "activeSchedules": bounds.active,
        "lowerBound": bounds.lower,
        "upperBound": bounds.upper,
        "targetQueueLatencyMilliseconds": spec.target_queue_latency_milliseconds,
        "tolerance": TOLERANCE,
        "upWindowSeconds": spec.scale_up.stabilization_window_seconds,
        "downWindowSeconds": spec.scale_down.stabilization_window_seconds,
        "scaleUpMaxStep": spec.scale_up.max_step_replicas,
        "scaleDownMaxStep": spec.scale_down.max_step_replicas,
    }


def _hold_without_data(
    problem: tuple[str, str],
    current: int,
    bounds: _Bounds,
    inputs: dict[str, Number],
    kept: tuple[Recommendation, ...],
) -> Decision:
    """Rule 2: no usable sample holds the count; only the bounds may move it."""
    code, message = problem
    held, held_notes = bounds.apply(current)
    inputs["replicas"] = held
    reason = f"{_verb(current, held)}: no metrics ({code}: {message})"
    if held == current:
        reason += "; no scale-down without data"
    return Decision(
        replicas=held,
        direction=_direction(current, held),
        reason=_join(reason, held_notes),
        inputs=inputs,
        metrics_available=False,
        metrics_reason=code,
        metrics_message=message,
        history=kept,
    )


def _stabilized(
    spec: AutoscalingSpec,
    fleet: Fleet,
    raw: int,
    latest: tuple[Recommendation, ...],
    now: dt.datetime,
    inputs: dict[str, Number],
) -> tuple[int, list[str]]:
    """Rules 5-7: the count the windows, the steps and the capacity on its way allow, and
    what limited it."""
    up_window = spec.scale_up.stabilization_window_seconds
    down_window = spec.scale_down.stabilization_window_seconds
    up_rec = min(r.replicas for r in latest if r.time >= now - dt.timedelta(seconds=up_window))
    down_rec = max(r.replicas for r in latest if r.time >= now - dt.timedelta(seconds=down_window))
    watched = _watched_seconds(latest, now, spec.evaluation_interval_seconds)
    inputs["upRecommendation"] = up_rec
    inputs["downRecommendation"] = down_rec
    inputs["downWindowWatchedSeconds"] = round(watched, 3)
    current = fleet.current
    supply = max(current, fleet.ready + fleet.starting)  # in force, or on its way
    on_their_way = supply - fleet.ready
    inputs["onTheirWay"] = on_their_way
    if up_rec > current or (up_rec == current and fleet.ready < up_rec and on_their_way > 0):
        if spec.slo.enabled and supply < up_rec < raw:  # rule 6: the window confirmed a rise
            inputs["upRecommendation"] = up_rec = raw
        return _step_up(spec, current, raw, up_rec, supply, on_their_way)
    if raw > current:
        return current, [
            f"the {up_window} s scale-up window still holds a recommendation of {up_rec}"
        ]
    if down_rec < current:
        if spec.slo.enabled:
            steady = _steady_seconds(latest, current, spec.evaluation_interval_seconds)
            inputs["steadySeconds"] = round(steady, 3)
            if steady < down_window:
                return current, [
                    f"a scale-down waits {down_window} s after the last change "
                    f"(slo: one step per window), {steady:.0f} s so far"
                ]
            watched = min(watched, steady)
            least = math.ceil(spec.slo.scale_down_hysteresis_percent / 100.0 * current)
            if current - down_rec < least and down_rec > 0:
                hysteresis = spec.slo.scale_down_hysteresis_percent
                return current, [
                    f"removing {current - down_rec} of {current} is less than "
                    f"slo.scaleDownHysteresisPercent ({hysteresis:g} %)"
                ]
        return _step_down(spec, current, raw, down_rec, watched)
    if raw < current:
        return current, [
            f"the {down_window} s scale-down window still holds a recommendation of {down_rec}"
        ]
    return current, []


def _step_up(
    spec: AutoscalingSpec, current: int, raw: int, up_rec: int, supply: int, on_their_way: int
) -> tuple[int, list[str]]:
    """Rules 5 and 6: what the scale-up window recommends, less what is on its way, one step."""
    up_window = spec.scale_up.stabilization_window_seconds
    notes: list[str] = []
    ask = up_rec - supply
    if up_rec < raw:
        notes.append(f"the lowest recommendation in the {up_window} s scale-up window is {up_rec}")
    if ask <= 0:
        notes.append(f"{on_their_way} replicas already on their way cover the {up_rec} recommended")
        return current, notes
    step = min(ask, spec.scale_up.max_step_replicas)
    if step < ask:
        notes.append(f"limited to +{step} by scaleUp.maxStepReplicas")
    return current + step, notes


def _step_down(
    spec: AutoscalingSpec, current: int, raw: int, down_rec: int, watched: float
) -> tuple[int, list[str]]:
    """Rule 7: a step down once the scale-down window has been watched in full."""
    down_window = spec.scale_down.stabilization_window_seconds
    if watched < down_window:
        return current, [
            f"a scale-down waits for the {down_window} s scale-down window, watched for "
            f"{watched:.0f} s so far"
        ]
    notes: list[str] = []
    step = min(current - down_rec, spec.scale_down.max_step_replicas)
    if down_rec > raw:
        notes.append(
            f"the highest recommendation in the {down_window} s scale-down window is {down_rec}"
        )
    if step < current - down_rec:
        notes.append(f"one step of {step} (scaleDown.maxStepReplicas)")
    return current - step, notes


# ---- helpers ------------------------------------------------------------------------------


def _unusable(obs: Observation) -> tuple[str, str] | None:
    """(reason, message) when the sample cannot be used, None when it can."""
    if obs.router is not None:
        r = obs.router
        if not r.available:
            return (
                r.unavailable_reason or NO_DATA,
                "router: " + (r.message or "the metrics source gave no detail"),
            )
        if r.in_flight is None or r.queued is None or r.stream_rate is None:
            return NO_DATA, "router: the sample lacks streams in flight, queued or arriving"
        router_numbers = (r.in_flight, r.queued, r.stream_rate, r.slots_per_pod)
        if any(x is not None and not math.isfinite(x) for x in router_numbers):
            return NOT_A_NUMBER, "router: the sample holds a NaN or infinite value"
        return None
    if not obs.available:
        return (
            obs.unavailable_reason or NO_DATA,
            obs.message or "the metrics source gave no detail",
        )
    numbers = (obs.queue_latency_ms, obs.pending_requests, obs.in_flight, obs.completion_rate)
    if any(x is not None and not math.isfinite(x) for x in numbers):
        return NOT_A_NUMBER, "the sample holds a NaN or infinite value"
    if obs.queue_latency_ms is None and not obs.no_traffic:
        return NO_DATA, "the sample has no queue latency"
    return None


def _steady_seconds(
    recommendations: Sequence[Recommendation], current: int, interval: int
) -> float:
    """How long the count has been `current`, as far as the recommendations reach back
    (each one standing for the interval before it)."""
    now = recommendations[-1].time
    oldest = now
    for r in reversed(recommendations):
        if r.in_force is not None and r.in_force != current:
            break
        if (oldest - r.time).total_seconds() > 2 * interval:
            break
        oldest = r.time
    return (now - oldest).total_seconds() + interval


def _watched_seconds(
    recommendations: Sequence[Recommendation], now: dt.datetime, interval: int
) -> float:
    """How far back the recommendations reach without a gap of more than two intervals, each
    one standing for the interval before it."""
    oldest = now
    for r in reversed(recommendations):
        if (oldest - r.time).total_seconds() > 2 * interval:
            break
        oldest = r.time
    return (now - oldest).total_seconds() + interval


@dataclass(frozen=True)
class _Bounds:
    lower: int
    upper: int
    min_replicas: int
    floor: int
    active: str

    @property
    def floor_capped(self) -> bool:
        return self.floor > self.upper

    def apply(self, desired: int) -> tuple[int, list[str]]:
        """`desired` within the bounds, and what the bounds did to it (rule 1)."""
        notes: list[str] = []
        if self.floor_capped:
            notes.append(
                f"the schedule floor {self.floor} ({self.active}) is above maxReplicas "
                f"{self.upper} and capped at it"
            )
        if desired < self.lower:
            if self.floor_capped:
                notes.append(f"raised to maxReplicas {self.upper}")
            elif self.floor > self.min_replicas:
                notes.append(f"raised to the schedule floor {self.floor} ({self.active})")
            else:
                notes.append(f"raised to minReplicas {self.min_replicas}")
            return self.lower, notes
        if desired > self.upper:
            notes.append(f"capped at maxReplicas {self.upper}")
            return self.upper, notes
        return desired, notes


def _verb(current: int, desired: int) -> str:
    if desired > current:
        return f"scaling up {current} -> {desired}"
    if desired < current:
        return f"scaling down {current} -> {desired}"
    return f"holding at {current}"


def _direction(current: int, desired: int) -> str:
    return "up" if desired > current else "down" if desired < current else "hold"


def _join(reason: str, notes: Sequence[str]) -> str:
    return "; ".join([reason, *notes])


def _metrics_message(obs: Observation, fleet: Fleet) -> str:
    if obs.router is not None:
        return router_text(obs.router, fleet.ready)
    if obs.no_traffic:
        return f"no traffic over {fleet.ready} Ready pods (fresh series, every rate 0)"
    parts = [f"queue latency {nonnegative(obs.queue_latency_ms):.1f} ms"]
    if obs.pending_requests is not None:
        parts.append(f"{count_text(obs.pending_requests)} waiting")
    if obs.in_flight is not None:
        parts.append(f"{obs.in_flight:.1f} in flight")
    if obs.completion_rate is not None:
        parts.append(f"{obs.completion_rate:.2f} completions/s")
    return ", ".join(parts) + f" over {fleet.ready} Ready pods"
