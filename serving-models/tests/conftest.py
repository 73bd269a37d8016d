"""Shared pieces of the tests of the project's model code with upstream's library.

They need what ``scripts/setup-serving-models.sh`` installs (``make serving-models`` runs it):
Debian's python3-torch and python3-torchaudio, and upstream's library in
``~/.cache/cosyvoice-operator/upstream-cpu-site``. Without them they fail, naming the
script; they are not part of ``make test`` (see ``serving-models/README.md``).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = ROOT / "serving-models"
DEBIAN_PYTHON = "/usr/bin/python3"
DEBIAN_SITE = Path("/usr/lib/python3/dist-packages")
UPSTREAM_SITE = Path(
    os.environ.get(
        "COSYVOICE_UPSTREAM_SITE",
        str(Path.home() / ".cache" / "cosyvoice-operator" / "upstream-cpu-site"),
    )
)


def library_path() -> str:
    """sys.path entries for our package and upstream's library (Debian torch last)."""
    return os.pathsep.join([str(PACKAGE_ROOT), str(UPSTREAM_SITE), str(DEBIAN_SITE)])


def require_library() -> None:
    missing = [
        str(p)
        for p in (DEBIAN_SITE / "torch", DEBIAN_SITE / "torchaudio", UPSTREAM_SITE / "cosyvoice")
        if not p.is_dir()
    ]
    if missing:
        pytest.fail(f"missing {', '.join(missing)}: run scripts/setup-serving-models.sh")


def debian_python(*args: str, timeout: float = 300) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PACKAGE_ROOT), str(UPSTREAM_SITE)]))
    done = subprocess.run(
        [DEBIAN_PYTHON, *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(f"{args} failed:\n{done.stderr[-4000:]}")
    return done.stdout


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny synthetic CosyVoice2 release (cosyvoice_serving_models.tiny_release)."""
    require_library()
    out = tmp_path_factory.mktemp("release") / "model"
    debian_python("-m", "cosyvoice_serving_models.tiny_release", str(out))
    yield out
