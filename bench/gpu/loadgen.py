"""Open-loop streaming load against a Triton orchestrator, standard library only.

Each request is an HTTP ``generate_stream`` call (server-sent events, one per audio chunk)
to CosyVoice2's orchestrator with a ``target_text`` sized so that the stand-in LLM produces
the requested audio length (3 speech tokens per text byte, 25 tokens per second of audio).
Arrivals are Poisson at a fixed rate (open loop: a slow server does not slow the arrivals);
:func:`closed_loop` keeps N requests in flight instead, to find a capacity quickly.

Issue 32: a step is a number of requests, not a number of seconds (:func:`open_loop_requests`,
:func:`closed_loop_requests`), so every decision rests on a known sample; the SLO decision is
taken on the lower end of a binomial interval of the attainment (:func:`wilson`); and a
percentile of fewer than :data:`MIN_SAMPLES` values is refused (:func:`percentile`).
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOKEN_RATE = 25
MIN_SAMPLES = 20  # the fewest values a percentile is taken of (the 95th of 20 is their max)
TOKENS_PER_TEXT_BYTE = 3
MAX_AUDIO_SECONDS = 30.0  # upstream's max_tokens 750 at 25 Hz


@dataclass
class Result:
    audio_seconds: float
    sent: float
    first: float | None = None
    done: float | None = None
    chunks: int = 0
    error: str = ""

    @property
    def first_chunk_s(self) -> float | None:
        return None if self.first is None else self.first - self.sent


def audio_lengths(trace: Path, limit: int | None = None) -> list[float]:
    """Seconds of audio per request of a trace with a GeneratedTokens column (tokens / 25),
    capped at 30 s like upstream's 750-token limit."""
    with trace.open(newline="") as handle:
        rows = csv.DictReader(handle)
        out = [min(MAX_AUDIO_SECONDS, int(r["GeneratedTokens"]) / TOKEN_RATE) for r in rows]
    return out[:limit] if limit else out


def text_for(seconds: float) -> str:
    size = max(1, math.ceil(seconds * TOKEN_RATE / TOKENS_PER_TEXT_BYTE))
    return "a" * size


def reference_fields(seconds: float = 3.0, rate: int = 16000, seed: int = 7) -> str:
    """JSON members for a request's reference voice (``reference_wav`` at 16 kHz and its length;
    no ``reference_text``, which the orchestrator takes as empty), serialized once: every
    request of a run names the same voice, so the orchestrator's speaker cache computes it
    once, as for a service's few voices."""
    rng = random.Random(seed)
    n = int(seconds * rate)
    wav = [
        round(0.3 * math.sin(2 * math.pi * 220 * i / rate) + rng.gauss(0, 0.02), 4)
        for i in range(n)
    ]
    return json.dumps({"reference_wav": wav, "reference_wav_len": [n]})[1:-1]


REFERENCE = ""  # set by the sweep to reference_fields() when the orchestrator needs a voice


