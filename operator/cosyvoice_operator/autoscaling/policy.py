"""The autoscaling policy: from one metrics sample, the fleet, and the recommendations of the
last few minutes, to one replica decision with its reason and every number it used.

Pure and deterministic: no I/O, no clock (``now`` is an argument), the same arguments give the
same `Decision`. The shell (`autoscaler`, `controller`) reads Prometheus and the caches, keeps
``Decision.history`` in memory for the next evaluation, and writes the count; in ``DryRun``
it writes nothing but the report, and ``enabled: false`` never gets here.

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

Rules, in the order they apply (each has rows in tests/unit/test_autoscaling.py)
------------------------------------------------------------------------------
1. Bounds. The result is always within ``[max(minReplicas, schedule floor), maxReplicas]``;
   a count outside them (a manual scale) is brought back at once, whatever the data and the
   windows. A schedule floor above maxReplicas is capped at maxReplicas, and the reason says
   so. Schedule floors: `schedule_floor`.
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
5. Scale-up counts capacity already on its way: what is asked for is
   ``up recommendation - max(current, ready + starting)``; if the pods starting (or not yet
   created) cover it, hold. E.g. current 4, ready 2, starting 2, recommendation 4: hold, not 6.
6. Scale-up stabilization and step (HPA semantics): the up recommendation is the *lowest*
   raw recommendation within ``scaleUp.stabilizationWindowSeconds`` (this one included),
   and one evaluation adds at most ``scaleUp.maxStepReplicas``.
7. Scale-down stabilization and step: the down recommendation is the *highest* raw
   recommendation within ``scaleDown.stabilizationWindowSeconds``; a scale-down happens only
   once the window has been watched in full (recommendations kept reach back over it, with
   no gap of more than two evaluation intervals: after an operator restart or an outage the
   window starts again), and removes at most ``scaleDown.maxStepReplicas``. The raw
   recommendations are already consolidation-checked (rule 4), so every step down is one the
   model predicts stays under 90 % of the target. Each evaluation after that may take one
   more step, for as long as the window's highest recommendation stays below the count.
8. Memory: `Decision.history` is the history to pass to the next call: the recommendations
   within the longest window plus two evaluation intervals, the newest last.

``mode`` (Active / DryRun) changes nothing here; it is reported in ``inputs``.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cosyvoice_operator.api.spec import AutoscalingSpec, Schedule, SpecError

# Kubernetes HPA's default tolerance (--horizontal-pod-autoscaler-tolerance=0.1).
TOLERANCE = 0.1
# Without a concurrency signal, the most one evaluation multiplies the Ready pods by
# (HPA's default scale-up policy allows 100 % per period).
LATENCY_ONLY_MAX_RATIO = 2.0
# Condition reason of MetricsAvailable=True.
METRICS_FRESH = "MetricsFresh"
NO_DATA = "NoData"
NOT_A_NUMBER = "NotANumber"
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # datetime.weekday() order
# Bounds on the model's work for absurd inputs (slots per pod, replicas searched).
MAX_SLOTS = 10_000
MAX_SEARCH = 1_000_000
# The smallest queue time a slot fit aims at: Triton reports microseconds.
_MIN_WAIT_SECONDS = 1e-6
_HHMM = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")

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


# ---- schedules ----------------------------------------------------------------------------


def schedule_floor(schedules: Sequence[Schedule], now: dt.datetime) -> tuple[int, str]:
    """The highest minReplicas of the schedules active at `now` (0 when none is), and the
    names of the active ones, comma-separated in spec order.

    A window is read on the wall clock of its time zone (as cron does): start inclusive, end
    exclusive, on the days it starts; one whose end is not after its start runs past
    midnight and belongs to the day it starts (22:00-06:00 on Fri is active Fri 22:00 to Sat
    06:00; an end of 00:00 is midnight). Across a DST change a window keeps its wall-clock
    times, so it lasts an hour more or less that night, and a start inside the skipped hour
    is reached at the first wall-clock minute after it. Raises `SpecError` (naming the field)
    for what the CRD would have refused, or an unknown time zone.
    """
    _require_aware(now, "now")
    floor = 0
    names: list[str] = []
    for index, schedule in enumerate(schedules):
        if _active(schedule, now, index):
            names.append(schedule.name)
            floor = max(floor, schedule.min_replicas)
    return floor, ", ".join(names)


def _active(schedule: Schedule, now: dt.datetime, index: int) -> bool:
    path = f"spec.autoscaling.schedules[{index}]"
    start = _minute_of_day(schedule.start, f"{path}.start")
    end = _minute_of_day(schedule.end, f"{path}.end")
    if start == end:
        raise SpecError(f"{path}.end", f"must differ from start ({schedule.start})")
    for day in schedule.days_of_week:
        if day not in DAYS:
            raise SpecError(f"{path}.daysOfWeek", f"must be among {', '.join(DAYS)}, got {day!r}")
    local = now.astimezone(_zone(schedule.timezone, f"{path}.timezone"))
    minute = local.hour * 60 + local.minute
    today = DAYS[local.weekday()]
    yesterday = DAYS[(local.weekday() - 1) % 7]
    days = schedule.days_of_week
    if start < end:
        return today in days and start <= minute < end
    return (today in days and minute >= start) or (yesterday in days and minute < end)


def _minute_of_day(value: str, path: str) -> int:
    m = _HHMM.match(value)
    if not m:
        raise SpecError(path, f"must be HH:MM on a 24-hour clock, got {value!r}")
    return int(m.group(1)) * 60 + int(m.group(2))


def _zone(name: str, path: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise SpecError(path, f"unknown IANA time zone {name!r}") from None


# ---- the queueing model -------------------------------------------------------------------


def queue_seconds(load: float, slots: int, service_seconds: float) -> float:
    """Mean time in queue of an M/M/c queue (Erlang C): `load` Erlangs (requests in service on
    average) offered to `slots` servers whose mean service time is `service_seconds`.
    Infinite at or beyond saturation."""
    if load <= 0:
        return 0.0
    if load >= slots:
        return math.inf
    blocking = 1.0  # Erlang B, by the stable recursion B(k) = aB(k-1) / (k + aB(k-1))
    for k in range(1, slots + 1):
        blocking = load * blocking / (k + load * blocking)
    wait_probability = slots * blocking / (slots - load * (1.0 - blocking))
    return wait_probability * service_seconds / (slots - load)


def fitted_slots(load: float, service_seconds: float, queue_wait_seconds: float) -> int:
    """The most slots per pod that still explain the observed queue time by queueing alone
    (Erlang C at `load` gives at least the observed wait), and at least one more than the
    load. A wait the model does not know (Triton's batching delay) only lowers the estimate,
    so it errs toward fewer slots, that is more replicas."""
    wait = max(queue_wait_seconds, _MIN_WAIT_SECONDS)
    low = max(1, math.floor(load) + 1)
    slots = _smallest(low, lambda c: queue_seconds(load, c, service_seconds) <= wait, MAX_SLOTS)
    if slots > low and queue_seconds(load, slots, service_seconds) < wait:
        slots -= 1
    return slots


def replicas_for(load: float, slots: int, service_seconds: float, wait_limit_seconds: float) -> int:
    """The fewest pods of `slots` slots that keep the predicted queue time of a total `load`
    (Erlangs, spread evenly) at most `wait_limit_seconds`; 0 for no load."""
    if load <= 0:
        return 0
    low = math.floor(load / slots) + 1
    return _smallest(
        low,
        lambda n: queue_seconds(load / n, slots, service_seconds) <= wait_limit_seconds,
        MAX_SEARCH,
    )


def _smallest(low: int, ok: Callable[[int], bool], cap: int) -> int:
    """The smallest n in [low, cap] for which the monotone `ok` holds (cap if none does)."""
    if low >= cap:
        return cap
    if ok(low):
        return low
    bad, step = low, 1
    while True:
        probe = min(bad + step, cap)
        if ok(probe):
            good = probe
            break
        if probe == cap:
            return cap
        bad, step = probe, step * 2
    while good - bad > 1:
        mid = (bad + good) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


# ---- one evaluation -----------------------------------------------------------------------


@dataclass
class _Assessment:
    """What one sample asks for, before windows, steps, capacity on its way, and bounds."""

    raw: int
    regime: str
    seen: str
    why: str
    slots: int | None
    pending: float | None
    predict_ms: Callable[[int], float] | None = None  # queue latency predicted on n replicas
    numbers: dict[str, Number] = field(default_factory=dict)


def decide(
    spec: AutoscalingSpec,
    obs: Observation,
    fleet: Fleet,
    history: Sequence[Recommendation],
    now: dt.datetime,
) -> Decision:
    """The replica count to set now (the rules are in the module docstring)."""
    _require_aware(now, "now")
    floor, active = schedule_floor(spec.schedules, now)
    upper = spec.max_replicas
    lower = min(max(spec.min_replicas, floor), upper)
    bounds = _Bounds(lower, upper, spec.min_replicas, floor, active)
    interval = spec.evaluation_interval_seconds
    up_window = spec.scale_up.stabilization_window_seconds
    down_window = spec.scale_down.stabilization_window_seconds
    horizon = dt.timedelta(seconds=max(up_window, down_window) + 2 * interval)
    kept = tuple(
        sorted((r for r in history if now - horizon <= r.time <= now), key=lambda r: r.time)
    )
    current = fleet.current
    inputs: dict[str, Number] = {
        "mode": spec.mode,
        "current": current,
        "ready": fleet.ready,
        "starting": fleet.starting,
        "minReplicas": spec.min_replicas,
        "maxReplicas": upper,
        "scheduleFloor": floor,
        "activeSchedules": active,
        "lowerBound": lower,
        "upperBound": upper,
        "targetQueueLatencyMilliseconds": spec.target_queue_latency_milliseconds,
        "tolerance": TOLERANCE,
        "upWindowSeconds": up_window,
        "downWindowSeconds": down_window,
        "scaleUpMaxStep": spec.scale_up.max_step_replicas,
        "scaleDownMaxStep": spec.scale_down.max_step_replicas,
    }

    problem = _unusable(obs)
    if problem is not None:
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

    a = _assess(spec, obs, fleet, kept, now)
    inputs.update(a.numbers)
    inputs["regime"] = a.regime
    inputs["rawRecommendation"] = a.raw
    latest = (*kept, Recommendation(now, a.raw, a.slots, a.pending))
    up_rec = min(r.replicas for r in latest if r.time >= now - dt.timedelta(seconds=up_window))
    down_rec = max(r.replicas for r in latest if r.time >= now - dt.timedelta(seconds=down_window))
    watched = _watched_seconds(latest, now, interval)
    inputs["upRecommendation"] = up_rec
    inputs["downRecommendation"] = down_rec
    inputs["downWindowWatchedSeconds"] = round(watched, 3)

    desired = current
    notes: list[str] = []
    supply = max(current, fleet.ready + fleet.starting)  # in force, or on its way
    on_their_way = supply - fleet.ready
    inputs["onTheirWay"] = on_their_way
    if up_rec > current or (up_rec == current and fleet.ready < up_rec and on_their_way > 0):
        ask = up_rec - supply
        if up_rec < a.raw:
            notes.append(
                f"the lowest recommendation in the {up_window} s scale-up window is {up_rec}"
            )
        if ask <= 0:
            notes.append(
                f"{on_their_way} replicas already on their way cover the {up_rec} recommended"
            )
        else:
            step = min(ask, spec.scale_up.max_step_replicas)
            desired = current + step
            if step < ask:
                notes.append(f"limited to +{step} by scaleUp.maxStepReplicas")
    elif a.raw > current:
        notes.append(f"the {up_window} s scale-up window still holds a recommendation of {up_rec}")
    elif down_rec < current:
        if watched < down_window:
            notes.append(
                f"a scale-down waits for the {down_window} s scale-down window, watched for "
                f"{watched:.0f} s so far"
            )
        else:
            step = min(current - down_rec, spec.scale_down.max_step_replicas)
            desired = current - step
            if down_rec > a.raw:
                notes.append(
                    f"the highest recommendation in the {down_window} s scale-down window is "
                    f"{down_rec}"
                )
            if step < current - down_rec:
                notes.append(f"one step of {step} (scaleDown.maxStepReplicas)")
    elif a.raw < current:
        notes.append(
            f"the {down_window} s scale-down window still holds a recommendation of {down_rec}"
        )

    desired, bounded_notes = bounds.apply(desired)
    notes.extend(bounded_notes)
    if a.predict_ms is not None and desired != current and desired > 0:
        predicted = a.predict_ms(desired)
        if math.isfinite(predicted):
            inputs["predictedQueueLatencyMilliseconds"] = round(predicted, 3)
    inputs["replicas"] = desired
    reason = f"{_verb(current, desired)}: {a.seen}; {a.why}"
    return Decision(
        replicas=desired,
        direction=_direction(current, desired),
        reason=_join(reason, notes),
        inputs=inputs,
        metrics_available=True,
        metrics_reason=METRICS_FRESH,
        metrics_message=_metrics_message(obs, fleet),
        history=latest,
    )


def _assess(
    spec: AutoscalingSpec,
    obs: Observation,
    fleet: Fleet,
    kept: tuple[Recommendation, ...],
    now: dt.datetime,
) -> _Assessment:
    target = spec.target_queue_latency_milliseconds
    current, ready = fleet.current, fleet.ready
    remembered = next((r.slots_per_pod for r in reversed(kept) if r.slots_per_pod), None)
    if obs.no_traffic:
        return _Assessment(
            raw=0,
            regime="NoTraffic",
            seen="no traffic (fresh series, every rate 0)",
            why="no replica is needed for it",
            slots=remembered,
            pending=0.0,
            predict_ms=lambda n: 0.0,
        )
    latency = _nonnegative(obs.queue_latency_ms)
    pending = _nonnegative(obs.pending_requests)
    ratio = latency / target
    numbers: dict[str, Number] = {
        "queueLatencyMilliseconds": round(latency, 3),
        "queueLatencyRatio": round(ratio, 4),
        "pendingRequests": round(pending, 3),
    }
    if obs.in_flight is not None:
        numbers["inFlight"] = round(_nonnegative(obs.in_flight), 3)
    if obs.completion_rate is not None:
        numbers["completionRate"] = round(_nonnegative(obs.completion_rate), 4)
    seen = (
        f"queue latency {latency:.1f} ms against a {target:g} ms target ({ratio:.2f}x), "
        f"{_count(pending)} waiting, {ready} Ready"
    )
    if ready == 0:
        demand = pending > 0 or latency > 0 or bool(obs.in_flight) or bool(obs.completion_rate)
        if current == 0 and demand:
            why = "requests arrive and no replica runs: one is needed"
            return _Assessment(1, "WakeUp", seen, why, remembered, pending, numbers=numbers)
        why = "no replica is Ready, so there is no per-pod load to measure yet"
        return _Assessment(current, "NoReadyPods", seen, why, remembered, pending, numbers=numbers)

    above = ratio > 1 + TOLERANCE
    below = ratio < 1 - TOLERANCE
    completions = _nonnegative(obs.completion_rate)
    in_service = 0.0
    if obs.in_flight is not None and completions > 0:
        in_service = _nonnegative(obs.in_flight) - completions * latency / 1000.0
    if in_service <= 0:
        pressing = pending >= ready  # no rate to turn the line into a wait: one per pod
        return _latency_only(
            latency, ratio, pending, fleet, seen, remembered, numbers, (above, below, pressing)
        )

    # The leading signal: the line waiting now, drained at the completion rate, is a wait of
    # pending / completions (Little's law); longer than the band allows is pressure.
    line_ms = 1000.0 * pending / completions
    pressing = pending >= 1 and line_ms > (1 + TOLERANCE) * target
    numbers["waitingLineMilliseconds"] = round(line_ms, 3)
    service = in_service / completions
    per_pod = in_service / ready
    growth: float | None = None
    previous = kept[-1] if kept else None
    if previous is not None and previous.pending_requests is not None:
        elapsed = (now - previous.time).total_seconds()
        if 0 < elapsed <= 2 * spec.evaluation_interval_seconds:
            growth = (pending - previous.pending_requests) / elapsed
    # Saturated: a line at least as long as what is in service can only build up when the
    # arrivals outrun every slot (near the knee, with spare slots, the line stays short).
    saturated = pending >= max(1.0, in_service)
    # A short line now under a latency above the band: the latency, counted when requests
    # complete (a whole stream later), still describes a queue that has drained.
    lagging = above and line_ms <= target and pending < ready
    keep: int | None
    if saturated:
        slots, source = min(MAX_SLOTS, max(1, round(per_pod))), "saturation"
        keep = slots
    elif remembered is not None and per_pod < remembered:
        slots, source, keep = remembered, "remembered", remembered
        if above and not lagging:
            # Worse than allowed: the model must explain what was seen (fewer slots than
            # remembered, if that is what it takes), for this evaluation only.
            fitted = fitted_slots(per_pod, service, latency / 1000.0)
            if fitted < remembered:
                slots, source = fitted, "fitted"
    else:
        slots, source = fitted_slots(per_pod, service, latency / 1000.0), "fitted"
        keep = None if above else slots  # a fit above the band may come from a lagging latency
    if saturated and growth is not None:
        arrivals = max(completions + growth, 0.0)
        load = arrivals * service
    else:
        arrivals = completions
        load = in_service + pending  # a waiting request is load too
    numbers.update(
        {
            "inService": round(in_service, 3),
            "serviceTimeSeconds": round(service, 4),
            "loadPerPod": round(per_pod, 3),
            "slotsPerPod": slots,
            "slotsSource": source,
            "utilization": round(per_pod / slots, 4),
            "arrivalRate": round(arrivals, 4),
            "load": round(load, 3),
        }
    )
    if growth is not None:
        numbers["pendingGrowthPerSecond"] = round(growth, 4)
    seen += f" ({per_pod:.1f} of {slots} slots busy per pod, {service:.2f} s per request)"

    def predict_ms(n: int) -> float:
        return 1000.0 * queue_seconds(load / n, slots, service) if n > 0 else math.inf

    if above or pressing:
        need = replicas_for(load, slots, service, target / 1000.0)
        raw = max(current, need)
        shrinking = growth is not None and growth < 0
        why = f"{need} replicas bring it under target at {arrivals:.2f} arrivals/s"
        if pressing and not shrinking and raw < ready + 1:
            raw = ready + 1
            why += f"; the waiting line is over the band: at least {raw}"
        elif lagging and need <= current:
            why += (
                f"; the line now is short ({line_ms:.0f} ms): the latency, counted when "
                "requests complete, lags"
            )
        elif shrinking and need <= current:
            why += " (the waiting line is shrinking)"
        regime = "AboveTarget" if above else "RequestsWaiting"
    elif not below:
        raw, regime = current, "WithinTolerance"
        why = f"within the ±{TOLERANCE:.0%} tolerance of the target"
    else:
        limit = (1 - TOLERANCE) * target
        need = replicas_for(load, slots, service, limit / 1000.0)
        # Never above the count in force (the model never overrules a latency under target),
        # but a fleet set to 0 that still serves traffic keeps one.
        raw, regime = min(max(current, 1), need), "BelowTarget"
        if raw < current:
            why = (
                f"{need} replicas keep it under {limit:g} ms "
                f"(predicted {predict_ms(max(need, 1)):.1f} ms)"
            )
        elif current <= 1:
            why = "traffic needs at least one replica"
        else:
            predicted = predict_ms(current - 1)
            numbers["predictedQueueLatencyWithOneFewerMilliseconds"] = (
                round(predicted, 3) if math.isfinite(predicted) else "inf"
            )
            outcome = (
                f"raise it to {predicted:.1f} ms"
                if math.isfinite(predicted)
                else "saturate the remaining ones"
            )
            why = (
                f"removing 1 of {current} would {outcome}, above {limit:g} ms "
                f"({1 - TOLERANCE:.0%} of the target)"
            )
    return _Assessment(raw, regime, seen, why, keep, pending, predict_ms, numbers)


def _latency_only(
    latency: float,
    ratio: float,
    pending: float,
    fleet: Fleet,
    seen: str,
    remembered: int | None,
    numbers: dict[str, Number],
    regimes: tuple[bool, bool, bool],
) -> _Assessment:
    """Rule 4 without a concurrency signal (no in-flight or completion data)."""
    above, below, pressing = regimes
    current, ready = fleet.current, fleet.ready

    def predict_ms(n: int) -> float:
        # Latency proportional to the load per pod: optimistic near a queue's knee, which is
        # why this path removes one replica per window at most.
        return latency * ready / n if n > 0 else math.inf

    seen += " (no concurrency signal: the latency ratio alone)"
    if above:
        raw = max(current, math.ceil(ready * min(ratio, LATENCY_ONLY_MAX_RATIO)))
        why = f"{raw} recommended (at most {LATENCY_ONLY_MAX_RATIO:g}x the Ready pods)"
        regime = "AboveTarget"
    elif pressing:
        raw = max(current, ready + 1)
        why, regime = "requests are waiting: one more replica", "RequestsWaiting"
    elif not below:
        raw, regime = current, "WithinTolerance"
        why = f"within the ±{TOLERANCE:.0%} tolerance of the target"
    else:
        fit = math.ceil(ready * ratio / (1 - TOLERANCE))
        raw, regime = min(current, max(current - 1, fit)), "BelowTarget"
        why = (
            "one replica fewer per window at most"
            if raw < current
            else f"removing 1 of {current} would bring it above the band"
        )
    return _Assessment(raw, regime, seen, why, remembered, pending, predict_ms, numbers)


# ---- helpers ------------------------------------------------------------------------------


def _unusable(obs: Observation) -> tuple[str, str] | None:
    """(reason, message) when the sample cannot be used, None when it can."""
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


def _count(value: float) -> str:
    """A request count as people read it: whole when it is, else one decimal."""
    return str(round(value)) if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def _nonnegative(value: float | None) -> float:
    return max(0.0, value) if value is not None else 0.0


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
    if obs.no_traffic:
        return f"no traffic over {fleet.ready} Ready pods (fresh series, every rate 0)"
    parts = [f"queue latency {_nonnegative(obs.queue_latency_ms):.1f} ms"]
    if obs.pending_requests is not None:
        parts.append(f"{_count(obs.pending_requests)} waiting")
    if obs.in_flight is not None:
        parts.append(f"{obs.in_flight:.1f} in flight")
    if obs.completion_rate is not None:
        parts.append(f"{obs.completion_rate:.2f} completions/s")
    return ", ".join(parts) + f" over {fleet.ready} Ready pods"


def _require_aware(value: dt.datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got {value!r}")
