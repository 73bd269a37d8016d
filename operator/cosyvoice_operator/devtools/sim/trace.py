"""Traffic for the simulator: arrivals (seconds from the start) with seconds of audio each.

Everything here is pure and seeded: the same arguments give the same trace.

- `load_csv` reads any CSV (or gzipped CSV) with a ``TIMESTAMP`` column and a size column
  (for the Azure LLM trace, ``GeneratedTokens``: seconds of audio = tokens / 25).
- `split` cuts a trace in time (the first part for training, the rest for evaluation).
- `multiply` scales the load by a factor while keeping its minute-scale shape: each arrival
  is kept, and copies of it are added at random offsets within ``COPY_JITTER_S`` (so the
  copies do not arrive in lock-step, as independent users would not), with the audio length
  of a request drawn at random from the trace. A fractional factor adds a copy with that
  probability.
- `modulate` multiplies the load by a function of time the same way (steps, ramps, bursts).
- `diurnal_day` synthesizes 24 hours (or a week) from one trace (the method is in its
  docstring); `diurnal_envelope` gives its shape by hour, with the trough as a parameter
  (0.2 of the peak: the original day; 0.05: the deep-trough variant), and weekend days
  scaled by a factor (docs/benchmarks/autoscaling.md says where the shapes come from and
  which numbers are assumptions).
"""

from __future__ import annotations

import bisect
import csv
import datetime as dt
import gzip
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

# Copies made by `multiply` / `modulate` land within this many seconds of the original.
COPY_JITTER_S = 30.0
DAY_S = 86_400.0


class TraceError(ValueError):
    """A trace that cannot be used: the message names the file and what is wrong."""


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order: ``arrivals[i]`` seconds after the start, ``audio[i]`` seconds
    of audio to synthesize. ``outages`` are [start, end) intervals in which Prometheus has no
    data (scrapes lost, queries answer an empty result)."""

    name: str
    arrivals: tuple[float, ...]
    audio: tuple[float, ...]
    duration_s: float
    outages: tuple[tuple[float, float], ...] = field(default=())

    def __post_init__(self) -> None:
        if len(self.arrivals) != len(self.audio):
            raise ValueError("arrivals and audio differ in length")

    def __len__(self) -> int:
        return len(self.arrivals)

    def per_minute(self) -> list[int]:
        """Arrivals in each whole or partial minute."""
        counts = [0] * max(1, math.ceil(self.duration_s / 60.0))
        for t in self.arrivals:
            counts[min(len(counts) - 1, int(t // 60))] += 1
        return counts


def _parse_time(value: str, where: str) -> float:
    text = value.strip()
    if text.replace(".", "", 1).isdigit():
        return float(text)  # already seconds
    # Python's fromisoformat takes at most 6 fractional digits; the Azure trace has 7.
    if "." in text:
        head, frac = text.split(".", 1)
        digits = "".join(c for c in frac if c.isdigit())
        rest = frac[len(digits) :]
        text = f"{head}.{digits[:6].ljust(6, '0')}{rest}"
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise TraceError(f"{where}: TIMESTAMP {value!r} is neither seconds nor ISO 8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def load_csv(
    path: str | Path, size_column: str = "GeneratedTokens", size_per_second: float = 25.0
) -> Trace:
    """A trace from a CSV file: arrivals from ``TIMESTAMP`` (ISO 8601 or seconds), seconds of
    audio = ``size_column`` / ``size_per_second``. Raises `TraceError` with the file name and
    the line for a missing file, a missing column or a value that cannot be read."""
    source = Path(path)
    try:
        handle: TextIO = (
            gzip.open(source, "rt", newline="")  # noqa: SIM115 (closed by the with below)
            if source.suffix == ".gz"
            else source.open(newline="")
        )
    except OSError as exc:
        raise TraceError(f"{source}: cannot read the trace: {exc.strerror}") from None
    times: list[float] = []
    sizes: list[float] = []
    with handle:
        reader = csv.DictReader(handle)
        columns = reader.fieldnames or []
        for needed in ("TIMESTAMP", size_column):
            if needed not in columns:
                raise TraceError(
                    f"{source}: no {needed} column (columns: {', '.join(columns) or 'none'}); "
                    "a trace needs TIMESTAMP and a size column (--size-column)"
                )
        for line, row in enumerate(reader, start=2):
            where = f"{source}:{line}"
            times.append(_parse_time(row["TIMESTAMP"] or "", where))
            try:
                size = float(row[size_column] or "")
            except ValueError:
                raise TraceError(
                    f"{where}: {size_column} {row[size_column]!r} is not a number"
                ) from None
            if not math.isfinite(size) or size < 0:
                raise TraceError(f"{where}: {size_column} must be a finite number >= 0")
            sizes.append(size / size_per_second)
    if not times:
        raise TraceError(f"{source}: the trace has no rows")
    order = sorted(range(len(times)), key=times.__getitem__)
    start = times[order[0]]
    arrivals = tuple(times[i] - start for i in order)
    audio = tuple(max(sizes[i], 0.04) for i in order)  # at least one speech token of audio
    name = source.name.removesuffix(".gz")  # the same trace, compressed or not
    return Trace(name, arrivals, audio, duration_s=arrivals[-1] + 1.0)


def split(trace: Trace, fraction: float = 0.5) -> tuple[Trace, Trace]:
    """The trace cut in time at ``fraction`` of its duration: (before, after), the second
    re-based to start at 0. Named ``NAME#train`` and ``NAME#eval``."""
    cut = trace.duration_s * fraction
    k = bisect.bisect_left(trace.arrivals, cut)
    first = Trace(f"{trace.name}#train", trace.arrivals[:k], trace.audio[:k], cut)
    second = Trace(
        f"{trace.name}#eval",
        tuple(t - cut for t in trace.arrivals[k:]),
        trace.audio[k:],
        trace.duration_s - cut,
    )
    return first, second


