"""Progress lines for ``kubectl logs``: ``[step i/n] name: message (elapsed s)``."""

from __future__ import annotations

import sys
import time

from cosyvoice_engine_builder.redaction import Redactor


class Console:
    """All human-facing output; everything passes the redactor on the way out."""

    def __init__(self, redactor: Redactor) -> None:
        self.redact = redactor

    def out(self, text: str) -> None:
        # sys.stdout looked up per call, so pytest's capture and redirection both work.
        print(self.redact(text), file=sys.stdout, flush=True)

    def err(self, text: str) -> None:
        print(self.redact(text), file=sys.stderr, flush=True)


class StepLog:
    def __init__(self, console: Console, index: int, total: int, name: str) -> None:
        self.console = console
        self.prefix = f"[step {index}/{total}] {name}"
        self.started = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def line(self, message: str) -> None:
        self.console.out(f"{self.prefix}: {message} ({self.elapsed:.1f}s)")

    def heartbeat(self, tool_elapsed: float) -> None:
        self.line(f"still running, no output for a while (tool running {tool_elapsed:.0f}s)")
