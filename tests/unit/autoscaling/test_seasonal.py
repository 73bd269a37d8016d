"""Issue 22, item 2: the seasonal profile (`autoscaling.seasonal`) and the foresight it gives
SLO sizing (rule 9), tested against the demand's own future: a profile learned on one day
sizes the next day's morning ramp a cold start early, where the short-term trend alone is
late; a floor at what the last period needed; no data keeps the profile and never scales
down; a scale-down removes several replicas at once only with the 10 % margin."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable

import pytest

from cosyvoice_operator.api.spec import AutoscalingSpec, SloSpec, SpecError, _slo
from cosyvoice_operator.autoscaling.policy import Fleet, Observation, Recommendation, decide
from cosyvoice_operator.autoscaling.queueing import replicas_for_miss
from cosyvoice_operator.autoscaling.seasonal import Bucket, Season, bucket_start, outlook, record
from tests.unit.autoscaling.slo_support import no_data, sample, slo_spec

T0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)  # midnight UTC
DAY = 86_400
S = 3.0  # seconds per request


def spec(**slo: float) -> AutoscalingSpec:
    """A 24-hour profile, variability 0.2, the pod's 4 slots, steps of any size."""
    values: dict[str, float] = {"variability": 0.2, "slots_per_pod": 4, "seasonal_period_hours": 24}
    return slo_spec(values | slo, up_step=1000)


def at(rate: float, t: dt.datetime) -> Observation:
    """`rate` requests/s of 3 s each, no wait."""
    return sample(t, rate * S, rate)


def ramp(seconds: float) -> float:
    """Requests/s by time of day: 2 at night, 30 from 09:00, a linear ramp from 08:00."""
    hour = (seconds % DAY) / 3600.0
    return 2.0 if hour < 8 else 30.0 if hour >= 9 else 2.0 + 28.0 * (hour - 8.0)


@pytest.mark.parametrize(
    ("moment", "bucket", "start"),
    [
        (T0 + dt.timedelta(minutes=14, seconds=59), 900, T0),
        (T0 + dt.timedelta(minutes=15), 900, T0 + dt.timedelta(minutes=15)),
        (T0 + dt.timedelta(hours=5, minutes=59), 3600, T0 + dt.timedelta(hours=5)),
    ],
)
def test_buckets_are_aligned_to_the_epoch(
    moment: dt.datetime, bucket: int, start: dt.datetime
) -> None:
    assert bucket_start(moment, bucket) == start


def test_record_averages_a_bucket_and_forgets_after_a_period() -> None:
    season = record((), T0, 4.0, DAY, 900)
    season = record(season, T0 + dt.timedelta(seconds=15), 8.0, DAY, 900)
    assert season == (Bucket(T0, 12.0, 2),) and season[0].mean == 6.0
    later = record(season, T0 + dt.timedelta(seconds=DAY + 1800), 1.0, DAY, 900)
    assert [b.start for b in later] == [T0, T0 + dt.timedelta(seconds=DAY + 1800)]
    gone = record(later, T0 + dt.timedelta(seconds=DAY + 1801 + 900), 1.0, DAY, 900)
    assert T0 not in [b.start for b in gone]


def test_outlook_reads_one_period_back_and_needs_every_bucket() -> None:
    season: Season = ()
    for minute in range(0, 60, 5):
        season = record(season, T0 + dt.timedelta(minutes=minute), float(minute), DAY, 900)
    now = T0 + dt.timedelta(seconds=DAY)
    o = outlook(season, now, 1200, DAY, 900)  # buckets 00:00 and 00:15 of yesterday
    assert o is not None
    assert (o.now, o.ahead) == (5.0, 20.0)  # means of 0,5,10 and of 15,20,25
    assert outlook(season, now + dt.timedelta(hours=2), 180, DAY, 900) is None  # no bucket


def test_spec_fields_and_their_limits() -> None:
    assert (SloSpec().seasonal_period_hours, SloSpec().seasonal_bucket_minutes) == (0, 15)
    assert _slo({"seasonalPeriodHours": 168}).seasonal_period_hours == 168
    for raw in ({"seasonalPeriodHours": 169}, {"seasonalBucketMinutes": 0}):
        with pytest.raises(SpecError, match=r"spec\.autoscaling\.slo\.seasonal"):
            _slo(raw)
    with pytest.raises(SpecError, match="seasonalFloorPercent"):
        _slo({"seasonalFloorPercent": 201})


