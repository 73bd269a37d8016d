"""What one metrics sample asks for: rules 3 and 4 of `policy` (pure).

No traffic recommends 0; no Ready pod holds (a fleet at 0 that sees requests gets 1); with
in-flight and completion data each pod is an M/M/c queue (`queueing`) whose slots are
measured at saturation, remembered or fitted, and the recommendation is the fewest replicas
the model keeps under the target (above the band), the count in force (within it), or the
fewest that stay under 90 % of it (below, never above the count in force); without that data
the latency ratio alone is used. `policy`'s docstring states each rule; `policy.decide`
then applies the windows, steps and bounds.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cosyvoice_operator.api.spec import AutoscalingSpec
from cosyvoice_operator.autoscaling.queueing import (
    MAX_SLOTS,
    fitted_slots,
    miss_probability,
    pooled_replicas_for,
    pooled_replicas_for_miss,
    queue_seconds,
    replicas_for,
    replicas_for_miss,
)
from cosyvoice_operator.autoscaling.sample import RouterSample
from cosyvoice_operator.autoscaling.seasonal import Season, outlook

if TYPE_CHECKING:  # policy holds the vocabulary and imports this module
    from cosyvoice_operator.autoscaling.policy import Fleet, Number, Observation, Recommendation

# Kubernetes HPA's default tolerance (--horizontal-pod-autoscaler-tolerance=0.1).
TOLERANCE = 0.1
# Without a concurrency signal, the most one evaluation multiplies the Ready pods by
# (HPA's default scale-up policy allows 100 % per period).
LATENCY_ONLY_MAX_RATIO = 2.0
# The SLO forecast extends a rising trend only when its slope is this many standard errors
# above 0.
TREND_SIGNIFICANCE = 2.0
# Behind the router: a queue above 0 for this many consecutive evaluations asks for more pods
# on its own (rule 4c). At the default 15 s interval, 30 s of streams waiting: longer than a
# burst the pooled model absorbs, shorter than a pod's cold start.
ROUTER_QUEUE_EVALUATIONS = 3


@dataclass
class Assessment:
    """What one sample asks for, before windows, steps, capacity on its way, and bounds."""

    raw: int
    regime: str
    seen: str
    why: str
    slots: int | None
    pending: float | None
    predict_ms: Callable[[int], float] | None = None  # queue latency predicted on n replicas
    numbers: dict[str, Number] = field(default_factory=dict)
    arrivals: float | None = None  # the demand seen, requests/s (kept for the SLO forecast)
    router_queued: float | None = None  # streams queued in the router (rule 4c)


@dataclass
class _Sample:
    """One usable sample as rule 4 reads it."""

    latency: float  # queue latency, ms
    pending: float  # requests waiting, all pods
    ratio: float  # latency / target
    completions: float  # per second, all pods
    in_service: float  # requests in service (Little's law), 0 without a concurrency signal
    seen: str  # what was seen, for the reason
    numbers: dict[str, Number]

    @property
    def above(self) -> bool:
        return self.ratio > 1 + TOLERANCE

    @property
    def below(self) -> bool:
        return self.ratio < 1 - TOLERANCE


def assess(
    spec: AutoscalingSpec,
    obs: Observation,
    fleet: Fleet,
    kept: tuple[Recommendation, ...],
    now: dt.datetime,
    season: Season = (),
) -> Assessment:
    """Rules 3 and 4: the raw recommendation of one usable sample (``season``: the seasonal
    profile, for SLO sizing)."""
    current, ready = fleet.current, fleet.ready
    remembered = next((r.slots_per_pod for r in reversed(kept) if r.slots_per_pod), None)
    if obs.router is not None:
        return router_assessment(spec, obs, fleet, (kept, season), now, remembered)
    if obs.no_traffic:
        return Assessment(
            raw=0,
            regime="NoTraffic",
            seen="no traffic (fresh series, every rate 0)",
            why="no replica is needed for it",
            slots=remembered,
            pending=0.0,
            predict_ms=lambda n: 0.0,
        )
    sample = _read(obs, spec.target_queue_latency_milliseconds, ready)
    seen, numbers, pending = sample.seen, sample.numbers, sample.pending
    if ready == 0:
        demand = (
            pending > 0 or sample.latency > 0 or bool(obs.in_flight) or bool(obs.completion_rate)
        )
        if current == 0 and demand:
            why = "requests arrive and no replica runs: one is needed"
            return Assessment(1, "WakeUp", seen, why, remembered, pending, numbers=numbers)
        why = "no replica is Ready, so there is no per-pod load to measure yet"
        return Assessment(current, "NoReadyPods", seen, why, remembered, pending, numbers=numbers)
    if sample.in_service <= 0:
        pressing = pending >= ready  # no rate to turn the line into a wait: one per pod
        regimes = (sample.above, sample.below, pressing)
        return _latency_only(
            sample.latency, sample.ratio, pending, fleet, seen, remembered, numbers, regimes
        )
    return _queueing(spec, sample, fleet, (kept, season), now, remembered)


def _read(obs: Observation, target: float, ready: int) -> _Sample:
    latency = nonnegative(obs.queue_latency_ms)
    pending = nonnegative(obs.pending_requests)
    ratio = latency / target
    numbers: dict[str, Number] = {
        "queueLatencyMilliseconds": round(latency, 3),
        "queueLatencyRatio": round(ratio, 4),
        "pendingRequests": round(pending, 3),
    }
    if obs.in_flight is not None:
        numbers["inFlight"] = round(nonnegative(obs.in_flight), 3)
    if obs.completion_rate is not None:
        numbers["completionRate"] = round(nonnegative(obs.completion_rate), 4)
    seen = (
        f"queue latency {latency:.1f} ms against a {target:g} ms target ({ratio:.2f}x), "
        f"{count_text(pending)} waiting, {ready} Ready"
    )
    completions = nonnegative(obs.completion_rate)
    in_service = 0.0
    if obs.in_flight is not None and completions > 0:
        in_service = nonnegative(obs.in_flight) - completions * latency / 1000.0
    return _Sample(latency, pending, ratio, completions, in_service, seen, numbers)


def _latency_only(
    latency: float,
    ratio: float,
    pending: float,
    fleet: Fleet,
    seen: str,
    remembered: int | None,
    numbers: dict[str, Number],
    regimes: tuple[bool, bool, bool],
) -> Assessment:
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
    return Assessment(raw, regime, seen, why, remembered, pending, predict_ms, numbers)


@dataclass(frozen=True)
class _Model:
    """The M/M/c model of one evaluation: the load offered to the fleet (Erlangs), each pod's
    slots, the mean service time, and the arrival rate the load comes from."""

    load: float
    slots: int
    service: float
    arrivals: float

    def predict_ms(self, n: int) -> float:
        """The queue latency predicted on n replicas."""
        return (
            1000.0 * queue_seconds(self.load / n, self.slots, self.service) if n > 0 else math.inf
        )

    def replicas_for(self, limit_ms: float) -> int:
        return replicas_for(self.load, self.slots, self.service, limit_ms / 1000.0)


def _queueing(
    spec: AutoscalingSpec,
    sample: _Sample,
    fleet: Fleet,
    memory: tuple[tuple[Recommendation, ...], Season],
    now: dt.datetime,
    remembered: int | None,
) -> Assessment:
    """Rule 4 with a concurrency signal: the M/M/c model, its slots measured or fitted."""
    kept = memory[0]
    target = spec.target_queue_latency_milliseconds
    pending, completions, in_service = sample.pending, sample.completions, sample.in_service
    numbers = sample.numbers
    # The leading signal: the line waiting now, drained at the completion rate, is a wait of
    # pending / completions (Little's law); longer than the band allows is pressure.
    line_ms = 1000.0 * pending / completions
    pressing = pending >= 1 and line_ms > (1 + TOLERANCE) * target
    numbers["waitingLineMilliseconds"] = round(line_ms, 3)
    service = in_service / completions
    per_pod = in_service / fleet.ready
    growth = _growth(pending, kept, now, spec.evaluation_interval_seconds)
    # Saturated: a line at least as long as what is in service can only build up when the
    # arrivals outrun every slot (near the knee, with spare slots, the line stays short).
    saturated = pending >= max(1.0, in_service)
    # A short line now under a latency above the band: the latency, counted when requests
    # complete (a whole stream later), still describes a queue that has drained.
    lagging = sample.above and line_ms <= target and pending < fleet.ready
    slots, source, keep = _slots(
        saturated, per_pod, remembered, sample.above, lagging, service, sample.latency
    )
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
    seen = sample.seen + (
        f" ({per_pod:.1f} of {slots} slots busy per pod, {service:.2f} s per request)"
    )
    model = _Model(load, slots, service, arrivals)
    demand = load / service if service > 0 else 0.0
    if spec.slo.enabled:
        raw, regime, why = slo_sizing(
            spec, model, fleet, memory, now, demand, sample.latency, numbers
        )
        if pressing and (growth is None or growth >= 0) and raw < fleet.ready + 1:
            raw = fleet.ready + 1
            why += f"; the waiting line is over the band: at least {raw}"
        elif sample.above and not lagging and raw < fleet.current:
            raw = fleet.current
            why += "; the queue latency is above the band: no fewer than in force"
        return Assessment(raw, regime, seen, why, keep, pending, model.predict_ms, numbers, demand)
    if sample.above or pressing:
        raw, regime, why = _above_band(
            model, fleet, target, sample.above, pressing, lagging, growth, line_ms
        )
    elif not sample.below:
        raw, regime = fleet.current, "WithinTolerance"
        why = f"within the ±{TOLERANCE:.0%} tolerance of the target"
    else:
        raw, regime, why = _below_band(model, fleet.current, target, numbers)
    return Assessment(raw, regime, seen, why, keep, pending, model.predict_ms, numbers, demand)


def slo_sizing(
    spec: AutoscalingSpec,
    model: _Model,
    fleet: Fleet,
    memory: tuple[tuple[Recommendation, ...], Season],
    now: dt.datetime,
    demand: float,
    latency_ms: float,
    numbers: dict[str, Number],
) -> tuple[int, str, str]:
    """Issue 22: the fewest replicas whose predicted first audio meets the SLO for
    ``attainmentPercent`` of requests at the demand forecast over the next cold start.

    The variability factor is measured as well as configured: the queue latency seen over
    the M/M/c mean wait at the load each Ready pod carries now is the factor by which this
    fleet waits longer than Poisson arrivals and exponential service would (Allen-Cunneen);
    the larger of it and ``slo.variability`` is used, so the model never finds the fleet
    better off than it was seen.

    With a seasonal period, the demand sized for is at least the seasonal forecast and floor
    (`seasonal_demand`). Below the count in force, the recommendation is the fewest replicas
    whose predicted miss is at most 90 % of the allowed one (HPA's tolerance as a margin):
    several replicas may go at once, but only with that margin."""
    slo = spec.slo
    f, seasonal, upper = _demand_forecast(spec, memory, now, demand, numbers)
    budget = (slo.first_audio_milliseconds - slo.first_chunk_milliseconds) / 1000.0
    miss = 1.0 - slo.attainment_percent / 100.0
    slots = slo.slots_per_pod or model.slots
    numbers["sloSlotsPerPod"] = slots
    numbers["sloFirstChunkMilliseconds"] = slo.first_chunk_milliseconds
    numbers["sloFirstChunkSource"] = slo.first_chunk_source
    expected = queue_seconds(model.load / max(fleet.ready, 1), slots, model.service)
    seen_k = latency_ms / 1000.0 / expected if math.isfinite(expected) and expected > 1e-3 else 0.0
    k = max(slo.variability, min(seen_k, 1.0))
    numbers["variabilitySeen"] = round(seen_k, 4)
    numbers["variability"] = round(k, 4)
    need = replicas_for_miss(upper * model.service, slots, model.service, budget, miss, k)
    if need < fleet.current:  # the margin of a scale-down
        margin = replicas_for_miss(
            upper * model.service, slots, model.service, budget, (1 - TOLERANCE) * miss, k
        )
        numbers["sloReplicasWithMargin"] = margin
        need = min(fleet.current, margin)
    at_need = miss_probability(
        upper * model.service / max(need, 1), slots, model.service, budget, k
    )
    numbers.update(_sizing_numbers(demand, f, upper, budget, need, at_need))
    why = (
        f"{need} replicas keep {slo.attainment_percent:g} % of first audio within "
        f"{slo.first_audio_milliseconds} ms (a wait of at most {budget:.2f} s, predicted "
        f"{100.0 * at_need:.2f} % over) at {upper:.2f} requests/s: {demand:.2f} now, trend "
        f"{60.0 * f.slope:+.2f}/min over the {slo.cold_start_seconds} s cold start, "
        f"+{slo.forecast_std_devs:g} x {f.spread:.2f} spread; variability {k:.2f}"
    )
    if seasonal is not None and upper > f.rate + slo.forecast_std_devs * f.spread:
        why += (
            f"; seasonal: the last {slo.seasonal_period_hours} h saw "
            f"{seasonal['seasonalAhead']:.2f} requests/s over the next cold start "
            f"({seasonal['seasonalNow']:.2f} at this time), forecast "
            f"{seasonal['seasonalForecast']:.2f}, floor {seasonal['seasonalFloor']:.2f}"
        )
    return need, "SloSizing", why


def _demand_forecast(
    spec: AutoscalingSpec,
    memory: tuple[tuple[Recommendation, ...], Season],
    now: dt.datetime,
    demand: float,
    numbers: dict[str, Number],
) -> tuple[Forecast, dict[str, float] | None, float]:
    """The SLO sizing's demand over the next cold start (both rules 4b): the forecast, the
    seasonal figures (recorded in `numbers`) and the upper rate sized for: the forecast plus
    its spread, at least the seasonal forecast and floor."""
    slo = spec.slo
    kept, season = memory
    f = forecast(demand, kept, now, slo.cold_start_seconds, spec.evaluation_interval_seconds)
    upper = f.rate + slo.forecast_std_devs * f.spread
    seasonal = seasonal_demand(spec, season, now, demand, slo.forecast_std_devs * f.spread)
    if seasonal is not None:
        numbers.update({k: round(v, 4) for k, v in seasonal.items()})
        upper = max(upper, seasonal["seasonalForecast"], seasonal["seasonalFloor"])
    return f, seasonal, upper


def _sizing_numbers(
    demand: float, f: Forecast, upper: float, budget: float, need: int, at_need: float
) -> dict[str, Number]:
    """The SLO sizing's figures as status and Events report them."""
    return {
        "demand": round(demand, 4),
        "forecastRate": round(f.rate, 4),
        "forecastTrendPerMinute": round(60.0 * f.slope, 4),
        "forecastSpread": round(f.spread, 4),
        "forecastUpper": round(upper, 4),
        "waitBudgetSeconds": round(budget, 4),
        "sloReplicas": need,
        "predictedMissPercent": round(100.0 * at_need, 4),
    }


def seasonal_demand(
    spec: AutoscalingSpec, season: Season, now: dt.datetime, demand: float, headroom: float
) -> dict[str, float] | None:
    """The seasonal forecast and floor (requests/s) over the next cold start, or None (no
    period set, or no complete profile one period back): the forecast is the demand now times
    the rise the last period had from this time of day over the cold start, plus the
    short-term forecast's ``headroom``; the floor ``seasonalFloorPercent`` % of the highest
    bucket the last period saw over it (`seasonal`'s docstring)."""
    slo = spec.slo
    if slo.seasonal_period_hours <= 0:
        return None
    o = outlook(
        season,
        now,
        slo.cold_start_seconds,
        3600 * slo.seasonal_period_hours,
        60 * slo.seasonal_bucket_minutes,
    )
    if o is None:
        return None
    rise = o.ahead / o.now if o.now > 0 else 1.0
    return {
        "seasonalNow": o.now,
        "seasonalAhead": o.ahead,
        "seasonalForecast": demand * rise + headroom,
        "seasonalFloor": slo.seasonal_floor_percent / 100.0 * o.ahead,
    }


@dataclass(frozen=True)
class Forecast:
    rate: float  # requests/s expected at the end of the horizon (the trend line's level)
    slope: float  # requests/s per second, rising only (0 when falling)
    spread: float  # std deviation of the demand around its trend, requests/s


def forecast(
    demand: float,
    kept: tuple[Recommendation, ...],
    now: dt.datetime,
    horizon_seconds: int,
    interval: int,
) -> Forecast:
    """The demand over the next `horizon_seconds`: a least-squares line through the demand
    seen over the last two horizons (this sample included), extended over the horizon when
    it rises significantly (TREND_SIGNIFICANCE standard errors); the spread is the residuals'
    robust std deviation."""
    reach = max(2 * horizon_seconds, 4 * interval)
    points = [
        ((r.time - now).total_seconds(), r.arrivals)
        for r in kept
        if r.arrivals is not None and (now - r.time).total_seconds() <= reach
    ]
    points.append((0.0, demand))
    if len(points) < 3:
        return Forecast(demand, 0.0, 0.0)
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var_t = sum((t - mean_t) ** 2 for t, _ in points)
    slope = sum((t - mean_t) * (y - mean_y) for t, y in points) / var_t if var_t > 0 else 0.0
    residuals = [y - (mean_y + slope * (t - mean_t)) for t, y in points]
    # Robust: 1.4826 x the median absolute residual (the std deviation of normal noise), so
    # that one transient (a backlog after a cold start) does not set the headroom for the
    # whole window.
    spread = 1.4826 * statistics.median(abs(r) for r in residuals)
    level = mean_y + slope * (0.0 - mean_t)
    # A trend counts when the data support it: a rise at least two standard errors above 0
    # (noise alone makes one in 40 windows look rising by that much).
    residual_sd = math.sqrt(sum(r * r for r in residuals) / max(n - 2, 1))
    # Samples of rates over overlapping windows are correlated: n of them carry the
    # information of fewer independent ones, n (1 - rho) / (1 + rho) for a lag-1
    # autocorrelation rho of the residuals, which widens the standard error.
    stderr = residual_sd / math.sqrt(var_t) * _correlation_inflation(residuals)
    if var_t <= 0:
        stderr = math.inf
    rising = slope if slope > TREND_SIGNIFICANCE * stderr else 0.0
    rate = max(level, 0.0) + rising * horizon_seconds
    return Forecast(rate, rising, spread)


def _correlation_inflation(residuals: list[float]) -> float:
    """How much a lag-1 autocorrelation of the residuals widens a standard error computed as
    if they were independent: sqrt((1 + rho) / (1 - rho)), rho clamped to [0, 0.9]."""
    total = sum(r * r for r in residuals)
    if total <= 0:
        return 1.0
    rho = sum(a * b for a, b in itertools.pairwise(residuals)) / total
    rho = min(max(rho, 0.0), 0.9)
    return math.sqrt((1 + rho) / (1 - rho))


def _growth(
    pending: float, kept: tuple[Recommendation, ...], now: dt.datetime, interval: int
) -> float | None:
    """How fast the waiting line grows (requests per second), from the previous evaluation
    when it is recent enough."""
    previous = kept[-1] if kept else None
    if previous is not None and previous.pending_requests is not None:
        elapsed = (now - previous.time).total_seconds()
        if 0 < elapsed <= 2 * interval:
            return (pending - previous.pending_requests) / elapsed
    return None


def _slots(
    saturated: bool,
    per_pod: float,
    remembered: int | None,
    above: bool,
    lagging: bool,
    service: float,
    latency_ms: float,
) -> tuple[int, str, int | None]:
    """The slots per pod for this evaluation, where they come from, and what to remember
    (the module docstring's three cases)."""
    if saturated:
        slots = min(MAX_SLOTS, max(1, round(per_pod)))
        return slots, "saturation", slots
    if remembered is not None and per_pod < remembered:
        if above and not lagging:
            # Worse than allowed: the model must explain what was seen (fewer slots than
            # remembered, if that is what it takes), for this evaluation only.
            fitted = fitted_slots(per_pod, service, latency_ms / 1000.0)
            if fitted < remembered:
                return fitted, "fitted", remembered
        return remembered, "remembered", remembered
    slots = fitted_slots(per_pod, service, latency_ms / 1000.0)
    return slots, "fitted", None if above else slots  # a fit above the band may lag


def _above_band(
    model: _Model,
    fleet: Fleet,
    target: float,
    above: bool,
    pressing: bool,
    lagging: bool,
    growth: float | None,
    line_ms: float,
) -> tuple[int, str, str]:
    """Above the band or under pressure: the fewest replicas that bring the predicted queue
    time under the target, never fewer than in force."""
    current = fleet.current
    need = model.replicas_for(target)
    raw = max(current, need)
    shrinking = growth is not None and growth < 0
    why = f"{need} replicas bring it under target at {model.arrivals:.2f} arrivals/s"
    if pressing and not shrinking and raw < fleet.ready + 1:
        raw = fleet.ready + 1
        why += f"; the waiting line is over the band: at least {raw}"
    elif lagging and need <= current:
        why += (
            f"; the line now is short ({line_ms:.0f} ms): the latency, counted when "
            "requests complete, lags"
        )
    elif shrinking and need <= current:
        why += " (the waiting line is shrinking)"
    return raw, "AboveTarget" if above else "RequestsWaiting", why


def _below_band(
    model: _Model, current: int, target: float, numbers: dict[str, Number]
) -> tuple[int, str, str]:
    """Below the band: the consolidation check (the fewest replicas that stay under 90 % of
    the target), never above the count in force."""
    limit = (1 - TOLERANCE) * target
    need = model.replicas_for(limit)
    # Never above the count in force (the model never overrules a latency under target),
    # but a fleet set to 0 that still serves traffic keeps one.
    raw = min(max(current, 1), need)
    if raw < current:
        why = (
            f"{need} replicas keep it under {limit:g} ms "
            f"(predicted {model.predict_ms(max(need, 1)):.1f} ms)"
        )
    elif current <= 1:
        why = "traffic needs at least one replica"
    else:
        predicted = model.predict_ms(current - 1)
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
    return raw, "BelowTarget", why


def count_text(value: float) -> str:
    """A request count as people read it: whole when it is, else one decimal."""
    return str(round(value)) if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def nonnegative(value: float | None) -> float:
    return max(0.0, value) if value is not None else 0.0


# ---- behind the router (rule 4c) ----------------------------------------------------------


def router_text(r: RouterSample, ready: int, slots: int | None = None) -> str:
    """The router's figures as the reasons name them."""
    in_flight, queued = nonnegative(r.in_flight), nonnegative(r.queued)
    text = (
        f"router: {count_text(in_flight)} streams in flight + {count_text(queued)} queued "
        f"over {ready} pods"
    )
    if slots:
        text += f" x {slots} slots ({ready * slots})"
    text += f", {nonnegative(r.stream_rate):.2f} streams/s arriving"
    if r.routers_seen > 1:
        text += f" (summed over {r.routers_seen} routers)"
    return text


def _router_queue_evaluations(
    queued: float, kept: tuple[Recommendation, ...], now: dt.datetime, interval: int
) -> int:
    """How many consecutive evaluations, this one included, saw streams queued in the
    router (a gap of more than two intervals, or one without a router reading, ends a run)."""
    if queued <= 0:
        return 0
    count, newer = 1, now
    for r in reversed(kept):
        if (newer - r.time).total_seconds() > 2 * interval:
            break
        if r.router_queued is None or r.router_queued <= 0:
            break
        count, newer = count + 1, r.time
    return count


def _service_seconds(obs: Observation, r: RouterSample) -> tuple[float, str] | None:
    """The mean time a stream holds a slot, and where it comes from: Triton's request time
    per completed request (a measurement per completion, whatever waits in the router), or,
    without Triton completions in the window, the router's Little's law (streams in flight
    over streams arriving), which is the service time only while nothing waits (then the
    arrivals are the completions). None when neither holds."""
    numbers = (obs.in_flight, obs.completion_rate, obs.queue_latency_ms)
    if all(x is not None and math.isfinite(x) for x in numbers):
        completions = nonnegative(obs.completion_rate)
        latency = nonnegative(obs.queue_latency_ms)
        in_service = nonnegative(obs.in_flight) - completions * latency / 1000.0
        if completions > 0 and in_service > 0:
            return in_service / completions, "triton"
    in_flight, queued, rate = (nonnegative(x) for x in (r.in_flight, r.queued, r.stream_rate))
    if rate > 0 and in_flight > 0 and queued == 0:
        return in_flight / rate, "router"
    return None


def router_assessment(
    spec: AutoscalingSpec,
    obs: Observation,
    fleet: Fleet,
    memory: tuple[tuple[Recommendation, ...], Season],
    now: dt.datetime,
    remembered: int | None,
) -> Assessment:
    """Rule 4c: the fleet's demand at the router, sized as one pooled queue."""
    r = obs.router
    assert r is not None
    kept = memory[0]
    current, ready = fleet.current, fleet.ready
    in_flight, queued, rate = (nonnegative(x) for x in (r.in_flight, r.queued, r.stream_rate))
    router_slots = round(r.slots_per_pod) if r.slots_per_pod and r.slots_per_pod >= 1 else None
    slots = spec.slo.slots_per_pod or router_slots or remembered
    numbers: dict[str, Number] = {
        "signal": "router",
        "routerInFlight": round(in_flight, 3),
        "routerQueued": round(queued, 3),
        "routerStreamRate": round(rate, 4),
        "routers": r.routers_seen,
    }
    if router_slots is not None:
        numbers["routerSlotsPerPod"] = router_slots
    if r.active_servers is not None and math.isfinite(r.active_servers):
        numbers["routerActiveServers"] = round(r.active_servers)
    runs = _router_queue_evaluations(queued, kept, now, spec.evaluation_interval_seconds)
    numbers["routerQueueEvaluations"] = runs

    keep = slots  # remembered: the spec's, the router's, or what was remembered

    def done(
        raw: int,
        regime: str,
        seen: str,
        why: str,
        arrivals: float | None = None,
        predict_ms: Callable[[int], float] | None = None,
    ) -> Assessment:
        return Assessment(raw, regime, seen, why, keep, 0.0, predict_ms, numbers, arrivals, queued)

    if in_flight == 0 and queued == 0 and rate == 0:
        seen = router_text(r, ready) + " (no stream over the window)"
        return done(0, "NoTraffic", seen, "no replica is needed for it", arrivals=0.0)
    if ready == 0:
        seen = router_text(r, ready)
        if current == 0:
            return done(1, "WakeUp", seen, "streams reach the router and no replica runs: one")
        why = "no replica is Ready, so there is no service time to measure yet"
        return done(current, "NoReadyPods", seen, why)
    if slots is None:  # no limit at the router, none set, none remembered: the busiest seen
        slots = max(1, math.ceil(in_flight / ready))
        numbers["slotsSource"] = "in flight per Ready pod"
    else:
        numbers["slotsSource"] = (
            "slo.slotsPerPod"
            if spec.slo.slots_per_pod
            else "router maxconn"
            if router_slots
            else "remembered"
        )
    numbers["slotsPerPod"] = slots
    seen = router_text(r, ready, slots)
    measured = _service_seconds(obs, r)
    if measured is None:
        why = (
            "no service time yet (no completion at Triton in the window, and streams wait "
            "in the router)"
        )
        if runs >= ROUTER_QUEUE_EVALUATIONS and ready + math.ceil(queued / slots) > current:
            raw = ready + math.ceil(queued / slots)
            why += (
                f"; the router's queue has held for {runs} evaluations: {ready} Ready + "
                f"ceil({count_text(queued)} queued / {slots} slots) = {raw}"
            )
            return done(raw, "RouterQueue", seen, why)
        return done(current, "RouterNoServiceTime", seen, why)
    service, source = measured
    # The demand in Erlangs: what is on the pods and waiting now (leading), or the arrivals
    # over the window times the service time, when that is more (a queue that grows).
    load = max(in_flight + queued, rate * service)
    arrivals = load / service
    numbers.update(
        {
            "serviceTimeSeconds": round(service, 4),
            "serviceTimeSource": source,
            "load": round(load, 3),
            "arrivalRate": round(arrivals, 4),
            "utilization": round(in_flight / (ready * slots), 4),
        }
    )
    seen += f", {service:.2f} s per stream ({source})"
    if spec.slo.enabled:
        raw, why = _router_slo(spec, load, slots, service, fleet, memory, now, arrivals, numbers)
        regime = "RouterSloSizing"
    else:
        raw, why = _router_target(spec, load, slots, service, current, numbers)
        regime = "RouterSizing"
    if queued > 0 and raw < current:
        raw = current
        why += f"; {count_text(queued)} streams wait in the router: no fewer than in force"
    if runs >= ROUTER_QUEUE_EVALUATIONS:
        need = ready + math.ceil(queued / slots)
        numbers["routerQueueReplicas"] = need
        if need > raw:
            raw, regime = need, "RouterQueue"
            why += (
                f"; the router's queue has held for {runs} evaluations: "
                f"{ready} Ready + ceil({count_text(queued)} queued / {slots} slots) = {need}"
            )

    def predict_ms(n: int) -> float:
        return 1000.0 * queue_seconds(load, n * slots, service) if n > 0 else math.inf

    return done(raw, regime, seen, why, arrivals=arrivals, predict_ms=predict_ms)


def _router_slo(
    spec: AutoscalingSpec,
    load: float,
    slots: int,
    service: float,
    fleet: Fleet,
    memory: tuple[tuple[Recommendation, ...], Season],
    now: dt.datetime,
    arrivals: float,
    numbers: dict[str, Number],
) -> tuple[int, str]:
    """Rule 4b's SLO sizing on the pooled queue: the demand forecast over the cold start
    (and the seasonal one), the budget SLO - first chunk, the configured variability (the
    router's wait is not measured: HAProxy 2.6's queue-time average is wrong while it warms
    up)."""
    slo = spec.slo
    f, _, upper = _demand_forecast(spec, memory, now, arrivals, numbers)
    upper = max(upper, load / service)  # never below what is on the pods and waiting now
    budget = (slo.first_audio_milliseconds - slo.first_chunk_milliseconds) / 1000.0
    miss = 1.0 - slo.attainment_percent / 100.0
    k = slo.variability
    need = pooled_replicas_for_miss(upper * service, slots, service, budget, miss, k)
    if need < fleet.current:
        margin = pooled_replicas_for_miss(
            upper * service, slots, service, budget, (1 - TOLERANCE) * miss, k
        )
        numbers["sloReplicasWithMargin"] = margin
        need = min(fleet.current, margin)
    at_need = miss_probability(upper * service, max(need, 1) * slots, service, budget, k)
    numbers.update(
        {
            "sloFirstChunkMilliseconds": slo.first_chunk_milliseconds,
            "sloFirstChunkSource": slo.first_chunk_source,
            "variability": round(k, 4),
            **_sizing_numbers(arrivals, f, upper, budget, need, at_need),
        }
    )
    why = (
        f"{need} replicas pooled behind the router ({need * slots} slots) keep "
        f"{slo.attainment_percent:g} % of first audio within {slo.first_audio_milliseconds} ms "
        f"(a wait of at most {budget:.2f} s, predicted {100.0 * at_need:.2f} % over) at "
        f"{upper:.2f} streams/s: {arrivals:.2f} now, trend {60.0 * f.slope:+.2f}/min over the "
        f"{slo.cold_start_seconds} s cold start, +{slo.forecast_std_devs:g} x {f.spread:.2f} "
        f"spread; variability {k:.2f}"
    )
    return need, why


def _router_target(
    spec: AutoscalingSpec,
    load: float,
    slots: int,
    service: float,
    current: int,
    numbers: dict[str, Number],
) -> tuple[int, str]:
    """Rule 4's target on the pooled queue: the fewest replicas whose predicted mean wait in
    the router is at most the target; below the count in force, at most 90 % of it."""
    target = spec.target_queue_latency_milliseconds
    up = pooled_replicas_for(load, slots, service, target / 1000.0)
    numbers["routerReplicasForTarget"] = up
    if up > current:
        predicted = 1000.0 * queue_seconds(load, up * slots, service)
        return up, (
            f"{up} replicas pooled behind the router keep the predicted wait at "
            f"{predicted:.1f} ms, within the {target:g} ms target"
        )
    limit = (1 - TOLERANCE) * target
    down = max(1, pooled_replicas_for(load, slots, service, limit / 1000.0))
    numbers["routerReplicasWithMargin"] = down
    raw = min(current, down)
    if raw < current:
        predicted = 1000.0 * queue_seconds(load, raw * slots, service)
        return raw, (
            f"{raw} replicas pooled behind the router keep the predicted wait at "
            f"{predicted:.1f} ms, under {limit:g} ms"
        )
    return raw, f"the pooled model keeps {current} replicas (fewer would wait over {limit:g} ms)"
