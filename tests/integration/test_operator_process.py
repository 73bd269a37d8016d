"""The operator process itself: its liveness endpoint and its answer to bad settings."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.conftest import Cluster
from tests.integration.operator_process import OperatorProcess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_liveness_endpoint_answers_once_the_operator_runs(cluster: Cluster, tmp_path: Path) -> None:
    ns = cluster.namespace("live")
    port = _free_port()
    op = OperatorProcess(cluster, ns, tmp_path)
    op.proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cosyvoice_operator",
            "run",
            "-n",
            ns,
            "--liveness",
            f"http://127.0.0.1:{port}/healthz",
        ],
        env=op.env,
        stdout=op.log_path.open("ab"),
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        status = 0
        while time.monotonic() < deadline and not status:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    status = r.status
            except OSError:
                time.sleep(0.3)
        assert status == 200, op.log()
    finally:
        op.stop()


def test_bad_setting_is_a_clear_error_naming_the_variable(cluster: Cluster) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "cosyvoice_operator", "run"],
        env={**cluster.env, "COSYVOICE_BUILD_MAX_ATTEMPTS": "three"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "COSYVOICE_BUILD_MAX_ATTEMPTS" in proc.stderr
    assert "Traceback" not in proc.stderr
