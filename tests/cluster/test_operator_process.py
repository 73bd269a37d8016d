"""The operator process itself: its liveness endpoint and its answer to bad settings."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.cluster.operator_process import OperatorProcess
from tests.conftest import Cluster


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


def test_a_kubeconfig_that_cannot_be_loaded_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    proc = subprocess.run(
        [sys.executable, "-m", "cosyvoice_operator", "run"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(missing)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    # It names the file it looked for and says there is none (not the loader's words about
    # a missing current-context).
    assert line.startswith("error: no kubeconfig:") and str(missing) in line, line
    assert "no such file exists" in line and "current-context" not in line, line


def test_an_api_server_that_does_not_answer_is_tried_a_few_times_then_one_clear_line(
    cluster: Cluster, tmp_path: Path
) -> None:
    # The cluster's own credentials, pointed at a port where nothing listens.
    config = Path(cluster.kubeconfig).read_text()
    dead = tmp_path / "kubeconfig"
    port = _free_port()
    dead.write_text(
        re.sub(r"server: https://127\.0\.0\.1:\d+", f"server: https://127.0.0.1:{port}", config)
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cosyvoice_operator", "run"],
        env={**cluster.env, "KUBECONFIG": str(dead), "COSYVOICE_CONNECT_ATTEMPTS": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "did not answer after 2 tries" in proc.stderr and f"127.0.0.1:{port}" in proc.stderr
    assert time.monotonic() - started < 60  # bounded, not forever
