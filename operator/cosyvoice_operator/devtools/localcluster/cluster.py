"""A local Kubernetes cluster of real components and fake GPU nodes, for tests and the demo.

etcd, kube-apiserver (TLS, RBAC), kube-controller-manager and kube-scheduler are the real
binaries; kwok stands in for the kubelets of nodes that advertise ``nvidia.com/gpu``, so the
real scheduler places GPU pods against real capacity. Each named cluster lives in its own
folder of the cache (certificates, etcd data, logs, kubeconfig, ports) and runs detached from
the command that started it: ``up`` returns once everything is ready, ``down`` stops it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosyvoice_operator.devtools.localcluster import binaries, pki, processes
from cosyvoice_operator.devtools.localcluster.binaries import Log, stderr_log

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
DEFAULT_GPU_NODES = {"NVIDIA-L20": 2, "NVIDIA-H100-80GB-HBM3": 2}
DEFAULT_GPUS_PER_NODE = 8
# Hostpath volumes the cluster offers to PersistentVolumeClaims (the engine cache, for one):
# no dynamic provisioner runs here, so a pool is made at start.
VOLUME_POOL = 48

# In start order; stopped in reverse.
COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]

CONTROLLERS = [
    "job-controller",
    "replicaset-controller",
    "deployment-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "node-lifecycle-controller",
    "pod-garbage-collector-controller",
    "ttl-after-finished-controller",
    "serviceaccount-controller",
    "persistentvolume-binder-controller",
    # The API server puts kubernetes.io/pvc-protection on every claim; without the
    # controller that lifts it, a deleted claim would never go.
    "persistentvolumeclaim-protection-controller",
    "disruption-controller",
    "endpointslice-controller",
]


class ClusterError(RuntimeError):
    """The cluster could not be brought to the asked state; the message says why."""


@dataclass
class ClusterPaths:
    name: str
    root: Path

    @classmethod
    def for_name(cls, name: str) -> ClusterPaths:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", name):
            raise ClusterError(f"cluster name {name!r}: use lowercase letters, digits and '-'")
        return cls(name, binaries.cache_root() / "clusters" / name)

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def volumes(self) -> Path:
        return self.root / "volumes"


@dataclass
class State:
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> State:
        if not path.is_file():
            return cls()
        data = json.loads(path.read_text())
        return cls(ports=data.get("ports", {}), pids=data.get("pids", {}))

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"ports": self.ports, "pids": self.pids}, indent=2))
        tmp.replace(path)


def parse_gpu_nodes(specs: Iterable[str]) -> dict[str, int]:
    """``PRODUCT=COUNT`` arguments into {product: count}; a repeated product adds up."""
    nodes: dict[str, int] = {}
    for spec in specs:
        product, sep, count = spec.partition("=")
        if not sep or not product or not count.isdigit():
            raise ClusterError(
                f"--gpu-nodes {spec!r}: expected PRODUCT=COUNT, e.g. NVIDIA-L20=2 "
                "(PRODUCT is the node label nvidia.com/gpu.product)"
            )
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?", product):
            raise ClusterError(
                f"--gpu-nodes {spec!r}: {product!r} is not a valid label value "
                "(at most 63 letters, digits, '-', '_' or '.', alphanumeric at both ends)"
            )
        nodes[product] = nodes.get(product, 0) + int(count)
    return nodes


def node_manifests(gpu_nodes: Mapping[str, int], gpus_per_node: int) -> list[dict[str, Any]]:
    """Fake GPU Nodes, labelled as NVIDIA's GPU feature discovery labels real ones."""
    items = []
    for product, count in gpu_nodes.items():
        slug = re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-")
        for i in range(count):
            name = f"{slug}-{i}"
            resources = {
                "cpu": "64",
                "memory": "512Gi",
                "pods": "110",
                "nvidia.com/gpu": str(gpus_per_node),
            }
            items.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {"kwok.x-k8s.io/node": "fake"},
                        "labels": {
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                            "type": "kwok",
                            "nvidia.com/gpu.present": "true",
                            "nvidia.com/gpu.product": product,
                            "nvidia.com/gpu.count": str(gpus_per_node),
                        },
                    },
                    "status": {"capacity": resources, "allocatable": resources},
                }
            )
    return items


