"""Which LLM server (one per tensor-parallel group) a CosyVoice3 stream goes to: the one with
the fewest streams in flight, counted across every orchestrator instance of the pod.

Each instance is its own process, so the counts live in a small file (one integer per
group) under an exclusive ``flock``; a stream takes a slot before its first LLM call and
gives it back when it ends, whatever the outcome. Ties go to the lowest index.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


class LeastLoaded:
    def __init__(self, urls: list[str], scope: str) -> None:
        if not urls:
            raise ValueError("no LLM server URL")
        self.urls = urls
        digest = hashlib.sha256(f"{scope}\0{','.join(urls)}".encode()).hexdigest()[:16]
        self.path = os.path.join(tempfile.gettempdir(), f"cosyvoice-llm-load-{digest}")

    def _update(self, change: int, index: int | None) -> int:
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
            f.seek(0)
            text = f.read()
            counts = json.loads(text) if text else [0] * len(self.urls)
            if len(counts) != len(self.urls):
                counts = [0] * len(self.urls)
            if index is None:
                index = min(range(len(counts)), key=lambda i: (counts[i], i))
            counts[index] = max(0, counts[index] + change)
            f.seek(0)
            f.truncate()
            f.write(json.dumps(counts))
            return index

    @contextmanager
    def slot(self) -> Iterator[str]:
        """The URL of the least-loaded group, held for the duration of the block."""
        index = self._update(+1, None)
        try:
            yield self.urls[index]
        finally:
            self._update(-1, index)

    def counts(self) -> list[int]:
        try:
            with open(self.path) as f:
                return list(json.loads(f.read() or "[]"))
        except FileNotFoundError:
            return [0] * len(self.urls)
