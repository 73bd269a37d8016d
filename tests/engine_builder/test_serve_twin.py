"""``cosyvoice-serve`` in front of the REAL tritonserver (the CPU twin's, from the pytriton wheel).

The pod is as the operator renders it for a CosyVoice2 service (an engine of 4 sequences):
its repository (``cpu_twin.to_cpu``), the project's own orchestrator
(``serving-models/models/cosyvoice2/model.py``, what the serving image ships) with the twin's
stand-ins for the other models as the image's model code, an engine the builder's pipeline
built (the gate passes), and tritonserver reached through ``TRITONSERVER``: a wrapper that
adds only what the wheel's server needs on a CPU (its Python backend, loopback addresses).
Nothing is faked between ``cosyvoice-serve`` and Triton, nor in the orchestrator: its drain
check, its ``cosyvoice_active_streams`` gauge and its refusal are the ones a pod runs. Only
its ``model_dir`` and ``llm_tokenizer_dir`` point at the tiny synthetic release's files
(``cpu_twin.write_orchestrator_files``), as in the closed loop (``PodServers._use_ours``).

A stream is held in flight by the stand-in LLM (``tensorrt_llm``): while the file
``COSYVOICE_TWIN_LLM_PAUSE_FILE`` names exists it sends every step but its last, so the
orchestrator has its first chunks out, and waits for the file to be gone.

Issue 19 item 6, a drain that drains: a stream mid-way when SIGTERM arrives completes, a
stream started after it is refused with Triton's UNAVAILABLE (gRPC status 14, issue 31),
readiness answers 503 meanwhile, and Triton is stopped only once the orchestrators'
``cosyvoice_active_streams`` gauge is 0. Item 7, self-healing: our orchestrator's Python stub
killed under a ready Triton makes ``/ready`` answer 503, and Triton restarted in place makes
it 200 again. Every wait is for a state (a chunk received, the gauge, the readiness answer,
a file), bounded; no sleep decides.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_engine_builder.serving import health, stubs
from cosyvoice_operator.api import spec
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.render import triton
from tests.engine_builder.test_serve import Pod, pod, running  # noqa: F401 (fixtures)
from tests.triton_twin.test_serving_options import GRPC_STATUS_HEADERS, Flow

ENGINE_DIR = "/engines/" + "e" * 40
URI = "hf://FunAudioLLM/CosyVoice2-0.5B"
ORCHESTRATOR = "cosyvoice2"
# Long enough that the drain never runs out in this test: the stream ends it.
DRAIN_SECONDS = 120
# The start of the refusal's message (cosyvoice_serving_models.admission.DRAINING_ERROR).
DRAINING_ERROR = "this pod is draining"
# What the tritonclient reports for gRPC status 14, the code clients retry elsewhere on.
UNAVAILABLE = "StatusCode.UNAVAILABLE"


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 90.0) -> None:
    """Poll a state until it holds (bounded: a hang fails with ``what``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class Serving:
    """One ``cosyvoice-serve`` process, its ports and what it printed."""

    def __init__(
        self, owner: Pod, process: subprocess.Popen[str], ports: list[int], pause: Path
    ) -> None:
        self.pod = owner
        self.process = process
        self.http, self.grpc, self.metrics, self.health = ports
        self.pause = pause
        self.lines: list[str] = []
        # Both pipes are read as they fill (Triton's log goes to them too).
        assert process.stdout is not None and process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(stream,), daemon=True)
            for stream in (process.stdout, process.stderr)
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Iterator[str]) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))

    def ready_status(self) -> int | None:
        return health.local_status(f"http://127.0.0.1:{self.health}/ready")

    def active_streams(self) -> float:
        text = health.local_text(f"http://127.0.0.1:{self.metrics}/metrics") or ""
        return health.sample_sum(text, health.ACTIVE_STREAMS)

    def output(self) -> str:
        return "\n".join(self.lines)

    def exited(self, timeout: float = 60) -> int:
        code = self.process.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return code

    def release(self) -> None:
        """Streams held by the stand-in LLM go on, and new ones are not held."""
        self.pause.unlink(missing_ok=True)

    def stop(self) -> None:
        """After a failure: SIGINT goes to Triton at once (no drain), then the process ends."""
        self.release()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def write_pod_repository(root: Path) -> tuple[Path, Path]:
    """The rendered default CosyVoice2 repository (CPU twin) as the ConfigMap's files, and as
    the image's model code our orchestrator and the twin's stand-ins for the rest."""
    # An engine of 4 sequences: 4 orchestrator instances (the default 16 only load slower).
    svc = spec.parse(
        {
            "model": {"variant": "cosyvoice2", "uri": URI},
            "engine": {"maxBatchSize": 4},
            "serving": {"dynamicBatching": {"preferredBatchSizes": [4]}},
        }
    )
    rendered = cpu_twin.to_cpu(triton.render_repository(svc, ENGINE_DIR))
    release = cpu_twin.write_orchestrator_files("cosyvoice2", root / "release")
    rendered[ORCHESTRATOR] = cpu_twin.with_parameters(
        rendered[ORCHESTRATOR],
        {"model_dir": str(release), "llm_tokenizer_dir": str(release / "llm")},
    )
    ours = cpu_twin.our_model_code(ORCHESTRATOR)
    assert ours is not None, "this checkout has no serving-models/"
    config, code = root / "config", root / "code"
    config.mkdir(parents=True)
    for name, text in rendered.items():
        (config / f"{name}.pbtxt").write_text(text)
        version = code / "cosyvoice2" / name / "1"
        version.mkdir(parents=True)
        if name == ORCHESTRATOR:
            shutil.copy(ours, version / "model.py")
        else:
            cpu_twin.place_standin(name, version)
    return config, code


