"""The running pod: the LLM servers and Triton as children, their signals, and the exit code.

The only module that starts and stops processes. As the container's PID 1 this process
also reaps orphans (:func:`reap_orphans`) and must route SIGTERM and SIGINT itself
(:func:`signals_to`). SIGTERM while Triton serves starts a drain (:meth:`Supervisor.run_triton`):
readiness answers not-ready (:mod:`.health`), the orchestrators refuse new streams (the
drain file), and Triton keeps serving until their ``cosyvoice_active_streams`` gauge sums
to 0 or ``--drain-seconds`` is up; only then is Triton told to stop. SIGINT, or a second
SIGTERM, goes to Triton at once. The LLM servers its streams still need are stopped only
after Triton has exited.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from cosyvoice_engine_builder.progress import Console
from cosyvoice_engine_builder.serving import health, launch, progress, stubs
from cosyvoice_engine_builder.serving.exit_codes import EXIT_SERVER_FAILED, ServerFailed
from cosyvoice_engine_builder.serving.launch import LlmServer
from cosyvoice_engine_builder.serving.options import ServeOptions

_HEALTH_POLL_SECONDS = 1.0
_PROGRESS_EVERY_SECONDS = 10.0
_LLM_STOP_GRACE_SECONDS = 15.0
# Beyond Triton's own exit timeout, before a Triton that ignores it is killed (only when
# serve itself stops Triton; after a forwarded signal the kubelet's grace period rules).
_TRITON_STOP_MARGIN_SECONDS = 15.0
_TAIL_LINES = 40
_DRAIN_POLL_SECONDS = 0.25
# Consecutive unreadable metrics pages after which a drain stops waiting (Triton's metrics
# server is gone or wedged: nothing tells how many streams are left).
_DRAIN_UNREADABLE_LIMIT = 8
_STUB_CHECK_SECONDS = 1.0


def exit_code_of(returncode: int) -> int:
    """A child's status as a shell would report it: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def reap_orphans(known: set[int]) -> list[int]:
    """Collect exited processes that are not our own children (PID 1's duty).

    As the container's PID 1 this process inherits every orphan (an MPI daemon whose
    parent died, a Python backend stub's helpers). ``waitid(WNOWAIT)`` peeks without
    reaping, so the children that ``subprocess`` tracks keep their exit status.
    """
    reaped: list[int] = []
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return reaped
        if info is None or info.si_pid in known:
            return reaped
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, 0)
        reaped.append(info.si_pid)


@dataclass
class _Child:
    name: str
    process: subprocess.Popen[str]
    tail: deque[str]

    def poll(self) -> int | None:
        return self.process.poll()

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signum)

    def kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


