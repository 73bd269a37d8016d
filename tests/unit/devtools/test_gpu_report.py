"""``bench/gpu/report.py``: goodput at SLO from a sweep's steps, and issue 13's summary."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

GPU = Path(__file__).resolve().parents[3] / "bench" / "gpu"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(GPU))
    try:
        spec = importlib.util.spec_from_file_location(f"gpu_{name}", GPU / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(GPU))


report = _load("report")


def step(good: float, p95: float | None, errors: int = 0, requests: int = 40, **gpus: Any) -> Any:
    return {
        "requests": requests,
        "errors": errors,
        "good_rps": good,
        "offered_rps": good,
        "p95_first_chunk_ms": p95,
        "p95_first_chunk_ms_counting_errors": p95,
        "p95_total_ms": 1000.0,
        "gpu_utilization_mean": 0.5,
        "per_gpu": {uuid: {"memory_max_gib": gib} for uuid, gib in gpus.items()},
    }


def raw_point(name: str, gpus: int, steps: list[Any]) -> Any:
    params = {"orchestratorPerGpu": 16, "instancesPerGpu": 1, "maxQueueDelayUs": 500}
    return {"name": name, "params": {**params, "maxBatchSize": 16, "gpus": gpus}, "steps": steps}


def test_goodput_is_the_best_step_that_met_the_slo() -> None:
    p = report.point(
        raw_point("a", 1, [step(3.0, 300.0), step(5.0, 900.0), step(6.0, 1500.0)]), 1000.0
    )
    assert p["goodput_rps"] == 5.0 and p["p95_first_chunk_ms"] == 900.0


def test_a_step_whose_p95_falls_on_failures_does_not_count() -> None:
    p = report.point(raw_point("a", 1, [step(3.0, None, errors=10)]), 1000.0)
    assert p["goodput_rps"] == 0.0 and p["error_rate"] == 0.25


def test_multi_gpu_compares_one_and_two_gpus_and_counts_the_gpus_used() -> None:
    points = [
        report.point(raw_point("one", 1, [step(4.0, 400.0, g0=8.5)]), 1000.0),
        report.point(raw_point("two", 2, [step(7.6, 450.0, g0=8.6, g1=8.4)]), 1000.0),
        report.point(raw_point("two-idle", 2, [step(3.0, 450.0, g0=8.6, g1=0.4)]), 1000.0),
    ]
    summary = report.multi_gpu(points)
    assert summary["one_gpu_goodput_rps"] == 4.0
    assert summary["two_gpu_goodput_rps"] == 7.6
    assert summary["ratio"] == 1.9
    assert summary["gpus_with_instances"] == 2
    assert summary["two_gpu_point"] == "two" and summary["errors"] == 0


def test_runs_of_one_point_merge_with_their_spread_and_lost_streams() -> None:
    def run(name: str, good: float, lost: int) -> Any:
        raw = {"name": name, "params": {}, "steps": [step(good, 500.0, errors=lost)]}
        return report.point(raw, 1000.0)

    merged = report.merge_runs([run("a", 4.0, 0), run("b", 2.0, 1), run("a", 3.0, 2)])
    by_name = {p["name"]: p for p in merged}
    assert by_name["a"]["goodput_rps"] == 4.0
    assert by_name["a"]["repeat_goodput_rps"] == [3.0]
    assert by_name["a"]["mean_goodput_rps"] == 3.5
    assert by_name["a"]["goodput_spread"] == round(1.0 / 3.5, 3)
    assert (by_name["a"]["requests"], by_name["a"]["lost_streams"]) == (80, 2)
    assert by_name["a"]["lost_stream_rate"] == 0.025
    assert by_name["b"]["repeat_goodput_rps"] == [] and by_name["b"]["goodput_spread"] == 0.0


def test_runs_on_different_cards_or_slos_are_not_merged() -> None:
    h200 = {"device": "NVIDIA H200, 143771 MiB, 580.1", "slo_first_chunk_ms": 1000.0}
    h100 = {"device": "NVIDIA H100 80GB HBM3, 81559 MiB, 580.1", "slo_first_chunk_ms": 1000.0}
    assert report.one_device([h200, {**h200, "device": "NVIDIA H200, 143771 MiB, 590.2"}]) is None
    mixed = report.one_device([h200, h100])
    assert mixed is not None and "NVIDIA H100 80GB HBM3" in mixed and "NVIDIA H200" in mixed
    slower = report.one_device([h200, {**h200, "slo_first_chunk_ms": 1500.0}])
    assert slower is not None and "SLO" in slower


calibrate = _load("calibrate")


def test_the_pod_model_is_fitted_to_the_concurrency_profile() -> None:
    profile = {
        "1": {"p50_first_chunk_ms": 200.0, "p50_rtf": 0.2},
        "4": {"p50_first_chunk_ms": 350.0, "p50_rtf": 0.3},
        "16": {"p50_first_chunk_ms": 950.0, "p50_rtf": 0.6},
    }
    point = {"params": {"orchestratorPerGpu": 16}, "concurrency_profile": profile}
    model = calibrate.fit(point)
    assert (model.slots, model.rtf, model.first_chunk_s, model.overhead_s) == (16, 0.6, 0.2, 0.0)
    assert abs(model.first_chunk_per_stream_s - 0.05) < 1e-9  # both points on one line


def test_a_heavier_step_simulates_a_longer_first_audio() -> None:
    model = calibrate.fit(
        {
            "params": {"orchestratorPerGpu": 4},
            "concurrency_profile": {"1": {"p50_first_chunk_ms": 200.0, "p50_rtf": 0.5}},
        }
    )
    light = sorted(calibrate.simulate_step(model, 0.2, 60.0, [8.0], s) for s in range(30))
    heavy = sorted(calibrate.simulate_step(model, 1.5, 60.0, [8.0], s) for s in range(30))
    assert light[15] < 0.5 < heavy[15]  # 4 slots of 4 s serve 1 req/s: 1.5 queues


sweep = _load("sweep")
loadgen = report.loadgen  # the module report.py imports (a dataclass needs sys.modules)


def _search(start: int, passes: set[int]) -> list[int]:
    """The rungs a point's steps run at when exactly the rungs in ``passes`` pass."""
    outcomes: dict[int, bool] = {}
    k: int | None = start
    ran: list[int] = []
    while k is not None:
        assert len(ran) < 20, "the search does not end"
        ran.append(k)
        outcomes[k] = k in passes
        k = sweep.next_rung(outcomes, k)
    return ran


