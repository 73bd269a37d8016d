"""The router's figures (issue 30 item 3) through a real Prometheus scraping real HAProxy.

Two Debian ``haproxy`` processes ("router pods" ``tts-router-a`` and ``-b``) run the
configuration the operator renders (render/router.py, static loopback servers), each letting
one stream at a time onto each of two stand-in "pods" (grpcio servers whose streams stay open
until the test releases them; the health check asks a tiny HTTP server for /ready). Streams
are sent on one client channel per router: what the source reads (streams in flight, queued,
arriving, slots per pod) must be what HAProxy did, and a router that is not scraped is no data,
never zeros.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from cosyvoice_operator.api.spec import parse
from cosyvoice_operator.autoscaling import policy
from cosyvoice_operator.autoscaling.sample import RouterSample
from cosyvoice_operator.devtools.closedloop.cpu_twin import free_ports
from cosyvoice_operator.devtools.closedloop.prometheus import Prometheus, write_targets
from cosyvoice_operator.render.router import RouterConfig, ServerSource, haproxy_config
from cosyvoice_operator.shell import prometheus_source as ms
from cosyvoice_operator.shell.autoscale_loop import Autoscaler
from cosyvoice_operator.shell.prometheus_source import PrometheusSource

NS = "voices"
ROUTERS = ("tts-router-a", "tts-router-b")
METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
WINDOW = 4  # seconds of rate(); Prometheus scrapes every second

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None or shutil.which("prometheus") is None,
    reason="needs Debian's haproxy and prometheus (scripts/setup.sh installs them)",
)


class Pod:
    """A stand-in Triton pod: a gRPC server whose streams answer once and stay open until
    released, and its health port answering /ready 200."""

    def __init__(self) -> None:
        self.grpc_port, self.health_port = free_ports(2)
        self.release = threading.Event()
        self.open = 0
        self._lock = threading.Lock()

        def stream(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
            with self._lock:
                self.open += 1
            try:
                yield b"first chunk"
                self.release.wait(60)
            finally:
                with self._lock:
                    self.open -= 1

        service, method = METHOD.rsplit("/", 1)
        handler = grpc.method_handlers_generic_handler(
            service.lstrip("/"), {method: grpc.unary_stream_rpc_method_handler(stream)}
        )
        self.server = grpc.server(futures.ThreadPoolExecutor(16), handlers=[handler])
        self.server.add_insecure_port(f"127.0.0.1:{self.grpc_port}")

        class Ready(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == "/ready" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.health = http.server.ThreadingHTTPServer(("127.0.0.1", self.health_port), Ready)

    def __enter__(self) -> Pod:
        self.server.start()
        threading.Thread(target=self.health.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.stop(grace=None)
        self.health.shutdown()
        self.health.server_close()


class Router:
    """Debian's haproxy running the rendered configuration on loopback."""

    def __init__(self, work: Path, pods: list[Pod], slots_per_server: int) -> None:
        self.grpc_port, self.http_port, self.metrics_port = free_ports(3)
        work.mkdir(parents=True, exist_ok=True)
        self.work = work
        config = RouterConfig(
            servers=ServerSource.of(
                [f"127.0.0.1:{p.grpc_port}:{p.grpc_port}:{p.health_port}" for p in pods]
            ),
            slots_per_server=slots_per_server,
            server_slots=len(pods),
            queue_timeout_ms=60_000,
            grpc_port=self.grpc_port,
            http_port=self.http_port,
            metrics_port=self.metrics_port,
            bind_address="127.0.0.1",
            runtime_dir=str(work),
        )
        self.config = work / "haproxy.cfg"
        self.config.write_text(haproxy_config(config))
        self.log = work / "haproxy.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Router:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                ["haproxy", "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def wait_for(
    read: Callable[[], RouterSample], done: Callable[[RouterSample], bool], timeout: float
) -> RouterSample:
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"still {got} after {timeout:.0f}s")
        time.sleep(0.5)


