"""One builder per key at a time, across pods, on the shared engine cache.

``flock`` is used (not ``fcntl``/POSIX record locks) because it conflicts between any
two open file descriptions, including two in one process, and because Linux maps it to
NFS byte-range locks on NFSv4, the usual backing of ReadWriteMany volumes. The lock file
is never deleted: unlinking a lock file lets a third process lock a fresh inode while
the second still holds the old one.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path


class LockTimeout(Exception):
    """Another builder kept the key's lock for longer than we were willing to wait."""


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 512, 0).decode("utf-8", errors="replace").strip()
    except OSError:
        return "unknown holder"
    return text or "unknown holder"


@contextmanager
def exclusive_lock(
    path: Path,
    *,
    timeout: float | None,
    on_wait: Callable[[float, str], None],
    poll_seconds: float = 1.0,
    report_every: float = 30.0,
) -> Iterator[None]:
    """Hold an exclusive flock on ``path``; report while waiting, give up after ``timeout``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        started = time.monotonic()
        next_report = 0.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - started
                if timeout is not None and waited >= timeout:
                    raise LockTimeout(
                        f"{path} is held by {_holder(fd)}; gave up after {waited:.0f}s"
                    ) from None
                if waited >= next_report:
                    on_wait(waited, _holder(fd))
                    next_report += report_every
                time.sleep(poll_seconds)
        # Who holds it, for the logs of whoever waits next.
        info = f"{socket.gethostname()} pid {os.getpid()} since {datetime.now(UTC).isoformat()}"
        os.ftruncate(fd, 0)
        os.pwrite(fd, info.encode("utf-8"), 0)
        yield
    finally:
        # Closing the descriptor releases the lock, also when the process is killed.
        os.close(fd)
