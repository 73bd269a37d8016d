"""The closed loop's router: a real HAProxy in front of the Triton processes, as in a cluster.

- :class:`SrvDirectory` is the cluster's DNS for the headless Service ``cvs-<name>-pods``: a
  tiny DNS server on loopback (dnslib) answering ``_grpc._tcp.<headless>`` (SRV) with one
  record per Ready pod, each pod on its own loopback address (``127.a.b.n``) with Triton's
  real ports, as pods have their own IP and the same container ports. A scale-up adds an
  answer and HAProxy (``server-template ... resolvers``) picks it up without a reload.
- :class:`HAProxy` runs Debian's ``haproxy`` on a config (the one the operator renders:
  ``render.router.haproxy_config``) plus a second file of the test world's own (a runtime
  socket, so that tests can read ``show servers state``): start, wait until its Prometheus
  exporter answers, read the fleet's queue and the streams per pod, restart, stop.
- :class:`PodHealth` is cosyvoice-serve's ``/ready`` of a pod (port 8003, what the router's
  health check reads): 503 while the pod drains.
- :class:`StandInPod` is a grpcio pod speaking Triton's ``ModelStreamInfer`` (each stream held
  until released, its pod's name in every answer) with that health endpoint: for the tests
  about the router, where a ``tritonserver`` twin would be slower than the point needs.
"""

from __future__ import annotations

import contextlib
import http.server
import random
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from dnslib import QTYPE, RR, SRV, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer
from tritonclient.grpc import service_pb2, service_pb2_grpc

from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.render.router import (
    GRPC_BACKEND,
    HEALTH_PATH,
    HEALTH_PORT,
    RouterConfig,
    ServerSource,
    haproxy_config,
)

# Triton's ports, which every pod has on its own address (the headless Service's named ports).
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
BACKEND = GRPC_BACKEND
MAINTENANCE = 0x23  # srv_admin_state bits of a server in maintenance (forced, inherited, resolver)
POD_PARAMETER = "pod"  # the stand-in pods' answers name their pod in this parameter


def loopback_block(rng: random.Random | None = None) -> str:
    """A random ``127.a.b`` block for one test world's pod addresses (``127.a.b.n``), so that
    two test worlds on one machine do not meet on Triton's fixed ports."""
    rng = rng or random.Random()
    return f"127.{rng.randrange(1, 255)}.{rng.randrange(1, 255)}"


def srv_name(host: str, port_name: str = "grpc") -> str:
    return f"_{port_name}._tcp.{host}"


# ---- the cluster's DNS for the headless Service ---------------------------------------------


