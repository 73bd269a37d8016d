"""Debian's ``prometheus`` on loopback over a ``file_sd`` file (start, stop, restart on the
same port and storage), for the closed loop. Its scrape manager applies target changes at most
every 5 s: a new process is scraped 5-7 s after it is listed; one taken out of the file has
its series marked stale as soon as that applies."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from cosyvoice_operator.devtools.closedloop import cpu_twin


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