class Supervisor:
    """Starts the servers, forwards signals, and decides the exit code."""

    def __init__(self, options: ServeOptions, console: Console, report: Callable[..., None]):
        self.options = options
        self.console = console
        self.report = report
        self.llms: list[tuple[LlmServer, _Child]] = []
        self.triton: _Child | None = None
        self.received: int | None = None
        # Once Triton is being started, signals are Triton's alone: the LLM servers must
        # outlive its drain.
        self.triton_phase = False
        # SIGTERM while Triton serves: the main loop drains, then stops Triton.
        self.drain_requested = False
        self.draining = False
        self.forwarded = False
        self.drain_file = drain_file_of(options)
        # The stubs recorded once Triton was ready (None before), and a failure found since.
        self.expected_stubs: dict[str, int] | None = None
        self.stub_failure: str | None = None
        self.stub_failures = 0
        # Streams in flight that made no progress for --stall-seconds (progress.py).
        self.stalls = 0
        self.watch = progress.StallWatch(options.stall_seconds)
        self.triton_restarts = 0
        self._next_stub_check = 0.0
        self._lock = threading.Lock()

    # Signals: recorded and forwarded from the handler, acted upon by the main loop.
    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if self.triton_phase:
            # The first SIGTERM is drained by the main loop (Triton keeps serving the
            # streams in flight, which still need the LLM servers); SIGINT or a second
            # SIGTERM goes to Triton at once. A signal that arrives while Triton is being
            # started is passed on once it runs.
            if signum == signal.SIGTERM and not self.drain_requested:
                self.drain_requested = True
            elif self.triton is not None:
                self.forwarded = True
                self.triton.signal(signum)
        else:
            for _, child in self.llms:
                child.signal(signum)

    def _start(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], *, piped: bool
    ) -> _Child:
        tail: deque[str] = deque(maxlen=_TAIL_LINES)
        try:
            process = subprocess.Popen(
                list(argv),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if piped else None,
                stderr=subprocess.STDOUT if piped else None,
                text=True,
                errors="replace",
                # Own process group: a last-resort SIGKILL reaches its workers too.
                start_new_session=True,
            )
        except OSError as exc:
            raise ServerFailed(
                f"{name}: cannot start {argv[0]}: {exc.strerror or exc}", EXIT_SERVER_FAILED
            ) from exc
        child = _Child(name, process, tail)
        if piped:
            assert process.stdout is not None
            threading.Thread(
                target=self._pump, args=(name, process.stdout, tail), daemon=True
            ).start()
        return child

    def _pump(self, name: str, stream: IO[str], tail: deque[str]) -> None:
        for raw in stream:
            line = raw.rstrip("\r\n")[:1000]
            with self._lock:
                tail.append(line)
            self.console.out(f"[{name}] {line}")

    def _known_pids(self) -> set[int]:
        pids = {c.process.pid for _, c in self.llms}
        if self.triton is not None:
            pids.add(self.triton.process.pid)
        return pids

    def _tick(self) -> None:
        if os.getpid() == 1:
            reap_orphans(self._known_pids())
        time.sleep(0.1)

    def stop_llms(self) -> None:
        running = [(s, c) for s, c in self.llms if c.poll() is None]
        for server, child in running:
            self.console.out(f"[serve] stopping {server.describe()}")
            child.signal(signal.SIGTERM)
        deadline = time.monotonic() + _LLM_STOP_GRACE_SECONDS
        for _, child in running:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill_group()
                child.process.wait()

    def _llm_exited(self) -> tuple[LlmServer, _Child, int] | None:
        for server, child in self.llms:
            code = child.poll()
            if code is not None:
                return server, child, code
        return None

    def _fail_llm(self, server: LlmServer, child: _Child, code: int, when: str) -> int:
        status = exit_code_of(code)
        message = f"{server.describe()} exited with code {status} {when}"
        self.console.err(f"error: {message}")
        self.report(step="llm", message=message, tail=list(child.tail))
        return status or EXIT_SERVER_FAILED

    def start_llms(self, servers: Sequence[LlmServer], environ: Mapping[str, str]) -> int | None:
        """Start every LLM server and wait for each /health; an exit code on failure."""
        for server in servers:
            env = {**environ, "CUDA_VISIBLE_DEVICES": ",".join(server.gpus)}
            self.console.out(
                f"[serve] starting {server.describe()}: CUDA_VISIBLE_DEVICES="
                f"{env['CUDA_VISIBLE_DEVICES']} {' '.join(server.argv)}"
            )
            self.llms.append((server, self._start(server.name, server.argv, env, piped=True)))
        started = time.monotonic()
        pending = {s.index for s in servers}
        next_progress = started + _PROGRESS_EVERY_SECONDS
        next_poll = started
        while pending:
            if self.received is not None:
                self.console.out(
                    f"[serve] {signal.Signals(self.received).name} before Triton started; "
                    "stopping the LLM servers"
                )
                self.stop_llms()
                return 128 + self.received
            exited = self._llm_exited()
            if exited is not None:
                server, child, code = exited
                result = self._fail_llm(server, child, code, "before it answered /health")
                self.stop_llms()
                return result
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + _HEALTH_POLL_SECONDS
                for server in servers:
                    if server.index in pending and _healthy(server.port):
                        pending.discard(server.index)
                        self.console.out(
                            f"[serve] {server.describe()} is healthy after {now - started:.1f}s"
                        )
            elapsed = now - started
            if pending and elapsed > self.options.llm_startup_timeout:
                names = ", ".join(s.describe() for s in servers if s.index in pending)
                message = (
                    f"{names} did not answer /health within "
                    f"{self.options.llm_startup_timeout:.0f}s (--llm-startup-timeout-seconds)"
                )
                self.console.err(f"error: {message}")
                tails = [line for _, c in self.llms for line in c.tail]
                self.report(step="llm", message=message, tail=tails)
                self.stop_llms()
                return EXIT_SERVER_FAILED
            if pending and now >= next_progress:
                next_progress = now + _PROGRESS_EVERY_SECONDS
                for server in servers:
                    if server.index in pending:
                        self.console.out(
                            f"[serve] waiting for {server.describe()} to answer /health: "
                            f"{elapsed:.0f}s of {self.options.llm_startup_timeout:.0f}s"
                        )
            if pending:
                self._tick()
        return None

    # Readiness, the drain, and the stubs.
    def _url(self, port: int, path: str) -> str:
        return f"http://127.0.0.1:{port}{path}"

    def _triton_ready(self) -> bool:
        url = self._url(self.options.http_port, "/v2/health/ready")
        return health.local_status(url) == 200

    def not_ready_reason(self) -> str | None:
        """None when the pod should take new streams; otherwise why not (GET /ready)."""
        if self.draining or self.drain_requested:
            return "draining: the pod is stopping and takes no new stream"
        if self.stub_failure is not None:
            return self.stub_failure
        if self.triton is None or self.triton.poll() is not None:
            return "Triton is not running"
        if self.expected_stubs is None:
            return "Triton is not ready yet"
        if not self._triton_ready():
            return "Triton's /v2/health/ready does not answer 200"
        return None

    def metrics_text(self) -> str:
        """This command's own counters (GET /metrics on --health-port)."""
        return (
            "# HELP cosyvoice_serve_stub_failures_total Python backend stubs found dead, "
            "a zombie or stopped under a ready Triton\n"
            "# TYPE cosyvoice_serve_stub_failures_total counter\n"
            f"cosyvoice_serve_stub_failures_total {self.stub_failures}\n"
            "# HELP cosyvoice_serve_stalls_total Times the streams in flight made no progress "
            "for --stall-seconds (a stub alive but stuck)\n"
            "# TYPE cosyvoice_serve_stalls_total counter\n"
            f"cosyvoice_serve_stalls_total {self.stalls}\n"
            "# HELP cosyvoice_serve_triton_restarts_total Triton restarts to recover stubs\n"
            "# TYPE cosyvoice_serve_triton_restarts_total counter\n"
            f"cosyvoice_serve_triton_restarts_total {self.triton_restarts}\n"
        )

    def _metrics(self) -> str | None:
        return health.local_text(self._url(self.options.metrics_port, "/metrics"))

    def _refuse_new_streams(self) -> None:
        with contextlib.suppress(OSError):
            self.drain_file.parent.mkdir(parents=True, exist_ok=True)
            self.drain_file.write_text("draining\n")

    def _drain(self, triton: _Child) -> None:
        """SIGTERM: keep Triton serving until no stream is in flight or the drain time is up,
        then stop it (Triton's own --exit-timeout-secs then applies)."""
        self.draining = True
        self._refuse_new_streams()
        if self.expected_stubs is None and not self._triton_ready():
            self.console.out("[serve] SIGTERM: Triton is not serving; stopping it")
            self._forward(triton)
            return
        self.console.out(
            "[serve] SIGTERM: not ready, refusing new streams; Triton serves the streams in "
            f"flight for up to {self.options.drain_seconds}s"
        )
        self._wait_for_streams(triton)
        self._forward(triton)

    def _wait_for_streams(self, triton: _Child, stuck: progress.StallWatch | None = None) -> None:
        """Until the orchestrators' gauge (plus Triton's queue) is 0, the drain time is up,
        Triton has exited or was signalled directly, or its metrics cannot be read; with
        ``stuck``, also once the streams left make no progress (the hung ones alone)."""
        started = time.monotonic()
        deadline = started + self.options.drain_seconds
        unreadable, last = 0, -1
        while triton.poll() is None and not self.forwarded:
            text = self._metrics()
            count = None if text is None else health.streams_in_flight(text)
            now = time.monotonic()
            seen = None if text is None else progress.reading(text)
            if stuck is not None and stuck.observe(now, seen) is not None:
                self.console.out(
                    f"[serve] the {count} stream(s) left make no progress: stopping Triton"
                )
                return
            if count is None:
                unreadable += 1
                if unreadable >= _DRAIN_UNREADABLE_LIMIT:
                    self.console.out(
                        "[serve] Triton's metrics cannot be read: stopping Triton without "
                        "knowing the streams in flight"
                    )
                    return
            else:
                unreadable = 0
                if count == 0:
                    self.console.out(
                        f"[serve] no stream in flight after {now - started:.1f}s: stopping Triton"
                    )
                    return
                if count != last:
                    self.console.out(f"[serve] draining: {count} stream(s) in flight")
                    last = count
            if now >= deadline:
                self.console.out(
                    f"[serve] drain time ({self.options.drain_seconds}s) is up with "
                    f"{last} stream(s) in flight: stopping Triton"
                )
                return
            if os.getpid() == 1:
                reap_orphans(self._known_pids())
            time.sleep(_DRAIN_POLL_SECONDS)

    def _forward(self, triton: _Child) -> None:
        if not self.forwarded:
            self.forwarded = True
            triton.signal(signal.SIGTERM)

    def _check_stubs(self, triton: _Child) -> list[str]:
        """The instances whose stub failed (see :mod:`.stubs`); first records them once
        Triton is ready. Checked at most every second."""
        now = time.monotonic()
        if now < self._next_stub_check:
            return []
        self._next_stub_check = now + _STUB_CHECK_SECONDS
        if self.expected_stubs is None:
            if self._triton_ready():
                self.expected_stubs = stubs.live_instances(stubs.stubs_of(triton.process.pid))
                self.console.out(
                    f"[serve] Triton is ready with {len(self.expected_stubs)} Python stub(s)"
                )
            return []
        return stubs.failed_instances(self.expected_stubs, stubs.stubs_of(triton.process.pid))

    def _check_progress(self, triton: _Child) -> float | None:
        """Seconds the work in flight has made no progress, once over --stall-seconds
        (:mod:`.progress`); read with the stubs, once Triton is ready."""
        if self.expected_stubs is None or self.options.stall_seconds <= 0:
            return None
        text = self._metrics()
        seen = None if text is None else progress.reading(text)
        return self.watch.observe(time.monotonic(), seen)

    def _recover(self, triton: _Child, failed: list[str], stalled: float | None = None) -> None:
        """A stub failed, or hangs: not ready at once; the other streams finish (up to the
        drain time; after a stall, until those left make no progress either), then Triton is
        stopped, to be started again by :meth:`run_triton`."""
        if stalled is None:
            self.stub_failures += len(failed)
            self.stub_failure = f"Python backend stub of {', '.join(failed)} died or stopped"
        else:
            self.stalls += 1
            self.stub_failure = (
                f"the streams in flight made no progress for {stalled:.0f}s "
                f"(--stall-seconds {self.options.stall_seconds}): a Python stub hangs"
            )
        self.console.err(
            f"[serve] {self.stub_failure}: not ready; Triton restarts once the streams in "
            f"flight are done (up to {self.options.drain_seconds}s)"
        )
        self._refuse_new_streams()
        stuck = None if stalled is None else progress.StallWatch(self.options.stall_seconds)
        self._wait_for_streams(triton, stuck)
        self._forward(triton)
        try:
            triton.process.wait(
                timeout=self.options.exit_timeout_seconds + _TRITON_STOP_MARGIN_SECONDS
            )
        except subprocess.TimeoutExpired:
            triton.kill_group()
            triton.process.wait()
        triton.kill_group()  # stubs that outlived it

    def run_triton(self, argv: Sequence[str], environ: Mapping[str, str]) -> int:
        """Triton until it exits; restarted in place when one of its stubs failed."""
        self.triton_phase = True
        env = {**environ, health.DRAIN_FILE_ENV: str(self.drain_file)}
        while True:
            self.drain_file.unlink(missing_ok=True)
            self.console.out(f"[serve] starting Triton: {launch.display(argv)}")
            triton = self._start("tritonserver", argv, env, piped=False)
            self.triton = triton
            self.expected_stubs = None
            self.stub_failure = None
            self.watch = progress.StallWatch(self.options.stall_seconds)
            self.forwarded = False
            if self.received is not None and not self.drain_requested:
                # A signal between the LLMs' health and Triton's start.
                self.forwarded = True
                triton.signal(self.received)
            result = self._serve(triton)
            if result is not None:
                return result
            self.triton_restarts += 1

    def _serve(self, triton: _Child) -> int | None:
        """Watch Triton: its exit code (the pod's), or None to start it again."""
        while True:
            code = triton.poll()
            if code is not None:
                break
            if self.drain_requested and not self.draining:
                self._drain(triton)
                continue
            exited = self._llm_exited() if self.received is None else None
            if exited is not None:
                server, child, llm_code = exited
                result = self._fail_llm(server, child, llm_code, "while Triton was serving")
                self.console.out("[serve] stopping Triton: the orchestrator needs every LLM")
                triton.signal(signal.SIGTERM)
                try:
                    triton.process.wait(
                        timeout=self.options.exit_timeout_seconds + _TRITON_STOP_MARGIN_SECONDS
                    )
                except subprocess.TimeoutExpired:
                    triton.kill_group()
                    triton.process.wait()
                self.stop_llms()
                return result
            checked = self.received is None and time.monotonic() >= self._next_stub_check
            failed = self._check_stubs(triton) if checked else []
            stalled = self._check_progress(triton) if checked and not failed else None
            if failed or stalled is not None:
                self._recover(triton, failed, stalled)
                if self.received is None:
                    return None
                continue  # a signal came meanwhile: Triton's exit is the pod's
            self._tick()
        status = exit_code_of(code)
        cause = f"after {signal.Signals(self.received).name}" if self.received is not None else ""
        self.console.out(f"[serve] Triton exited with code {status} {cause}".rstrip())
        self.drain_file.unlink(missing_ok=True)
        self.stop_llms()
        return status


def drain_file_of(options: ServeOptions) -> Path:
    """Beside the model repository (a directory this command owns): its existence tells the
    orchestrators to refuse new streams."""
    repository = options.model_repository
    return repository.parent / f"{repository.name}.draining"


# Straight to the loopback address: a cluster-wide HTTP_PROXY must not carry health probes.
_LOCAL_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _healthy(port: int) -> bool:
    try:
        with _LOCAL_OPENER.open(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


@contextlib.contextmanager
def signals_to(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """Route SIGTERM and SIGINT to ``handler`` while serving.

    As the container's PID 1 this process would otherwise ignore SIGTERM altogether (the
    kernel drops default-action signals to a namespace's init), and the kubelet would
    wait out the grace period and SIGKILL Triton mid-stream.
    """
    if threading.current_thread() is not threading.main_thread():
        # Signal handlers can only be installed from the main thread (embedding, tests).
        yield
        return
    previous = {
        signum: signal.signal(signum, handler) for signum in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
