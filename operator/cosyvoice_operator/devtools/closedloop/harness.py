"""The closed loop's real parts, outside the cluster: Triton processes, Prometheus, load.

Used by ``cosyvoice-operator demo`` and by the tests (``tests/closed_loop/``,
``tests/cluster/``).

The local cluster's pods are kwok's: Ready in the API server, with no container behind them.
This module gives them one:

- :class:`PodServers` watches a service's Ready serving pods (``kubectl`` every second, or
  any list of names the caller provides) and runs, for every one, a real ``tritonserver`` on
  loopback serving the CPU twin of the service's model repository (rendered by
  ``cosyvoice_operator.render.triton`` and turned CPU by :mod:`.cpu_twin`), whose
  orchestrator holds each request for a configurable service time. It writes the live
  processes to a Prometheus ``file_sd`` file, labelled ``namespace`` and ``pod`` as a
  Kubernetes scrape config labels real pods, and stops a process when its pod goes.
- :class:`Prometheus` runs Debian's ``prometheus`` on loopback over that file (start, stop,
  restart on the same port and storage). Its scrape manager applies target changes at most
  every 5 s: a new process is scraped 5-7 s after it is listed; one taken out of the file
  has its series marked stale as soon as that applies.
- :class:`LoadGenerator` sends streaming gRPC requests to the orchestrator, round-robin over
  the live processes, at a concurrency (closed loop) and/or a rate (open loop, Poisson
  arrivals), and records each request's first-chunk latency and completion.

Both variants' twins take sustained load. (CosyVoice2's orchestrator stub used to die under
it, a Python-backend bug of the wheel's Triton that its stand-in now steps around: see
``standins/cosyvoice2/model.py``, ``let_go_after_cleanup``.)

Sized for a 2-core machine: every model of the twin is capped at ``max_instances``
instances (2 by default; each Python-backend instance is a process of its own), so that a
handful of servers fit beside the control plane. The cap changes a pod's capacity
(``max_instances / service_seconds`` requests per second), not its behaviour.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import random
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from prometheus_api_client import PrometheusConnect
from tritonclient.grpc import model_config_pb2 as mc
from urllib3.util.retry import Retry

from cosyvoice_operator.api.spec import ServiceSpec
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.devtools.closedloop.cpu_twin import request_inputs
from cosyvoice_operator.render import triton

# Where the rendered configs point for engine files; the stand-ins read none of them.
ENGINE_DIR = "/engines/closed-loop"
SERVICE_SECONDS_ENV = "COSYVOICE_TWIN_SERVICE_SECONDS"
FIRST_CHUNK_SECONDS_ENV = "COSYVOICE_TWIN_FIRST_CHUNK_SECONDS"


def twin_repository(svc: ServiceSpec, max_instances: int | None = 2) -> dict[str, str]:
    """The CPU twin of the service's repository, every instance count capped (None: not)."""
    twin = cpu_twin.to_cpu(triton.render_repository(svc, ENGINE_DIR))
    if max_instances is None:
        return twin
    capped = {}
    for name, text in twin.items():
        config = text_format.Parse(text, mc.ModelConfig())
        for group in config.instance_group:
            group.count = min(group.count, max_instances)
        capped[name] = text_format.MessageToString(config)
    return capped


# ---- Prometheus ----------------------------------------------------------------------------


def write_targets(path: Path, targets: Mapping[str, tuple[str, str]]) -> None:
    """The ``file_sd`` file: one target per ``address: (namespace, pod)``, written atomically
    (Prometheus may read it at any moment)."""
    groups = [
        {"targets": [address], "labels": {"namespace": namespace, "pod": pod}}
        for address, (namespace, pod) in sorted(targets.items())
    ]
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(groups, indent=1))
    os.replace(partial, path)


def read_targets(path: Path) -> dict[str, tuple[str, str]]:
    """What ``write_targets`` wrote: ``{address: (namespace, pod)}``."""
    groups = json.loads(path.read_text())
    return {
        address: (g["labels"]["namespace"], g["labels"]["pod"])
        for g in groups
        for address in g["targets"]
    }


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


