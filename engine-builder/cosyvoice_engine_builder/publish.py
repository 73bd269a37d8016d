"""Atomic completion: an engine directory appears whole, with its manifest, or not at all.

Files are assembled in ``<cache-dir>/<key>.partial/``, the manifest is written last and
synced, and the directory is renamed to ``<key>`` in one ``rename(2)``. A reader (a
serving pod, the operator, the next builder) therefore sees either no ``<key>`` or a
complete one; a crash leaves only a ``.partial`` directory, which nothing treats as done
and the next attempt discards.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cosyvoice_engine_builder.manifest import (
    file_entries,
    fsync_dir,
    verify_engine_dir,
    write_manifest,
)


@dataclass(frozen=True)
class Placement:
    """Put ``source`` (a file or a directory) at ``dest`` inside the engine directory."""

    source: Path
    dest: str
    # Hidden entries of a fetched model (.cache/huggingface, .git*) are download
    # bookkeeping, not model content.
    skip_hidden: bool = False


def _link_or_copy(src: Path, dst: Path) -> None:
    # The work directory normally lives on the cache volume itself: a hard link costs no
    # space and no time for multi-GB engines. Across volumes (pvc:// sources) it copies.
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _place(placement: Placement, root: Path) -> None:
    dest = root / placement.dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    if placement.source.is_file():
        _link_or_copy(placement.source, dest)
        return
    for dirpath, dirnames, filenames in os.walk(placement.source, followlinks=True):
        if placement.skip_hidden:
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            filenames = [f for f in filenames if not f.startswith(".")]
        rel = Path(dirpath).relative_to(placement.source)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            src = Path(dirpath) / name
            if src.is_file():
                _link_or_copy(src, dest / rel / name)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


@dataclass(frozen=True)
class Published:
    engine_dir: Path
    # True when a complete engine for the key appeared while we were building (another
    # builder without our lock, e.g. a manual run); ours was discarded.
    already_present: bool
    # The sha256 of the engine's manifest.json: of the bytes written, or of the present
    # engine's as they verified.
    manifest_sha256: str = ""


def publish(
    *,
    cache_dir: Path,
    key: str,
    placements: Sequence[Placement],
    manifest_for: Callable[[list[dict[str, Any]]], dict[str, Any]],
    echo: Callable[[str], None],
) -> Published:
    engine_dir = cache_dir / key
    partial = cache_dir / f"{key}.partial"
    if partial.exists():
        echo(f"discarding the leftover {partial} of an interrupted attempt")
        _remove(partial)
    partial.mkdir(parents=True)
    for placement in placements:
        _place(placement, partial)

    echo("hashing and syncing files")
    entries = file_entries(partial, sync=True)
    digest = write_manifest(partial, manifest_for(entries))

    if engine_dir.exists():
        present = verify_engine_dir(engine_dir, key)
        if present.ok:
            _remove(partial)
            return Published(engine_dir, True, present.manifest_sha256)
        # A directory that does not verify is not an engine; set it aside rather than
        # delete it in place, so the rename below never meets a half-deleted tree.
        trash = cache_dir / ".trash" / f"{key}.{datetime.now(UTC).strftime('%Y%m%dT%H%M%S%f')}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        echo(f"moving the invalid {engine_dir} aside to {trash}")
        os.replace(engine_dir, trash)
        shutil.rmtree(trash, ignore_errors=True)

    os.replace(partial, engine_dir)
    fsync_dir(cache_dir)
    return Published(engine_dir, False, digest)
