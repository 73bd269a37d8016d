"""The router's HAProxy configuration (pure): one fleet-wide queue in front of the Triton pods.

Every gRPC call (one ``ModelStreamInfer`` stream) is one HTTP/2 stream: HAProxy's
``balance leastconn`` counts in-flight streams per server, ``maxconn`` caps a server at its
share of the pod's stream slots, and the streams that find every slot busy wait in the
backend's one FIFO queue until the first slot frees or ``timeout queue`` answers 503 (gRPC
clients see UNAVAILABLE). docs/concepts/routing.md says what clients see.

Membership never needs a reload: in a cluster the servers come from the DNS SRV records of
the headless Service of the Triton pods (``server-template``, one answer per Ready pod); a pod
that leaves the records is put in maintenance and keeps its playing streams. A draining pod
(cosyvoice-serve's ``/ready`` answers 503) fails the health check and gets no new stream
before it even leaves the records. For local tests the same configuration is rendered with a
static server list (``ServerSource.static``), so the test world runs the production config.

Only keywords that HAProxy 2.6 (Debian 12, the tests) and 3.2 (the cluster image) both
document are used; every rendered configuration passes ``haproxy -c`` in the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

# Backend names are fixed: the autoscaler's queries select ``proxy="triton"``.
GRPC_BACKEND = "triton"
HTTP_BACKEND = "triton_http"
GRPC_PORT, HTTP_PORT, METRICS_PORT = 8001, 8000, 8404
# cosyvoice-serve's GET /ready on the Triton pod's health port: Triton ready and not draining.
HEALTH_PORT, HEALTH_PATH = 8003, "/ready"
# The router's own liveness and readiness (answered by HAProxy itself on the metrics port).
LIVENESS_PATH = "/healthz"
# The runtime directory (an emptyDir in the pod): the admin socket.
RUNTIME_DIR = "/var/run/haproxy"
RESOLVER = "kube-dns"
# tune.bufsize: see haproxy_config.
BUFSIZE_BYTES = 262144


@dataclass(frozen=True)
class StaticServer:
    """One Triton endpoint named by address (local tests): gRPC, HTTP and health ports."""

    host: str
    grpc_port: int
    http_port: int
    health_port: int = HEALTH_PORT

    @classmethod
    def parse(cls, text: str) -> StaticServer:
        """``host:grpc_port:http_port`` or ``host:grpc_port:http_port:health_port``."""
        parts = text.split(":")
        if len(parts) not in (3, 4) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
            raise ValueError(
                f"a static server is host:grpc_port:http_port[:health_port], got {text!r}"
            )
        ports = [int(p) for p in parts[1:]]
        if not all(0 < p < 65536 for p in ports):
            raise ValueError(f"ports must be 1-65535, got {text!r}")
        return cls(parts[0], *ports)


@dataclass(frozen=True)
class ServerSource:
    """Where the Triton pods come from: DNS SRV names of a headless Service (a cluster), or a
    static list (local tests). Build with ``dns`` or ``static``."""

    grpc_srv: str = ""  # _grpc._tcp.<headless>.<ns>.svc.cluster.local
    http_srv: str = ""  # _http._tcp.<headless>.<ns>.svc.cluster.local
    # "" : the nameservers of /etc/resolv.conf (the pod's, i.e. the cluster DNS); else
    # "address:port" of one nameserver (local tests: a loopback SRV responder).
    nameserver: str = ""
    static: tuple[StaticServer, ...] = ()

    @classmethod
    def dns(
        cls,
        headless_service: str,
        namespace: str,
        nameserver: str = "",
        zone: str = "cluster.local",
    ) -> ServerSource:
        host = f"{headless_service}.{namespace}.svc.{zone}"
        return cls(
            grpc_srv=f"_grpc._tcp.{host}", http_srv=f"_http._tcp.{host}", nameserver=nameserver
        )

    @classmethod
    def of(cls, servers: list[str] | tuple[str, ...]) -> ServerSource:
        """A static list of ``host:grpc_port:http_port[:health_port]`` strings."""
        return cls(static=tuple(StaticServer.parse(s) for s in servers))

    @property
    def is_dns(self) -> bool:
        return bool(self.grpc_srv)


@dataclass(frozen=True)
class RouterConfig:
    servers: ServerSource
    slots_per_server: int  # maxconn of each Triton pod in this router: floor(slots / replicas)
    server_slots: int  # server-template size: the most Triton pods the fleet may have
    queue_timeout_ms: int  # `timeout queue`: how long a stream may wait for a slot
    grpc_port: int = GRPC_PORT
    http_port: int = HTTP_PORT
    metrics_port: int = METRICS_PORT
    bind_address: str = ""  # "" : every address (a pod); local tests bind loopback
    health_path: str = HEALTH_PATH
    # Inactivity limit of a stream or an idle client connection (both directions): above
    # the longest silence in a stream. An idle client connection is closed with a GOAWAY
    # after it; gRPC channels reconnect on their next call.
    idle_timeout_s: int = 600
    connect_timeout_ms: int = 5000
    # After a stop signal (SIGUSR1: soft stop), how long streams in flight may finish.
    hard_stop_after_s: int = 0  # 0 : no limit in the config (the kubelet's grace decides)
    runtime_dir: str = RUNTIME_DIR

    def __post_init__(self) -> None:
        if self.slots_per_server < 1:
            raise ValueError(f"slots_per_server must be >= 1, got {self.slots_per_server}")
        if self.server_slots < 1:
            raise ValueError(f"server_slots must be >= 1, got {self.server_slots}")
        if self.queue_timeout_ms < 1:
            raise ValueError(f"queue_timeout_ms must be >= 1, got {self.queue_timeout_ms}")
        if not self.servers.is_dns and not self.servers.static:
            raise ValueError("servers: a DNS SRV name or at least one static server")


def haproxy_config(params: RouterConfig) -> str:
    """haproxy.cfg of one router (see the module docstring)."""
    p = params
    at = p.bind_address
    lines = [
        "# Rendered by cosyvoice-operator (render/router.py); docs/concepts/routing.md.",
        "global",
        "    log stdout format raw local0",
        f"    stats socket {p.runtime_dir}/admin.sock mode 600 level admin",
        # Each stream's buffer. At HAProxy's default (16 KB) a stream waiting in the queue
        # whose request is larger (a 2-s reference is 128 KB) fills it and blocks the h2
        # demux of its client connection: every other stream of that channel, the playing
        # ones too, stalls until its deadline (measured on 2.6.12:
        # tests/closed_loop/test_router.py). 256 KB holds a reference of about 4 s (16 kHz,
        # FP32); docs/concepts/routing.md says what a larger one costs.
        f"    tune.bufsize {BUFSIZE_BYTES}",
    ]
    if p.hard_stop_after_s:
        lines.append(f"    hard-stop-after {p.hard_stop_after_s}s")
    if p.servers.is_dns:
        lines += ["", f"resolvers {RESOLVER}"]
        if p.servers.nameserver:
            lines.append(f"    nameserver dns1 {p.servers.nameserver}")
        else:
            lines.append("    parse-resolv-conf")
        lines += [
            "    accepted_payload_size 8192",
            "    resolve_retries 3",
            "    timeout resolve 1s",
            "    timeout retry 1s",
            # a pod that left the SRV records goes to maintenance at the next answer (its
            # playing streams go on; no new stream reaches it)
            "    hold obsolete 0s",
        ]
    lines += [
        "",
        "defaults",
        "    mode http",
        "    log global",
        "    option redispatch",
        "    retries 2",
        f"    timeout connect {p.connect_timeout_ms}ms",
        f"    timeout client {p.idle_timeout_s}s",
        f"    timeout server {p.idle_timeout_s}s",
        f"    timeout queue {p.queue_timeout_ms}ms",
        "    timeout check 2s",
        "",
        "frontend grpc",
        f"    bind {at}:{p.grpc_port} proto h2",
        "    option httplog",
        f"    default_backend {GRPC_BACKEND}",
        "",
        "frontend http",
        f"    bind {at}:{p.http_port}",
        "    option httplog",
        f"    default_backend {HTTP_BACKEND}",
        "",
        "frontend metrics",
        f"    bind {at}:{p.metrics_port}",
        "    no log",
        f"    monitor-uri {LIVENESS_PATH}",
        "    http-request use-service prometheus-exporter if { path /metrics }",
        "",
        f"backend {GRPC_BACKEND}",
        "    balance leastconn",
        *_health_check(p),
        "    default-server inter 2s fall 1 rise 1",
    ]
    lines += _servers(p, grpc=True)
    lines += [
        "",
        f"backend {HTTP_BACKEND}",
        "    balance leastconn",
        *_health_check(p),
        "    default-server inter 2s fall 1 rise 1",
    ]
    lines += _servers(p, grpc=False)
    return "\n".join(lines) + "\n"


def _health_check(p: RouterConfig) -> list[str]:
    """cosyvoice-serve's readiness (HTTP/1.1 on its health port, whatever the traffic's
    protocol). For servers filled from SRV records the port and protocol are an explicit
    ``http-check connect`` rule: written as ``check port ... check-proto h1`` on the
    ``server-template`` line, every server but the first failed it with a socket error on
    HAProxy 2.6.12 while its endpoint answered 200 (tests/closed_loop/test_router.py)."""
    if p.servers.is_dns:
        return [
            "    option httpchk",
            f"    http-check connect port {HEALTH_PORT} proto h1",
            f"    http-check send meth GET uri {p.health_path}",
            "    http-check expect status 200",
        ]
    return [f"    option httpchk GET {p.health_path}", "    http-check expect status 200"]


def _servers(p: RouterConfig, *, grpc: bool) -> list[str]:
    # gRPC: HTTP/2 to the pod, at most its slots; the health check speaks HTTP/1.1 to
    # cosyvoice-serve's health port whatever the traffic's protocol.
    traffic = f" proto h2 maxconn {p.slots_per_server}" if grpc else ""
    if p.servers.is_dns:
        srv = p.servers.grpc_srv if grpc else p.servers.http_srv
        return [
            f"    server-template pod 1-{p.server_slots} {srv} resolvers {RESOLVER}"
            f" init-addr none{traffic} check"
        ]
    return [
        f"    server pod{i} {s.host}:{s.grpc_port if grpc else s.http_port}{traffic}"
        f" check port {s.health_port} check-proto h1"
        for i, s in enumerate(p.servers.static, 1)
    ]