class Prometheus:
    """Debian's ``prometheus`` on a free 127.0.0.1 port, scraping the targets of ``targets``
    (a ``file_sd`` JSON file, re-read every ``scrape_interval``) every ``scrape_interval``.

    ``stop`` then ``start`` (or ``restart``) keeps the port and the storage, like a real
    restart; ``url`` stays the same.
    """

    def __init__(self, work: Path, targets: Path, scrape_interval: float = 1.0) -> None:
        self.work = work
        self.targets = targets
        self.scrape_interval = scrape_interval
        self.port = cpu_twin.free_ports(1)[0]
        self.config = work / "prometheus.yml"
        self.storage = work / "prometheus-data"
        self.log = work / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _write_config(self) -> None:
        every = _duration(self.scrape_interval)
        config = {
            "global": {
                "scrape_interval": every,
                "scrape_timeout": every,
                "evaluation_interval": every,
            },
            "scrape_configs": [
                {
                    "job_name": "triton",
                    "file_sd_configs": [{"files": [str(self.targets)], "refresh_interval": every}],
                }
            ],
        }
        self.config.write_text(json.dumps(config, indent=1))  # JSON is YAML

    def start(self, ready_timeout: float = 30.0) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError(
                "prometheus is not on PATH: run scripts/setup.sh (it installs Debian's "
                "package), or apt-get install -y --no-install-recommends prometheus"
            )
        self.work.mkdir(parents=True, exist_ok=True)
        if not self.targets.exists():
            write_targets(self.targets, {})
        self._write_config()
        argv = [
            binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.storage}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1h",
        ]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        # Ready once it answers a query (it refuses them while its storage opens).
        client = PrometheusConnect(self.url, retry=Retry(total=0), timeout=2)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(Exception):
                client.custom_query("1")
                return self
            time.sleep(0.2)
        raise TimeoutError(f"prometheus not ready after {ready_timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self) -> Prometheus:
        self.stop()
        return self.start()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query (for tests' own checks; the operator reads through its source)."""
        result: list[dict[str, Any]] = PrometheusConnect(self.url, timeout=5).custom_query(promql)
        return result

    def up(self) -> dict[str, float]:
        """``up`` of each scraped pod: 1 when its last scrape succeeded."""
        return {r["metric"].get("pod", ""): float(r["value"][1]) for r in self.query("up")}

    def wait_up(self, pods: Collection[str], timeout: float = 30.0) -> None:
        """Until every one of ``pods`` is scraped successfully (``up`` 1)."""
        deadline = time.monotonic() + timeout
        up: dict[str, float] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                up = self.up()
                if all(up.get(pod) == 1 for pod in pods):
                    return
            time.sleep(0.25)
        raise TimeoutError(f"Prometheus at {self.url}: up={up} after {timeout:.0f}s, want {pods}")

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- Triton per Ready pod ------------------------------------------------------------------


def _is_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


class Kubectl(Protocol):
    """What :func:`ready_pods` needs of a cluster (the tests' ``Cluster``)."""

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]: ...


def ready_pods(cluster: Kubectl, namespace: str, selector: str) -> Callable[[], list[str]]:
    """A pod lister for :class:`PodServers`: the names of the Ready pods matching
    ``selector`` (a label selector) that are not being deleted, from ``kubectl``."""

    def names() -> list[str]:
        proc = cluster.kubectl(
            "get", "pods", "-n", namespace, "-l", selector, "-o", "json", check=False, timeout=20
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl get pods -l {selector}: {proc.stderr.strip()}")
        return sorted(
            pod["metadata"]["name"]
            for pod in json.loads(proc.stdout)["items"]
            if _is_ready(pod) and not pod["metadata"].get("deletionTimestamp")
        )

    return names


@dataclass
class PodProcess:
    """One pod's ``tritonserver``: ``starting`` -> ``live`` -> ``stopped`` (or ``failed``)."""

    pod: str
    server: cpu_twin.TritonServer
    state: str = "starting"
    error: str = ""
    gone: bool = False  # the pod went while its server was starting
    started_at: float = field(default_factory=time.monotonic)
    live_at: float | None = None


class PodServers:
    """A ``tritonserver`` for every Ready pod of a service, listed in a ``file_sd`` file.

    ``pods`` is called every ``poll_seconds`` (see :func:`ready_pods`; a test may pass any
    callable); a pod that appears gets a process (started in the background, at most
    ``parallel_starts`` at a time, listed once Triton is ready); a pod that goes is taken out
    of the file first, then its process is stopped. When ``pods`` fails (the API server
    restarting, say) nothing changes.

    Each server's orchestrator holds every request ``service_seconds`` (of which
    ``first_chunk_seconds``, default a quarter, before the first audio); every model has at
    most ``max_instances`` instances. CosyVoice3's trtllm-serve is one shared stand-in.
    """

    def __init__(
        self,
        svc: ServiceSpec,
        work: Path,
        targets: Path,
        *,
        namespace: str,
        pods: Callable[[], Iterable[str]],
        service_seconds: float = 0.5,
        first_chunk_seconds: float | None = None,
        max_instances: int | None = 2,
        poll_seconds: float = 1.0,
        parallel_starts: int = 2,
    ) -> None:
        self.svc = svc
        self.work = work
        self.targets = targets
        self.namespace = namespace
        self.list_pods = pods
        self.model = triton.orchestrator(svc.model.variant)
        self.repository = twin_repository(svc, max_instances)
        self.poll_seconds = poll_seconds
        self.env = dict(triton.server_environment(svc))
        self.env[SERVICE_SECONDS_ENV] = str(service_seconds)
        if first_chunk_seconds is not None:
            self.env[FIRST_CHUNK_SECONDS_ENV] = str(first_chunk_seconds)
        self.llm: cpu_twin.LlmStandIn | None = None
        self.failures: list[str] = []
        self.list_error = ""
        # (time.monotonic(), pod, "live" | "stopped"): when capacity joined and left.
        self.history: list[tuple[float, str, str]] = []
        self._processes: dict[str, PodProcess] = {}
        self._retired: list[PodProcess] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(parallel_starts)
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._serial = itertools.count()

    # -- lifecycle --

    def start(self) -> PodServers:
        urls = triton.llm_urls(self.svc)
        if urls:
            self.llm = cpu_twin.LlmStandIn(urls).__enter__()
            self.env.update(self.llm.env)
        self.work.mkdir(parents=True, exist_ok=True)
        write_targets(self.targets, {})
        self._poller = threading.Thread(target=self._poll, name="pod-servers", daemon=True)
        self._poller.start()
        return self

    def stop(self) -> None:
        """Stop watching, stop every process (in parallel), empty the targets file."""
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=30)
        with self._lock:
            processes = list(self._processes.values())
            self._processes.clear()
            for process in processes:
                process.gone = True
            self._write_targets()
        self._join(processes)
        if self.llm is not None:
            self.llm.__exit__(None, None, None)
            self.llm = None

    def __enter__(self) -> PodServers:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _join(self, stopping: list[PodProcess]) -> None:
        stoppers = [threading.Thread(target=self._halt, args=(p,), daemon=True) for p in stopping]
        for thread in stoppers:
            thread.start()
        for thread in [*stoppers, *self._threads]:
            thread.join(timeout=120)

    # -- one pass --

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.sync()
            self._stop.wait(self.poll_seconds)

    def sync(self) -> None:
        """One reconciliation: a process for each pod listed, none for the others."""
        try:
            wanted = set(self.list_pods())
            self.list_error = ""
        except Exception as err:  # keep what runs; the next pass tries again
            self.list_error = str(err)
            return
        with self._lock:
            if self._stop.is_set():
                return
            for pod in sorted(wanted - set(self._processes)):
                self._launch(pod)
            gone = [self._processes.pop(pod) for pod in sorted(set(self._processes) - wanted)]
            for process in gone:
                process.gone = True
            if gone:
                self._write_targets()
        for process in gone:
            if process.state != "starting":  # a starting one stops itself when ready
                self._spawn(self._halt, process)

    def _launch(self, pod: str) -> None:
        work = self.work / f"{pod}-{next(self._serial)}"
        repository = cpu_twin.write_repository(self.repository, work / "models")
        server = cpu_twin.TritonServer(repository, work, env=self.env)
        process = PodProcess(pod, server)
        self._processes[pod] = process
        self._spawn(self._boot, process)

    def _spawn(self, target: Callable[[PodProcess], None], process: PodProcess) -> None:
        thread = threading.Thread(target=target, args=(process,), daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _boot(self, process: PodProcess) -> None:
        with self._slots:
            if not process.gone:
                try:
                    process.server.start()
                except Exception as err:
                    process.server.stop()
                    if process.gone:  # stopped while starting: not a failure
                        process.state = "stopped"
                        return
                    process.state, process.error = "failed", str(err)
                    self.failures.append(f"{process.pod}: {err}")
                    return
        with self._lock:
            if not process.gone:
                process.state, process.live_at = "live", time.monotonic()
                self.history.append((process.live_at, process.pod, "live"))
                self._write_targets()
                return
        self._halt(process)

    def _halt(self, process: PodProcess) -> None:
        process.server.stop()
        with self._lock:
            if process.state != "stopped":
                process.state = "stopped"
                self._retired.append(process)
                self.history.append((time.monotonic(), process.pod, "stopped"))

    def _write_targets(self) -> None:
        write_targets(
            self.targets,
            {
                f"127.0.0.1:{p.server.metrics_port}": (self.namespace, p.pod)
                for p in self._processes.values()
                if p.state == "live"
            },
        )

    # -- what runs --

    def live(self) -> dict[str, cpu_twin.TritonServer]:
        """Pod -> its server, for the servers that are ready and listed."""
        with self._lock:
            return {p.pod: p.server for p in self._processes.values() if p.state == "live"}

    def grpc_urls(self) -> list[str]:
        """The gRPC addresses of the live servers (what :class:`LoadGenerator` spreads over)."""
        return [server.grpc for _, server in sorted(self.live().items())]

    def starting(self) -> list[str]:
        with self._lock:
            return sorted(p.pod for p in self._processes.values() if p.state == "starting")

    def stopped(self) -> list[PodProcess]:
        """Processes stopped so far (their pod went), in the order they stopped."""
        with self._lock:
            return list(self._retired)

    def wait_live(self, pods: Collection[str] | int, timeout: float = 120.0) -> list[str]:
        """Until exactly these pods (or this many) are live; the live pods."""
        deadline = time.monotonic() + timeout
        while True:
            live = sorted(self.live())
            if (len(live) == pods) if isinstance(pods, int) else (set(live) == set(pods)):
                return live
            if self.failures:
                raise RuntimeError(f"tritonserver failed: {self.failures}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"live {live}, starting {self.starting()}, want {pods} "
                    f"(pod listing: {self.list_error or 'ok'})"
                )
            time.sleep(0.2)


# ---- load ----------------------------------------------------------------------------------

DEFAULT_TEXT = "Hello from the closed loop."


@dataclass(frozen=True)
class RequestRecord:
    """One streaming request, seen from the client (times from ``time.monotonic()``)."""

    server: str
    started: float  # when it was due (open loop) or sent (closed loop)
    first_chunk_s: float | None  # to the first audio chunk
    total_s: float | None  # to the final response; None when it failed
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(frozen=True)
class LoadSummary:
    sent: int
    completed: int
    failed: int
    first_chunk_p50_s: float | None
    first_chunk_p95_s: float | None
    errors: tuple[str, ...]  # the distinct messages (at most 10)


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class LoadGenerator:
    """Streaming gRPC requests to ``model``, round-robin over ``servers()`` (gRPC addresses,
    asked again for every request, so that servers joining or leaving are followed).

    Two knobs, usable together: ``set_concurrency(n)`` keeps ``n`` requests in flight
    (closed loop: each worker sends its next request when the last one ends);
    ``set_rate(r)`` sends ``r`` requests per second with Poisson arrivals (open loop; an
    arrival finding ``max_outstanding`` requests in flight is recorded as dropped).
    ``stop()`` sets both to 0 and waits for the requests in flight.
    """

    def __init__(
        self,
        servers: Callable[[], Sequence[str]],
        model: str,
        *,
        text: str = DEFAULT_TEXT,
        timeout: float = 60.0,
        max_outstanding: int = 64,
        seed: int = 0,
    ) -> None:
        self.servers = servers
        self.model = model
        self.text = text
        self.timeout = timeout
        self.max_outstanding = max_outstanding
        self._random = random.Random(seed)
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []
        self._concurrency = 0
        self._workers: dict[int, threading.Thread] = {}
        self._rate = 0.0
        self._rate_changed = threading.Event()
        self._dispatcher: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_outstanding, thread_name_prefix="load")
        self._outstanding = 0
        self._closed = False
        self._local = threading.local()

    # -- knobs --

    def set_concurrency(self, n: int) -> None:
        with self._lock:
            self._concurrency = n
            for i in range(n):
                worker = self._workers.get(i)
                if worker is None or not worker.is_alive():
                    worker = threading.Thread(target=self._work, args=(i,), daemon=True)
                    self._workers[i] = worker
                    worker.start()

    def set_rate(self, per_second: float) -> None:
        with self._lock:
            self._rate = per_second
            if per_second > 0 and (self._dispatcher is None or not self._dispatcher.is_alive()):
                self._dispatcher = threading.Thread(target=self._dispatch, daemon=True)
                self._dispatcher.start()
        self._rate_changed.set()

    def stop(self, wait: float = 120.0) -> None:
        """No new requests; waits (up to ``wait`` s) for those in flight."""
        self.set_concurrency(0)
        self.set_rate(0)
        deadline = time.monotonic() + wait
        with self._lock:
            threads = [*self._workers.values(), self._dispatcher]
        for thread in threads:
            if thread is not None:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        while self.outstanding and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self.stop()
        self._closed = True
        self._pool.shutdown(wait=True)

    def __enter__(self) -> LoadGenerator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def outstanding(self) -> int:
        """Open-loop requests in flight."""
        with self._lock:
            return self._outstanding

    # -- what happened --

    def records(self, since: float | None = None) -> list[RequestRecord]:
        with self._lock:
            return [r for r in self._records if since is None or r.started >= since]

    def summary(self, since: float | None = None) -> LoadSummary:
        records = self.records(since)
        done = [r for r in records if r.ok]
        firsts = [r.first_chunk_s for r in done if r.first_chunk_s is not None]
        return LoadSummary(
            sent=len(records),
            completed=len(done),
            failed=len(records) - len(done),
            first_chunk_p50_s=_quantile(firsts, 0.5),
            first_chunk_p95_s=_quantile(firsts, 0.95),
            errors=tuple(sorted({r.error for r in records if r.error}))[:10],
        )

    def per_server(self, since: float | None = None) -> dict[str, int]:
        """Completed requests per server address."""
        counts: dict[str, int] = {}
        for record in self.records(since):
            if record.ok:
                counts[record.server] = counts.get(record.server, 0) + 1
        return counts

    # -- the machinery --

    def _work(self, index: int) -> None:
        while True:
            with self._lock:
                if index >= self._concurrency:
                    return
            record = self._one(time.monotonic())
            if record.error and not record.server:
                time.sleep(0.2)  # no server at all: do not spin

    def _dispatch(self) -> None:
        due = time.monotonic()
        while True:
            with self._lock:
                rate = self._rate
            if rate <= 0:
                return
            due += self._random.expovariate(rate)
            self._rate_changed.clear()
            if self._rate_changed.wait(max(0.0, due - time.monotonic())):
                due = time.monotonic()  # a new rate applies from now
                continue
            with self._lock:
                full = self._outstanding >= self.max_outstanding
                if not full:
                    self._outstanding += 1
            if full:
                self._record(
                    RequestRecord("", due, None, None, f"dropped: {self.max_outstanding} in flight")
                )
                continue
            self._pool.submit(self._open_loop_one, due)

    def _open_loop_one(self, due: float) -> None:
        try:
            self._one(due)
        finally:
            with self._lock:
                self._outstanding -= 1

    def _record(self, record: RequestRecord) -> RequestRecord:
        with self._lock:
            self._records.append(record)
        return record

    def _client(self, url: str) -> Any:
        clients: dict[str, Any] = self._local.__dict__.setdefault("clients", {})
        if url not in clients:
            clients[url] = grpcclient.InferenceServerClient(url)
        return clients[url]

    def _drop_client(self, url: str) -> None:
        clients: dict[str, Any] = self._local.__dict__.get("clients", {})
        client = clients.pop(url, None)
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def _one(self, started: float) -> RequestRecord:
        urls = list(self.servers())
        if not urls:
            return self._record(RequestRecord("", started, None, None, "no live server"))
        url = urls[next(self._turn) % len(urls)]
        first: list[float] = []
        errors: list[str] = []
        final = threading.Event()

        def on_response(result: Any, error: Any) -> None:
            if error is not None:
                errors.append(str(error))
                final.set()
                return
            audio = result.as_numpy("waveform")
            if audio is not None and audio.size and not first:
                first.append(time.monotonic())
            if result.get_response().parameters["triton_final_response"].bool_param:
                final.set()

        client = self._client(url)
        try:
            client.start_stream(callback=on_response)
            client.async_stream_infer(
                self.model,
                request_inputs(self.text),
                request_id=uuid.uuid4().hex,
                enable_empty_final_response=True,
            )
            if not final.wait(self.timeout):
                errors.append(f"no final response after {self.timeout:.0f}s")
        except Exception as err:  # a server that went away, mostly
            errors.append(str(err))
        finally:
            with contextlib.suppress(Exception):
                # Without an answer, do not wait for one that may never come.
                client.stop_stream(cancel_requests=bool(errors))
        end = time.monotonic()
        if errors:
            self._drop_client(url)
        if not errors and not first:
            errors.append("no audio before the final response")
        return self._record(
            RequestRecord(
                server=url,
                started=started,
                first_chunk_s=first[0] - started if first else None,
                total_s=None if errors else end - started,
                error="; ".join(errors)[:300],
            )
        )
