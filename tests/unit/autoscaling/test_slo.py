"""Issue 22's SLO sizing (spec.autoscaling.slo): the tail model, the forecast, the spec's
validation, and the policy's rows (sizing, no scale-down on missing data, one step per window)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math

import pytest

from cosyvoice_operator.api.spec import AutoscalingSpec, ScaleRule, SloSpec, SpecError, _slo
from cosyvoice_operator.autoscaling.assessment import _correlation_inflation, forecast
from cosyvoice_operator.autoscaling.policy import Fleet, Observation, Recommendation, decide
from cosyvoice_operator.autoscaling.queueing import (
    miss_probability,
    replicas_for_miss,
    wait_probability,
)
from tests.unit.autoscaling.slo_support import no_data, sample, slo_spec

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def spec(**slo: float) -> AutoscalingSpec:
    return slo_spec(slo)


def obs(t: dt.datetime, in_flight: float, completions: float, latency: float = 0.0) -> Observation:
    return sample(t, in_flight, completions, latency)


@pytest.mark.parametrize(
    ("load", "slots", "expected"),
    [(0.0, 4, 0.0), (4.0, 4, 1.0), (1.0, 1, 1.0), (0.5, 1, 0.5), (2.0, 4, 0.1739)],
)
def test_wait_probability_is_erlang_c(load: float, slots: int, expected: float) -> None:
    assert wait_probability(load, slots) == pytest.approx(expected, abs=1e-4)


def test_miss_probability_m_m_1_closed_form() -> None:
    # M/M/1: P(W > t) = rho * exp(-(1 - rho) t / s)
    assert miss_probability(0.5, 1, 2.0, 1.0) == pytest.approx(0.5 * math.exp(-0.25))


def test_lower_variability_needs_fewer_replicas() -> None:
    poisson = replicas_for_miss(80.0, 4, 3.0, 0.393, 0.01, 1.0)
    regular = replicas_for_miss(80.0, 4, 3.0, 0.393, 0.01, 0.2)
    assert regular < poisson
    assert miss_probability(80.0 / poisson, 4, 3.0, 0.393) <= 0.01
    assert miss_probability(80.0 / (poisson - 1), 4, 3.0, 0.393) > 0.01
    assert replicas_for_miss(0.0, 4, 3.0, 0.393, 0.01) == 0


def test_forecast_extends_a_rising_trend_and_never_a_falling_one() -> None:
    rising = tuple(
        Recommendation(T0 + dt.timedelta(seconds=15 * i), 1, arrivals=10.0 + i) for i in range(8)
    )
    now = T0 + dt.timedelta(seconds=120)
    f = forecast(18.0, rising, now, 180, 15)
    assert f.slope == pytest.approx(1 / 15)
    assert f.rate == pytest.approx(18.0 + 180 / 15)
    assert f.spread == pytest.approx(0.0, abs=1e-9)
    falling = tuple(
        Recommendation(T0 + dt.timedelta(seconds=15 * i), 1, arrivals=20.0 - i) for i in range(8)
    )
    g = forecast(12.0, falling, now, 180, 15)
    assert g.slope == 0.0
    assert g.rate == pytest.approx(12.0)
    assert forecast(5.0, (), now, 180, 15).rate == 5.0  # too few points: the demand now


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"firstAudioMilliseconds": -1}, "spec.autoscaling.slo.firstAudioMilliseconds"),
        ({"attainmentPercent": 100}, "spec.autoscaling.slo.attainmentPercent"),
        ({"forecastStdDevs": "2"}, "spec.autoscaling.slo.forecastStdDevs"),
        ({"variability": 0}, "spec.autoscaling.slo.variability"),
        (
            {"firstAudioMilliseconds": 1000, "firstChunkMilliseconds": 1000},
            "spec.autoscaling.slo.firstChunkMilliseconds",
        ),
    ],
)
def test_spec_refuses(raw: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=message.replace(".", r"\.")):
        _slo(raw)


def test_spec_defaults_are_off() -> None:
    assert _slo({}) == SloSpec()
    assert not SloSpec().enabled


def test_sizes_for_the_slo_and_says_why() -> None:
    # 40 pods, 80 requests in service at 3 s each: 26.7 requests/s.
    seen = (Recommendation(T0 - dt.timedelta(seconds=15), 40, slots_per_pod=4),)
    d = decide(spec(), obs(T0, 80.0, 80.0 / 3.0), Fleet(40, 40, 0), seen, T0)
    need = replicas_for_miss(80.0, 4, 3.0, 0.393, 0.01)
    assert d.inputs["sloReplicas"] == need
    assert d.replicas == need
    assert "keep 99 % of first audio within 1500 ms" in d.reason


def test_no_scale_down_on_missing_data() -> None:
    d = decide(spec(), no_data(T0), Fleet(60, 60, 0), (), T0)
    assert d.replicas == 60 and not d.metrics_available


def test_scale_down_one_step_per_window() -> None:
    s = spec()
    history: tuple[Recommendation, ...] = (
        Recommendation(T0 - dt.timedelta(seconds=15), 100, slots_per_pod=4),
    )
    fleet = Fleet(100, 100, 0)
    counts = []
    for i in range(60):  # 15 min of a steady 20 requests/s on 100 pods
        now = T0 + dt.timedelta(seconds=15 * i)
        d = decide(s, obs(now, 60.0, 20.0), fleet, history, now)
        history = d.history
        fleet = Fleet(d.replicas, d.replicas, 0)
        counts.append(d.replicas)
    changes = [b for a, b in itertools.pairwise(counts) if a != b]
    # one event, all at once, down to what keeps the miss within 90 % of the allowed 1 %
    assert changes == [replicas_for_miss(60.0, 4, 3.0, 0.393, 0.009)]
    assert changes[0] < 100 - 1  # several replicas in one step


def test_configured_slots_replace_the_measured_ones() -> None:
    # Measured at saturation as 2 (a line as long as what is in service): with slotsPerPod 4
    # the sizing uses 4.
    seen = (Recommendation(T0 - dt.timedelta(seconds=15), 40, slots_per_pod=2),)
    d = decide(spec(slots_per_pod=4), obs(T0, 80.0, 80.0 / 3.0), Fleet(40, 40, 0), seen, T0)
    assert d.inputs["sloSlotsPerPod"] == 4
    assert d.inputs["sloReplicas"] == replicas_for_miss(80.0, 4, 3.0, 0.393, 0.01)


def test_a_wait_longer_than_the_configured_variability_explains_raises_it() -> None:
    seen = (Recommendation(T0 - dt.timedelta(seconds=15), 40, slots_per_pod=4),)
    # 40 pods at 2 Erlangs each, 3 s requests: M/M/c predicts a mean wait of 209 ms.
    expected = 0.2087
    calm = decide(spec(variability=0.2), obs(T0, 80.0, 80.0 / 3.0, 0.0), Fleet(40, 40, 0), seen, T0)
    busy = decide(
        spec(variability=0.2),
        obs(T0, 80.0, 80.0 / 3.0, 0.5 * 1000 * expected),
        Fleet(40, 40, 0),
        seen,
        T0,
    )
    assert calm.inputs["variability"] == 0.2
    # about 0.5: the wait also takes requests out of service (Little's law), so a bit less
    assert 0.4 < float(busy.inputs["variability"]) < 0.6
    assert int(busy.inputs["sloReplicas"]) > int(calm.inputs["sloReplicas"])


def test_correlated_residuals_widen_the_trend_s_standard_error() -> None:
    assert _correlation_inflation([1.0, 1.0, 1.0, -1.0, -1.0, -1.0]) == pytest.approx(math.sqrt(3))
    assert _correlation_inflation([1.0, -1.0, 1.0, -1.0]) == 1.0  # negative: as independent
    assert _correlation_inflation([0.0, 0.0, 0.0]) == 1.0


def test_a_slow_wave_is_not_extended_as_a_trend() -> None:
    # The demand rises by 1/s per 15 s for a minute, then stays: read through 60 s rate
    # windows, the residuals are correlated; the trend must not be extended over 180 s.
    wave = [20.0, 20.5, 21.0, 21.5, 22.0, 22.5, 22.5, 22.5, 22.0, 21.5, 21.5, 22.0, 22.5, 23.0]
    kept = tuple(
        Recommendation(T0 + dt.timedelta(seconds=15 * i), 1, arrivals=v)
        for i, v in enumerate(wave[:-1])
    )
    f = forecast(wave[-1], kept, T0 + dt.timedelta(seconds=15 * (len(wave) - 1)), 180, 15)
    assert f.slope == 0.0 and f.rate < 24.0


@pytest.mark.parametrize(
    ("hysteresis", "in_force", "expected"),
    [
        (10.0, 140, 140),  # the model allows 136: 4 of 140 is under 10 % (14): hold
        (0.0, 140, 136),  # no hysteresis: the 4 go
        (10.0, 160, 136),  # 24 of 160 is over 10 % (16): one step to 136
    ],
)
def test_scale_down_hysteresis(hysteresis: float, in_force: int, expected: int) -> None:
    s = spec(scale_down_hysteresis_percent=hysteresis)
    history: tuple[Recommendation, ...] = (
        Recommendation(T0 - dt.timedelta(seconds=15), in_force, slots_per_pod=4),
    )
    fleet = Fleet(in_force, in_force, 0)
    counts = []
    for i in range(40):  # 10 min of a steady 40 requests/s of 3 s
        now = T0 + dt.timedelta(seconds=15 * i)
        d = decide(s, obs(now, 120.0, 40.0), fleet, history, now)
        history, fleet = d.history, Fleet(d.replicas, d.replicas, 0)
        counts.append(d.replicas)
    assert replicas_for_miss(120.0, 4, 3.0, 0.393, 0.009) == 136  # with the 10 % margin
    assert counts[-1] == expected
    assert len(set(counts)) <= 2  # at most one event
    if expected == in_force:
        assert "slo.scaleDownHysteresisPercent (10 %)" in d.reason


def test_a_confirmed_rise_is_sized_on_the_newest_recommendation() -> None:
    s = dataclasses.replace(spec(slots_per_pod=4), scale_up=ScaleRule(60, 1000))
    history: tuple[Recommendation, ...] = ()
    fleet = Fleet(140, 140, 0)
    rates = [40.0] * 4 + [44.0, 48.0, 52.0, 56.0, 60.0, 64.0]  # a rise held over a minute
    for i, rate in enumerate(rates):
        now = T0 + dt.timedelta(seconds=15 * i)
        d = decide(s, obs(now, 3.0 * rate, rate), fleet, history, now)
        history = d.history
        if d.replicas != fleet.current:
            break
    window = [r.replicas for r in history if r.time >= now - dt.timedelta(seconds=60)]
    assert min(window) > 140  # the first evaluation whose whole window is above 140
    # sized on the newest recommendation, not on the window's lowest: one event
    assert d.inputs["upRecommendation"] == d.inputs["rawRecommendation"] == window[-1]
    assert d.replicas == window[-1] > min(window)


def test_hysteresis_field_and_its_limits() -> None:
    assert SloSpec().scale_down_hysteresis_percent == 10.0
    assert _slo({"scaleDownHysteresisPercent": 0}).scale_down_hysteresis_percent == 0.0
    with pytest.raises(SpecError, match=r"spec\.autoscaling\.slo\.scaleDownHysteresisPercent"):
        _slo({"scaleDownHysteresisPercent": 51})
