"""``bench/gpu/report.py``: goodput at SLO from a sweep's steps, and issue 13's summary."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def _ladder(outcomes: list[bool]) -> list[float]:
    """The fractions a point's steps run at, given whether each met the SLO."""
    fraction: float | None = sweep.UP[0]
    ran, passed = [], False
    for ok in outcomes:
        assert fraction is not None, "the ladder stopped before the outcomes ran out"
        ran.append(fraction)
        fraction = sweep.next_fraction(fraction, ok, passed)
        passed = passed or ok
    assert fraction is None, f"the ladder would go on to {fraction}"
    return ran


def test_the_ladder_climbs_from_0_6_until_the_slo_is_missed() -> None:
    assert _ladder([True, True, False]) == [0.6, 0.8, 0.95]
    assert _ladder([True, True, True, True]) == [0.6, 0.8, 0.95, 1.1]


def test_the_ladder_descends_when_0_6_misses_and_stops_at_the_first_pass() -> None:
    assert _ladder([False, False, True]) == [0.6, 0.45, 0.3]
    assert _ladder([False, False, False, False]) == [0.6, 0.45, 0.3, 0.15]


def test_every_rung_has_its_own_fixed_seed() -> None:
    assert len(set(sweep.SEEDS.values())) == len(sweep.UP) + len(sweep.DOWN)
    assert [sweep.SEEDS[f] for f in sweep.UP] == [10, 11, 12, 13]  # runs before the descent
