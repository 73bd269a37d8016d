"""The pod's readiness as the kubelet sees it, and what a drain waits for.

Triton's own ``/v2/health/ready`` cannot carry a drain: once tritonserver is told to stop,
every BLS call of a stream in flight fails ("Server not ready") and Triton counts 0
in-flight inferences for a decoupled Python model, so it unloads at once. So SIGTERM stays
with the supervisor (:mod:`.supervisor`), which first answers not-ready here (the pod
leaves the Service's endpoints), tells the orchestrators to refuse new streams (the drain
file, :data:`DRAIN_FILE_ENV`), and stops Triton only once the orchestrators' gauge
:data:`ACTIVE_STREAMS` sums to 0 or the drain time is up.

``GET /ready`` on ``--health-port``: 200 while Triton is ready, every Python stub it started
is alive (:mod:`.stubs`) and the pod is not draining; 503 with the reason otherwise (the
rendered startup and readiness probes). ``GET /metrics`` there: the stub failures and the
Triton restarts that recovered them.
"""

from __future__ import annotations

import http.server
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

# The gauge the project's orchestrators export per instance (serving-models/models/*,
# and the CPU twin's stand-ins): the streams being served now.
ACTIVE_STREAMS = "cosyvoice_active_streams"
# Triton's own count of requests waiting in a model's queue: a request queued before the
# drain began is served (and refused by the orchestrator) before Triton is stopped.
PENDING_REQUESTS = "nv_inference_pending_request_count"
# The file whose existence tells the orchestrators to refuse new streams; its path is in
# tritonserver's environment (the stubs inherit it).
DRAIN_FILE_ENV = "COSYVOICE_DRAIN_FILE"

# Straight to the loopback address: a cluster-wide HTTP_PROXY must not carry local probes.
_LOCAL_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def local_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answered."""
    try:
        with _LOCAL_OPENER.open(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except (OSError, ValueError):
        return None


def local_text(url: str, timeout: float = 2.0) -> str | None:
    """The body of a GET answered 200, or None."""
    try:
        with _LOCAL_OPENER.open(url, timeout=timeout) as response:
            if response.status != 200:
                return None
            return str(response.read().decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return None


def sample_sum(metrics: str, family: str) -> float:
    """The sum of every sample of one metric family in Prometheus' text format (0 if none)."""
    total = 0.0
    for line in metrics.splitlines():
        if not line.startswith(family):
            continue
        rest = line[len(family) :]
        if not rest or rest[0] not in "{ ":
            continue  # another family sharing the prefix
        try:
            total += float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
    return total


def streams_in_flight(metrics: str) -> int:
    """Streams the orchestrators serve now plus requests still queued in Triton."""
    return int(sample_sum(metrics, ACTIVE_STREAMS) + sample_sum(metrics, PENDING_REQUESTS))


class HealthServer:
    """``GET /ready``, ``/live`` and ``/metrics`` on 0.0.0.0:``port``; ``check`` says ready or
    why not, ``metrics`` is the Prometheus text of this command's own counters."""

    def __init__(
        self, port: int, check: Callable[[], str | None], metrics: Callable[[], str]
    ) -> None:
        self.check = check
        self.metrics = metrics

        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/live":
                    outer._answer(self, 200, "live\n")
                elif self.path == "/metrics":
                    outer._answer(self, 200, outer.metrics())
                elif self.path == "/ready":
                    reason = outer.check()
                    if reason is None:
                        outer._answer(self, 200, "ready\n")
                    else:
                        outer._answer(self, 503, f"not ready: {reason}\n")
                else:
                    outer._answer(self, 404, "not found\n")

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the kubelet probes every few seconds."""

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @staticmethod
    def _answer(handler: http.server.BaseHTTPRequestHandler, code: int, body: str) -> None:
        data = body.encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
