"""``cosyvoice-operator sim --pod``: which pod the benchmark simulates, and overrides."""

from __future__ import annotations

import argparse

import pytest

from cosyvoice_operator.api import pod_profiles
from cosyvoice_operator.devtools.sim import command


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_parser(parser.add_subparsers())
    return parser.parse_args(["sim", *argv])


def test_without_pod_options_it_is_upstreams_l20() -> None:
    model = command.service_model(parse())
    assert (model.pod, model.slots, model.rtf, model.first_chunk_busy_ms) == ("L20", 4, 0.37, 1107)
    assert model.source == pod_profiles.UPSTREAM_L20.source


def test_a_measured_pod_is_taken_whole() -> None:
    measured = pod_profiles.measured()
    if not measured:
        pytest.fail("api/pod_profiles.json holds no measured pod (bench/gpu/calibrate.py)")
    name, profile = sorted(measured.items())[0]
    model = command.service_model(parse("--pod", name))
    assert (model.pod, model.slots, model.rtf) == (name, profile.slots, profile.rtf)
    assert model.first_chunk_busy_ms == profile.first_chunk_busy_ms
    assert model.source == profile.source


def test_given_figures_override_the_pod_and_are_named_in_its_source() -> None:
    model = command.service_model(parse("--slots", "8", "--first-chunk-per-stream", "0.1"))
    assert (model.slots, model.first_chunk_per_stream_s, model.rtf) == (8, 0.1, 0.37)
    assert model.first_chunk_busy_ms == round(1000 * (0.22 + 0.1 * 7))
    assert "slots=8" in model.source and "first_chunk_per_stream_s=0.1" in model.source


def test_an_unknown_pod_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match=r"--pod B300: no pod profile .B300.; known: .*L20"):
        command.service_model(parse("--pod", "B300"))


def test_a_pod_whose_busy_first_chunk_exceeds_the_slo_is_refused_before_any_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse("--first-chunk", "1.0", "--slo", "1.5")
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "error: the L20 pod's first chunk with all 4 slots busy is 1888 ms" in err
    assert "raise --slo" in err


def test_requests_per_pod_targets_scale_with_the_pods_slots() -> None:
    from cosyvoice_operator.devtools.sim import experiment as ex
    from cosyvoice_operator.devtools.sim.plant import ServiceModel

    def targets(points: list[tuple[str, dict[str, float]]], policy: str) -> list[float]:
        return sorted({p["target"] for name, p in points if name == policy})

    l20 = ex.sweep_points(ex.Sweep(), 20.0, None, ServiceModel().slo_sizing(1.5))
    bare = ex.sweep_points(ex.Sweep(), 20.0)
    assert l20 == bare  # the L20 pod's grid is the grid every earlier run was keyed by
    assert targets(l20, "keda") == [1.5, 2.0, 2.5, 3.0, 3.5]
    sixteen = ServiceModel(slots=16, first_chunk_busy_ms=1689).slo_sizing(2.0)
    big = ex.sweep_points(ex.Sweep(), 20.0, None, sixteen)
    for policy in ("hpa-concurrency", "keda", "kpa"):
        assert targets(big, policy) == [6.0, 8.0, 10.0, 12.0, 14.0]
    assert targets(big, "keda-fallback") == [6.0, 8.0, 10.0]
    assert targets(big, "llmd") == targets(l20, "llmd")  # a ratio to the SLO: no slots in it
    assert targets(big, "hpa") == targets(l20, "hpa")  # milliseconds of queue time


def test_llm_ds_rule_divides_by_the_simulations_slo() -> None:
    from cosyvoice_operator.devtools.sim import policies

    params = {"target": 0.75, "min_replicas": 1, "down_window_s": 300}
    assert policies.make("llmd", params).slo_s == 1.5  # type: ignore[attr-defined]
    assert policies.make("llmd", params, 2.0).slo_s == 2.0  # type: ignore[attr-defined]


def test_the_traces_without_a_sweep_run_ours_as_chosen_even_an_slo_point() -> None:
    from cosyvoice_operator.devtools.sim import experiment as ex

    sweep = ex.Sweep()
    points = ex.sweep_points(sweep, 20.0)
    slo_points = [p for name, p in points if name == "cosyvoice" and "slo_ms" in p]
    chosen_slo = next(p for p in slo_points if p["variability"] == 0.15)  # not a later one
    chosen = {"cosyvoice": chosen_slo, "hpa": {"target": 50.0}, "keda": {"target": 2.0}}
    later = ex.later_configs(chosen, points, sweep)
    assert ("cosyvoice", chosen_slo) in later  # before: left out, so ours had no row there
    assert ("hpa", {"target": 50.0}) not in later  # Sweep.later_skip
    ours = [p for name, p in later if name == "cosyvoice"]
    assert len(ours) == len({ex._key(p) for p in ours})  # each once
    assert {p["variability"] for p in ours} == {0.15, *sweep.later_variability}
    # a chosen SLO point that is also a later one runs once
    at_later = next(p for p in slo_points if p["variability"] == 0.2)
    again = ex.later_configs({"cosyvoice": at_later}, points, sweep)
    assert again.count(("cosyvoice", at_later)) == 1
