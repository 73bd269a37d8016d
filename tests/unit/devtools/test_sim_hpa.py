"""The simulator's HPA (devtools.sim.hpa) against the algorithm Kubernetes documents.

Each row is a worked example of the documented rules: ``ceil(current * metric / target)``,
the 0.1 tolerance, missing metrics counted at the target on a scale-down and at 0 on a
scale-up, not-yet-running pods at 0 on a scale-up, no action when that recount reverses the
direction or lands in the tolerance; then the stabilization windows and scaling policies.
"""

from __future__ import annotations

import pytest

from cosyvoice_operator.devtools.sim.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    Hpa,
    PodMetric,
    ScalingPolicy,
    ScalingRules,
    external_average_replicas,
    pods_metric_replicas,
    rate_limit,
    stabilize,
)


def pods(*values: float | None, pending: int = 0) -> list[PodMetric]:
    return [PodMetric(v) for v in values] + [PodMetric(None, running=False)] * pending


@pytest.mark.parametrize(
    ("current", "metrics", "target", "expected", "why"),
    [
        # The docs' example: 200m against 100m doubles, 50m halves.
        (3, pods(200, 200, 200), 100, 6, "ratio 2.0 doubles"),
        (4, pods(50, 50, 50, 50), 100, 2, "ratio 0.5 halves"),
        # A custom metric, 3 pods at 20k, 10k, 30k against 15k: mean 20k, ratio 4/3 -> 4.
        (3, pods(20_000, 10_000, 30_000), 15_000, 4, "ceil(3 * 1.333)"),
        (5, pods(108, 108, 108, 108, 108), 100, 5, "1.08 is within the tolerance"),
        (5, pods(92, 92, 92, 92, 92), 100, 5, "0.92 is within the tolerance"),
        (5, pods(111, 111, 111, 111, 111), 100, 6, "1.11 is outside: ceil(5.55)"),
        # Missing metrics: at the target on a scale-down...
        (3, pods(50, 50, None), 100, 2, "(50+50+100)/3 = 0.667 -> ceil(2.0)"),
        # ...and at 0 on a scale-up, which can bring the ratio into the tolerance: hold.
        (3, pods(150, 150, None), 100, 3, "(150+150+0)/3 = 1.0: hold"),
        (4, pods(300, 300, None, None), 100, 6, "(600)/4 = 1.5 -> ceil(6.0)"),
        # ...or reverse the direction: hold.
        (4, pods(120, 120, None, None), 100, 4, "1.2 becomes 0.6: reversed, hold"),
        # A pod not yet running counts as 0 on a scale-up.
        (2, pods(200, pending=1), 100, 2, "(200+0)/2 = 1.0: hold"),
        (3, pods(400, 400, pending=1), 100, 8, "(400+400+0)/3 = 2.67 -> ceil(8.0)"),
        # ...and is left out on a scale-down.
        (3, pods(40, 40, pending=1), 100, 1, "ratio 0.4 over the 2 measured pods"),
    ],
)
def test_pods_metric_replicas(
    current: int, metrics: list[PodMetric], target: float, expected: int, why: str
) -> None:
    assert pods_metric_replicas(current, metrics, target) == expected, why


def test_no_metric_at_all_is_an_error_and_the_hpa_holds() -> None:
    assert pods_metric_replicas(4, pods(None, None, pending=2), 100) is None
    hpa = Hpa(min_replicas=1, max_replicas=10)
    assert hpa.sync(0.0, 4, None) == 4
    assert hpa.recommendations == []  # nothing recorded for the windows


def test_external_average_value_uses_the_replica_count() -> None:
    # 30 requests in all against 3 per pod: 10 pods, from whatever is running.
    assert external_average_replicas(4, 30.0, 3.0) == 10
    assert external_average_replicas(10, 31.0, 3.0) == 10  # 1.033: within the tolerance
    assert external_average_replicas(10, 0.0, 3.0) == 0  # an empty result read as 0


def test_scale_down_stabilization_keeps_the_highest_recommendation_of_the_window() -> None:
    up, down = DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN
    history = [(1000.0 - 200, 10), (1000.0 - 100, 8)]
    assert stabilize(10, 5, history, 1000.0, up, down) == 10
    # 301 s later the 10 has left the 300 s window; the 8 has not.
    assert stabilize(10, 5, history, 1101.0, up, down) == 8
    assert stabilize(10, 5, history, 1300.0, up, down) == 5


def test_scale_up_stabilization_keeps_the_lowest_recommendation_of_its_window() -> None:
    up = ScalingRules(60.0, DEFAULT_SCALE_UP.policies)
    history = [(950.0, 6), (980.0, 9)]
    assert stabilize(4, 12, history, 1000.0, up, DEFAULT_SCALE_DOWN) == 6


@pytest.mark.parametrize(
    ("current", "desired", "added_recently", "expected"),
    [
        (10, 50, 0, 20),  # +100 % beats +4
        (2, 50, 0, 6),  # +4 beats +100 %
        (20, 50, 10, 20),  # the period started at 10: 10 + 100 % = 20 already reached
        (10, 12, 0, 12),  # within the limit
    ],
)
def test_scale_up_policies(current: int, desired: int, added_recently: int, expected: int) -> None:
    events = [(995.0, added_recently)] if added_recently else []
    got = rate_limit(
        current, desired, events, [], 1000.0, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN, 1, 1000
    )
    assert got == expected


def test_scale_down_policies_and_select_min() -> None:
    # Default: 100 % per 15 s, straight to the recommendation (and never under minReplicas).
    assert rate_limit(20, 3, [], [], 0.0, DEFAULT_SCALE_UP, DEFAULT_SCALE_DOWN, 5, 100) == 5
    slow = ScalingRules(
        300.0,
        (ScalingPolicy("Pods", 2, 60.0), ScalingPolicy("Percent", 50, 60.0)),
        select="Min",
    )
    # Min picks the policy allowing the smaller change: -2 pods rather than -50 %.
    assert rate_limit(20, 3, [], [], 0.0, DEFAULT_SCALE_UP, slow, 1, 100) == 18
    # 2 removed within the period already: the period started at 20, so 18 is the limit.
    assert rate_limit(18, 3, [], [(-30.0, 2)], 0.0, DEFAULT_SCALE_UP, slow, 1, 100) == 18
    disabled = ScalingRules(300.0, (), select="Disabled")
    assert rate_limit(20, 3, [], [], 0.0, DEFAULT_SCALE_UP, disabled, 1, 100) == 20


def test_sync_applies_window_policies_and_bounds_over_time() -> None:
    hpa = Hpa(min_replicas=2, max_replicas=30)
    assert hpa.sync(0.0, 10, 40) == 20  # +100 % in one period
    assert hpa.sync(15.0, 20, 40) == 30  # the next period: capped at maxReplicas
    assert hpa.sync(30.0, 30, 1) == 30  # the 300 s window remembers 40
    assert hpa.sync(330.0, 30, 1) == 2  # the window has passed: down to minReplicas
    assert hpa.sync(345.0, 1, 1) == 2  # a count under minReplicas is raised at once
