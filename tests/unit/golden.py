"""Golden files: what the operator would write, compared as text, rewritten only on request.

``UPDATE_GOLDEN=1`` rewrites the files that differ, and the test that rewrote one then
fails, naming it: a run that rewrites goldens never passes, so the variable leaking into CI
(or into a long-lived shell) cannot turn every golden test green. With ``CI`` set (as CI
services set it) ``UPDATE_GOLDEN=1`` fails at once and writes nothing. A file that already
holds the rendered text is left alone and its test passes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import pytest


def updating() -> bool:
    """Whether this run may rewrite golden files (``UPDATE_GOLDEN=1``, never under CI)."""
    if os.environ.get("UPDATE_GOLDEN") != "1":
        return False
    if os.environ.get("CI"):
        pytest.fail(
            f"UPDATE_GOLDEN=1 with CI={os.environ['CI']!r}: golden files are rewritten by hand "
            "and reviewed, never in CI",
            pytrace=False,
        )
    return True


def _rewritten(paths: list[Path]) -> None:
    if paths:
        pytest.fail(
            "golden file(s) rewritten: "
            + ", ".join(str(p) for p in paths)
            + "; review the diff and rerun without UPDATE_GOLDEN",
            pytrace=False,
        )


def check(path: Path, text: str) -> None:
    """``text`` equals the golden file ``path`` (rewritten, and failing, under UPDATE_GOLDEN)."""
    if updating() and (not path.exists() or path.read_text() != text):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        _rewritten([path])
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{path.name} differs from the golden file (UPDATE_GOLDEN=1)"


def sync_folder(folder: Path, files: Mapping[str, str], suffix: str) -> None:
    """Under UPDATE_GOLDEN, make ``folder``'s ``*suffix`` files exactly ``files`` (name ->
    text; stale ones deleted) and fail if anything changed; otherwise do nothing (the caller
    compares)."""
    if not updating():
        return
    changed = []
    folder.mkdir(parents=True, exist_ok=True)
    for stale in sorted(folder.glob(f"*{suffix}")):
        if stale.name[: -len(suffix)] not in files:
            stale.unlink()
            changed.append(stale)
    for name, text in files.items():
        path = folder / f"{name}{suffix}"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    _rewritten(changed)