class SrvDirectory:
    """DNS on ``127.0.0.1:<port>`` (UDP and TCP) for one headless Service (``headless`` in
    ``namespace``): ``_grpc._tcp`` and ``_http._tcp`` SRV records, one per member, and the
    members' A records (``set``)."""

    def __init__(self, headless: str, namespace: str, *, ttl: int = 1) -> None:
        self.service = headless
        self.namespace = namespace
        self.headless = f"{headless}.{namespace}.svc.cluster.local"
        self.ttl = ttl
        self.port = cpu_twin.free_ports(1)[0]
        self._members: dict[str, str] = {}
        self._lock = threading.Lock()
        self._servers: list[DNSServer] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def source(self) -> ServerSource:
        """The rendered config's server source for this directory."""
        return ServerSource.dns(self.service, self.namespace, nameserver=self.address)

    def set(self, members: Mapping[str, str]) -> None:
        """The Ready pods now: ``{pod: address}``."""
        with self._lock:
            self._members = dict(members)

    def members(self) -> dict[str, str]:
        with self._lock:
            return dict(self._members)

    def _target(self, address: str) -> str:
        return f"{address.replace('.', '-')}.{self.headless}"

    def answer(self, qname: str, qtype: str) -> list[RR]:
        """The answers for one question (the additional A records of an SRV answer too)."""
        name = qname.rstrip(".")
        records: list[RR] = []
        with self._lock:
            addresses = sorted(self._members.values())
        ports = {
            srv_name(self.headless, "grpc"): GRPC_PORT,
            srv_name(self.headless, "http"): HTTP_PORT,
        }
        if qtype == "SRV" and name in ports:
            for address in addresses:
                target = self._target(address)
                srv = SRV(priority=0, weight=100, port=ports[name], target=target)
                records.append(RR(name, QTYPE.SRV, ttl=self.ttl, rdata=srv))
        elif qtype == "A":
            records += [
                RR(name, QTYPE.A, ttl=self.ttl, rdata=A(address))
                for address in addresses
                if self._target(address) == name
            ]
        return records

    def start(self) -> SrvDirectory:
        directory = self

        class Resolver(BaseResolver):  # type: ignore[misc]
            def resolve(self, request: Any, handler: Any) -> Any:
                reply = request.reply()
                qtype = QTYPE[request.q.qtype]
                for record in directory.answer(str(request.q.qname), qtype):
                    reply.add_answer(record)
                if qtype == "SRV":
                    for record in list(reply.rr):
                        for extra in directory.answer(str(record.rdata.target), "A"):
                            reply.add_ar(extra)
                return reply

        quiet = DNSLogger("-request,-reply,-truncated,-data,-recv,-send,-error", prefix=False)
        for tcp in (False, True):
            server = DNSServer(
                Resolver(), port=self.port, address="127.0.0.1", tcp=tcp, logger=quiet
            )
            server.start_thread()
            self._servers.append(server)
        return self

    def stop(self) -> None:
        for server in self._servers:
            with contextlib.suppress(Exception):
                server.stop()
        self._servers.clear()

    def __enter__(self) -> SrvDirectory:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def local_router(
    directory: SrvDirectory,
    work: Path,
    *,
    address: str,
    slots_per_server: int,
    server_slots: int,
    queue_timeout_ms: int,
) -> RouterConfig:
    """The operator's router config with the pods from ``directory``, bound to ``address``
    (Triton's ports, as a router pod has them), its runtime socket in ``work``."""
    return RouterConfig(
        servers=directory.source(),
        slots_per_server=slots_per_server,
        server_slots=server_slots,
        queue_timeout_ms=queue_timeout_ms,
        bind_address=address,
        runtime_dir=str(work),
    )