def volume_manifests(paths: ClusterPaths, count: int) -> list[dict[str, Any]]:
    items = []
    for i in range(count):
        items.append(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": f"local-pool-{i:03d}", "labels": {"local-pool": "true"}},
                "spec": {
                    "capacity": {"storage": "10Ti"},
                    "accessModes": ["ReadWriteMany", "ReadWriteOnce", "ReadOnlyMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": str(paths.volumes / f"{i:03d}")},
                },
            }
        )
    return items


class LocalCluster:
    """Start, inspect and stop one named local cluster."""

    def __init__(self, name: str = "cosyvoice", log: Log = stderr_log) -> None:
        self.paths = ClusterPaths.for_name(name)
        self.log = log

    # ---- queries -------------------------------------------------------------------------

    def running(self) -> dict[str, bool]:
        state = State.load(self.paths.state)
        return {comp: processes.alive(pid, comp) for comp, pid in state.pids.items()}

    def is_up(self) -> bool:
        status = self.running()
        return bool(status) and all(status.values()) and set(status) == set(COMPONENTS)

    def exports(self) -> str:
        """Shell lines that point kubectl and helm at this cluster."""
        return f'export KUBECONFIG={self.paths.kubeconfig}\nexport PATH={self.paths.bin}:"$PATH"\n'

    # ---- up ------------------------------------------------------------------------------

    def up(
        self,
        gpu_nodes: Mapping[str, int] | None = None,
        gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    ) -> None:
        started = time.monotonic()
        gpu_nodes = dict(DEFAULT_GPU_NODES if gpu_nodes is None else gpu_nodes)
        paths = binaries.ensure_all(self.log)
        for d in (self.paths.root, self.paths.logs, self.paths.bin, self.paths.volumes):
            d.mkdir(parents=True, exist_ok=True)
        self._link_tools(paths)
        state = State.load(self.paths.state)
        for comp in COMPONENTS:
            state.ports.setdefault(comp, processes.free_port())
        state.ports.setdefault("etcd-peer", processes.free_port())
        if not any(processes.alive(pid, comp) for comp, pid in state.pids.items()):
            # Nothing of this cluster runs: a port another program took since the last
            # `up` is replaced (the kubeconfig below follows), instead of failing the start.
            for name, port in sorted(state.ports.items()):
                if not processes.port_free(port):
                    state.ports[name] = processes.free_port()
                    self.log(f"port {port} ({name}) is in use now; {name} moves to another")
        state.save(self.paths.state)
        pki.ensure_pki(self.paths.pki, SERVICE_IP)
        self._write_kubeconfig(state.ports["kube-apiserver"])
        spawned: list[str] = []
        try:
            for comp in COMPONENTS:
                pid = state.pids.get(comp)
                if pid and processes.alive(pid, comp):
                    continue
                self.log(f"starting {comp} ...")
                proc = self._spawn(comp, paths, state.ports)
                spawned.append(comp)
                state.pids[comp] = proc.pid
                state.save(self.paths.state)
                self._wait_ready(comp, proc, state.ports)
            self._apply(node_manifests(gpu_nodes, gpus_per_node))
            self._apply(volume_manifests(self.paths, VOLUME_POOL))
            self._wait_nodes(gpu_nodes)
            self._wait_default_serviceaccount()
        except ClusterError:
            # Stop what this call started, nothing more: `up` on a running cluster that
            # fails (say, on a node list it cannot apply) leaves that cluster running.
            for comp in reversed(spawned):
                pid = state.pids.pop(comp, None)
                if pid:
                    processes.stop(pid, comp)
            state.save(self.paths.state)
            raise
        total = sum(gpu_nodes.values())
        self.log(
            f"cluster {self.paths.name!r} ready in {time.monotonic() - started:.1f}s: "
            f"{total} GPU node(s) {dict(gpu_nodes)}, {gpus_per_node} GPU(s) each"
        )

    def _link_tools(self, paths: Mapping[str, Path]) -> None:
        for tool in ("kubectl", "helm"):
            link = self.paths.bin / tool
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(paths[tool])

    def _write_kubeconfig(self, port: int) -> None:
        pki_dir = self.paths.pki
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.paths.name,
                    "cluster": {
                        "server": f"https://127.0.0.1:{port}",
                        "certificate-authority": str(pki_dir / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(pki_dir / "admin.crt"),
                        "client-key": str(pki_dir / "admin.key"),
                    },
                }
            ],
            "contexts": [
                {"name": self.paths.name, "context": {"cluster": self.paths.name, "user": "admin"}}
            ],
            "current-context": self.paths.name,
        }
        self.paths.kubeconfig.write_text(yaml.safe_dump(config))
        self.paths.kubeconfig.chmod(0o600)

    def _args(self, comp: str, bins: Mapping[str, Path], ports: Mapping[str, int]) -> list[str]:
        p = self.paths.pki
        kubeconfig = str(self.paths.kubeconfig)
        if comp == "etcd":
            client = f"http://127.0.0.1:{ports['etcd']}"
            peer = f"http://127.0.0.1:{ports['etcd-peer']}"
            return [
                str(bins["etcd"]),
                f"--name={self.paths.name}",
                f"--data-dir={self.paths.root / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster={self.paths.name}={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
                "--quota-backend-bytes=4294967296",
            ]
        if comp == "kube-apiserver":
            return [
                str(bins["kube-apiserver"]),
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['kube-apiserver']}",
                f"--tls-cert-file={p / 'apiserver.crt'}",
                f"--tls-private-key-file={p / 'apiserver.key'}",
                f"--client-ca-file={p / 'ca.crt'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={p / 'sa.pub'}",
                f"--service-account-signing-key-file={p / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                "--v=0",
            ]
        common = [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={ports[comp]}",
            "--profiling=false",
        ]
        if comp == "kube-controller-manager":
            return [
                str(bins["kube-controller-manager"]),
                *common,
                f"--controllers={','.join(CONTROLLERS)}",
                f"--service-account-private-key-file={p / 'sa.key'}",
                f"--root-ca-file={p / 'ca.crt'}",
                "--use-service-account-credentials=false",
                "--node-monitor-grace-period=60s",
                # The default client rate (20 QPS) lifts the not-ready taint of ~5 nodes a
                # second: 100 fake nodes would take 20 s to become schedulable.
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
                "--concurrent-gc-syncs=5",
            ]
        if comp == "kube-scheduler":
            return [
                str(bins["kube-scheduler"]),
                *common,
                "--kube-api-qps=500",
                "--kube-api-burst=1000",
            ]
        if comp == "kwok":
            node_stages = _kwok_node_stages()
            return [
                str(bins["kwok"]),
                f"--kubeconfig={kubeconfig}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                "--node-ip=127.0.0.1",
                "--cidr=10.244.0.0/16",
                "--node-lease-duration-seconds=40",
                *[f"--config={s}" for s in node_stages],
                f"--config={binaries.kwok_stage_dir() / 'pods.yaml'}",
            ]
        raise AssertionError(comp)

    def _spawn(
        self, comp: str, bins: Mapping[str, Path], ports: Mapping[str, int]
    ) -> subprocess.Popen[bytes]:
        log_file = (self.paths.logs / f"{comp}.log").open("ab")
        env = dict(os.environ)
        env.pop("KUBECONFIG", None)
        # Own session: the cluster outlives `cluster up`, and a Ctrl-C in the user's shell
        # does not reach it.
        return subprocess.Popen(
            self._args(comp, bins, ports),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.paths.root,
            env=env,
            start_new_session=True,
        )

    def _ssl(self, client_cert: bool, verify: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.paths.pki / "ca.crt"))
        if not verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if client_cert:
            ctx.load_cert_chain(
                str(self.paths.pki / "admin.crt"), str(self.paths.pki / "admin.key")
            )
        return ctx

    def _probe(self, comp: str, ports: Mapping[str, int]) -> bool:
        port = ports[comp]
        try:
            if comp == "etcd":
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    return bool(json.loads(r.read()).get("health") == "true")
            if comp == "kwok":
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    return bool(r.status == 200)
            path = "/readyz" if comp == "kube-apiserver" else "/healthz"
            ctx = self._ssl(client_cert=comp == "kube-apiserver", verify=comp == "kube-apiserver")
            with urllib.request.urlopen(
                f"https://127.0.0.1:{port}{path}", timeout=2, context=ctx
            ) as r:
                return bool(r.status == 200)
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def _wait_ready(
        self,
        comp: str,
        proc: subprocess.Popen[bytes],
        ports: Mapping[str, int],
        timeout: float = 90,
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # poll(), not /proc: right after fork the child still shows Python's command line.
            if proc.poll() is not None:
                log = self.paths.logs / f"{comp}.log"
                raise ClusterError(
                    f"{comp} exited during start; last lines of {log}:\n{processes.tail(log)}"
                )
            if self._probe(comp, ports):
                return
            time.sleep(0.2)
        raise ClusterError(
            f"{comp} not ready after {timeout:.0f}s; last lines of its log:\n"
            + processes.tail(self.paths.logs / f"{comp}.log")
        )

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        proc = subprocess.run(
            [str(binaries.kubectl_path()), f"--kubeconfig={self.paths.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def wait_established(self, *crds: str, timeout: float = 120) -> None:
        """Until each named CRD (its full name) reads Established=True. Not `kubectl wait
        --for=condition=Established`: on a CRD just created, before the API server has written
        any condition, that fails at once ("conditions accessor error") instead of waiting."""
        deadline = time.monotonic() + timeout
        jsonpath = '{.status.conditions[?(@.type=="Established")].status}'
        for crd in crds:
            while True:
                out = self.kubectl("get", "crd", crd, "-o", f"jsonpath={jsonpath}", check=False)
                if out.strip() == "True":
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {crd} not Established after {timeout:.0f}s")
                time.sleep(0.2)

    def _apply(self, items: list[dict[str, Any]]) -> None:
        if not items:
            return
        body = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
        # Server-side apply: repeated `up` calls converge, and node status (kwok's) is kept.
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=body)

    def _wait_nodes(self, gpu_nodes: Mapping[str, int], timeout: float = 90) -> None:
        want = sum(gpu_nodes.values())
        deadline = time.monotonic() + timeout
        ready = 0
        while time.monotonic() < deadline:
            out = json.loads(self.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json"))
            ready = 0
            for node in out["items"]:
                conds = {
                    c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])
                }
                taints = node.get("spec", {}).get("taints") or []
                not_ready_taint = any(
                    t["key"].startswith("node.kubernetes.io/not-") for t in taints
                )
                if conds.get("Ready") == "True" and not not_ready_taint:
                    ready += 1
            if ready >= want:
                return
            time.sleep(0.3)
        raise ClusterError(
            f"only {ready}/{want} fake GPU nodes became Ready (and untainted) in {timeout:.0f}s; "
            f"kwok log:\n{processes.tail(self.paths.logs / 'kwok.log')}"
        )

    def _wait_default_serviceaccount(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.kubectl(
                "get",
                "serviceaccount",
                "default",
                "-n",
                "default",
                "--ignore-not-found",
                "-o",
                "name",
            ).strip():
                return
            time.sleep(0.3)
        raise ClusterError(
            "the default ServiceAccount was not created: is the controller-manager running?"
        )

    # ---- down ----------------------------------------------------------------------------

    def down(self, quiet: bool = False, wipe: bool = False) -> None:
        state = State.load(self.paths.state)
        for comp in reversed(COMPONENTS):
            pid = state.pids.get(comp)
            if pid and processes.alive(pid, comp):
                if not quiet:
                    self.log(f"stopping {comp} (pid {pid})")
                processes.stop(pid, comp)
        state.pids = {}
        if self.paths.root.exists():
            state.save(self.paths.state)
        if wipe and self.paths.root.exists():
            shutil.rmtree(self.paths.root)

    def status(self) -> dict[str, Any]:
        state = State.load(self.paths.state)
        running = self.running()
        procs = {
            comp: {
                "pid": state.pids.get(comp),
                "port": state.ports.get(comp),
                "running": running.get(comp, False),
            }
            for comp in COMPONENTS
        }
        return {
            "name": self.paths.name,
            "kubeconfig": str(self.paths.kubeconfig),
            "components": procs,
        }


def _kwok_node_stages() -> list[Path]:
    """kwok's own node stages (initialise, heartbeat with lease), from its Go module source."""
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kwok@{binaries.KWOK_VERSION}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, GOFLAGS="-mod=mod"),
        cwd=binaries.cache_root(),
    )
    if proc.returncode != 0:
        raise ClusterError(f"cannot locate the kwok module source: {proc.stderr.strip()}")
    root = Path(json.loads(proc.stdout)["Dir"]) / "kustomize" / "stage" / "node"
    stages = [
        root / "fast" / "node-initialize.yaml",
        root / "heartbeat-with-lease" / "node-heartbeat-with-lease.yaml",
    ]
    for s in stages:
        if not s.is_file():
            raise ClusterError(f"kwok stage file missing: {s}")
    return stages
