"""The operator as a real process against the local cluster, and waiting helpers for tests."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.conftest import Cluster

T = TypeVar("T")

FAST_SETTINGS = {
    "COSYVOICE_BUILD_RETRY_BASE_SECONDS": "2",
    "COSYVOICE_BUILD_MAX_ATTEMPTS": "3",
    "COSYVOICE_BUILD_BACKOFF_LIMIT": "0",
}


class OperatorProcess:
    """``cosyvoice-operator run -n NS`` in a subprocess, with its log kept for failures."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        log_dir: Path,
        *args: str,
        **env: str,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.args = args
        self.env = {**cluster.env, **FAST_SETTINGS, **env}
        self.log_path = log_dir / f"operator-{namespace}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.liveness_port: int | None = None
        self.metrics_port: int | None = None

    def with_metrics(self, port: int) -> OperatorProcess:
        """Serve the operator's metrics on 127.0.0.1:`port` (read by requests_made)."""
        self.metrics_port = port
        self.args = (*self.args, "--metrics-port", str(port), "--metrics-address", "127.0.0.1")
        return self

    def start(self, liveness_port: int | None = None) -> OperatorProcess:
        log = self.log_path.open("ab")
        extra: list[str] = []
        self.liveness_port = liveness_port
        if liveness_port is not None:
            extra = ["--liveness", f"http://127.0.0.1:{liveness_port}/healthz"]
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cosyvoice_operator",
                "run",
                "-n",
                self.namespace,
                *self.args,
                *extra,
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies or the pod is OOM-killed."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def health(self) -> dict[str, Any] | None:
        """The liveness endpoint's answer (the control loop's own report), or None."""
        assert self.liveness_port is not None, "started without a liveness port"
        url = f"http://127.0.0.1:{self.liveness_port}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=3) as r:
                found: dict[str, Any] = json.loads(r.read())
                return found
        except (OSError, ValueError):
            return None

    def loop(self) -> dict[str, Any]:
        """The control loop's report (requests made, passes, queue), waiting for it. kopf
        answers the liveness endpoint from a copy up to 10 s old: for a count at a moment,
        read requests_made()."""
        return wait_for(
            "the control loop's report", lambda: (self.health() or {}).get("controlLoop")
        )

    def requests_made(self) -> Counter[tuple[str, str]]:
        """The operator's own count of its requests to the API server, now, from its metrics
        endpoint (cosyvoice_api_requests_total): (verb, resource) -> count, WATCH for watches.
        """
        assert self.metrics_port is not None, "started without a metrics port"

        def scrape() -> str | None:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=3) as r:
                    text: str = r.read().decode()
                    return text
            except OSError:
                return None

        found: Counter[tuple[str, str]] = Counter()
        for line in wait_for("the operator's metrics", scrape).splitlines():
            if line.startswith("cosyvoice_api_requests_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
                count = int(float(line.rsplit(" ", 1)[1]))
                found[(labels["verb"], labels["resource"])] += count
        return found

    def log(self, whole: bool = False) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text if whole else text[-4000:]


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 60, interval: float = 0.5
) -> T:
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def get_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def service(
    name: str,
    uri: str = "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
    variant: str = "cosyvoice3",
    **spec: Any,
) -> str:
    body: dict[str, Any] = {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": name},
        "spec": {"model": {"variant": variant, "uri": uri}, **spec},
    }
    return json.dumps(body)


def cache_claim(name: str = "cosyvoice-engines") -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "100Gi"}},
            },
        }
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def env_flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false")
