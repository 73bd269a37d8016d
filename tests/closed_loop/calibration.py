"""A self-check of the simulator's queueing code against a fixed-hold twin (issue 10).

What it is, and is not: the twin's LLM stand-in streams every answer over the same fixed time
whatever the concurrency (``cpu_twin``), and the simulator replays the very same arrival
times through FIFO slots with that fixed hold. Agreement therefore shows that the simulator's
queueing (slots, FIFO order, the first chunk's offset, the measured overheads) computes what
a real Triton's queue in front of our orchestrator does with the same requests; it does not
show that the per-replica model predicts a GPU pod (that takes GPU runs held out from the
fit). Audit 2026-12-06, F2.

One ``tritonserver`` (CosyVoice3's CPU twin, through :class:`PodServers`) is measured in
three steps, with :class:`LoadGenerator`'s streaming gRPC requests:

1. overhead: one request at a time; what a request takes beyond the service time asked for
   (``service_seconds``: the project's orchestrator streams the stand-in LLM's answer over
   that time, its first audio after ``firstChunkTokens`` of it);
2. streams: many requests at once; completions per second times the time each takes gives
   the streams the pod serves concurrently (the orchestrator's instances);
3. agreement: Poisson arrivals at a given rate; the same arrival times go through the
   simulator's `Plant` with the measured model, and the first-audio p95 of both is compared,
   with the real p95's distribution-free 95 % confidence interval (order statistics,
   :func:`quantile_interval`) for how far a p95 of that many requests can be trusted.

The twin holds each request for a fixed time whatever its text, so its RTF is that hold over
the audio its stand-ins produce for the text sent (CosyVoice3's rule: 3 speech tokens per
character of reference and target text, 25 tokens a second).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosyvoice_operator.devtools.closedloop.harness import PodServers
from cosyvoice_operator.devtools.closedloop.load import DEFAULT_TEXT, LoadGenerator, RequestRecord
from cosyvoice_operator.devtools.sim.engine import percentile
from cosyvoice_operator.devtools.sim.plant import Plant, ServiceModel
from cosyvoice_operator.render import triton
from tests.triton_twin.test_twin import service, speech_tokens

VARIANT = "cosyvoice3"


@dataclass(frozen=True)
class Agreement:
    rate_per_s: float
    seconds: float
    requests: int
    real_p95_s: float
    sim_p95_s: float
    real_p50_s: float
    sim_p50_s: float
    # The real p95's 95 % confidence interval (quantile_interval); None: too few requests.
    real_p95_interval_s: tuple[float, float] | None = None

    @property
    def gap(self) -> float:
        """(sim - real) / real of the p95."""
        return (self.sim_p95_s - self.real_p95_s) / self.real_p95_s


@dataclass(frozen=True)
class Calibration:
    service_seconds: float
    instances: int  # what the rendered repository gives the orchestrator (capped)
    streams: int  # measured
    first_chunk_overhead_s: float
    total_overhead_s: float
    audio_s: float  # of the text sent
    rtf: float  # per stream: time held per second of audio
    model: ServiceModel
    agreements: tuple[Agreement, ...]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for a, agreement in zip(doc["agreements"], self.agreements, strict=True):
            a["p95_gap"] = round(agreement.gap, 4)
        return doc


def quantile_interval(
    ordered: list[float], q: float, confidence: float = 0.95
) -> tuple[float, float] | None:
    """A distribution-free ``confidence`` interval for the ``q``-quantile of the population
    the sorted sample ``ordered`` was drawn from: the order statistics X(r) <= X(s) with
    P(B < r) and P(B >= s) each at most (1 - confidence) / 2, B ~ Binomial(n, q) (the count
    of draws below the quantile). None when n is too small for either end (for the p95 at
    95 %, fewer than 72 values: even the maximum is below the p95 more than 2.5 % of the time).
    """
    n = len(ordered)
    tail = (1.0 - confidence) / 2.0
    pmf = [math.comb(n, k) * q**k * (1.0 - q) ** (n - k) for k in range(n + 1)]
    below = 0.0  # P(B <= r - 1)
    r = 0
    while r < n and below + pmf[r] <= tail:
        below += pmf[r]
        r += 1
    above = 0.0  # P(B >= s)
    s = n + 1
    while s > 1 and above + pmf[s - 1] <= tail:
        above += pmf[s - 1]
        s -= 1
    if r < 1 or s > n:
        return None
    return ordered[r - 1], ordered[s - 1]


def _ok(records: list[RequestRecord]) -> list[RequestRecord]:
    return [r for r in records if r.ok and r.first_chunk_s is not None and r.total_s is not None]


def simulate_same_arrivals(
    model: ServiceModel, records: list[RequestRecord], audio: float
) -> list[float]:
    """First-audio latencies of the same arrivals through one simulated pod."""
    plant = Plant(model, cold_start_s=0.0, initial_ready=1, give_up_s=1e9)
    plant.tick(0.0)
    start = min(r.started for r in records)
    return [
        plant.dispatch(r.started - start, audio) for r in sorted(records, key=lambda r: r.started)
    ]


def calibrate(
    work: Path,
    service_seconds: float = 1.0,
    max_instances: int = 2,
    rates: tuple[float, ...] = (1.2,),
    seconds: float = 40.0,
    seed: int = 7,
) -> Calibration:
    svc = service(VARIANT)
    audio = speech_tokens(VARIANT, DEFAULT_TEXT) / 25.0
    instances = min(triton.orchestrator_instances(svc), max_instances)
    servers = PodServers(
        svc,
        work / "pods",
        work / "targets.json",
        namespace="calibration",
        pods=lambda: ["replica-0"],
        service_seconds=service_seconds,
        max_instances=max_instances,
    )
    with servers:
        servers.wait_live(["replica-0"], timeout=120)
        with LoadGenerator(servers.grpc_urls, servers.model, seed=seed) as load:
            load.set_concurrency(1)  # warm every model's first call
            time.sleep(2 * service_seconds)
            load.stop()
            mark = time.monotonic()
            load.set_concurrency(1)
            time.sleep(max(6.0, 8 * service_seconds))
            load.stop()
            alone = _ok(load.records(since=mark))
            first_overhead = statistics.median(
                r.first_chunk_s - service_seconds / 4 for r in alone if r.first_chunk_s
            )
            total_overhead = statistics.median(
                r.total_s - service_seconds for r in alone if r.total_s
            )
            mark = time.monotonic()
            load.set_concurrency(4 * instances)
            time.sleep(max(8.0, 8 * service_seconds))
            load.stop()
            busy = _ok(load.records(since=mark))
            span = max(r.started + (r.total_s or 0) for r in busy) - min(r.started for r in busy)
            held = service_seconds + total_overhead
            streams = max(1, round(len(busy) / span * held))
            model = ServiceModel(
                slots=streams,
                rtf=held / audio,
                overhead_s=0.0,
                first_chunk_s=service_seconds / 4 + first_overhead,
                first_chunk_per_stream_s=0.0,
            )
            agreements = []
            for rate in rates:
                mark = time.monotonic()
                load.set_rate(rate)
                time.sleep(seconds)
                load.stop()
                served = _ok(load.records(since=mark))
                real = sorted(r.first_chunk_s for r in served if r.first_chunk_s is not None)
                sim = sorted(simulate_same_arrivals(model, served, audio))
                agreements.append(
                    Agreement(
                        rate_per_s=rate,
                        seconds=seconds,
                        requests=len(served),
                        real_p95_s=percentile(real, 0.95),
                        sim_p95_s=percentile(sim, 0.95),
                        real_p50_s=percentile(real, 0.5),
                        sim_p50_s=percentile(sim, 0.5),
                        real_p95_interval_s=quantile_interval(real, 0.95),
                    )
                )
    return Calibration(
        service_seconds=service_seconds,
        instances=instances,
        streams=streams,
        first_chunk_overhead_s=first_overhead,
        total_overhead_s=total_overhead,
        audio_s=audio,
        rtf=held / audio,
        model=model,
        agreements=tuple(agreements),
    )
