"""The work queue: which objects to reconcile next, each at most once at a time.

The semantics of controller-runtime's queue, which reconcilers depend on:
- a key added many times before a worker takes it is processed once (de-duplication);
- a key is never processed by two workers at once; added while processed, it is processed
  again after (it is "dirty");
- `add_after` schedules a key for later (a build's retry time); the earliest wins;
- `add_rate_limited` is for failures: per-key exponential backoff, reset by `forget`.
The queue holds each key once, so its size is bounded by the number of objects, not by the
number of events.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(
        self,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.clock = clock
        self._ready: collections.deque[K] = collections.deque()  # FIFO of keys to process now
        self._queued: set[K] = set()  # keys in _ready
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # added while being processed
        self._later: list[tuple[float, int, K]] = []  # (due, seq, key) heap
        self._due: dict[K, float] = {}  # earliest due time per delayed key
        self._failures: dict[K, int] = {}
        self._seq = itertools.count()
        self._wakeup = asyncio.Event()
        self.shut = False
        self.processed = 0

    def __len__(self) -> int:
        return len(self._queued) + len(self._due)

    @property
    def processing(self) -> int:
        return len(self._processing)

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        if key not in self._queued:
            self._queued.add(key)
            self._ready.append(key)
            self._wakeup.set()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        due = self.clock() + delay
        if self._due.get(key, float("inf")) <= due:
            return  # already scheduled sooner
        self._due[key] = due
        heapq.heappush(self._later, (due, next(self._seq), key))
        self._wakeup.set()

    def add_rate_limited(self, key: K) -> float:
        """Schedule a retry after a failure; the delay it got."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = float(min(self.base_delay * 2.0**failures, self.max_delay))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def _promote(self) -> float | None:
        """Move due keys to the ready list; seconds until the next one is due."""
        now = self.clock()
        while self._later:
            due, _, key = self._later[0]
            if self._due.get(key) != due:
                heapq.heappop(self._later)  # superseded by an earlier schedule
                continue
            if due > now:
                return due - now
            heapq.heappop(self._later)
            del self._due[key]
            self.add(key)
        return None

    def take_nowait(self) -> K | None:
        self._promote()
        if not self._ready:
            return None
        key = self._ready.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    async def get(self) -> K:
        """The next key to process; call `done` with it afterwards."""
        while True:
            if self.shut:
                raise asyncio.CancelledError
            # Cleared before looking, so an add (or a key falling due) after the look wakes us.
            self._wakeup.clear()
            key = self.take_nowait()
            if key is not None:
                return key
            wait = self._promote()
            if self._ready:
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=wait)

    def done(self, key: K) -> None:
        self._processing.discard(key)
        self.processed += 1
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def shutdown(self) -> None:
        self.shut = True
        self._wakeup.set()
