"""The clairvoyant bounds of the benchmark (`devtools.sim.oracle`): the per-bucket sizing, the
schedule asked for a cold start ahead, the work bound, and the search in the plant."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from cosyvoice_operator.autoscaling.queueing import miss_probability, replicas_for_miss
from cosyvoice_operator.devtools.sim import experiment, oracle, report
from cosyvoice_operator.devtools.sim.engine import SimConfig, played, simulate
from cosyvoice_operator.devtools.sim.plant import ServiceModel
from cosyvoice_operator.devtools.sim.policies import make
from cosyvoice_operator.devtools.sim.trace import Trace
from tests.unit.devtools.test_sim_experiment import write_trace

MODEL = ServiceModel()
CONFIG = SimConfig(initial_replicas=2, warmup_s=300.0)


def poisson(rate_of: list[float], seed: int = 1, audio: float = 8.0) -> Trace:
    """Poisson arrivals at ``rate_of[minute]`` requests/s, ``audio`` seconds each."""
    rng = random.Random(seed)
    arrivals = []
    for minute, rate in enumerate(rate_of):
        t = 60.0 * minute
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= 60.0 * (minute + 1):
                break
            arrivals.append(t)
    return Trace("t", tuple(arrivals), (audio,) * len(arrivals), 60.0 * len(rate_of))


def test_budget_is_the_slo_less_the_first_chunk_with_every_slot_busy() -> None:
    assert oracle.budget_seconds(CONFIG) == pytest.approx(1.5 - (0.22 + 3 * 0.296))


def test_bucket_needs_size_each_bucket_on_its_own_arrivals() -> None:
    # bucket 0: 120 requests of 8 s audio (3.01 s of service each); bucket 1: none
    arrivals = [0.5 * i for i in range(120)]
    needs = oracle.bucket_needs(arrivals, [8.0] * 120, MODEL, 120.0, 0.39, 0.01)
    service = MODEL.service_seconds(8.0)
    assert needs == [replicas_for_miss(120 * service / 60.0, 4, service, 0.39, 0.01), 1]
    looser = oracle.bucket_needs(arrivals, [8.0] * 120, MODEL, 120.0, 0.39, 0.2)
    assert looser[0] < needs[0]


def test_the_schedule_asks_a_cold_start_ahead_and_lets_go_at_once() -> None:
    s = oracle.OracleSchedule([1, 1, 1, 1, 9, 2, 2, 2], lead_s=185.0)
    assert s.count_at(0.0) == 1  # buckets 0-3
    assert s.count_at(60.0) == 9  # bucket 4 starts at 240 s, within 185 s of 60 s
    assert s.count_at(240.0) == 9
    assert s.count_at(300.0) == 2  # bucket 4 is past: removed at once
    assert s.count_at(10_000.0) == 2  # past the end: the last need


def test_work_bound_keeps_the_shortest_services_and_clips_at_the_end() -> None:
    t = Trace("w", (0.0, 10.0, 20.0, 95.0), (1.0, 2.0, 30.0, 40.0), 100.0)
    services = sorted(
        [MODEL.service_seconds(1.0), MODEL.service_seconds(2.0), MODEL.service_seconds(30.0), 5.0]
    )
    # 3 of 4 requests (goal 0.75): the three shortest, the last one clipped to 5 s
    expected = sum(services[:3]) / 4 / 3600
    assert oracle.work_bound_gpu_hours(t, MODEL, 0.75) == pytest.approx(expected)


def test_the_oracle_schedule_is_ready_for_a_step_it_knows_of() -> None:
    trace = poisson([2.0] * 10 + [12.0] * 10)
    arrivals, _, warm, head = played(trace, CONFIG.warmup_s)
    assert warm == 300.0 and len(arrivals) == len(trace) + head
    run = oracle.schedule_run(trace, CONFIG, 0.01)
    assert run.slo_attainment >= 0.99
    assert run.gpu_hours >= oracle.work_bound_gpu_hours(trace, MODEL, run.slo_attainment)


def test_search_keeps_the_cheapest_run_reaching_the_goal() -> None:
    trace = poisson([2.0] * 10 + [12.0] * 10)
    bound = oracle.search(trace, CONFIG, 0, 0.99, steps=3)
    assert bound.outcome.slo_attainment >= 0.99
    reaching = [(m, g) for m, a, g in bound.tried if a >= 0.99]
    assert bound.outcome.gpu_hours == min(g for _, g in reaching)
    assert bound.work_bound_gpu_hours < bound.outcome.gpu_hours
    assert len(bound.tried) in (1 + 3, 1 + 3 + 1)  # the upper end, the steps (and the lower)
    again = oracle.search(trace, CONFIG, 0, 0.99, steps=3)  # deterministic
    assert again.tried == bound.tried


def test_the_oracle_schedule_beats_a_fleet_sized_for_the_peak() -> None:
    trace = poisson([2.0] * 10 + [12.0] * 10)
    bound = oracle.search(trace, CONFIG, 0, 0.99, steps=3)
    peak = max(oracle.bucket_needs(*played(trace, 300.0)[:2], MODEL, 1500.0, 0.39, bound.miss))
    static = simulate(trace, make("static", {"replicas": peak}), CONFIG)
    assert bound.outcome.gpu_hours < static.gpu_hours


TINY = experiment.Sweep(
    ours_targets=(25.0,),
    ours_variability=(0.2,),
    ours_seasonal=((0, 100.0),),
    hpa_targets=(200.0,),
    concurrency_targets=(2.0,),
    floors=(0.0,),
    down_windows_s=(300.0,),
    kpa_delays_s=(0.0,),
    static_counts=(1.4,),
    fallback_targets=(2.0,),
    llmd_targets=(0.75,),
    new_floors=(0.0,),
)


def test_the_report_shows_the_bounds_and_they_can_be_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    train = write_trace(tmp_path / "train.csv", 20, 1.5, seed=1)
    evaluation = write_trace(tmp_path / "eval.csv", 20, 2.5, seed=2)
    exp = experiment.files_experiment(
        str(train), [str(evaluation)], 1.0, 1, "GeneratedTokens", 25.0
    )
    exp = dataclasses.replace(exp, sweep=TINY, jobs=1, bounds=True)
    result = experiment.run_experiment(exp)
    (bound,) = result.bounds
    assert bound.trace == "eval.csv" and bound.outcome.slo_attainment >= 0.99
    assert "| eval.csv | oracle schedule |" in report.markdown(result)
    assert "oracle schedule" in report.table(result)
    (verdict,) = report.verdicts(result)
    # Baselines reach 99 % on this trace (hpa-concurrency, keda, keda-fallback when written),
    # so the bounds are priced against the cheapest of them: the ratios must be there.
    assert verdict.compared_with, verdict
    assert verdict.oracle_ratio is not None and verdict.work_ratio is not None, verdict
    assert verdict.work_ratio < verdict.oracle_ratio
    document = json.loads(json.dumps(report.to_json(result)))
    assert document["summary"]["bounds"][0]["trace"] == "eval.csv"
    (again,) = oracle.bounds_from_json(document)
    assert again == bound

    def never(*args: object) -> oracle.Bound:
        raise AssertionError("a known bound was searched again")

    monkeypatch.setattr(experiment, "search", never)
    reused = experiment.run_experiment(dataclasses.replace(exp, known_bounds=(again,)))
    assert reused.bounds == [bound]


def test_priced_needs_minimize_pods_plus_priced_misses() -> None:
    arrivals = [0.5 * i for i in range(120)]  # bucket 0: 2 requests/s; bucket 1: none
    service = MODEL.service_seconds(8.0)
    load = 120 * service / 60.0
    for price in (0.0, 0.05, 1.0, 50.0):
        (n, idle) = oracle.priced_needs(arrivals, [8.0] * 120, MODEL, 120.0, 0.39, price)
        assert idle == 1

        def cost(k: int, price: float = price) -> float:
            per_pod = load / k
            p = 1.0 if per_pod >= 4 else miss_probability(per_pod, 4, service, 0.39)
            return k + price * 120 * p

        assert cost(n) == min(cost(k) for k in range(1, 40))
    cheap = oracle.priced_needs(arrivals, [8.0] * 120, MODEL, 120.0, 0.39, 0.01)
    dear = oracle.priced_needs(arrivals, [8.0] * 120, MODEL, 120.0, 0.39, 100.0)
    assert cheap[0] < dear[0]


def test_bucket_counts_hold_the_largest_need_a_cold_start_ahead() -> None:
    trace = poisson([2.0] * 10 + [12.0] * 10)
    arrivals, audio, warm, _ = played(trace, CONFIG.warmup_s)
    needs = oracle.priced_needs(
        arrivals, audio, MODEL, warm + trace.duration_s, oracle.budget_seconds(CONFIG), 0.1
    )
    counts = oracle.bucket_counts(trace, CONFIG, 0.1)
    lead = 4  # ceil((180 s cold start + 5 s) / 60 s)
    assert counts == [max(needs[b : b + lead + 1]) for b in range(len(needs))]
    assert counts[5 + 10 - lead] > counts[5]  # ready for the step before it comes


def test_the_priced_search_and_its_refinement_reach_the_goal_for_less() -> None:
    trace = poisson([2.0] * 10 + [12.0] * 10)
    price, priced, runs = oracle.search_priced(trace, CONFIG, 0.99, steps=5)
    assert runs == 5 and priced.slo_attainment >= 0.99
    assert oracle.search_priced(trace, CONFIG, 0.99, steps=5) == (price, priced, runs)
    counts = oracle.bucket_counts(trace, CONFIG, price)
    start = oracle.counts_run(trace, CONFIG, counts)
    best, fewer, spent = oracle.refine(trace, CONFIG, counts, 0.99)
    assert best.slo_attainment >= 0.99 and best.gpu_hours <= start.gpu_hours
    assert all(a <= b for a, b in zip(fewer, counts, strict=True)) and spent > 1
    assert oracle.counts_run(trace, CONFIG, fewer) == best
    # a local minimum: one replica fewer in any minute misses the goal
    for b, n in enumerate(fewer):
        if n > 1:
            less = [*fewer[:b], n - 1, *fewer[b + 1 :]]
            assert oracle.counts_run(trace, CONFIG, less).slo_attainment < 0.99
