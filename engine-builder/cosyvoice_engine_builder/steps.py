"""Completion markers that make a rerun resume where the last attempt stopped.

A Job pod can be evicted or OOM-killed twenty minutes into trtllm-build; its retry must
not download and convert again. Each step, once its outputs are complete, writes
``<work>/steps/<name>.done`` holding a digest of everything that went into it (its exact
command line, the digest of the step it consumed, tool versions) and what it produced:
the size and sha256 of each output file (synced to disk before the marker is written,
since the tools never fsync), and the size of every file under an output directory (a
model directory can be many GB: sizes catch a truncated or missing file without reading
it all). A step is skipped only when that digest matches *and* its outputs are still
exactly what was recorded; anything else reruns it from a clean output directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cosyvoice_engine_builder.manifest import sha256_file


def params_digest(params: Mapping[str, object]) -> str:
    canonical = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class StepMarkers:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, name: str) -> Path:
        return self.directory / f"{name}.done"

    def _record(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path(name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def recorded_digest(self, name: str) -> str | None:
        digest = (self._record(name) or {}).get("digest")
        return digest if isinstance(digest, str) else None

    def is_done(self, name: str, digest: str, outputs: Sequence[Path] | None = None) -> bool:
        """Done with these inputs, and (when given) the outputs are still as recorded."""
        record = self._record(name)
        if record is None or record.get("digest") != digest:
            return False
        if outputs is None:
            return True
        return record.get("outputs") == [_describe(p) for p in outputs]

    def clear(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def outputs_digest(self, name: str) -> str:
        """A digest of what a finished step produced, as recorded (for the steps after it)."""
        return params_digest({"outputs": (self._record(name) or {}).get("outputs")})

    def mark_done(self, name: str, digest: str, outputs: Sequence[Path] = ()) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        record = {
            "step": name,
            "digest": digest,
            "finishedAt": datetime.now(UTC).isoformat(),
            "outputs": [_describe(p, sync=True) for p in outputs],
        }
        # Write-then-rename: a crash while writing must leave "not done", never a
        # half-written marker that happens to parse.
        tmp = self.path(name).with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, self.path(name))


def _describe(path: Path, *, sync: bool = False) -> dict[str, Any]:
    """What an output is: a file's size and sha256, or a directory's file sizes.

    A missing output describes as missing, which never equals what was recorded.
    """
    if path.is_file():
        size = path.stat().st_size
        return {"path": str(path), "size": size, "sha256": sha256_file(path, sync=sync)}
    if path.is_dir():
        # lstat: a dangling link in a pvc:// model is described, not a crash of every retry.
        sizes: dict[str, int] = {}
        for root, _, names in os.walk(path):
            for name in names:
                full = os.path.join(root, name)
                sizes[os.path.relpath(full, path)] = os.lstat(full).st_size
        return {"path": str(path), "files": dict(sorted(sizes.items()))}
    return {"path": str(path), "missing": True}
