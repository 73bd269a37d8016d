"""The metrics source against a real Prometheus scraping a real Triton (the CPU twin).

Debian's ``prometheus`` runs on loopback with a ``file_sd`` target file; the closed-loop
harness gives a "pod" a ``tritonserver`` serving CosyVoice3's CPU twin, whose orchestrator
(2 instances) holds every request 0.3 s, and drives streaming gRPC load through it. What the
source reads must agree with what the client saw, and every way of having no data must come
back as a reason, never as zeros.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from cosyvoice_operator.devtools.closedloop.harness import PodServers
from cosyvoice_operator.devtools.closedloop.load import LoadGenerator
from cosyvoice_operator.devtools.closedloop.prometheus import Prometheus
from cosyvoice_operator.shell import prometheus_source as ms
from cosyvoice_operator.shell.prometheus_source import PrometheusSource, Sample
from tests.triton_twin.test_twin import service

NS = "voices"
POD = "tts-5c9d8-x2x7q"
MODEL = "cosyvoice3"
WINDOW = 8  # seconds of rate(); scrapes every second
SERVICE_SECONDS = 0.3
INSTANCES = 2  # orchestrator instances: capacity 2 / 0.3 s = 6.7 requests/s
CONCURRENCY = 6  # 4 requests wait at any time: about 2 service times each


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

        # Under load: what Prometheus says agrees with queueing and with the client.
        load.set_concurrency(CONCURRENCY)
        time.sleep(WINDOW + 3)
        busy = sample()
        seen = load.summary(since=time.monotonic() - WINDOW - 3)
        assert busy.available and not busy.no_traffic, busy
        assert seen.failed == 0 and seen.completed > 0, seen
        capacity = INSTANCES / SERVICE_SECONDS
        assert busy.completion_rate is not None
        assert 0.5 * capacity < busy.completion_rate < 1.15 * capacity, busy
        assert busy.in_flight is not None and 0.6 * CONCURRENCY < busy.in_flight < 1.1 * CONCURRENCY
        assert busy.pending_requests is not None and 1 <= busy.pending_requests <= CONCURRENCY
        # Waiting ~(6 - 2) / 2 service times; the client's first audio comes after the wait
        # plus a quarter of the service time.
        waited = (CONCURRENCY - INSTANCES) / INSTANCES * SERVICE_SECONDS
        assert busy.queue_latency_ms is not None
        assert 0.5 * waited < busy.queue_latency_ms / 1e3 < 2.0 * waited, busy
        assert seen.first_chunk_p50_s is not None and seen.first_chunk_p50_s > 0.5 * waited
        print(f"\nbusy: {busy}\nclient: {seen}")

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
