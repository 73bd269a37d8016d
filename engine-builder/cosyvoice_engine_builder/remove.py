"""``remove``: take one engine, and whatever its builds left behind, out of the cache.

Under the key's build lock (:mod:`~cosyvoice_engine_builder.lock`), so it never pulls an
engine from under a builder of the same key, it removes:

- ``<cache-dir>/<key>``: the engine, first moved to ``.trash/`` in one rename, so readers
  see it whole or not at all (never half deleted), then deleted;
- ``<cache-dir>/<key>.partial``: an engine being assembled when a build stopped
  (:mod:`~cosyvoice_engine_builder.publish`);
- ``<cache-dir>/.work/<key>``: the default work dir (fetched model, weights, engines, step
  markers) of a build that did not finish;
- ``<cache-dir>/.trash/<key>.*``: invalid engines a build set aside and could not delete.

The lock file itself stays (lock.py: deleting lock files breaks the lock). Nothing outside
the cache dir is ever touched: an entry that is a symbolic link is unlinked, not followed,
links inside a removed tree are removed as links, and a bookkeeping directory (``.work``,
``.trash``, ``.locks``) that resolves outside the cache dir stops the command before it
removes anything.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from cosyvoice_engine_builder.lock import exclusive_lock
from cosyvoice_engine_builder.manifest import fsync_dir

# What the operator's content keys look like (engine.KEY_LENGTH hex digits); ``build``
# accepts a wider alphabet, ``remove`` only what the operator can have built.
CONTENT_KEY_RE = re.compile(r"^[0-9a-f]{40}$")
_BOOKKEEPING = (".work", ".trash", ".locks")


class RemoveRefused(Exception):
    """Removing cannot be done safely or at all with these arguments; a retry won't help.

    ``step`` is what the termination message blames: ``arguments`` for a bad ``--key`` or
    ``--cache-dir``, ``remove`` for a cache dir that is unsafe to clean.
    """

    def __init__(self, message: str, *, step: str = "remove") -> None:
        super().__init__(message)
        self.step = step


@dataclass(frozen=True)
class Removal:
    key: str
    # What was removed, relative to the cache dir, in the order it was removed.
    removed: tuple[str, ...]
    seconds: float


def validate_content_key(key: str) -> str:
    if not CONTENT_KEY_RE.match(key):
        raise RemoveRefused(
            f"--key {key!r}: expected the operator's content key (40 lowercase hex digits)",
            step="arguments",
        )
    return key


def lock_path(cache_dir: Path, key: str) -> Path:
    """The same lock file ``build`` takes for the key (request.BuildRequest.lock_path)."""
    return cache_dir / ".locks" / f"{key}.lock"


def _check_bookkeeping(cache_dir: Path, root: Path) -> None:
    for name in _BOOKKEEPING:
        path = cache_dir / name
        if not os.path.lexists(path):
            continue
        target = path.resolve()
        if not target.is_relative_to(root):
            raise RemoveRefused(
                f"{path} is a symbolic link to {target}, outside the cache dir {root}; "
                "refusing to follow it"
            )


def _leftovers(cache_dir: Path, key: str) -> list[tuple[Path, str]]:
    """What a build of ``key`` may have left, with a word on each, engine first."""
    found = [
        (cache_dir / key, "engine"),
        (cache_dir / f"{key}.partial", "partial engine of an interrupted build"),
        (cache_dir / ".work" / key, "work dir"),
    ]
    trash = cache_dir / ".trash"
    if trash.is_dir():
        # Keys have no dots, so "<key>." starts only this key's entries.
        names = sorted(e.name for e in os.scandir(trash) if e.name.startswith(f"{key}."))
        found += [(trash / n, "set aside by a build") for n in names]
    return [(path, what) for path, what in found if os.path.lexists(path)]


def _delete(path: Path) -> None:
    """Delete ``path`` without following a link: a link is unlinked, a tree removed as is."""
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    # shutil.rmtree does not descend into links (on Linux it works on directory file
    # descriptors), so a link in the tree to somewhere else removes the link only.
    shutil.rmtree(path)


def remove_engine(
    cache_dir: Path,
    key: str,
    *,
    echo: Callable[[str], None],
    lock_timeout: float | None = None,
) -> Removal:
    """Remove the engine ``key`` and its build leftovers from ``cache_dir``, under its lock.

    Raises :class:`RemoveRefused` (bad key, no cache dir, a bookkeeping link out of it),
    :class:`~cosyvoice_engine_builder.lock.LockTimeout`, or ``OSError`` from the file system.
    """
    started = time.monotonic()
    key = validate_content_key(key)
    if not cache_dir.is_dir():
        raise RemoveRefused(
            f"--cache-dir {cache_dir}: not a directory (is the cache mounted?)", step="arguments"
        )
    root = cache_dir.resolve()
    _check_bookkeeping(cache_dir, root)
    lock = lock_path(cache_dir, key)

    def waiting(waited: float, holder: str) -> None:
        echo(f"[lock] waiting for {lock}, held by {holder} ({waited:.0f}s)")

    echo(f"[remove] engine {key} in {cache_dir}")
    removed: list[str] = []
    with exclusive_lock(lock, timeout=lock_timeout, on_wait=waiting):
        echo(f"[remove] holding {lock}")
        for path, what in _leftovers(cache_dir, key):
            if path == cache_dir / key and path.is_dir() and not path.is_symlink():
                # Out of sight in one rename first: a serving pod or a builder never sees
                # a half-deleted engine (a crash here leaves only .trash/<key>.*, which
                # the next remove of the key deletes).
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
                aside = cache_dir / ".trash" / f"{key}.{stamp}.removed"
                aside.parent.mkdir(exist_ok=True)
                os.replace(path, aside)
                fsync_dir(cache_dir)
                echo(f"[remove] moved {path} aside to {aside}")
                _delete(aside)
            else:
                _delete(path)
            removed.append(path.relative_to(cache_dir).as_posix())
            echo(f"[remove] removed {path} ({what})")
    seconds = time.monotonic() - started
    if removed:
        echo(f"[remove] done: removed {len(removed)} path(s) of {key} ({seconds:.1f}s)")
    else:
        echo(f"[remove] nothing to remove: no engine or build leftovers of {key} in {cache_dir}")
    return Removal(key, tuple(removed), seconds)
