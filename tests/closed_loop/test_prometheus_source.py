"""The metrics source against a real Prometheus scraping a real Triton (the CPU twin).

Debian's ``prometheus`` runs on loopback with a ``file_sd`` target file; the closed-loop
harness gives a "pod" a ``tritonserver`` serving CosyVoice3's CPU twin (our orchestrator, 2
instances, over a stand-in LLM that streams each answer over 0.3 s; our code adds its own CPU
time, so the service time is measured first), and drives streaming gRPC load through it. What
the source reads must agree with what the client saw over the same window and with queueing
at the measured service time, and every way of having no data must come back as a reason,
never as zeros.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from cosyvoice_operator.devtools.closedloop.harness import PodServers
from cosyvoice_operator.devtools.closedloop.load import LoadGenerator, RequestRecord
from cosyvoice_operator.devtools.closedloop.prometheus import Prometheus
from cosyvoice_operator.shell import prometheus_source as ms
from cosyvoice_operator.shell.prometheus_source import PrometheusSource, Sample
from tests.triton_twin.test_twin import service

NS = "voices"
POD = "tts-5c9d8-x2x7q"
MODEL = "cosyvoice3"
WINDOW = 8  # seconds of rate(); scrapes every second
SERVICE_SECONDS = 0.3  # the stand-in LLM's stream; our orchestrator adds its own CPU time
INSTANCES = 2  # orchestrator instances: capacity INSTANCES / the measured service time
CONCURRENCY = 6  # 4 requests wait at any time: 2 service times each
WARM_SAMPLES = 12  # requests that measure the service time
STEADY_READINGS = 3  # consecutive samples, a second apart, ...
STEADY_SPREAD = 0.1  # ... whose completion rates are within 10 % of their median


def wait_for_records(
    load: LoadGenerator, since: float, count: int, timeout: float
) -> list[RequestRecord]:
    """The first ``count`` requests started after ``since`` and completed, once they are."""
    deadline = time.monotonic() + timeout
    while True:
        done = [r for r in load.records(since) if r.ok]
        if len(done) >= count:
            return sorted(done, key=lambda r: r.started)[:count]
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(done)} of {count} requests done after {timeout:.0f}s")
        time.sleep(0.2)


def wait_steady(read: Callable[[], Sample], after: float, timeout: float) -> tuple[Sample, float]:
    """A sample taken after ``after`` (a whole rate window under the new load) once the last
    STEADY_READINGS completion rates, a second apart, are within STEADY_SPREAD of their
    median; with the time it was taken."""
    deadline = after + timeout
    readings: list[tuple[Sample, float]] = []
    while True:
        time.sleep(max(0.0, after - time.monotonic()) or 1.0)
        taken = time.monotonic()
        got = read()
        if got.completion_rate:
            readings.append((got, taken))
        recent = [s.completion_rate or 0.0 for s, _ in readings[-STEADY_READINGS:]]
        middle = statistics.median(recent) if recent else 0.0
        if len(recent) == STEADY_READINGS and all(
            abs(r - middle) <= STEADY_SPREAD * middle for r in recent
        ):
            return readings[-1]
        if time.monotonic() > deadline:
            raise AssertionError(f"no steady rate after {timeout:.0f}s: {recent}")


def wait_for(read: Callable[[], Sample], done: Callable[[Sample], bool], timeout: float) -> Sample:
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"still {got} after {timeout:.0f}s")
        time.sleep(0.5)


@pytest.mark.timeout(240)
def test_signals_of_a_real_triton_through_a_real_prometheus(tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    pods = {POD}
    servers = PodServers(
        service(MODEL),
        tmp_path / "pods",
        targets,
        namespace=NS,
        pods=lambda: set(pods),
        service_seconds=SERVICE_SECONDS,
        max_instances=INSTANCES,
    )
    prometheus = Prometheus(tmp_path, targets)
    source = PrometheusSource(prometheus.url, window_seconds=WINDOW)

    def sample(namespace: str = NS, names: tuple[str, ...] = (POD,)) -> Sample:
        return asyncio.run(source.sample(namespace, names, MODEL))

    with servers, prometheus, LoadGenerator(servers.grpc_urls, MODEL) as load:
        servers.wait_live([POD], timeout=60)
        prometheus.wait_up([POD])

        # Idle and fresh: no traffic, which is a measurement (queue latency 0), not a gap.
        idle = wait_for(sample, lambda s: s.available, 20)
        assert idle.no_traffic and idle.queue_latency_ms == 0.0, idle
        assert idle.pending_requests == 0 and idle.completion_rate == 0 and idle.pods_seen == 1
        assert idle.first_response_p95_ms is None  # no first-response histogram on 2.51

        # Only the service's own pods count; odd names are escaped, not matched as patterns.
        assert sample(names=("tts-5c9d8-other",)).unavailable_reason == ms.NO_DATA
        assert sample(namespace="elsewhere").unavailable_reason == ms.NO_DATA
        assert sample(names=("tts-5c9d8-x2x7.", ".*")).unavailable_reason == ms.NO_DATA
        both = sample(names=(POD, "tts.5c9d8(x)|[a]"))
        assert both.available and both.pods_seen == 1, both

        # The twin's service time, measured: INSTANCES streams at once, so none waits (the
        # first requests, which warm every model, left out).
        load.set_concurrency(INSTANCES)
        wait_for_records(load, time.monotonic(), 2 * INSTANCES, 60)
        alone = wait_for_records(load, time.monotonic(), WARM_SAMPLES, 90)
        service_s = statistics.median(r.total_s for r in alone if r.total_s is not None)
        assert service_s >= SERVICE_SECONDS, alone  # the stand-in LLM streams that long

        # Under load: once the windowed rates are steady, what Prometheus says agrees with the
        # client over the same window and with queueing at the measured service time.
        load.set_concurrency(CONCURRENCY)
        busy, at = wait_steady(sample, time.monotonic() + WINDOW + 1, 120)
        ended = [(r, r.started + r.total_s) for r in load.records() if r.total_s is not None]
        in_window = [r for r, end in ended if r.ok and at - WINDOW <= end <= at]
        client_rate = len(in_window) / WINDOW
        assert busy.available and not busy.no_traffic, busy
        assert busy.completion_rate is not None
        assert abs(busy.completion_rate - client_rate) <= 0.25 * client_rate, (busy, client_rate)
        # Saturated: INSTANCES streams at a time, each taking the measured service time.
        capacity = INSTANCES / service_s
        assert 0.75 * capacity <= busy.completion_rate <= 1.25 * capacity, (busy, service_s)
        # Closed loop: CONCURRENCY requests are out at any time, all but the client's turn
        # between two of them inside Triton.
        assert busy.in_flight is not None
        assert 0.75 * CONCURRENCY <= busy.in_flight <= 1.1 * CONCURRENCY, busy
        assert busy.pending_requests is not None and 1 <= busy.pending_requests <= CONCURRENCY
        # Each request waits for (CONCURRENCY - INSTANCES) / INSTANCES service times; what the
        # client saw beyond a service time is that wait too.
        waited = (CONCURRENCY - INSTANCES) / INSTANCES * service_s
        assert busy.queue_latency_ms is not None
        assert 0.6 * waited <= busy.queue_latency_ms / 1e3 <= 1.5 * waited, (busy, service_s)
        client_wait = statistics.mean(r.total_s for r in in_window if r.total_s) - service_s
        assert abs(busy.queue_latency_ms / 1e3 - client_wait) <= 0.35 * waited, client_wait
        print(f"\nservice {service_s:.3f} s; busy: {busy}\nclient: {client_rate:.2f}/s, waited")
        print(f"{client_wait:.3f} s; {load.summary(since=at - WINDOW)}")

        # Load gone: no traffic again once the window has passed.
        load.stop()
        quiet = wait_for(sample, lambda s: s.no_traffic, WINDOW + 15)
        assert quiet.available and quiet.queue_latency_ms == 0.0

        # Prometheus stopped: unreachable, at once.
        prometheus.stop()
        started = time.monotonic()
        down = sample()
        assert down.unavailable_reason == ms.UNREACHABLE, down
        assert prometheus.url in down.message and time.monotonic() - started < 3

        # The pod goes while Prometheus is down: after the restart its last samples are
        # there without a staleness marker, and age.
        pods.clear()
        servers.wait_live([], timeout=30)
        prometheus.start()
        strict = PrometheusSource(prometheus.url, window_seconds=WINDOW, stale_seconds=3)
        stale = wait_for(
            lambda: asyncio.run(strict.sample(NS, [POD], MODEL)),
            lambda s: s.unavailable_reason == ms.STALE,
            15,
        )
        assert "stale after 3s" in stale.message and stale.queue_latency_ms is None

        # The pod back: data again, and then it stops with Prometheus up: no data at once
        # (Prometheus marks the series of a vanished target stale), never zeros.
        pods.add(POD)
        servers.wait_live([POD], timeout=60)
        wait_for(sample, lambda s: s.available and s.no_traffic, 30)
        pods.clear()
        servers.wait_live([], timeout=30)
        gone = wait_for(sample, lambda s: not s.available, 10)
        assert gone.unavailable_reason in (ms.NO_DATA, ms.STALE), gone
        assert gone.queue_latency_ms is None and gone.completion_rate is None
        assert not servers.failures


@pytest.mark.timeout(60)
def test_a_refused_query_reads_as_its_status_code_only(tmp_path: Path) -> None:
    """A query Prometheus refuses: what the client raises carries Prometheus' error, and
    the source reports it as QueryFailed with the status code and reason only (the body of
    whatever answered never reaches status or Events, issue 21 H2)."""
    with Prometheus(tmp_path, tmp_path / "targets.json") as prometheus:
        empty = asyncio.run(PrometheusSource(prometheus.url).sample(NS, [POD], MODEL))
        assert empty.unavailable_reason == ms.NO_DATA, empty
        with pytest.raises(PrometheusApiClientException) as refused:
            PrometheusConnect(prometheus.url).custom_query("sum(rate(x[1m])")

    class Refusing:
        def custom_query(self, query: str) -> object:
            raise refused.value

    got = asyncio.run(PrometheusSource(prometheus.url, client=Refusing()).sample(NS, [POD], MODEL))
    assert got.unavailable_reason == ms.QUERY_FAILED, got
    assert "HTTP 400 Bad Request" in got.message and "parse error" not in got.message
