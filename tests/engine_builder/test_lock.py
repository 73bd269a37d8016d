"""Two builders of one key never write at once."""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cosyvoice_engine_builder import pipeline
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


def lock_waits(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> threading.Event:
    """An event set once ``module`` (pipeline or remove) has found the key's lock held and
    reported that it waits: a spy around the real :func:`exclusive_lock`, so that another
    builder's thread releases the lock on that state, not after a guessed time."""
    waiting = threading.Event()
    real = module.exclusive_lock

    def spied(path: Path, *, on_wait: Callable[[float, str], None], **kwargs: Any) -> Any:
        def reported(waited: float, holder: str) -> None:
            on_wait(waited, holder)
            waiting.set()

        return real(path, on_wait=reported, **kwargs)

    monkeypatch.setattr(module, "exclusive_lock", spied)
    return waiting


def hold_until(
    lock: Path, waiting: threading.Event, then: Callable[[], None] = lambda: None
) -> tuple[threading.Thread, list[bool]]:
    """Another builder's thread: holds ``lock`` until ``waiting`` is set (at most 60 s), runs
    ``then`` still holding it, and releases. ``acquired`` is set once it holds the lock;
    ``saw_waiter`` records whether the waiter was seen before the release."""
    acquired = threading.Event()
    saw_waiter: list[bool] = []

    def other_builder() -> None:
        with held(lock):
            acquired.set()
            saw_waiter.append(waiting.wait(timeout=60))
            then()

    thread = threading.Thread(target=other_builder)
    thread.start()
    assert acquired.wait(timeout=30)
    return thread, saw_waiter


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


def test_the_second_builder_proceeds_once_the_lock_is_released(
    builder: Builder, monkeypatch: pytest.MonkeyPatch
) -> None:
    waiting = lock_waits(monkeypatch, pipeline)
    thread, saw_waiter = hold_until(_lock_path(builder), waiting)
    result = builder.build()
    thread.join()
    # The lock was released only once this builder waited for it, and then it built.
    assert saw_waiter == [True]
    assert result.code == 0, result.out
    assert "[lock] waiting for" in result.out
    assert builder.tools_called() == ["convert", "trtllm-build", "trtexec", "trtexec"]


def test_an_engine_finished_by_the_lock_holder_is_reused(
    builder: Builder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Build the same key elsewhere first, to play the part of the other builder's result.
    elsewhere = tmp_path / "elsewhere"
    assert builder.build(cache_dir=elsewhere).code == 0
    builder.reset_calls()

    def finish() -> None:  # the other builder's engine lands while this one waits
        builder.cache.mkdir(parents=True, exist_ok=True)
        shutil.copytree(elsewhere / KEY, builder.cache / KEY)

    waiting = lock_waits(monkeypatch, pipeline)
    thread, saw_waiter = hold_until(_lock_path(builder), waiting, finish)
    result = builder.build()
    thread.join()
    assert saw_waiter == [True]
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