def run_days(
    s: AutoscalingSpec, days: int, rate: Callable[[float], float] = ramp
) -> list[tuple[float, int, int]]:
    """The policy every 15 s over `days` of `rate` on a fleet that has what it asks for at
    once: (seconds, replicas, replicas the demand a cold start later needs)."""
    f = rate
    history: tuple[Recommendation, ...] = ()
    fleet = Fleet(2, 2, 0)
    out = []
    for i in range(days * DAY // 15):
        t = 15.0 * i
        now = T0 + dt.timedelta(seconds=t)
        d = decide(s, at(f(t), now), fleet, history, now)
        history = d.history
        fleet = Fleet(d.replicas, d.replicas, 0)
        later = f(t + s.slo.cold_start_seconds)
        out.append((t, d.replicas, replicas_for_miss(later * S, 4, S, 0.393, 0.01, 0.2)))
    return out


def short_on_the_ramp(runs: list[tuple[float, int, int]], day: int) -> int:
    """Evaluations of `day` between 07:50 and 09:00 whose fleet is short of what the demand a
    cold start later needs."""
    lo, hi = day * DAY + 7 * 3600 + 3000, day * DAY + 9 * 3600
    return sum(1 for t, have, need in runs if lo <= t < hi and have < need)


def test_a_profile_learned_yesterday_sizes_todays_ramp_a_cold_start_early() -> None:
    plain = run_days(spec(seasonal_period_hours=0), 2)
    seasonal = run_days(spec(), 2)
    # Day 1: no profile yet, both are late on the ramp the same way.
    assert short_on_the_ramp(seasonal, 0) == short_on_the_ramp(plain, 0) > 0
    # Day 2 (the profile's future): the seasonal fleet is never short, the plain one is.
    assert short_on_the_ramp(plain, 1) > 0
    assert short_on_the_ramp(seasonal, 1) == 0


def test_the_floor_holds_what_the_last_period_needed() -> None:
    def quiet_day_two(t: float) -> float:
        return ramp(t) if t < DAY else 0.5 * ramp(t)  # day 2 at half of day 1

    def noon(runs: list[tuple[float, int, int]]) -> int:
        return next(n for t, n, _ in runs if t == DAY + 12 * 3600)

    half = run_days(spec(seasonal_floor_percent=50), 2, quiet_day_two)
    full = run_days(spec(seasonal_floor_percent=100), 2, quiet_day_two)
    none = run_days(spec(seasonal_floor_percent=0), 2, quiet_day_two)
    need_30 = replicas_for_miss(30 * S, 4, S, 0.393, 0.009, 0.2)
    need_15 = replicas_for_miss(15 * S, 4, S, 0.393, 0.009, 0.2)
    assert noon(full) >= need_30 - 1  # yesterday's noon (its margin aside)
    assert need_15 <= noon(half) <= noon(full)
    assert noon(none) <= noon(half)


def test_no_data_keeps_the_profile_and_the_count() -> None:
    s = spec()
    history: tuple[Recommendation, ...] = ()
    fleet = Fleet(2, 2, 0)
    for i in range(DAY // 15):
        now = T0 + dt.timedelta(seconds=15 * i)
        d = decide(s, at(ramp(15.0 * i), now), fleet, history, now)
        history, fleet = d.history, Fleet(d.replicas, d.replicas, 0)
    outage = T0 + dt.timedelta(seconds=DAY)
    for k in range(120):  # 30 minutes without data: longer than every window
        moment = outage + dt.timedelta(seconds=15 * k)
        d = decide(s, no_data(moment), fleet, history, moment)
        assert d.replicas == fleet.current and not d.metrics_available
        history = d.history
    assert any(r.season for r in history)
    back = T0 + dt.timedelta(seconds=DAY + 7 * 3600 + 3540)  # 07:59: the ramp a cold start on
    d = decide(s, at(2.0, back), fleet, history, back)
    assert float(d.inputs["seasonalAhead"]) > 2.0
    assert "seasonal: the last 24 h saw" in d.reason
    assert math.isclose(float(d.inputs["seasonalNow"]), 2.0)
