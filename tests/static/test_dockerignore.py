"""The root .dockerignore (read by podman, buildah and Docker's legacy builder, whose
context for all three images is the repository root) keeps out nothing an image copies."""

from __future__ import annotations

import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ("Dockerfile", "engine-builder/Dockerfile", "serving-image/Dockerfile")


def ignored_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def copied_sources() -> list[str]:
    """Every source path of a COPY from the build context (not from another stage)."""
    sources = []
    for name in DOCKERFILES:
        for line in (ROOT / name).read_text().splitlines():
            words = line.split()
            if not words or words[0] != "COPY" or any(w.startswith("--from") for w in words):
                continue
            args = [w for w in words[1:] if not w.startswith("--")]
            sources += [a.rstrip("/") for a in args[:-1]]
    return sources


def excluded(path: str, patterns: list[str]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern) or fnmatch.fnmatch(parts[i], pattern.removeprefix("**/"))
        for pattern in patterns
        for i, prefix in enumerate(prefixes)
    )


def test_every_copied_path_exists_and_is_in_the_context() -> None:
    sources = copied_sources()
    assert len(sources) >= 8, sources  # the three Dockerfiles' COPY lines were found
    patterns = ignored_patterns()
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not excluded(source, patterns), (source, patterns)


def test_the_heavy_local_folders_stay_out() -> None:
    patterns = ignored_patterns()
    for heavy in (".venv", ".git", "tests", "bench"):
        assert excluded(heavy, patterns), heavy
