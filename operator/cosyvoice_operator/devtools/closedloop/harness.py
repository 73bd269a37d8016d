"""The closed loop's real parts, outside the cluster: Triton processes, Prometheus, load.

Used by ``cosyvoice-operator demo`` and by the tests (``tests/closed_loop/``,
``tests/cluster/``).

The local cluster's pods are kwok's: Ready in the API server, with no container behind them.
This module gives them one:

- :class:`PodServers` watches a service's Ready serving pods (``kubectl`` every second, or
  any list of names the caller provides) and runs, for every one, a real ``tritonserver`` on
  loopback serving the CPU twin of the service's model repository (rendered by
  ``cosyvoice_operator.render.triton`` and turned CPU by :mod:`.cpu_twin`), in which each
  request takes a configurable service time. It writes the live
  processes to a Prometheus ``file_sd`` file, labelled ``namespace`` and ``pod`` as a
  Kubernetes scrape config labels real pods, and stops a process when its pod goes.
- :class:`.prometheus.Prometheus` runs Debian's ``prometheus`` over that file.
- :class:`.load.LoadGenerator` sends the streaming load.

The orchestrator is the project's own (``serving-models/models/<variant>/model.py``, issue 19
item 2: one stream per instance, so the queue latency the autoscaler reads is Triton's queue
in front of our code) wherever this checkout has it; both variants' run without upstream's
library (NumPy and ``tokenizers``). Their LLM is a stand-in (CosyVoice3's trtllm-serve,
CosyVoice2's ``tensorrt_llm`` model) paced so that each stream takes the service time; the
models behind them (token2wav, vocoder, audio tokenizer, speaker embedding) stay stand-ins
(CosyVoice2's token2wav stand-in takes the vocoder state our orchestrator carries).

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
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api.spec import ServiceSpec
from cosyvoice_operator.devtools.closedloop import cpu_twin, router
from cosyvoice_operator.devtools.closedloop.prometheus import write_targets
from cosyvoice_operator.devtools.closedloop.router import SrvDirectory
from cosyvoice_operator.render import triton

# Where the rendered configs point for engine files; the stand-ins read none of them.
ENGINE_DIR = "/engines/closed-loop"
# The variants whose closed loop runs the project's orchestrator (see the module's docstring).
OURS = ("cosyvoice2", "cosyvoice3")
# The stand-in tensorrt_llm model streams each answer over this many seconds when set.
STREAM_SECONDS_ENV = "COSYVOICE_TWIN_STREAM_SECONDS"
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
    health: router.PodHealth | None = None  # cosyvoice-serve's /ready, where pods have addresses


class PodServers:
    """A ``tritonserver`` for every Ready pod of a service, listed in a ``file_sd`` file.

    ``pods`` is called every ``poll_seconds`` (see :func:`ready_pods`; a test may pass any
    callable); a pod that appears gets a process (started in the background, at most
    ``parallel_starts`` at a time, listed once Triton is ready); a pod that goes is taken out
    of the file first, then its process is stopped. When ``pods`` fails (the API server
    restarting, say) nothing changes.

    Every request takes ``service_seconds``: with the project's orchestrator (see the module's
    docstring) the stand-in LLM streams each answer over that time, and the first audio comes
    after ``firstChunkTokens`` of it; with the stand-in orchestrator, it holds each request
    that long (``first_chunk_seconds`` of it, default a quarter, before the first audio).
    Every model has at most ``max_instances`` instances. CosyVoice3's trtllm-serve is one
    shared stand-in.
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
        addresses: str | None = None,
        directory: SrvDirectory | None = None,
        extra_targets: Mapping[str, tuple[str, str]]
        | Callable[[], Mapping[str, tuple[str, str]]]
        | None = None,
        drained: Callable[[str], bool] | None = None,
        drain_timeout: float = 60.0,
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
        self.service_seconds = service_seconds
        # The project's orchestrator, where it runs without upstream's library (CosyVoice3).
        self.ours = cpu_twin.our_model_code(self.model) if svc.model.variant in OURS else None
        if first_chunk_seconds is not None:
            if self.ours is not None:
                raise ValueError("first_chunk_seconds is the stand-in orchestrator's")
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
        # As in a cluster (issue 30): each pod its own loopback address in the block
        # ``addresses`` (127.a.b.n, n from 2; .1 is the router's) with Triton's ports, and
        # cosyvoice-serve's /ready on 8003; the live ones are the ``directory``'s SRV answers.
        self.addresses = addresses
        self.directory = directory
        # More file_sd targets (the router's exporter): fixed, or asked at every pass (the
        # router pod's name comes from the cluster).
        self._extra = extra_targets
        self.extra_targets: dict[str, tuple[str, str]] = (
            {} if extra_targets is None or callable(extra_targets) else dict(extra_targets)
        )
        self._hosts = itertools.count(2)
        # A pod that goes drains first where ``drained`` is given (its address -> nothing new
        # routed to it and no stream in flight: FleetRouter.drained): its /ready answers 503
        # and it has left the DNS answers; its process stops once drained (or after
        # ``drain_timeout``), as cosyvoice-serve stops Triton after SIGTERM.
        self.drained = drained
        self.drain_timeout = drain_timeout

    # -- lifecycle --

    def start(self) -> PodServers:
        urls = triton.llm_urls(self.svc)
        if urls:
            stream = self.service_seconds if self.ours is not None else 0.0
            self.llm = cpu_twin.LlmStandIn(urls, stream_seconds=stream).__enter__()
            self.env.update(self.llm.env)
        self.work.mkdir(parents=True, exist_ok=True)
        if self.ours is not None:
            self._use_ours(urls)
        write_targets(self.targets, {})
        self._poller = threading.Thread(target=self._poll, name="pod-servers", daemon=True)
        self._poller.start()
        return self

    def _use_ours(self, urls: list[str]) -> None:
        """The orchestrator's config points at what the twin has in place of the pod's: the
        tiny release's yaml and tokenizer, the stand-in LLM servers."""
        model_dir = cpu_twin.write_orchestrator_files(self.svc.model.variant, self.work / "model")
        values = {"model_dir": str(model_dir), "llm_tokenizer_dir": str(model_dir / "llm")}
        if self.llm is not None:
            remap = self.llm.remap
            values["llm_api_base"] = remap[urls[0]]
            values["llm_api_bases"] = ",".join(remap[url] for url in urls)
        self.repository[self.model] = cpu_twin.with_parameters(self.repository[self.model], values)
        self.env["COSYVOICE_MODELS_PATH"] = str(cpu_twin.SERVING_MODELS)
        self.env[STREAM_SECONDS_ENV] = str(self.service_seconds)

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
        extra = self.extra_targets
        if callable(self._extra):
            with contextlib.suppress(Exception):  # kept as it was; the next pass asks again
                extra = dict(self._extra())
        with self._lock:
            if self._stop.is_set():
                return
            if extra != self.extra_targets:
                self.extra_targets = extra
                self._write_targets()
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
        if self.ours is not None:
            shutil.copy(self.ours, repository / self.model / "1" / "model.py")
        if self.addresses is None:
            server = cpu_twin.TritonServer(repository, work, env=self.env)
            health = None
        else:
            host = f"{self.addresses}.{next(self._hosts)}"
            if host.endswith(".255"):
                raise RuntimeError(f"pod addresses of {self.addresses}.0/24 used up")
            ports = (router.HTTP_PORT, router.GRPC_PORT, router.METRICS_PORT)
            server = cpu_twin.TritonServer(repository, work, env=self.env, host=host, ports=ports)
            health = router.PodHealth(host, router.triton_ready(server.http))
        process = PodProcess(pod, server, health=health)
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
                    if process.health is not None:
                        process.health.start()
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
        if process.health is not None:
            if self.drained is not None and not self._stop.is_set():
                process.health.draining = True
                deadline = time.monotonic() + self.drain_timeout
                while time.monotonic() < deadline and not self._stop.is_set():
                    with contextlib.suppress(Exception):
                        if self.drained(process.server.host):
                            break
                    time.sleep(0.1)
            process.health.stop()
        process.server.stop()
        with self._lock:
            if process.state != "stopped":
                process.state = "stopped"
                self._retired.append(process)
                self.history.append((time.monotonic(), process.pod, "stopped"))

    def _write_targets(self) -> None:
        live = [p for p in self._processes.values() if p.state == "live"]
        targets = {
            f"{p.server.host}:{p.server.metrics_port}": (self.namespace, p.pod) for p in live
        }
        write_targets(self.targets, {**targets, **self.extra_targets})
        if self.directory is not None:
            self.directory.set({p.pod: p.server.host for p in live})

    def drain(self, pod: str) -> None:
        """The pod starts draining (its /ready answers 503, as cosyvoice-serve's on SIGTERM):
        the router sends it no new stream; the pod stays listed until it goes."""
        with self._lock:
            process = self._processes[pod]
        if process.health is None:
            raise ValueError("draining needs pods with addresses (addresses=...)")
        process.health.draining = True

    def addresses_of(self) -> dict[str, str]:
        """Pod -> its address, for the live pods."""
        return {pod: server.host for pod, server in self.live().items()}

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