def write_tritonserver(work: Path) -> Path:
    """``TRITONSERVER``: the wheel's server with cosyvoice-serve's own arguments."""
    command, env = cpu_twin.server_command(work)
    wrapper = work / "tritonserver"
    quoted = " ".join(f"'{part}'" for part in command)
    wrapper.write_text(
        "#!/bin/sh\n"
        f"export LD_LIBRARY_PATH='{env['LD_LIBRARY_PATH']}'\n"
        f"export PATH='{env['PATH']}'\n"
        f'exec {quoted} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


@contextmanager
def started_serving(
    pod: Pod,  # noqa: F811
    running: list[subprocess.Popen[str]],  # noqa: F811
    **overrides: Any,
) -> Iterator[Serving]:
    work = pod.tmp / "twin"
    work.mkdir()
    config, code = write_pod_repository(work)
    ports = cpu_twin.free_ports(4)
    argv = pod.argv(
        "cosyvoice2",
        repository_config=config,
        model_code=code,
        http_port=ports[0],
        grpc_port=ports[1],
        metrics_port=ports[2],
        health_port=ports[3],
        drain_seconds=DRAIN_SECONDS,
        # Python instances unload one after the other once the drain is over.
        exit_timeout_seconds=30,
        **overrides,
    )
    # While this file exists, a stream's last LLM step, after its first chunks, waits.
    pause = work / "llm-pause"
    pause.touch()
    process = pod.start(
        argv[1:],
        module="cosyvoice_engine_builder.serving",
        TRITONSERVER=str(write_tritonserver(work)),
        COSYVOICE_TWIN_LLM_PAUSE_FILE=str(pause),
        # Where our orchestrator's stub finds its package (as the serving image sets it).
        COSYVOICE_MODELS_PATH=str(cpu_twin.SERVING_MODELS),
    )
    running.append(process)
    server = Serving(pod, process, ports, pause)
    try:
        wait_until("GET /ready to answer 200", lambda: server.ready_status() == 200, 120)
        yield server
    finally:
        server.stop()


@pytest.fixture
def serving(pod: Pod, running: list[subprocess.Popen[str]]) -> Iterator[Serving]:  # noqa: F811
    with started_serving(pod, running) as server:
        yield server


# A held stream (COSYVOICE_TWIN_LLM_PAUSE_FILE) is a stream whose LLM call hangs: every stub
# alive, no progress.
STALL_SECONDS = 3


@pytest.fixture
def stalling(pod: Pod, running: list[subprocess.Popen[str]]) -> Iterator[Serving]:  # noqa: F811
    with started_serving(pod, running, stall_seconds=STALL_SECONDS) as server:
        yield server


def test_sigterm_lets_the_stream_in_flight_finish_and_refuses_new_ones(serving: Serving) -> None:
    url = f"127.0.0.1:{serving.grpc}"
    playing = Flow(url, "cosyvoice2", "A stream that is playing when the pod is told to stop.")
    try:
        assert playing.first_audio.wait(60), playing.errors
        wait_until("the gauge to count the stream", lambda: serving.active_streams() == 1)

        serving.process.terminate()  # SIGTERM, as the kubelet sends it after preStop
        wait_until("GET /ready to answer 503", lambda: serving.ready_status() == 503)
        drain_file = Path(f"{serving.pod.repository}.draining")
        wait_until("the drain file", drain_file.exists)

        # Refused with UNAVAILABLE: a client that asks Triton for gRPC status codes on its
        # stream gets status 14 and the stream closed; one that does not gets the message
        # alone (Triton's streams carry no status without that header).
        late = Flow(url, "cosyvoice2", "A stream after SIGTERM.", headers=GRPC_STATUS_HEADERS)
        plain = Flow(url, "cosyvoice2", "Another stream after SIGTERM.")
        try:
            assert late.done.wait(60) and plain.done.wait(60)
            assert late.statuses == [UNAVAILABLE], (late.statuses, late.errors)
            assert DRAINING_ERROR in late.errors[0], late.errors
            assert plain.statuses == [None] and DRAINING_ERROR in plain.errors[0], plain.errors
            assert not late.first_audio.is_set() and not plain.first_audio.is_set()
        finally:
            late.close()
            plain.close()

        # Triton still serves the stream that is playing: nothing was stopped.
        assert serving.process.poll() is None
        assert serving.active_streams() == 1
        assert not playing.done.is_set()

        serving.release()
        assert playing.done.wait(60), serving.output()
        assert playing.errors == [], playing.errors
    finally:
        playing.close()
    code = serving.exited()
    out = serving.output()
    assert code == 0, out
    assert "[serve] SIGTERM: not ready, refusing new streams" in out
    assert "[serve] no stream in flight after" in out
    assert "[serve] Triton exited with code 0 after SIGTERM" in out
    assert not drain_file.exists()


def triton_pid(serve_pid: int) -> int:
    """The tritonserver cosyvoice-serve started (its child, a session of its own)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            status = (proc / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if (
            fields.get("PPid", "").strip() == str(serve_pid)
            and fields.get("Name") == "tritonserver"
        ):
            return int(proc.name)
    raise AssertionError(f"no tritonserver under {serve_pid}")


def test_a_dead_python_stub_makes_the_pod_not_ready_until_triton_is_restarted(
    serving: Serving,
) -> None:
    """Issue 19 item 7: Triton itself stays ready with a dead stub; the pod does not."""
    serving.release()
    triton_before = triton_pid(serving.process.pid)
    wait_until("the stubs to be recorded", lambda: "Python stub(s)" in serving.output())
    [orchestrator] = [s for s in stubs.stubs_of(triton_before) if s.instance == "cosyvoice2_0_0"]
    killed_at = time.monotonic()
    os.kill(orchestrator.pid, signal.SIGKILL)
    wait_until("GET /ready to answer 503", lambda: serving.ready_status() == 503, 30)
    not_ready_after = time.monotonic() - killed_at
    wait_until("GET /ready to answer 200 again", lambda: serving.ready_status() == 200, 120)
    ready_after = time.monotonic() - killed_at
    print(
        f"stub killed: not ready after {not_ready_after:.1f}s, ready again after {ready_after:.1f}s"
    )
    assert triton_pid(serving.process.pid) != triton_before
    counters = health.local_text(f"http://127.0.0.1:{serving.health}/metrics") or ""
    assert health.sample_sum(counters, "cosyvoice_serve_stub_failures_total") == 1
    assert health.sample_sum(counters, "cosyvoice_serve_triton_restarts_total") == 1
    assert "Python backend stub of cosyvoice2_0_0 died or stopped" in serving.output()
    # The restarted Triton serves a whole stream.
    flow = Flow(f"127.0.0.1:{serving.grpc}", "cosyvoice2", "After the recovery.")
    try:
        assert flow.done.wait(60)
        assert flow.errors == [] and flow.first_audio.is_set()
    finally:
        flow.close()


def triton_restarted(serve_pid: int, before: int) -> bool:
    with suppress(AssertionError):
        return triton_pid(serve_pid) != before
    return False  # between the old Triton's exit and the new one's start


def test_a_stream_that_makes_no_progress_makes_the_pod_not_ready_until_triton_is_restarted(
    stalling: Serving,
) -> None:
    """Issue 19 item 7, a wedged stub: the orchestrator's stub is alive but its stream makes
    no progress (held after its first chunk), so no stub is dead and Triton stays ready; with
    work in flight and no inference completing for --stall-seconds the pod turns not ready,
    the stall is counted, Triton is restarted and the pod is ready again."""
    url = f"127.0.0.1:{stalling.grpc}"
    triton_before = triton_pid(stalling.process.pid)
    held = Flow(url, "cosyvoice2", "A stream whose stub hangs after its first chunk.")
    try:
        assert held.first_audio.wait(60), held.errors
        wait_until("GET /ready to answer 503", lambda: stalling.ready_status() == 503, 60)
        wait_until(
            "Triton to be restarted",
            lambda: triton_restarted(stalling.process.pid, triton_before),
            120,
        )
        stalling.release()  # the restarted Triton's streams run through
        wait_until("GET /ready to answer 200 again", lambda: stalling.ready_status() == 200, 120)
        assert held.done.wait(60) and held.errors, "the held stream ends with the old Triton"
    finally:
        held.close()
    out = stalling.output()
    assert f"made no progress for {STALL_SECONDS}s (--stall-seconds {STALL_SECONDS})" in out
    assert "stream(s) left make no progress: stopping Triton" in out
    counters = health.local_text(f"http://127.0.0.1:{stalling.health}/metrics") or ""
    assert health.sample_sum(counters, "cosyvoice_serve_stalls_total") == 1
    assert health.sample_sum(counters, "cosyvoice_serve_stub_failures_total") == 0
    assert health.sample_sum(counters, "cosyvoice_serve_triton_restarts_total") == 1
    flow = Flow(url, "cosyvoice2", "After the recovery.")
    try:
        assert flow.done.wait(60)
        assert flow.errors == [] and flow.first_audio.is_set()
    finally:
        flow.close()
