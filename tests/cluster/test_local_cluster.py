"""`cosyvoice-operator cluster ...` as a user runs it: exports, idempotence, names, teardown."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cosyvoice_operator.devtools.localcluster import ClusterError, LocalCluster, pki
from cosyvoice_operator.devtools.localcluster.cluster import COMPONENTS, SERVICE_IP, State
from cosyvoice_operator.devtools.localcluster.processes import alive

CLI = [sys.executable, "-m", "cosyvoice_operator", "cluster"]


def _cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"cluster {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


@pytest.fixture
def named() -> Iterator[tuple[str, str]]:
    names = ("cli-a", "cli-b")
    yield names
    for n in names:
        LocalCluster(n).down(quiet=True, wipe=True)


def test_up_prints_only_exports_and_is_idempotent(named: tuple[str, str]) -> None:
    a, b = named
    first = _cli(
        "up", "--name", a, "--gpu-nodes", "NVIDIA-L20=1", "--gpu-nodes", "NVIDIA-A100-SXM4-80GB=2"
    )
    lines = first.stdout.strip().splitlines()
    assert lines and all(line.startswith("export ") for line in lines), first.stdout
    assert any(line.startswith("export KUBECONFIG=") for line in lines)
    assert "ready in" in first.stderr  # progress goes to stderr
    kubeconfig = next(ln.split("=", 1)[1] for ln in lines if "KUBECONFIG" in ln)

    # eval "$(cluster up)" puts a kubectl that reaches this cluster on PATH.
    shell = subprocess.run(
        ["bash", "-c", f'eval "{first.stdout}"; kubectl get nodes -o name; helm version --short'],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shell.returncode == 0, shell.stderr
    nodes = sorted(n for n in shell.stdout.split() if n.startswith("node/"))
    assert nodes == [
        "node/nvidia-a100-sxm4-80gb-0",
        "node/nvidia-a100-sxm4-80gb-1",
        "node/nvidia-l20-0",
    ]

    pids_before = State.load(LocalCluster(a).paths.state).pids
    again = _cli("up", "--name", a, "--gpu-nodes", "NVIDIA-L20=1")
    assert again.stdout == first.stdout
    assert State.load(LocalCluster(a).paths.state).pids == pids_before  # nothing restarted

    # A second named cluster runs beside the first, on its own ports.
    second = _cli("up", "--name", b, "--gpu-nodes", "NVIDIA-H100-80GB-HBM3=1")
    ports_a = set(State.load(LocalCluster(a).paths.state).ports.values())
    ports_b = set(State.load(LocalCluster(b).paths.state).ports.values())
    assert not ports_a & ports_b
    env = dict(os.environ, KUBECONFIG=kubeconfig)
    out = subprocess.run(
        [str(LocalCluster(a).paths.bin / "kubectl"), "get", "nodes", "-o", "name"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert "h100" not in out  # b's nodes are not in a
    assert "export KUBECONFIG=" in second.stdout

    status = _cli("status", "--name", a)
    parsed = json.loads(status.stdout)
    assert all(c["running"] for c in parsed["components"].values())

    pids = State.load(LocalCluster(a).paths.state).pids
    _cli("down", "--name", a)
    assert set(pids) == set(COMPONENTS)
    assert not any(alive(pid, comp) for comp, pid in pids.items())
    assert _cli("status", "--name", a, check=False).returncode == 3
    assert LocalCluster(b).is_up()  # stopping a leaves b alone


def test_bad_gpu_nodes_argument_is_a_clear_error() -> None:
    proc = _cli("up", "--name", "cli-bad", "--gpu-nodes", "NVIDIA-L20", check=False)
    assert proc.returncode == 1
    assert "PRODUCT=COUNT" in proc.stderr
    assert proc.stdout == ""


def test_component_that_cannot_start_is_reported_with_its_log(tmp_path: Path) -> None:
    name = "cli-fail"
    local = LocalCluster(name)
    local.down(quiet=True, wipe=True)
    # The API server's serving certificate is garbage: it must fail, and say why.
    pki.ensure_pki(local.paths.pki, SERVICE_IP)
    (local.paths.pki / "apiserver.crt").write_text("not a certificate\n")
    proc = _cli("up", "--name", name, check=False)
    try:
        assert proc.returncode == 1
        assert "kube-apiserver" in proc.stderr
        assert "failed to find any PEM data" in proc.stderr  # the tail of its own log
        assert proc.stdout == ""
        # Nothing is left running after the failed start.
        assert not any(local.running().values())
    finally:
        local.down(quiet=True, wipe=True)


def test_ports_taken_since_the_last_up_are_replaced(tmp_path: Path) -> None:
    name = "cli-ports"
    local = LocalCluster(name)
    local.down(quiet=True, wipe=True)
    local.paths.root.mkdir(parents=True)
    # Another program took the API server's port while the cluster was down.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        State(ports={"kube-apiserver": taken}).save(local.paths.state)
        try:
            proc = _cli("up", "--name", name, "--gpu-nodes", "NVIDIA-L20=1", check=False)
            assert proc.returncode == 0, proc.stderr
            assert f"port {taken} (kube-apiserver) is in use now" in proc.stderr
            port = State.load(local.paths.state).ports["kube-apiserver"]
            assert port != taken
            assert f"127.0.0.1:{port}" in local.paths.kubeconfig.read_text()
            assert local.is_up()
        finally:
            local.down(quiet=True, wipe=True)


def test_a_failed_up_leaves_a_running_cluster_running() -> None:
    name = "cli-keep"
    local = LocalCluster(name)
    local.down(quiet=True, wipe=True)
    try:
        _cli("up", "--name", name, "--gpu-nodes", "NVIDIA-L20=1")
        pids = State.load(local.paths.state).pids
        # A node the API server rejects (its product label is longer than a label value may
        # be; the CLI refuses that before starting, the library call gets as far as the API).
        with pytest.raises(ClusterError, match="kubectl apply"):
            LocalCluster(name).up(gpu_nodes={f"NVIDIA-{'L' * 300}": 1})
        assert local.is_up()
        assert State.load(local.paths.state).pids == pids
    finally:
        local.down(quiet=True, wipe=True)