def modulate(
    trace: Trace, factor: Callable[[float], float], seed: int, name: str | None = None
) -> Trace:
    """Each arrival at ``t`` kept ``floor(f)`` times plus once more with probability
    ``f - floor(f)`` (``f = factor(t)``); copies beyond the original land within
    ``COPY_JITTER_S`` of it and take an audio length drawn from the trace."""
    rng = random.Random(seed)
    pool = trace.audio
    out: list[tuple[float, float]] = []
    for t, audio in zip(trace.arrivals, trace.audio, strict=True):
        f = max(0.0, factor(t))
        copies = int(f) + (1 if rng.random() < f - int(f) else 0)
        for j in range(copies):
            if j == 0:
                out.append((t, audio))
            else:
                moved = t + rng.uniform(-COPY_JITTER_S, COPY_JITTER_S)
                out.append((min(max(moved, 0.0), trace.duration_s), rng.choice(pool)))
    out.sort()
    return Trace(
        name or trace.name,
        tuple(a for a, _ in out),
        tuple(s for _, s in out),
        trace.duration_s,
        trace.outages,
    )


def multiply(trace: Trace, factor: float, seed: int) -> Trace:
    """The load times ``factor`` (see `modulate`), same name."""
    return modulate(trace, lambda _t: factor, seed)


def step(at_s: float, before: float, after: float) -> Callable[[float], float]:
    return lambda t: before if t < at_s else after


def burst(start_s: float, length_s: float, height: float) -> Callable[[float], float]:
    return lambda t: height if start_s <= t < start_s + length_s else 1.0


def ramp(start_s: float, end_s: float, low: float, high: float) -> Callable[[float], float]:
    def f(t: float) -> float:
        if t <= start_s:
            return low
        if t >= end_s:
            return high
        return low + (high - low) * (t - start_s) / (end_s - start_s)

    return f


def with_outage(trace: Trace, start_s: float, length_s: float, name: str | None = None) -> Trace:
    return replace(
        trace,
        name=name or trace.name,
        outages=(*trace.outages, (start_s, start_s + length_s)),
    )


def _envelope_raw(hour: float) -> float:
    x = 2.0 * math.pi * (hour - 4.0) / 24.0
    return 0.5 - 0.42 * math.cos(x) - 0.12 * math.cos(2.0 * x)


