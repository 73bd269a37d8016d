"""Shared fixtures. ``cluster`` is a real local control plane (devtools.localcluster)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # imported where used: unit tests never load the local cluster's stack
    from cosyvoice_operator.devtools.localcluster import LocalCluster

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"
TEST_GPU_NODES = {"NVIDIA-L20": 2, "NVIDIA-H100-80GB-HBM3": 2}


@dataclass
class Cluster:
    local: LocalCluster

    @property
    def kubeconfig(self) -> str:
        return str(self.local.paths.kubeconfig)

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ, KUBECONFIG=self.kubeconfig)
        env["PATH"] = f"{self.local.paths.bin}:{env.get('PATH', '')}"
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        from cosyvoice_operator.devtools.localcluster.binaries import kubectl_path

        proc = subprocess.run(
            [str(kubectl_path()), f"--kubeconfig={self.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}"
            )
        return proc

    def apply(self, namespace: str, manifest: str) -> subprocess.CompletedProcess[str]:
        """`kubectl apply` of a JSON or YAML manifest (one or several documents)."""
        return self.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)

    def namespace(self, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.kubectl("create", "namespace", name)
        return name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the real control plane is marked ``cluster``, by its fixtures, so
    ``-m "not cluster"`` selects exactly the tests that need no control plane."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm (the same binary the cluster links into its bin/), no cluster needed:
    built from the Go module proxy on first use, cached afterwards."""
    from cosyvoice_operator.devtools.localcluster import binaries

    return binaries.build(binaries.BINARIES["helm"])


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    from cosyvoice_operator.devtools.localcluster import LocalCluster

    local = LocalCluster(os.environ.get("COSYVOICE_TEST_CLUSTER", "pytest"))
    local.down(quiet=True, wipe=True)  # a previous run killed midway leaves nothing behind
    local.up(gpu_nodes=TEST_GPU_NODES, gpus_per_node=8)
    c = Cluster(local)
    c.kubectl("apply", "--server-side", "-f", str(CRD_DIR))
    local.wait_established("cosyvoiceservices.tts.cosyvoice.dev")
    try:
        yield c
    finally:
        local.down(quiet=True, wipe=True)