@pytest.mark.timeout(120)
def test_router_figures_of_real_haproxy_through_a_real_prometheus(tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    with Pod() as pod1, Pod() as pod2:
        pods = [pod1, pod2]
        routers = [Router(tmp_path / name, pods, slots_per_server=1) for name in ROUTERS]
        scraped = zip(routers, ROUTERS, strict=True)
        write_targets(targets, {f"127.0.0.1:{r.metrics_port}": (NS, name) for r, name in scraped})
        prometheus = Prometheus(tmp_path / "prometheus", targets)
        source = PrometheusSource(prometheus.url, window_seconds=WINDOW)

        def sample(names: tuple[str, ...] = ROUTERS, namespace: str = NS) -> RouterSample:
            return asyncio.run(source.sample_router(namespace, names))

        with routers[0], routers[1], prometheus:
            channels = [grpc.insecure_channel(f"127.0.0.1:{r.grpc_port}") for r in routers]
            try:
                # Idle and fresh: every figure 0, a measurement, not a gap.
                idle = wait_for(sample, lambda s: s.available and s.active_servers == 2, timeout=40)
                assert (idle.in_flight, idle.queued, idle.stream_rate) == (0, 0, 0), idle
                # Each router lets a pod hold 1 stream: the pod's slots are 2 in all.
                assert idle.slots_per_pod == 2 and idle.routers_seen == 2

                # One channel per router: 3 streams through a (2 slots: 1 waits), 2 through b.
                calls = []
                for channel, count in zip(channels, (3, 2), strict=True):
                    call = channel.unary_stream(METHOD)
                    calls += [call(b"utterance") for _ in range(count)]
                busy = wait_for(sample, lambda s: s.queued == 1 and s.in_flight == 4, 30)
                assert pod1.open + pod2.open == 4  # what HAProxy let through, the pods hold
                assert busy.slots_per_pod == 2 and busy.active_servers == 2
                # HAProxy counts a stream as it reaches the backend (sessions_total), the
                # queued one included, before any ends: the arrival rate is the demand, 5
                # streams over the window; the streams ended (http_requests_total) are 0.
                counted = wait_for(
                    sample,
                    lambda s: (s.stream_rate or 0) * WINDOW >= 4.5 and s.queued == 1,
                    30,
                )
                assert counted.completed_stream_rate == 0, counted
                assert pod1.open + pod2.open == 4 and counted.in_flight == 4
                assert not any(c.done() for c in calls)

                # A router pod Prometheus does not scrape is no data, never zeros; the
                # namespace must match too.
                assert sample(("tts-router-c",)).unavailable_reason == ms.NO_DATA
                assert sample(namespace="other").unavailable_reason == ms.NO_DATA
                only_a = sample((ROUTERS[0],))
                assert only_a.available and only_a.routers_seen == 1
                assert (only_a.in_flight, only_a.queued, only_a.slots_per_pod) == (2, 1, 1)

                # The loop's reading (mode Router, the default) of a fleet at 0 with streams
                # at the router: the policy wakes it with one replica.
                woken = asyncio.run(wake_up(prometheus.url))
                assert woken.replicas == 1 and woken.inputs["regime"] == "WakeUp", woken.reason
                assert woken.reason.startswith(
                    "scaling up 0 -> 1: router: 4 streams in flight + 1 queued over 0 pods"
                ), woken.reason

                # Released: the queued stream gets its slot, then everything drains.
                for pod in pods:
                    pod.release.set()
                for call in calls:
                    assert list(call) == [b"first chunk"]
                # Ended: the 5 streams are counted as requests now (a rate over the window).
                drained = wait_for(
                    sample,
                    lambda s: (
                        s.in_flight == 0 and s.queued == 0 and (s.completed_stream_rate or 0) > 0
                    ),
                    30,
                )
                assert drained.available
            finally:
                for channel in channels:
                    channel.close()


async def wake_up(url: str) -> policy.Decision:
    """One evaluation as the autoscale loop makes it (its Prometheus sources, mode Router's
    reading of the router pods; no Triton pod Ready), decided by the policy."""
    svc = parse(
        {
            "model": {"variant": "cosyvoice3", "uri": "hf://a/b"},
            "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 4},
        }
    )
    autoscaler = Autoscaler(None, None, url, WINDOW, lambda: now)  # type: ignore[arg-type]
    now = dt.datetime.now(dt.UTC)
    obs, triton, router = await autoscaler._observe(svc, NS, [], list(ROUTERS), now)
    assert triton is not None and not triton.available  # no Triton pod to read
    assert router is not None and router.available and obs.router is router
    return policy.decide(svc.autoscaling, obs, policy.Fleet(0, 0, 0), (), now)