# ---- HAProxy ---------------------------------------------------------------------------------


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition as ``(name, labels, value)`` rows (comments skipped)."""
    rows = []
    pattern = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
    for line in text.splitlines():
        match = pattern.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        with contextlib.suppress(ValueError):
            rows.append((match.group(1), labels, float(match.group(3))))
    return rows


@dataclass(frozen=True)
class ServerState:
    """One server slot of the backend, from ``show servers state``."""

    name: str
    address: str  # "" while the slot has no member (server-template, init-addr none)
    port: int
    operational: int  # srv_op_state: 0 stopped, 1 starting, 2 running, 3 stopping
    admin: int  # srv_admin_state bits (0x20: the resolver put it in maintenance)

    @property
    def up(self) -> bool:
        return self.operational == 2 and not self.admin & MAINTENANCE


@dataclass(frozen=True)
class RouterView:
    """What the router says about its fleet (HAProxy's Prometheus exporter, proxy ``triton``)."""

    queue: int  # haproxy_backend_current_queue: streams waiting for a slot
    active_servers: int  # haproxy_backend_active_servers
    sessions: dict[str, int]  # haproxy_server_current_sessions per server name (slot)
    limits: dict[str, int]  # haproxy_server_limit_sessions per server name
    total: dict[str, int]  # haproxy_server_sessions_total per server name


def localize(rendered: str, *, address: str, nameserver: str, runtime_dir: Path) -> str:
    """A router config rendered for a cluster (``kubectl get configmap cvs-<name>-router``)
    as it runs here: what a router pod's environment gives it, given on loopback instead (its
    own address for the binds, the cluster DNS as ``nameserver``, its runtime directory).
    Nothing else changes."""
    lines = []
    for line in rendered.splitlines():
        stripped = line.strip()
        indent = line[: len(line) - len(line.lstrip())]
        if stripped == "parse-resolv-conf":
            line = f"{indent}nameserver dns1 {nameserver}"
        elif stripped.startswith("bind :"):
            line = f"{indent}bind {address}{stripped[len('bind ') :]}"
        elif stripped.startswith("stats socket "):
            words = stripped.split()
            words[2] = str(runtime_dir / Path(words[2]).name)
            line = indent + " ".join(words)
        lines.append(line)
    return "\n".join(lines) + "\n"


class HAProxy:
    """Debian's ``haproxy`` on a router config, written to ``work``: the one the operator
    renders for ``params`` (``render.router.haproxy_config``), or the text given as
    ``rendered`` (a cluster's ConfigMap, ``localize``d). ``grpc`` is where clients connect,
    ``metrics_url`` its Prometheus exporter, ``socket`` its runtime API."""

    def __init__(
        self,
        params: RouterConfig,
        work: Path,
        *,
        rendered: str | None = None,
    ) -> None:
        self.params = params
        self.config_text = haproxy_config(params) if rendered is None else rendered
        self.work = work
        host = params.bind_address or "127.0.0.1"
        self.metrics_url = f"http://{host}:{params.metrics_port}/metrics"
        self.grpc = f"{host}:{params.grpc_port}"
        self.config = work / "haproxy.cfg"
        self.socket = Path(params.runtime_dir) / "admin.sock"
        self.log = work / "haproxy.log"
        self.process: subprocess.Popen[bytes] | None = None

    @staticmethod
    def binary() -> str:
        binary = shutil.which("haproxy") or (
            "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
        )
        if binary is None:
            raise FileNotFoundError(
                "haproxy is not on PATH: run scripts/setup.sh (it installs Debian's package), "
                "or apt-get install -y --no-install-recommends haproxy"
            )
        return binary

    def _argv(self) -> list[str]:
        return [self.binary(), "-f", str(self.config)]

    def _write(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(self.config_text)

    def check(self) -> str:
        """``haproxy -c`` on the files; its output. Raises when the config is refused."""
        self._write()
        proc = subprocess.run([*self._argv(), "-c"], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise ValueError(f"haproxy -c refused the config:\n{proc.stdout}{proc.stderr}")
        return proc.stdout + proc.stderr

    def start(self, ready_timeout: float = 30.0) -> HAProxy:
        self._write()
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [*self._argv(), "-db"], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"haproxy exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.metrics_url, timeout=2) as response,
            ):
                if response.status == 200:
                    return self
            time.sleep(0.1)
        raise TimeoutError(f"haproxy not ready after {ready_timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()  # SIGTERM: a hard stop, its connections closed
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def restart(self, ready_timeout: float = 30.0) -> HAProxy:
        self.stop()
        return self.start(ready_timeout)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> HAProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- what it says --

    def runtime(self, command: str) -> str:
        """One command on the runtime socket (``show stat``, ``show servers state triton``)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket))
            sock.sendall(command.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def servers(self, backend: str = BACKEND) -> dict[str, ServerState]:
        """The backend's server slots by name (``show servers state``)."""
        lines = self.runtime(f"show servers state {backend}").splitlines()
        header = next((line for line in lines if line.startswith("# be_id")), None)
        if header is None:
            raise RuntimeError(f"show servers state {backend}: {lines[:3]}")
        columns = header[2:].split()
        states = {}
        for line in lines:
            if line.startswith("#") or len(line.split()) < len(columns):
                continue
            row = dict(zip(columns, line.split(), strict=False))
            address = row["srv_addr"] if row["srv_addr"] not in ("-", "0.0.0.0") else ""
            states[row["srv_name"]] = ServerState(
                name=row["srv_name"],
                address=address,
                port=int(row["srv_port"]),
                operational=int(row["srv_op_state"]),
                admin=int(row["srv_admin_state"]),
            )
        return states

    def checks(self, backend: str = BACKEND) -> dict[str, str]:
        """The last health check's status of each server of ``backend`` (``show stat``'s
        check_status: L7OK passed, L7STS a wrong status, SOCKERR, ...; "" none yet)."""
        lines = self.runtime("show stat").splitlines()
        columns = lines[0].lstrip("# ").split(",")
        statuses = {}
        for line in lines[1:]:
            row = dict(zip(columns, line.split(","), strict=False))
            if row.get("pxname") == backend and row.get("svname") not in ("FRONTEND", "BACKEND"):
                statuses[row["svname"]] = row.get("check_status", "").lstrip("* ")
        return statuses

    def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as response:
            return parse_metrics(response.read().decode())

    def view(self, backend: str = BACKEND) -> RouterView:
        rows = [r for r in self.metrics() if r[1].get("proxy") == backend]

        def per_server(name: str) -> dict[str, int]:
            return {
                labels["server"]: int(v)
                for n, labels, v in rows
                if n == name and "server" in labels
            }

        def backend_value(name: str) -> int:
            return int(
                next((v for n, labels, v in rows if n == name and "server" not in labels), 0)
            )

        return RouterView(
            queue=backend_value("haproxy_backend_current_queue"),
            active_servers=backend_value("haproxy_backend_active_servers"),
            sessions=per_server("haproxy_server_current_sessions"),
            limits=per_server("haproxy_server_limit_sessions"),
            total=per_server("haproxy_server_sessions_total"),
        )

    def streams_per_pod(self, pods: Mapping[str, str], backend: str = BACKEND) -> dict[str, int]:
        """In-flight streams per pod (``pods``: pod -> its address), from the server slots."""
        sessions = self.view(backend).sessions
        by_address = {s.address: s.name for s in self.servers(backend).values() if s.address}
        return {pod: sessions.get(by_address.get(address, ""), 0) for pod, address in pods.items()}

    def wait_servers(
        self, addresses: set[str], timeout: float = 30.0, backend: str = BACKEND
    ) -> dict[str, ServerState]:
        """Until exactly ``addresses`` are the backend's servers that are up, each with a
        health check passed (L7OK: a server filled from DNS counts as up before its first
        check); those servers."""
        deadline = time.monotonic() + timeout
        up: dict[str, ServerState] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, RuntimeError):
                checks = self.checks(backend)
                up = {
                    s.address: s
                    for s in self.servers(backend).values()
                    if s.up and checks.get(s.name) == "L7OK"
                }
                if set(up) == addresses:
                    return up
            time.sleep(0.1)
        raise TimeoutError(f"haproxy's up servers {sorted(up)}, want {sorted(addresses)}")


# ---- a grpcio stand-in pod -------------------------------------------------------------------


class PodHealth:
    """cosyvoice-serve's health endpoint of one pod: ``GET /ready`` on ``address:8003``
    answers 200 while ``ready()`` holds and the pod is not ``draining``, 503 otherwise (what
    the router's health check reads)."""

    def __init__(self, address: str, ready: Callable[[], bool] = lambda: True) -> None:
        self.address = address
        self.ready = ready
        self.draining = False
        self._server: http.server.ThreadingHTTPServer | None = None

    def start(self) -> PodHealth:
        health = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = False
                if self.path == HEALTH_PATH and not health.draining:
                    with contextlib.suppress(Exception):
                        ok = health.ready()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((self.address, HEALTH_PORT), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def triton_ready(http_url: str) -> Callable[[], bool]:
    """``ready`` for :class:`PodHealth` in front of a ``tritonserver``: its own readiness."""

    def ready() -> bool:
        with urllib.request.urlopen(f"{http_url}/v2/health/ready", timeout=2) as response:
            return bool(response.status == 200)

    return ready


class StandInPod(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """A pod at ``address`` (gRPC on 8001, cosyvoice-serve's ``/ready`` on 8003) whose
    ``ModelStreamInfer`` answers each request with ``chunks`` responses naming the pod (each
    with ``chunk_bytes`` of audio when set). While
    ``release`` is clear a stream waits before its first answer (set by default: at once).
    ``health.draining`` makes the ready endpoint answer 503."""

    def __init__(self, name: str, address: str, *, chunks: int = 2, chunk_bytes: int = 0) -> None:
        self.name = name
        self.address = address
        self.chunks = chunks
        self.chunk_bytes = chunk_bytes  # audio bytes per answer (as a raw output)
        self.release = threading.Event()
        self.release.set()
        self.health = PodHealth(address)
        self.active = 0
        self.served = 0
        self.cancelled = 0
        self.seen: list[str] = []  # request ids, in the order their streams reached the pod
        self._lock = threading.Lock()
        self._grpc: grpc.Server | None = None

    def ModelStreamInfer(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        with self._lock:
            self.active += 1
            self.served += 1
        try:
            for request in requests:
                with self._lock:
                    self.seen.append(request.id)
                while not self.release.wait(0.05):
                    if not context.is_active():
                        with self._lock:
                            self.cancelled += 1
                        return
                for index in range(self.chunks):
                    response = service_pb2.ModelStreamInferResponse()
                    answer = response.infer_response
                    answer.model_name = request.model_name
                    answer.id = request.id
                    answer.parameters[POD_PARAMETER].string_param = self.name
                    answer.parameters["triton_final_response"].bool_param = index == self.chunks - 1
                    if self.chunk_bytes:
                        answer.outputs.add(name="waveform", datatype="FP32", shape=[1, 1])
                        answer.raw_output_contents.append(bytes(self.chunk_bytes))
                    yield response
        finally:
            with self._lock:
                self.active -= 1

    def start(self) -> StandInPod:
        self._grpc = grpc.server(ThreadPoolExecutor(64))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self, self._grpc)
        self._grpc.add_insecure_port(f"{self.address}:{GRPC_PORT}")
        self._grpc.start()
        self.health.start()
        return self

    def stop(self, grace: float | None = None) -> None:
        self.health.stop()
        if self._grpc is not None:
            self._grpc.stop(grace).wait()


# ---- one client channel ----------------------------------------------------------------------


def stream_request(model: str, inputs: list[Any], request_id: str) -> Any:
    """Triton's ``ModelInferRequest`` for ``inputs`` (tritonclient ``InferInput`` objects)."""
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    for tensor in inputs:
        request.inputs.append(tensor._get_tensor())
        content = tensor._get_content()
        if content is not None:
            request.raw_input_contents.append(content)
    return request


def open_stream(channel: grpc.Channel, request: Any, timeout: float | None = None) -> Any:
    """One ``ModelStreamInfer`` call on ``channel`` with one request (the stream half-closes
    after it, as one utterance per stream): the call, an iterator of responses."""
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    return stub.ModelStreamInfer(iter([request]), timeout=timeout)


def wait_for(
    predicate: Callable[[], Any], timeout: float = 30.0, what: str = "a state", every: float = 0.05
) -> Any:
    """Until ``predicate()`` is truthy (its value), raising ``TimeoutError`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, RuntimeError, urllib.error.URLError):
            last = predicate()
            if last:
                return last
        time.sleep(every)
    raise TimeoutError(f"no {what} after {timeout:.0f}s (last: {last!r})")


# ---- the closed loop's router, assembled -----------------------------------------------------


class FleetRouter:
    """What a service's router is in a cluster, on loopback: the headless Service's DNS
    (``directory``, for ``cvs-<service>-pods`` in ``namespace``) and one HAProxy router pod
    (``haproxy``, named ``pod`` for Prometheus) on ``<block>.1`` with the operator's config.
    The pods go on ``<block>.2`` onwards (``harness.PodServers(addresses=block, ...)``)."""

    def __init__(
        self,
        work: Path,
        *,
        service: str,
        namespace: str,
        slots_per_server: int = 1,
        server_slots: int = 1,
        queue_timeout_ms: int = 1,
        rendered: str | None = None,
        block: str | None = None,
    ) -> None:
        self.block = block or loopback_block()
        self.work = work
        self.namespace = namespace
        self.pod = f"cvs-{service}-router-0"
        self.directory = SrvDirectory(f"cvs-{service}-pods", namespace)
        self.params = local_router(
            self.directory,
            work,
            address=f"{self.block}.1",
            slots_per_server=slots_per_server,
            server_slots=server_slots,
            queue_timeout_ms=queue_timeout_ms,
        )
        self.haproxy = self._haproxy(rendered)
        # Which server slots each pod's address has had: a pod that leaves the DNS answers
        # has its slot's address cleared at once (hold obsolete 0s) while its streams play on.
        self._slots: dict[str, set[str]] = {}
        self._watching = threading.Event()
        self._watcher: threading.Thread | None = None

    def _watch(self) -> None:
        while not self._watching.wait(0.2):
            with contextlib.suppress(OSError, RuntimeError):
                self._remember(self.haproxy.servers())

    def _remember(self, servers: Mapping[str, ServerState]) -> None:
        for server in servers.values():
            if server.address:
                self._slots.setdefault(server.address, set()).add(server.name)

    def _haproxy(self, rendered: str | None) -> HAProxy:
        if rendered is not None:
            rendered = localize(
                rendered,
                address=f"{self.block}.1",
                nameserver=self.directory.address,
                runtime_dir=self.work,
            )
        return HAProxy(self.params, self.work, rendered=rendered)

    def use_rendered(self, rendered: str) -> None:
        """Run a cluster's rendered config (its ConfigMap's ``haproxy.cfg``) from now on: the
        router restarts on it when it runs (the pods stay)."""
        running = self.haproxy.running
        self.haproxy.stop()
        self.haproxy = self._haproxy(rendered)
        if running:
            self.haproxy.start()

    @property
    def grpc(self) -> str:
        return self.haproxy.grpc

    def targets(self) -> dict[str, tuple[str, str]]:
        """The router's exporter as a ``file_sd`` target: ``{address: (namespace, pod)}``."""
        return {f"{self.block}.1:{self.params.metrics_port}": (self.namespace, self.pod)}

    def start(self, router: bool = True) -> FleetRouter:
        """The DNS, and the router unless ``router`` is False (``haproxy.start()`` later)."""
        self.directory.start()
        try:
            if router:
                self.haproxy.start()
        except Exception:
            self.directory.stop()
            raise
        self._watcher = threading.Thread(target=self._watch, name="router-slots", daemon=True)
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._watching.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        self.haproxy.stop()
        self.directory.stop()

    def __enter__(self) -> FleetRouter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def drained(self, address: str) -> bool:
        """The router sends the pod at ``address`` nothing new and it has no stream in flight
        (what a pod that drains waits for before it stops)."""
        servers = self.haproxy.servers()
        self._remember(servers)
        if any(s.up and s.address == address for s in servers.values()):
            return False
        # Its slots: those it had, unless another pod has taken them since.
        names = [
            n
            for n in self._slots.get(address, set())
            if n in servers and servers[n].address in ("", address)
        ]
        sessions = self.haproxy.view().sessions
        return all(sessions.get(name, 0) == 0 for name in names)

    def streams_per_pod(self, addresses: Mapping[str, str]) -> dict[str, int]:
        """In-flight streams per pod (``addresses``: pod -> its address)."""
        return self.haproxy.streams_per_pod(addresses)

    def served_per_pod(self, addresses: Mapping[str, str]) -> dict[str, int]:
        """Streams each pod's server slot has taken so far (``sessions_total``)."""
        total = self.haproxy.view().total
        by_address = {s.address: s.name for s in self.haproxy.servers().values() if s.address}
        return {pod: total.get(by_address.get(a, ""), 0) for pod, a in addresses.items()}

    def summary(self, addresses: Mapping[str, str]) -> str:
        """One line: the router's queue and the streams per pod (the closed loop prints it)."""
        try:
            view = self.haproxy.view()
            streams = self.streams_per_pod(addresses)
        except (OSError, RuntimeError) as err:
            return f"router: unreadable ({err})"
        per_pod = " ".join(f"{pod}={n}" for pod, n in sorted(streams.items())) or "-"
        return f"router: queue {view.queue}, up {view.active_servers}, streams per pod {per_pod}"
