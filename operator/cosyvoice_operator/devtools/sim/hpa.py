"""Kubernetes' HorizontalPodAutoscaler (autoscaling/v2), as its documentation describes it.

Written from the documented behaviour (kubernetes.io, "Horizontal Pod Autoscaling",
"Algorithm details" and "Configurable scaling behavior"), pure:

- `pods_metric_replicas`: a ``Pods`` metric with an ``AverageValue`` target. The usage ratio
  is the mean of the per-pod values over the target. Within the tolerance (0.1) nothing
  changes; otherwise ``ceil(ratio * pods with a metric)``. Pods being deleted are ignored
  (the caller leaves them out). Pods not yet running (``Pending``) and Ready pods without a
  metric are set aside; if any were, the ratio is computed again with the missing pods
  counted at the target on a scale-down and at 0 on a scale-up, and the not-yet-running pods
  at 0 when the first ratio asked for a scale-up. If the new ratio is within tolerance, or
  reverses the direction, nothing changes; a result that would move against the new ratio's
  direction keeps the current count. No metric at all is an error: the HPA does not scale.
- `external_average_replicas`: an ``External`` metric with an ``AverageValue`` target (what
  a KEDA ScaledObject gives the HPA): ratio = value / (target * current replicas), within
  tolerance nothing changes, otherwise ``ceil(value / target)``.
- `stabilize`: the scale-up window keeps the lowest recommendation in it, the scale-down
  window the highest (this evaluation's raw recommendation included); the result moves
  from the current count only as far as both allow.
- `rate_limit`: scaling policies over their periods (``Pods``: a number of pods,
  ``Percent``: of the count at the start of the period; ``selectPolicy`` Max picks the one
  allowing the biggest change, Min the smallest, Disabled none), counted from the scale
  events of the period.

Defaults are the documented ones: tolerance 0.1; scale-up: no window, the larger of +4 pods
or +100 % per 15 s; scale-down: 300 s window, -100 % per 15 s; the controller syncs every 15 s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

TOLERANCE = 0.1
SYNC_PERIOD_S = 15.0


@dataclass(frozen=True)
class ScalingPolicy:
    kind: str  # "Pods" | "Percent"
    value: int
    period_s: float


@dataclass(frozen=True)
class ScalingRules:
    stabilization_s: float
    policies: tuple[ScalingPolicy, ...]
    select: str = "Max"  # "Max" | "Min" | "Disabled"


DEFAULT_SCALE_UP = ScalingRules(
    0.0, (ScalingPolicy("Pods", 4, 15.0), ScalingPolicy("Percent", 100, 15.0))
)
DEFAULT_SCALE_DOWN = ScalingRules(300.0, (ScalingPolicy("Percent", 100, 15.0),))


@dataclass(frozen=True)
class PodMetric:
    """One pod of the target as the HPA sees it."""

    value: float | None  # None: no metric for it
    running: bool = True  # False: Pending (not yet running), set aside


def _within(ratio: float, tolerance: float) -> bool:
    return abs(1.0 - ratio) <= tolerance


def pods_metric_replicas(
    current: int, pods: Sequence[PodMetric], target: float, tolerance: float = TOLERANCE
) -> int | None:
    """The replica count a ``Pods`` metric asks for; None when no pod has a metric (the HPA
    reports an error and does not scale)."""
    measured = [p.value for p in pods if p.running and p.value is not None]
    missing = sum(1 for p in pods if p.running and p.value is None)
    not_running = sum(1 for p in pods if not p.running)
    if not measured:
        return None
    ratio = sum(measured) / len(measured) / target
    up_with_not_running = not_running > 0 and ratio > 1.0
    if not up_with_not_running and missing == 0:
        if _within(ratio, tolerance):
            return current
        return math.ceil(ratio * len(measured))
    values = list(measured)
    if missing:
        values += [target if ratio < 1.0 else 0.0] * missing
    if up_with_not_running:
        values += [0.0] * not_running
    new_ratio = sum(values) / len(values) / target
    if (
        _within(new_ratio, tolerance)
        or (ratio < 1.0 and new_ratio > 1.0)
        or (ratio > 1.0 and new_ratio < 1.0)
    ):
        return current
    wanted = math.ceil(new_ratio * len(values))
    if (new_ratio < 1.0 and wanted > current) or (new_ratio > 1.0 and wanted < current):
        return current
    return wanted


def external_average_replicas(
    current: int, value: float, target: float, tolerance: float = TOLERANCE
) -> int:
    """The replica count an ``External`` metric with an ``AverageValue`` target asks for."""
    if current > 0 and _within(value / (target * current), tolerance):
        return current
    return math.ceil(value / target)


def external_value_replicas(
    current: int, ready: int, value: float, target: float, tolerance: float = TOLERANCE
) -> int:
    """The replica count an ``External`` metric with a ``Value`` target asks for
    (replica_calculator.go's GetExternalMetricReplicas: the usage ratio times the Ready pods,
    held within the tolerance; from 0 replicas, the ratio itself)."""
    ratio = value / target
    if current == 0:
        return math.ceil(ratio)
    if _within(ratio, tolerance):
        return current
    return math.ceil(ratio * ready)


def stabilize(
    current: int,
    raw: int,
    recommendations: Sequence[tuple[float, int]],
    now: float,
    up: ScalingRules,
    down: ScalingRules,
) -> int:
    """The count after the stabilization windows; ``recommendations`` are earlier (time,
    raw recommendation) pairs, this evaluation's ``raw`` is counted too."""
    up_rec = down_rec = raw
    for t, r in recommendations:
        if t > now - up.stabilization_s:
            up_rec = min(up_rec, r)
        if t > now - down.stabilization_s:
            down_rec = max(down_rec, r)
    result = current
    result = max(result, up_rec)
    return min(result, down_rec)


