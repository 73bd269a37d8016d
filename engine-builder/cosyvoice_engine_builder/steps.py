"""Completion markers that make a rerun resume where the last attempt stopped.

A Job pod can be evicted or OOM-killed twenty minutes into trtllm-build; its retry must
not download and convert again. Each step, once its outputs are complete, writes
``<work>/steps/<name>.done`` holding a digest of everything that went into it (its exact
command line, the digest of the step it consumed, tool versions). A step is skipped only
when that digest matches *and* its outputs are still there; anything else reruns it from
a clean output directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path


def params_digest(params: Mapping[str, object]) -> str:
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class StepMarkers:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.done"

    def recorded_digest(self, name: str) -> str | None:
        try:
            data = json.loads(self.path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        digest = data.get("digest") if isinstance(data, dict) else None
        return digest if isinstance(digest, str) else None

    def is_done(self, name: str, digest: str) -> bool:
        return self.recorded_digest(name) == digest

    def clear(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def mark_done(self, name: str, digest: str) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {"step": name, "digest": digest, "finishedAt": datetime.now(UTC).isoformat()}
        # Write-then-rename: a crash while writing must leave "not done", never a
        # half-written marker that happens to parse.
        tmp = self.path(name).with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path(name))
