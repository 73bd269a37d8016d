"""The Python backend's stub processes under Triton, read from ``/proc``.

Triton's health endpoints stay 200 when a Python model's stub process has died or hangs
(Triton issues #8604, #8841): the backend notices only when a request reaches that instance,
so a pod can stay Ready while it fails what it is sent. The supervisor therefore watches the
stubs itself: once Triton is ready it records one stub per model instance (by the instance
name the backend passes on the stub's command line), and from then on an instance whose stub
is gone, a zombie, or stopped makes the pod not ready and is recovered
(:meth:`~.supervisor.Supervisor.run_triton`).

What this cannot see: a stub that is alive but stuck (a deadlock inside the model's own code
with its process sleeping); :mod:`.progress` sees it by the progress it stops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

STUB_PROGRAM = "triton_python_backend_stub"
# The stub's argv (python_backend src/stub_launcher.cc): program, model path, shm region,
# default and growth sizes, parent pid, python lib, IPC handle, instance name, model dir.
_INSTANCE_ARG = 8
_DEAD_STATES = frozenset("ZXT")  # zombie, dead, stopped (SIGSTOP: it answers nothing)


@dataclass(frozen=True)
class Stub:
    pid: int
    instance: str
    state: str

    @property
    def alive(self) -> bool:
        return self.state not in _DEAD_STATES


def _stat(proc: Path) -> tuple[str, int] | None:
    """(state, session id) from /proc/PID/stat, or None."""
    try:
        text = (proc / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    if len(fields) < 4:
        return None
    return fields[0], int(fields[3])


def stubs_of(session: int, proc_root: Path = Path("/proc")) -> list[Stub]:
    """The Python backend stubs in Triton's session (it runs in a session of its own: the
    stubs of an ``mpirun``-wrapped Triton are found too)."""
    found = []
    for proc in proc_root.iterdir():
        if not proc.name.isdigit():
            continue
        stat = _stat(proc)
        if stat is None or stat[1] != session:
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].decode(errors="replace").endswith(STUB_PROGRAM):
            continue
        instance = argv[_INSTANCE_ARG].decode(errors="replace") if len(argv) > 8 else proc.name
        found.append(Stub(int(proc.name), instance, stat[0]))
    return found


def live_instances(stubs: list[Stub]) -> dict[str, int]:
    return {s.instance: s.pid for s in stubs if s.alive}


def failed_instances(expected: Mapping[str, int], stubs: list[Stub]) -> list[str]:
    """The instances recorded when Triton became ready that have no live stub now (the
    backend may have started a new one for an instance: a live stub of that name counts)."""
    live = live_instances(stubs)
    return sorted(name for name in expected if name not in live)