def _changed_in(events: Sequence[tuple[float, int]], now: float, period_s: float) -> int:
    return sum(change for t, change in events if t > now - period_s)


def rate_limit(
    current: int,
    desired: int,
    up_events: Sequence[tuple[float, int]],
    down_events: Sequence[tuple[float, int]],
    now: float,
    up: ScalingRules,
    down: ScalingRules,
    min_replicas: int,
    max_replicas: int,
) -> int:
    """``desired`` within the scaling policies and the bounds. Events are (time, pods added)
    for scale-ups and (time, pods removed) for scale-downs."""
    if desired > current:
        if up.select == "Disabled":
            return current
        proposals = []
        for p in up.policies:
            start = current - _changed_in(up_events, now, p.period_s)
            if p.kind == "Pods":
                proposals.append(start + p.value)
            else:
                proposals.append(math.ceil(start * (1.0 + p.value / 100.0)))
        limit = max(proposals) if up.select == "Max" else min(proposals)
        return max(current, min(desired, limit, max_replicas))
    if desired < current:
        if down.select == "Disabled":
            return current
        proposals = []
        for p in down.policies:
            start = current + _changed_in(down_events, now, p.period_s)
            if p.kind == "Pods":
                proposals.append(start - p.value)
            else:
                proposals.append(int(start * (1.0 - p.value / 100.0)))
        limit = min(proposals) if down.select == "Max" else max(proposals)
        return min(current, max(desired, limit, min_replicas))
    return current


@dataclass
class Hpa:
    """One HorizontalPodAutoscaler's memory between syncs, and one sync."""

    min_replicas: int
    max_replicas: int
    up: ScalingRules = DEFAULT_SCALE_UP
    down: ScalingRules = DEFAULT_SCALE_DOWN

    def __post_init__(self) -> None:
        self.recommendations: list[tuple[float, int]] = []
        self.up_events: list[tuple[float, int]] = []
        self.down_events: list[tuple[float, int]] = []

    def sync(self, now: float, current: int, raw: int | None) -> int:
        """The count to set after this sync; ``raw`` None (the metric failed): unchanged,
        unless the count is outside the bounds."""
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        elif raw is None:
            return current
        else:
            bounded = min(max(raw, self.min_replicas), self.max_replicas)
            stable = stabilize(current, bounded, self.recommendations, now, self.up, self.down)
            horizon = max(self.up.stabilization_s, self.down.stabilization_s)
            self.recommendations = [
                (t, r) for t, r in self.recommendations if t > now - horizon
            ] + [(now, bounded)]
            desired = rate_limit(
                current,
                stable,
                self.up_events,
                self.down_events,
                now,
                self.up,
                self.down,
                self.min_replicas,
                self.max_replicas,
            )
        longest = max([p.period_s for p in (*self.up.policies, *self.down.policies)] or [0.0])
        self.up_events = [(t, c) for t, c in self.up_events if t > now - longest]
        self.down_events = [(t, c) for t, c in self.down_events if t > now - longest]
        if desired > current:
            self.up_events.append((now, desired - current))
        elif desired < current:
            self.down_events.append((now, current - desired))
        return desired
