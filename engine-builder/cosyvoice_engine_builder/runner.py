"""The one place external programs are started.

Every tool (converter, trtllm-build, trtexec, the version probes, ``aws s3 sync``) goes
through :class:`Runner`, which is why tests can replace all of them with stand-in
scripts by pointing the tool environment variables elsewhere, and why redaction and
tail capture cannot be forgotten for one of them.

Output is streamed line by line to the builder's stdout (so ``kubectl logs`` shows the
tool's own progress during a 20-minute engine build) and the last lines are kept for
the termination message.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from cosyvoice_engine_builder.redaction import Redactor

# A single tqdm bar or a base64 blob can be one enormous "line"; the tail is for humans.
_MAX_LINE_CHARS = 1000
# How long a tool gets to exit after SIGTERM before it is killed.
_KILL_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    # The complete environment of the child; None inherits the builder's.
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    timeout: float | None = None

    def display(self) -> str:
        return shlex.join(self.argv)

    @property
    def tool(self) -> str:
        """The program's name for messages: the script, when run by an interpreter."""
        name = Path(self.argv[0]).name
        if name.startswith("python") and len(self.argv) > 1 and not self.argv[1].startswith("-"):
            return Path(self.argv[1]).name
        return name


@dataclass(frozen=True)
class CommandResult:
    returncode: int
    seconds: float
    stdout_tail: tuple[str, ...] = field(default=())
    stderr_tail: tuple[str, ...] = field(default=())


class CommandFailed(Exception):
    """A command did not start, exited non-zero, or ran out of time."""

    def __init__(self, command: Command, reason: str, result: CommandResult | None) -> None:
        super().__init__(f"{command.tool}: {reason}")
        self.command = command
        self.reason = reason
        self.result = result

    def tail(self) -> tuple[str, ...]:
        """The lines that most likely explain the failure.

        stderr normally; stdout when the tool wrote nothing to stderr, because several
        TensorRT-LLM scripts log their errors to stdout.
        """
        if self.result is None:
            return ()
        return self.result.stderr_tail or self.result.stdout_tail


class Runner:
    """Runs commands, streaming redacted output through ``echo``."""

    def __init__(
        self,
        *,
        redactor: Redactor,
        echo: Callable[[str], None],
        tail_lines: int = 200,
        heartbeat_seconds: float = 60.0,
    ) -> None:
        self._redact = redactor
        self._echo = echo
        self._tail_lines = tail_lines
        self._heartbeat_seconds = heartbeat_seconds

    def run(
        self,
        command: Command,
        *,
        heartbeat: Callable[[float], None] | None = None,
        echo_output: bool = True,
    ) -> CommandResult:
        """Run to completion; raise :class:`CommandFailed` unless it exits 0.

        ``heartbeat(elapsed)`` is called when the tool has been silent for a while, so a
        long quiet build still shows signs of life in the logs.
        """
        started = time.monotonic()
        try:
            process = subprocess.Popen(
                command.argv,
                env=dict(command.env) if command.env is not None else None,
                cwd=command.cwd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                # Its own process group, so a timeout or SIGTERM can stop the tool and
                # everything it spawned (mpirun, worker processes), and nothing else.
                start_new_session=True,
            )
        except OSError as exc:
            raise CommandFailed(command, f"could not start: {exc.strerror or exc}", None) from exc

        stdout_tail: deque[str] = deque(maxlen=self._tail_lines)
        stderr_tail: deque[str] = deque(maxlen=self._tail_lines)
        last_output = [time.monotonic()]
        lock = threading.Lock()

        def pump(stream: IO[str], tail: deque[str]) -> None:
            for raw in stream:
                line = self._redact(raw.rstrip("\r\n"))[:_MAX_LINE_CHARS]
                with lock:
                    tail.append(line)
                    last_output[0] = time.monotonic()
                    if echo_output:
                        self._echo(f"  | {line}")

        assert process.stdout is not None and process.stderr is not None
        readers = [
            threading.Thread(target=pump, args=(process.stdout, stdout_tail), daemon=True),
            threading.Thread(target=pump, args=(process.stderr, stderr_tail), daemon=True),
        ]
        for reader in readers:
            reader.start()

        timed_out = False
        try:
            while True:
                try:
                    process.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if command.timeout is not None and now - started > command.timeout:
                    timed_out = True
                    _stop(process)
                    break
                if heartbeat is not None and now - last_output[0] >= self._heartbeat_seconds:
                    last_output[0] = now
                    heartbeat(now - started)
        except BaseException:
            # SIGTERM from the kubelet (raised as an exception by the CLI's handler) or
            # an interrupt: the tool must not outlive the builder.
            _stop(process)
            raise
        finally:
            for reader in readers:
                reader.join(timeout=5.0)

        result = CommandResult(
            returncode=process.returncode,
            seconds=time.monotonic() - started,
            stdout_tail=tuple(stdout_tail),
            stderr_tail=tuple(stderr_tail),
        )
        if timed_out:
            raise CommandFailed(command, f"timed out after {command.timeout:.0f}s", result)
        if result.returncode != 0:
            raise CommandFailed(command, _describe_exit(result.returncode), result)
        return result


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with code {returncode}"


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, _KILL_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
