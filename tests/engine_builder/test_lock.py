"""Two builders of one key never write at once."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cosyvoice_engine_builder.lock import exclusive_lock
from tests.engine_builder.conftest import KEY, Builder


@contextmanager
def held(path: Path) -> Iterator[int]:
    """Hold the key's lock the way another builder pod would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, b"other-builder-pod pid 42")
    try:
        yield fd
    finally:
        os.close(fd)


def _lock_path(builder: Builder) -> Path:
    return builder.cache / ".locks" / f"{KEY}.lock"


def test_a_held_lock_stops_a_second_builder(builder: Builder) -> None:
    with held(_lock_path(builder)):
        result = builder.build(lock_timeout=1)
    assert result.code == 3
    assert builder.calls() == []
    assert not (builder.cache / ".work" / KEY).exists()
    assert result.termination is not None
    assert result.termination["step"] == "lock"
    assert "other-builder-pod pid 42" in result.termination["message"]
    assert "[lock] waiting for" in result.out


def test_the_second_builder_proceeds_once_the_lock_is_released(builder: Builder) -> None:
    lock = _lock_path(builder)
    acquired = threading.Event()

    def other_builder() -> None:
        with held(lock):
            acquired.set()
            time.sleep(1.5)

    thread = threading.Thread(target=other_builder)
    thread.start()
    acquired.wait()
    started = time.monotonic()
    result = builder.build()
    thread.join()
    assert result.code == 0, result.out
    assert time.monotonic() - started >= 1.0
    assert "[lock] waiting for" in result.out
    assert builder.tools_called() == ["convert", "trtllm-build", "trtexec", "trtexec"]


def test_an_engine_finished_by_the_lock_holder_is_reused(builder: Builder, tmp_path: Path) -> None:
    # Build the same key elsewhere first, to play the part of the other builder's result.
    elsewhere = tmp_path / "elsewhere"
    assert builder.build(cache_dir=elsewhere).code == 0
    builder.reset_calls()
    lock = _lock_path(builder)
    acquired = threading.Event()

    def other_builder() -> None:
        with held(lock):
            acquired.set()
            time.sleep(1.0)
            builder.cache.mkdir(parents=True, exist_ok=True)
            shutil.copytree(elsewhere / KEY, builder.cache / KEY)

    thread = threading.Thread(target=other_builder)
    thread.start()
    acquired.wait()
    result = builder.build()
    thread.join()
    assert result.code == 0
    assert "already built (by another builder)" in result.out
    assert builder.calls() == []


def test_lock_is_exclusive_between_descriptors_of_one_process(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "k.lock"
    waits: list[float] = []
    with exclusive_lock(path, timeout=None, on_wait=lambda w, h: waits.append(w)):
        with held_attempt(path) as got:
            assert got is False
        assert "pid" in path.read_text()
    with held_attempt(path) as got:
        assert got is True
    assert waits == []


@contextmanager
def held_attempt(path: Path) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            yield True
        except BlockingIOError:
            yield False
    finally:
        os.close(fd)
