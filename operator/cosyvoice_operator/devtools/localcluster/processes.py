"""The local cluster's processes: free ports, whether a pid still runs its binary, stopping
a component's process group, and the tail of its log."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_free(port: int) -> bool:
    with socket.socket() as s:
        # As the components' own listeners do: a port in TIME_WAIT after a quick down/up is
        # free to them, and must not make the cluster move.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def alive(pid: int, binary: str) -> bool:
    """True when pid runs `binary` (a recycled pid of another program does not count)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if not cmdline:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    except (OSError, IndexError):
        return False
    return Path(cmdline.split(b"\0")[0].decode()).name == binary


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop(pid: int, binary: str, grace: float = 10) -> None:
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not alive(pid, binary):
            reap(pid)
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    reap(pid)


def reap(pid: int) -> None:
    # Only a child of this process can be reaped (the fixture's own cluster); others are
    # reaped by init.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
