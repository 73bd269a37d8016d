"""Every policy in the simulation loop: a step load, a Prometheus outage, cold starts, and our
policy being the operator's own module, unchanged."""

from __future__ import annotations

import random

import pytest

from cosyvoice_operator.autoscaling import policy
from cosyvoice_operator.devtools.sim import policies, trace
from cosyvoice_operator.devtools.sim.engine import SimConfig, simulate
from cosyvoice_operator.devtools.sim.plant import PrometheusModel, ServiceModel

# Small pods so that a few requests per second need several of them: 4 slots, 4 s streams.
MODEL = ServiceModel(
    slots=4, rtf=0.4, overhead_s=0.0, first_chunk_s=0.2, first_chunk_per_stream_s=0.1
)
CONFIG = SimConfig(service=MODEL, cold_start_s=60.0, slo_s=1.5, initial_replicas=3, warmup_s=300.0)
AUTOSCALERS: dict[str, policies.Params] = {
    "cosyvoice": {"target_ms": 50.0, "min_replicas": 1, "up_step": 10, "down_window_s": 300},
    "hpa": {"target": 200.0, "min_replicas": 1, "down_window_s": 300},
    "hpa-concurrency": {"target": 2.5, "min_replicas": 1, "down_window_s": 300},
    "keda": {"target": 2.5, "min_replicas": 1, "down_window_s": 300},
    "kpa": {"target": 2.5, "min_replicas": 1, "down_window_s": 0},
    "keda-fallback": {"target": 2.5, "min_replicas": 1, "down_window_s": 300, "fallback": 6},
    "llmd": {"target": 0.75, "min_replicas": 1, "down_window_s": 300},
}


def poisson(rates: list[tuple[float, float]], seed: int = 1, name: str = "t") -> trace.Trace:
    """Arrivals at ``rate`` per second for each (seconds, rate) segment, 10 s of audio each."""
    rng = random.Random(seed)
    arrivals: list[float] = []
    start = 0.0
    for length, rate in rates:
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= start + length:
                break
            arrivals.append(t)
        start += length
    return trace.Trace(name, tuple(arrivals), tuple(10.0 for _ in arrivals), start)


def test_our_policy_is_the_operators_module_called_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[policy.Observation] = []
    real = policy.decide

    def spy(*args: object, **kwargs: object) -> policy.Decision:
        calls.append(args[1])  # type: ignore[arg-type]
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(policy, "decide", spy)
    outcome = simulate(
        poisson([(900.0, 2.0)]), policies.make("cosyvoice", AUTOSCALERS["cosyvoice"]), CONFIG
    )
    assert outcome.requests > 0
    # Every 15 s over the warm-up and the trace, fed like the operator feeds it.
    assert len(calls) == pytest.approx((900 + 300) / 15, abs=1)
    fresh = [o for o in calls if o.available]
    assert fresh and all(o.in_flight is not None and o.completion_rate for o in fresh[5:])


@pytest.mark.parametrize("policy", sorted(AUTOSCALERS))
def test_a_step_load_makes_every_autoscaler_scale_up(policy: str) -> None:
    # 1 request/s of 4 s streams is 4 Erlangs (2 pods at 2.5 per pod); from minute 10, 4/s
    # is 16 Erlangs: more than the 4 slots of 4 pods, 7 pods at 2.5.
    step = poisson([(600.0, 1.0), (900.0, 4.0)])
    outcome = simulate(step, policies.make(policy, AUTOSCALERS[policy]), CONFIG)
    before = [m.replicas for m in outcome.timeline[:9]]
    after = [m.replicas for m in outcome.timeline[-5:]]
    assert max(after) >= 6 and max(after) >= 2 * max(before), (policy, before, after)
    assert outcome.scale_events >= 1


