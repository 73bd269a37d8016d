"""The real process: `python -m cosyvoice_engine_builder`, exit codes, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cosyvoice_engine_builder
from tests.engine_builder.conftest import KEY, Builder

PACKAGE_ROOT = str(Path(cosyvoice_engine_builder.__file__).resolve().parents[1])


def _env(builder: Builder, **extra: str) -> dict[str, str]:
    env = {**builder.env, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def test_module_entry_point_builds_and_verifies(builder: Builder) -> None:
    env = _env(builder)
    build = subprocess.run(
        [sys.executable, "-m", "cosyvoice_engine_builder", *builder.args()],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    verify = subprocess.run(
        [
            *(sys.executable, "-m", "cosyvoice_engine_builder", "verify"),
            *("--cache-dir", str(builder.cache), "--key", KEY),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert verify.returncode == 0
    assert json.loads(verify.stdout)["key"] == KEY


def test_sigterm_stops_the_tool_and_reports(builder: Builder) -> None:
    pid_file = builder.tmp / "tool.pid"
    env = _env(builder, FAKE_SLEEP="trtllm-build:60", FAKE_PID_FILE=str(pid_file))
    proc = subprocess.Popen(
        [sys.executable, "-m", "cosyvoice_engine_builder", *builder.args()],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pid_file.exists(), "the build tool never started"
        tool_pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143
    assert "terminated by SIGTERM during build" in out
    message = json.loads(builder.termination_path.read_text())
    assert message == {
        "result": "failed",
        "step": "build",
        "key": KEY,
        "message": "terminated by SIGTERM",
    }
    # The tool did not outlive the builder.
    try:
        os.kill(tool_pid, 0)
        alive = True
    except ProcessLookupError:
        alive = False
    assert not alive
    # And the next attempt resumes after convert.
    builder.reset_calls()
    assert builder.build().code == 0
    assert builder.tools_called()[0] == "trtllm-build"


def test_version_flag() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "cosyvoice_engine_builder", "--version"],
        env={**os.environ, "PYTHONPATH": PACKAGE_ROOT},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0
    assert cosyvoice_engine_builder.__version__ in out.stdout
