"""The seasonal profile of SLO sizing (issue 22, ``spec.autoscaling.slo.seasonal*``): what the
service's own demand was one period ago (a day, a week) at this time of day, learned from
its history and used for foresight over the next cold start (pure).

The demand seen at each evaluation (requests/s) is averaged into buckets of
``seasonalBucketMinutes``, aligned to the Unix epoch in UTC (so a 24-hour period repeats at
the same UTC time of day; daylight saving is not followed), and kept for one period and
two buckets. `outlook` reads, one period back:

- ``now``: the bucket holding ``now - period`` (the level the last period had at this time);
- ``ahead``: the highest bucket mean over ``[now - period, now - period + horizon]`` (what
  the last period needed at this time of day over the next cold start).

`policy` turns them into a seasonal forecast, ``demand now x ahead / now`` (the last period's
rise applied to today's level: the morning ramp is foreseen a cold start early), and a floor,
``floorPercent`` % of ``ahead`` (never below what the last period needed at this time of day).
A bucket with no sample (an outage, an operator restart: the profile lives in memory) is
missing, and a missing bucket gives no outlook: no data, no seasonal term.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Bucket:
    start: dt.datetime  # aware, UTC; a multiple of the bucket length since the epoch
    total: float  # demand summed over the samples, requests/s
    samples: int

    @property
    def mean(self) -> float:
        return self.total / self.samples if self.samples else 0.0


Season = tuple[Bucket, ...]


@dataclass(frozen=True)
class Outlook:
    now: float  # mean demand one period ago, in the bucket holding now - period
    ahead: float  # highest bucket mean over [now - period, now - period + horizon]


def bucket_start(moment: dt.datetime, bucket_seconds: int) -> dt.datetime:
    elapsed = int((moment - EPOCH).total_seconds())
    return EPOCH + dt.timedelta(seconds=elapsed - elapsed % bucket_seconds)


def record(
    season: Season, now: dt.datetime, demand: float, period_seconds: int, bucket_seconds: int
) -> Season:
    """``season`` with one more sample of ``demand`` at ``now``, buckets older than a period
    and two buckets dropped (the newest last)."""
    start = bucket_start(now, bucket_seconds)
    oldest = start - dt.timedelta(seconds=period_seconds + 2 * bucket_seconds)
    kept = [b for b in season if oldest <= b.start < start]
    same = [b for b in season if b.start == start]
    if same:
        b = same[0]
        kept.append(Bucket(start, b.total + demand, b.samples + 1))
    else:
        kept.append(Bucket(start, demand, 1))
    return tuple(kept)


def outlook(
    season: Season,
    now: dt.datetime,
    horizon_seconds: int,
    period_seconds: int,
    bucket_seconds: int,
) -> Outlook | None:
    """What the last period saw at this time of day and over the next ``horizon_seconds``;
    None when a bucket of that stretch has no sample."""
    back = now - dt.timedelta(seconds=period_seconds)
    first = bucket_start(back, bucket_seconds)
    last = bucket_start(back + dt.timedelta(seconds=horizon_seconds), bucket_seconds)
    by_start = {b.start: b for b in season if b.samples > 0}
    means: list[float] = []
    moment = first
    while moment <= last:
        bucket = by_start.get(moment)
        if bucket is None:
            return None
        means.append(bucket.mean)
        moment += dt.timedelta(seconds=bucket_seconds)
    return Outlook(now=means[0], ahead=max(means))