def test_static_never_scales() -> None:
    step = poisson([(600.0, 1.0), (900.0, 4.0)])
    outcome = simulate(step, policies.make("static", {"replicas": 4}), CONFIG)
    assert outcome.scale_events == 0
    assert {m.replicas for m in outcome.timeline} == {4}
    # 16 slots for 16 Erlangs after the step: saturated, the SLO suffers.
    assert outcome.slo_attainment < 0.8
    # 4 pods for the 25 scored minutes.
    assert outcome.gpu_hours == pytest.approx(4 * 1500 / 3600, rel=0.01)


def test_a_prometheus_outage_scales_keda_down_and_nothing_else() -> None:
    steady = poisson([(1800.0, 2.5)])
    outage = trace.with_outage(steady, 300.0, 900.0)
    results = {
        p: simulate(outage, policies.make(p, AUTOSCALERS[p]), CONFIG)
        for p in ("cosyvoice", "hpa-concurrency", "keda")
    }
    # KEDA reads the empty result as 0 and drops to its minimum after its window.
    assert results["keda"].missing_data_scale_downs >= 1
    assert min(m.replicas for m in results["keda"].timeline) == 1
    assert results["keda"].slo_attainment < 0.9
    for p in ("cosyvoice", "hpa-concurrency"):
        assert results[p].missing_data_scale_downs == 0, p
        during = [m.replicas for m in results[p].timeline[6:19]]
        assert len(set(during)) == 1, (p, during)  # held through the outage
        assert results[p].slo_attainment > 0.98, p


def test_keda_with_fallback_holds_then_sizes_to_its_fallback_and_llmd_reads_zero() -> None:
    steady = poisson([(1800.0, 2.5)])
    outage = trace.with_outage(steady, 300.0, 900.0)
    fallback = simulate(
        outage, policies.make("keda-fallback", AUTOSCALERS["keda-fallback"]), CONFIG
    )
    during = [m.replicas for m in fallback.timeline[7:19]]
    assert set(during) == {6}  # 3 failed polls (90 s), then fallback.replicas
    assert fallback.slo_attainment > 0.95
    llmd = simulate(outage, policies.make("llmd", AUTOSCALERS["llmd"]), CONFIG)
    assert llmd.missing_data_scale_downs >= 1  # the empty result read as 0 (KEDA's default)
    assert min(m.replicas for m in llmd.timeline) == 1


def test_cold_start_delays_capacity_and_counts_gpu_time() -> None:
    step = poisson([(600.0, 1.0), (900.0, 4.0)])
    slow = simulate(
        step,
        policies.make("hpa-concurrency", AUTOSCALERS["hpa-concurrency"]),
        SimConfig(service=MODEL, cold_start_s=300.0, initial_replicas=3, warmup_s=300.0),
    )
    fast = simulate(
        step,
        policies.make("hpa-concurrency", AUTOSCALERS["hpa-concurrency"]),
        SimConfig(service=MODEL, cold_start_s=30.0, initial_replicas=3, warmup_s=300.0),
    )
    assert slow.slo_attainment < fast.slo_attainment
    lag = [m.replicas - m.ready for m in slow.timeline]
    assert max(lag) >= 3  # pods created but not Ready for minutes


def test_scrape_interval_and_lag_slow_the_reaction() -> None:
    step = poisson([(600.0, 1.0), (900.0, 4.0)])

    def first_scale_up(model: PrometheusModel) -> int:
        config = SimConfig(
            service=MODEL, prometheus=model, cold_start_s=60.0, initial_replicas=3, warmup_s=300.0
        )
        outcome = simulate(
            step, policies.make("hpa-concurrency", AUTOSCALERS["hpa-concurrency"]), config
        )
        return next(i for i, m in enumerate(outcome.timeline) if m.replicas >= 6)

    quick = first_scale_up(PrometheusModel(scrape_interval_s=5.0, rate_window_s=30.0))
    slow = first_scale_up(PrometheusModel(scrape_interval_s=30.0, rate_window_s=120.0, lag_s=60))
    assert slow > quick
