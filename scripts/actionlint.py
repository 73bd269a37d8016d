"""actionlint on every GitHub Actions workflow of the repository (`make lint`).

actionlint is built once from the Go module proxy into the cache, like the local cluster's
binaries (cosyvoice_operator/devtools/localcluster/binaries.py); `scripts/setup.sh` never needs
to know: the first `make lint` builds it (about a minute on 2 cores), later ones find it.
With `shellcheck` on PATH actionlint also checks the workflows' `run:` scripts.

    .venv/bin/python scripts/actionlint.py [--build-only] [actionlint arguments ...]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cosyvoice_operator.devtools.localcluster import binaries

# github.com/rhysd/actionlint, the newest release the module proxy serves here.
VERSION = "v1.7.12"
ACTIONLINT = binaries.Binary(
    "actionlint",
    VERSION,
    (
        "install",
        "-trimpath",
        "-ldflags",
        f"-s -w -X github.com/rhysd/actionlint.version={VERSION}",
        f"github.com/rhysd/actionlint/cmd/actionlint@{VERSION}",
    ),
)
REPO = Path(__file__).resolve().parents[1]


def workflows() -> list[Path]:
    folder = REPO / ".github" / "workflows"
    return sorted([*folder.glob("*.yml"), *folder.glob("*.yaml")])


def main(argv: list[str]) -> int:
    exe = binaries.build(ACTIONLINT)
    if argv[:1] == ["--build-only"]:
        print(exe)
        return 0
    files = workflows()
    if not files:
        print("actionlint: no workflow under .github/workflows", file=sys.stderr)
        return 1
    proc = subprocess.run([str(exe), *argv, *(str(f) for f in files)], cwd=REPO)
    if proc.returncode == 0:
        print(f"actionlint {VERSION}: {len(files)} workflows clean")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