async def stream(
    host: str, port: int, model: str, seconds: float, limit_s: float, result: Result | None = None
) -> Result:
    """One streaming request; ``result`` (filled in place, so a caller sees its first chunk
    arrive while the stream goes on) or a new one."""
    if result is None:
        result = Result(seconds, time.monotonic())
    body = json.dumps({"target_text": text_for(seconds)}).encode()
    if REFERENCE:
        body = body[:-1] + b", " + REFERENCE.encode() + b"}"
    head = (
        f"POST /v2/models/{model}/generate_stream HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    writer = None
    try:
        async with asyncio.timeout(limit_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(head + body)
            await writer.drain()
            status = await reader.readline()
            if b" 200 " not in status:
                rest = await reader.read(2000)
                raise RuntimeError(f"{status.decode().strip()}: {rest.decode(errors='replace')}")
            chunked = False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                chunked |= line.lower().startswith(b"transfer-encoding: chunked")
            buffer = b""
            while True:
                if chunked:
                    size = int((await reader.readline()).strip() or b"0", 16)
                    if size == 0:
                        break
                    data = await reader.readexactly(size + 2)
                    buffer += data[:-2]
                else:
                    data = await reader.read(65536)
                    if not data:
                        break
                    buffer += data
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    if not event.startswith(b"data:"):
                        continue
                    payload = json.loads(event[5:])
                    if "error" in payload:
                        raise RuntimeError(str(payload["error"]))
                    result.chunks += 1
                    if result.first is None:
                        result.first = time.monotonic()
            if result.chunks == 0:
                raise RuntimeError("the stream ended without audio")
            result.done = time.monotonic()
    except TimeoutError:
        result.error = f"no end within {limit_s:.0f} s"
    except Exception as exc:  # reported in the results, never fatal to the run
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if writer is not None:
            writer.close()
    return result


async def open_loop(
    host: str,
    port: int,
    model: str,
    rate: float,
    duration: float,
    lengths: list[float],
    seed: int,
    limit_s: float = 120.0,
) -> list[Result]:
    """Poisson arrivals at ``rate`` per second for ``duration`` seconds; waits for every
    request to end (or time out)."""
    rng = random.Random(seed)
    tasks: list[asyncio.Task[Result]] = []
    start = time.monotonic()
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        if at >= duration:
            break
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        seconds = rng.choice(lengths)
        tasks.append(asyncio.create_task(stream(host, port, model, seconds, limit_s)))
    return list(await asyncio.gather(*tasks))


async def closed_loop(
    host: str,
    port: int,
    model: str,
    clients: int,
    duration: float,
    lengths: list[float],
    seed: int,
    limit_s: float = 120.0,
) -> list[Result]:
    rng = random.Random(seed)
    end = time.monotonic() + duration
    results: list[Result] = []

    async def client() -> None:
        while time.monotonic() < end:
            results.append(await stream(host, port, model, rng.choice(lengths), limit_s))

    await asyncio.gather(*(client() for _ in range(clients)))
    return results


async def open_loop_requests(
    host: str,
    port: int,
    model: str,
    rate: float,
    count: int,
    lengths: list[float],
    seed: int,
    slo_s: float,
    stop_after_misses: int | None = None,
    limit_s: float = 120.0,
) -> tuple[list[Result], float]:
    """``count`` Poisson arrivals at ``rate`` per second (open loop), or fewer when
    ``stop_after_misses`` misses (:func:`is_miss`, a request still waiting for its first
    chunk past the SLO included) have happened first: the step's decision is then already
    made. Waits for every request sent to end; returns them and the seconds of arrivals."""
    rng = random.Random(seed)
    results: list[Result] = []
    tasks: list[asyncio.Task[Result]] = []
    start = time.monotonic()
    at = 0.0
    for _ in range(count):
        at += rng.expovariate(rate)
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.monotonic()
        if stop_after_misses is not None and (
            sum(1 for r in results if is_miss(r, slo_s, now)) >= stop_after_misses
        ):
            break
        seconds = rng.choice(lengths)
        result = Result(seconds, now)
        results.append(result)
        tasks.append(asyncio.create_task(stream(host, port, model, seconds, limit_s, result)))
    span = time.monotonic() - start
    await asyncio.gather(*tasks)
    return results, span


async def closed_loop_requests(
    host: str,
    port: int,
    model: str,
    clients: int,
    count: int,
    lengths: list[float],
    seed: int,
    limit_s: float = 120.0,
) -> list[Result]:
    """``clients`` streams kept in flight until ``count`` requests have been sent; waits for
    them all. Every request is sent with ``clients - 1`` others in flight, apart from the
    last ``clients - 1`` (sent while the loop is winding down: they are left out)."""
    rng = random.Random(seed)
    results: list[Result] = []

    async def client() -> None:
        while len(results) < count + clients - 1:
            result = Result(rng.choice(lengths), time.monotonic())
            results.append(result)
            await stream(host, port, model, result.audio_seconds, limit_s, result)

    await asyncio.gather(*(client() for _ in range(clients)))
    return results[:count]


def in_flight_at_arrival(results: list[Result]) -> list[int]:
    """For each request, the others in flight (sent, not ended) when it was sent."""
    spans = [(r.sent, r.done if r.done is not None else math.inf) for r in results]
    return [sum(1 for s, e in spans if s < r.sent < e) for r in results]


class TooFewSamples(ValueError):
    """A percentile asked of fewer than :data:`MIN_SAMPLES` values."""


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile; refuses (:class:`TooFewSamples`) fewer than
    :data:`MIN_SAMPLES` values: the p95 of 13 values is their maximum, not a percentile."""
    if len(values) < MIN_SAMPLES:
        raise TooFewSamples(f"a percentile of {len(values)} values (fewer than {MIN_SAMPLES})")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def percentile_or_none(values: list[float], q: float) -> float | None:
    """:func:`percentile`, or None where it refuses (a summary's field left empty)."""
    return percentile(values, q) if len(values) >= MIN_SAMPLES else None


def wilson(good: int, n: int, z: float = 1.6449) -> tuple[float, float]:
    """Wilson's score interval of a binomial proportion ``good / n``; with the default ``z``
    the two-sided 90 % interval, whose lower end is the one-sided 95 % lower bound."""
    if n <= 0:
        return (0.0, 1.0)
    p = good / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def misses_allowed(n: int, target: float, z: float = 1.6449) -> int:
    """The most misses of ``n`` requests whose attainment's lower bound still reaches
    ``target`` (-1 when even none does): a step may stop at one miss more, its decision made."""
    allowed = -1
    for misses in range(n + 1):
        if wilson(n - misses, n, z)[0] < target:
            break
        allowed = misses
    return allowed


def is_miss(result: Result, slo_s: float, now: float | None = None) -> bool:
    """A request that failed, or whose first chunk came (or, at ``now``, has not yet come)
    later than ``slo_s`` after it was sent."""
    if result.error:
        return True
    if result.first is not None:
        return result.first - result.sent > slo_s
    return now is not None and now - result.sent > slo_s


def p95_counting_errors(results: list[Result]) -> float | None:
    """p95 of the first chunk with every failed request counted as never arriving (None when
    the 95th percentile falls on a failure): the SLO test, errors being misses."""
    ranked = sorted(
        math.inf if r.error or r.first_chunk_s is None else r.first_chunk_s for r in results
    )
    value = percentile_or_none(ranked, 95)
    return None if value is None or math.isinf(value) else value


def meets_slo(step: dict[str, Any], slo_ms: float) -> bool:
    """A load step meets the SLO when its p95 first chunk, failures counted as misses, is
    within the target. For steps recorded before that field existed, a conservative bound:
    no more failures than the 5% tail holds, and the p99 of the successes within target."""
    if "p95_first_chunk_ms_counting_errors" in step:
        p95 = step["p95_first_chunk_ms_counting_errors"]
        return p95 is not None and p95 <= slo_ms
    n, errors, p99 = step["requests"], step["errors"], step["p99_first_chunk_ms"]
    return bool(n) and errors <= n - math.ceil(0.95 * n) and p99 is not None and p99 <= slo_ms


def summarize(results: list[Result], duration: float, slo_s: float) -> dict[str, Any]:
    firsts = [r.first_chunk_s for r in results if not r.error and r.first_chunk_s is not None]
    totals = [r.done - r.sent for r in results if not r.error and r.done is not None]
    good = sum(1 for f in firsts if f <= slo_s)
    audio = sum(r.audio_seconds for r in results if not r.error)

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 1)

    low, high = wilson(good, len(results))
    return {
        "requests": len(results),
        "errors": sum(1 for r in results if r.error),
        "offered_rps": round(len(results) / duration, 3),
        "good_rps": round(good / duration, 3),
        "good_requests": good,
        "slo_attainment": round(good / len(results), 4) if results else None,
        "slo_attainment_wilson90": [round(low, 4), round(high, 4)],
        "audio_seconds_per_s": round(audio / duration, 2),
        "p50_first_chunk_ms": ms(percentile_or_none(firsts, 50)),
        "p95_first_chunk_ms": ms(percentile_or_none(firsts, 95)),
        "p99_first_chunk_ms": ms(percentile_or_none(firsts, 99)),
        "p95_first_chunk_ms_counting_errors": ms(p95_counting_errors(results)),
        "p50_total_ms": ms(percentile_or_none(totals, 50)),
        "p95_total_ms": ms(percentile_or_none(totals, 95)),
        "error_samples": sorted({r.error[:200] for r in results if r.error})[:3],
    }


def samples(results: list[Result], origin: float) -> list[list[Any]]:
    """Every request, compact (for the raw record and later fits): seconds from ``origin`` to
    its sending, its first chunk and its end after sending (None: none), its audio seconds,
    and whether it failed."""

    def after(t: float | None, sent: float) -> float | None:
        return None if t is None else round(t - sent, 4)

    return [
        [
            round(r.sent - origin, 3),
            after(r.first, r.sent),
            after(r.done, r.sent),
            r.audio_seconds,
            int(bool(r.error)),
        ]
        for r in results
    ]
