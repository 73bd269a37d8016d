"""The orchestrator's speaker cache: prompt features per reference, on the CPU, bounded."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any, Generic, TypeVar

V = TypeVar("V")

DEFAULT_ENTRIES = 64


def speaker_key(reference_wav: Any, reference_text: str) -> str:
    """SHA-256 of the reference audio's samples and of its text: two voices that read the same
    text are two entries, and so are two texts read by one voice."""
    digest = hashlib.sha256()
    digest.update(memoryview(reference_wav.astype("<f4").tobytes()))
    digest.update(b"\0")
    digest.update(reference_text.encode("utf-8"))
    return digest.hexdigest()


class SpeakerCache(Generic[V]):
    """Least-recently-used, at most ``entries`` speakers (values are NumPy arrays: host
    memory, no device tensor kept between requests)."""

    def __init__(self, entries: int = DEFAULT_ENTRIES) -> None:
        if entries < 1:
            raise ValueError("a speaker cache holds at least one entry")
        self.entries = entries
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: str) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: str, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)
