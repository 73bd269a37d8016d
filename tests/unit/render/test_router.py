"""The router's HAProxy configuration: golden files, and every golden passes `haproxy -c`
(Debian's HAProxy, installed by scripts/setup.sh) without a warning."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from cosyvoice_operator.render.router import (
    GRPC_BACKEND,
    HTTP_BACKEND,
    RouterConfig,
    ServerSource,
    StaticServer,
    haproxy_config,
)
from tests.unit import golden

GOLDEN = Path(__file__).parent / "golden" / "router"

CASES = {
    # a cluster: pods by DNS SRV of the headless Service, the pod's resolv.conf
    "cluster": RouterConfig(
        servers=ServerSource.dns("cvs-tts-pods", "voices"),
        slots_per_server=8,
        server_slots=16,
        queue_timeout_ms=3893,
        hard_stop_after_s=175,
    ),
    # the test world: SRV from a loopback responder, loopback binds
    "loopback-dns": RouterConfig(
        servers=ServerSource.dns("cvs-tts-pods", "ns", nameserver="127.0.0.1:5353"),
        slots_per_server=2,
        server_slots=4,
        queue_timeout_ms=20000,
        bind_address="127.0.0.1",
        grpc_port=19001,
        http_port=19000,
        metrics_port=19404,
        runtime_dir="/tmp/cosyvoice-router",
    ),
    # the test world: a static list of stand-in pods
    "loopback-static": RouterConfig(
        servers=ServerSource.of(["127.0.0.2:8001:8000", "127.0.0.3:8001:8000:9003"]),
        slots_per_server=1,
        server_slots=2,
        queue_timeout_ms=1500,
        bind_address="127.0.0.1",
        runtime_dir="/tmp/cosyvoice-router",
    ),
}


def test_goldens() -> None:
    rendered = {name: haproxy_config(config) for name, config in CASES.items()}
    golden.sync_folder(GOLDEN, rendered, ".cfg")
    assert sorted(p.stem for p in GOLDEN.glob("*.cfg")) == sorted(rendered)
    for name, text in rendered.items():
        golden.check(GOLDEN / f"{name}.cfg", text)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_golden_passes_haproxy_check(name: str) -> None:
    haproxy = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    assert haproxy, (
        "haproxy is not installed: scripts/setup.sh installs Debian's (apt-get install -y "
        "--no-install-recommends haproxy); every rendered router config is checked with it"
    )
    done = subprocess.run(
        [haproxy, "-c", "-f", str(GOLDEN / f"{name}.cfg")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "Configuration file is valid" in out, out
    assert "WARNING" not in out and "ALERT" not in out, out


def test_the_fleet_queue_and_its_limits() -> None:
    text = haproxy_config(CASES["cluster"])
    backend = text.split(f"\nbackend {GRPC_BACKEND}\n")[1].split("\nbackend ")[0]
    assert "balance leastconn" in backend
    assert (
        "server-template pod 1-16 _grpc._tcp.cvs-tts-pods.voices.svc.cluster.local resolvers "
        "kube-dns init-addr none proto h2 maxconn 8 check"
    ) in backend
    # The health check of SRV-filled servers: an explicit connect rule (the server-line form
    # fails on 2.6.12 for all servers but the first), HTTP/1.1 to cosyvoice-serve's /ready.
    assert (
        "http-check connect port 8003 proto h1\n    http-check send meth GET uri /ready" in backend
    )
    # Each stream's buffer holds a real-size request (tests/closed_loop/test_router.py).
    assert "    tune.bufsize 262144\n" in text.split("\ndefaults\n")[0]
    assert "timeout queue 3893ms" in text  # explicit: HAProxy's default is timeout connect
    assert "parse-resolv-conf" in text and "nameserver" not in text
    assert "bind :8001 proto h2" in text and "bind :8000\n" in text and "bind :8404\n" in text
    assert "use-service prometheus-exporter if { path /metrics }" in text
    assert "hard-stop-after 175s" in text
    http = text.split(f"\nbackend {HTTP_BACKEND}\n")[1]
    assert "_http._tcp.cvs-tts-pods.voices.svc.cluster.local" in http
    assert "maxconn" not in http and "proto h2" not in http


def test_static_servers() -> None:
    text = haproxy_config(CASES["loopback-static"])
    assert "resolvers" not in text
    assert "server pod1 127.0.0.2:8001 proto h2 maxconn 1 check port 8003 check-proto h1" in text
    assert "server pod2 127.0.0.3:8000 check port 9003 check-proto h1" in text
    assert "bind 127.0.0.1:8001 proto h2" in text


@pytest.mark.parametrize(
    "bad", ["127.0.0.2:8001", "127.0.0.2:x:8000", ":8001:8000", "h:0:8000", "h:1:2:3:4"]
)
def test_a_bad_static_server_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"host:grpc_port:http_port|1-65535"):
        StaticServer.parse(bad)


@pytest.mark.parametrize(
    ("field", "value"), [("slots_per_server", 0), ("server_slots", 0), ("queue_timeout_ms", 0)]
)
def test_limits_below_one_are_refused(field: str, value: int) -> None:
    args = {"slots_per_server": 1, "server_slots": 1, "queue_timeout_ms": 1, field: value}
    with pytest.raises(ValueError, match=field):
        RouterConfig(
            ServerSource.of(["h:1:2"]),
            args["slots_per_server"],
            args["server_slots"],
            args["queue_timeout_ms"],
        )
    with pytest.raises(ValueError, match="servers"):
        RouterConfig(ServerSource(), 1, 1, 1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_rendered_router_runs_and_exports_the_autoscalers_series(tmp_path: Path) -> None:
    """The config does what the probes and the autoscaler rely on, in a real HAProxy: /healthz
    answers on the metrics port, and the exporter has the fleet's queue and each server's
    limit (maxconn) under proxy="triton"."""
    import time
    import urllib.request

    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    assert Path(haproxy).exists(), "haproxy is not installed: scripts/setup.sh installs it"
    metrics = _free_port()
    config = RouterConfig(
        servers=ServerSource.of(["127.0.0.2:1:2", "127.0.0.3:1:2"]),
        slots_per_server=3,
        server_slots=2,
        queue_timeout_ms=1000,
        bind_address="127.0.0.1",
        grpc_port=_free_port(),
        http_port=_free_port(),
        metrics_port=metrics,
        runtime_dir=str(tmp_path),
    )
    path = tmp_path / "haproxy.cfg"
    path.write_text(haproxy_config(config))
    proc = subprocess.Popen(
        [haproxy, "-db", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 20
        health = text = ""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                base = f"http://127.0.0.1:{metrics}"
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as r:
                    health = str(r.status)
                with urllib.request.urlopen(f"{base}/metrics", timeout=2) as r:
                    text = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)  # not listening yet: poll until it is (20 s ceiling)
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        assert health == "200"
        assert 'haproxy_backend_current_queue{proxy="triton"} 0' in text
        assert 'haproxy_server_limit_sessions{proxy="triton",server="pod1"} 3' in text
        assert 'haproxy_server_current_sessions{proxy="triton",server="pod2"} 0' in text
        assert 'haproxy_backend_active_servers{proxy="triton"}' in text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