def test_the_search_climbs_after_a_pass_until_the_rung_above_fails() -> None:
    assert _search(2, {-4, -3, -2, -1, 0, 1, 2, 3}) == [2, 3, 4]


def test_the_search_descends_after_a_failure_until_a_rung_passes() -> None:
    assert _search(2, {-4, -3, -2, -1, 0}) == [2, 1, 0]


def test_the_search_gives_up_below_the_lowest_rung() -> None:
    assert _search(0, set()) == [0, -1, -2, -3, -4]


def test_the_rungs_are_a_geometric_ladder_and_every_step_has_its_own_seed() -> None:
    assert sweep.rung_rate(0) == 0.4 and sweep.rung_rate(2) == 0.625
    assert all(sweep.rung(sweep.rung_rate(k)) == k for k in range(-4, 12))
    seeds = {sweep.step_seed(r, i) for r in (1, 2, 3) for i in range(20)}
    assert len(seeds) == 60  # a repeat replays no step's arrivals


def test_the_attainment_interval_and_the_misses_a_decision_allows() -> None:
    low, high = loadgen.wilson(99, 100)
    assert 0.95 < low < 0.99 < high <= 1.0
    assert loadgen.wilson(100, 100)[1] == 1.0
    assert loadgen.misses_allowed(100, 0.95) == 1  # 98 of 100: lower bound 0.941
    assert loadgen.wilson(98, 100)[0] < 0.95
    assert loadgen.misses_allowed(20, 0.95) == -1  # 20 requests cannot show 95 %
    assert loadgen.misses_allowed(200, 0.95) >= 4


def test_the_percentile_refuses_fewer_than_20_samples() -> None:
    with pytest.raises(loadgen.TooFewSamples):
        loadgen.percentile([float(x) for x in range(19)], 95)
    assert loadgen.percentile([float(x) for x in range(20)], 95) == 18.0
    assert loadgen.percentile_or_none([1.0] * 13, 95) is None


def test_a_searched_point_reports_its_decisive_steps_and_drops_the_samples() -> None:
    step = {"rate_rps": 0.625, "requests": 100, "samples": [[0, 0.3, 5, 8, 0]]}
    raw = {
        "name": "a",
        "params": {},
        "requests": 250,
        "lost_streams": 0,
        "steps": [step],
        "goodput_rps": 0.61,
        "goodput_rate_rps": 0.625,
        "bracketed": True,
        "decisive": {"passed": {"rate_rps": 0.625}, "failed_above": {"rate_rps": 0.7812}},
        "concurrency_profile": {"1": {"requests": 100, "samples": [[0, 0.3, 1, 1, 0]]}},
    }
    p = report.point(raw, 1000.0)
    assert p["goodput_interval_rps"] == [0.625, 0.7812] and p["error_rate"] == 0.0
    assert "samples" not in p["steps"][0] and "samples" not in p["concurrency_profile"]["1"]