_ENVELOPE_LOW = _envelope_raw(4.0)
_ENVELOPE_HIGH = max(_envelope_raw(h / 10.0) for h in range(240))


def diurnal_envelope(hour: float, trough: float = 0.2) -> float:
    """Relative load by hour of the day, 1.0 at the peak: ``trough`` (0.2 by default) at
    04:00, a steep morning rise, a plateau through the afternoon, an evening decline (the
    shape of conversational services' days; two harmonics)."""
    raw = _envelope_raw(hour)
    return trough + (1.0 - trough) * (raw - _ENVELOPE_LOW) / (_ENVELOPE_HIGH - _ENVELOPE_LOW)


def week_factor(day: int, weekend: float) -> float:
    """The load of day ``day`` (0 is a Monday) relative to a weekday: ``weekend`` on
    Saturdays and Sundays."""
    return weekend if day % 7 >= 5 else 1.0


def diurnal_day(
    source: Trace,
    seed: int,
    peak_factor: float = 1.0,
    block_minutes: int = 10,
    name: str = "diurnal-day",
    trough: float = 0.2,
    days: int = 1,
    weekend: float = 1.0,
) -> Trace:
    """24 hours (``days`` of them, the first a Monday) built from ``source``'s burst
    structure.

    Method: the source's per-minute counts (whole minutes only) divided by their mean give
    its minute-scale burst ratios. The day's minute ``m`` has
    ``round(mean * peak_factor * envelope(m) * week(m) * ratio(m))`` arrivals, where
    ``envelope`` is `diurnal_envelope` with ``trough``, ``week`` is `week_factor` with
    ``weekend`` and ``ratio`` comes from a block bootstrap of the source's ratios
    (blocks of ``block_minutes`` consecutive minutes, random starts) so that bursts keep
    their length. Inside a minute, arrivals are placed at offsets drawn from a random source
    minute's own offsets (with 0.5 s of jitter), so the seconds-scale clumping is the
    source's too; audio lengths are drawn from the source. At ``peak_factor`` 1 the peak
    hour carries the source's mean load."""
    rng = random.Random(seed)
    counts = source.per_minute()
    whole = int(source.duration_s // 60)
    counts = counts[:whole] if whole else counts
    mean = sum(counts) / len(counts)
    ratios = [c / mean for c in counts]
    offsets: list[list[float]] = [[] for _ in counts]
    for t in source.arrivals:
        m = int(t // 60)
        if m < len(offsets):
            offsets[m].append(t - 60 * m)
    usable = [o for o in offsets if o] or [[30.0]]
    block = max(1, min(block_minutes, len(ratios)))
    minutes = 1440 * days
    day_ratios: list[float] = []
    while len(day_ratios) < minutes:
        begin = rng.randrange(0, len(ratios) - block + 1)
        day_ratios.extend(ratios[begin : begin + block])
    arrivals: list[float] = []
    audio: list[float] = []
    for m in range(minutes):
        shape = diurnal_envelope((m % 1440) / 60.0, trough) * week_factor(m // 1440, weekend)
        level = mean * peak_factor * shape * day_ratios[m]
        n = int(level) + (1 if rng.random() < level - int(level) else 0)
        pattern = rng.choice(usable)
        for _ in range(n):
            offset = rng.choice(pattern) + rng.uniform(-0.5, 0.5)
            arrivals.append(60.0 * m + min(max(offset, 0.0), 59.999))
            audio.append(rng.choice(source.audio))
    order = sorted(range(len(arrivals)), key=arrivals.__getitem__)
    return Trace(
        name,
        tuple(arrivals[i] for i in order),
        tuple(audio[i] for i in order),
        DAY_S * days,
    )


def offered_load(
    trace: Trace, service_seconds: Callable[[float], float], start: float, end: float
) -> float:
    """Mean requests in service (Erlangs) offered by the arrivals in [start, end)."""
    lo = bisect.bisect_left(trace.arrivals, start)
    hi = bisect.bisect_left(trace.arrivals, end)
    work = sum(service_seconds(a) for a in trace.audio[lo:hi])
    return work / max(end - start, 1e-9)
