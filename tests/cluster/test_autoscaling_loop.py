"""The autoscaler in a closed loop of real parts: the local cluster and the operator; a real
Prometheus; a real `tritonserver` (the CPU twin of the service's repository) for every Ready
serving pod, listed to Prometheus through file_sd; a gRPC streaming load over them.

Time is compressed: 5 s evaluations, a 10 s rate window, a 20 s scale-down window. The test
prints (and keeps, under the pytest tmp dir) a timeline of load, queue latency, desired and
ready replicas: the closing note's table comes from one such run.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_operator.api.spec import parse
from cosyvoice_operator.devtools.closedloop.harness import PodServers, ready_pods
from cosyvoice_operator.devtools.closedloop.load import LoadGenerator
from cosyvoice_operator.devtools.closedloop.prometheus import Prometheus
from cosyvoice_operator.devtools.localcluster.binaries import kubectl_path
from tests.cluster.operator_process import (
    OperatorProcess,
    cache_claim,
    free_port,
    get_json,
    service,
    wait_for,
)
from tests.conftest import Cluster

L20 = {"nvidia.com/gpu.product": "NVIDIA-L20"}
TARGET_MS = 100
EVALUATION_S = 5
SCALE_DOWN_WINDOW_S = 20
AUTOSCALING = {
    "enabled": True,
    "minReplicas": 1,
    "maxReplicas": 4,
    "targetQueueLatencyMilliseconds": TARGET_MS,
    "evaluationIntervalSeconds": EVALUATION_S,
    "scaleUp": {"stabilizationWindowSeconds": 0, "maxStepReplicas": 4},
    "scaleDown": {"stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S, "maxStepReplicas": 1},
}


def status(cluster: Cluster, ns: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(cluster, "cvs", "tts", "-n", ns).get("status", {})
    return found


def condition(st: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((dict(c) for c in st.get("conditions", []) if c["type"] == kind), {})


def deployment_replicas(cluster: Cluster, ns: str) -> int:
    items = get_json(cluster, "deployments", "-n", ns, "-l", "tts.cosyvoice.dev/service=tts")
    return sum(int(d["spec"].get("replicas") or 0) for d in items["items"])


class Timeline:
    """Samples load, latency and replicas every `period` s in the background."""

    def __init__(self, cluster: Cluster, ns: str, load: Callable[[], str], period: float = 2.0):
        self.cluster, self.ns, self.load, self.period = cluster, ns, load, period
        self.rows: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                st = status(self.cluster, self.ns)
            except AssertionError:
                continue
            a = st.get("autoscaling", {})
            self.rows.append(
                {
                    "t": round(time.monotonic() - self.started, 1),
                    "load": self.load(),
                    "queueMs": a.get("lastQueueLatencyMilliseconds"),
                    "desired": a.get("desiredReplicas"),
                    "ready": st.get("readyReplicas"),
                    "metrics": condition(st, "MetricsAvailable").get("status"),
                }
            )

    def table(self) -> str:
        lines = ["   t(s)  load            queue-ms  desired  ready  metrics"]
        for r in self.rows:
            lines.append(
                f"{r['t']:7.1f}  {r['load']:<14}  {r['queueMs']!s:>8}  {r['desired']!s:>7}"
                f"  {r['ready']!s:>5}  {r['metrics']}"
            )
        return "\n".join(lines)


class DesiredWatch:
    """Every value ``status.autoscaling.desiredReplicas`` takes, from a ``kubectl get --watch``
    of the service: each status write arrives as an event, so no step is missed however slow
    a poll would be."""

    def __init__(self, cluster: Cluster, ns: str) -> None:
        self.values: list[int] = []
        self._process = subprocess.Popen(
            [
                str(kubectl_path()),
                f"--kubeconfig={cluster.kubeconfig}",
                "get", "cvs", "tts", "-n", ns, "--watch",
                "-o", 'jsonpath={.status.autoscaling.desiredReplicas}{"\\n"}',
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            text = line.strip()
            if text.isdigit() and (not self.values or self.values[-1] != int(text)):
                self.values.append(int(text))

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def close(self) -> None:
        self._process.terminate()
        self._process.wait(timeout=10)


@pytest.fixture
def loop_ns(cluster: Cluster) -> Any:
    name = cluster.namespace("scale")
    cluster.apply(name, cache_claim())
    yield name
    # The service goes at once (a cluster-wide operator of a later test must not see it).
    cluster.kubectl("delete", "cvs", "--all", "-n", name, "--timeout=60s", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def test_queue_latency_drives_replicas_in_a_closed_loop(
    cluster: Cluster, loop_ns: str, tmp_path: Path
) -> None:
    ns = loop_ns
    body = json.loads(
        # Triton's queue is the signal under test: mode Service (no router in front).
        service(
            "tts",
            replicas=1,
            serving={"nodeSelector": L20},
            autoscaling=AUTOSCALING,
            routing={"mode": "Service"},
        )
    )
    svc = parse(body["spec"])
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    prometheus = Prometheus(tmp_path / "prom", targets, scrape_interval=1.0)
    (tmp_path / "prom").mkdir()
    prometheus.start()
    servers = PodServers(
        svc,
        tmp_path / "pods",
        targets,
        namespace=ns,
        pods=ready_pods(cluster, ns, "tts.cosyvoice.dev/service=tts"),
        service_seconds=0.4,
        max_instances=2,
    )
    metrics_port = free_port()
    op = OperatorProcess(
        cluster,
        ns,
        tmp_path,
        "--metrics-port",
        str(metrics_port),
        "--metrics-address",
        "127.0.0.1",
        COSYVOICE_PROMETHEUS_URL=prometheus.url,
        COSYVOICE_METRICS_WINDOW_SECONDS="10",
    ).start()
    phase = ["idle"]
    load = LoadGenerator(servers.grpc_urls, "cosyvoice3")
    watch: DesiredWatch | None = None
    try:
        servers.start()
        cluster.apply(ns, json.dumps(body))
        wait_for(
            "one Ready pod with its Triton scraped",
            lambda: status(cluster, ns).get("readyReplicas") == 1 and len(servers.live()) == 1,
            timeout=120,
        )
        desired = watch = DesiredWatch(cluster, ns)
        with Timeline(cluster, ns, lambda: phase[0]) as timeline:
            # 1. Load past what one pod carries: the replicas rise, capacity joins, and the
            #    latency comes back under the target because it did.
            phase[0] = "8 streams"
            load.set_concurrency(8)
            wait_for(
                "the desired replicas to rise",
                lambda: (
                    (status(cluster, ns).get("autoscaling") or {}).get("desiredReplicas", 1) > 1
                ),
                timeout=120,
            )
            assert deployment_replicas(cluster, ns) > 1
            wait_for(
                "new Tritons serving",
                lambda: len(servers.live()) > 1,
                timeout=90,
            )
            joined = time.monotonic()
            wait_for(
                "queue latency back under the target",
                lambda: (
                    (load.summary(since=joined + 10).first_chunk_p50_s or 99) < 1.0
                    and (status(cluster, ns).get("autoscaling") or {}).get(
                        "lastQueueLatencyMilliseconds", 1e9
                    )
                    < TARGET_MS
                ),
                timeout=120,
                interval=2,
            )
            peak = status(cluster, ns)["autoscaling"]["desiredReplicas"]
            assert len(load.per_server(since=joined)) > 1  # the load really spread

            # 2. Prometheus stops: no scale-down, and the condition says why.
            phase[0] = "no metrics"
            load.set_concurrency(0)
            outage = len(desired.values)
            prometheus.stop()
            wait_for(
                "MetricsAvailable False",
                lambda: condition(status(cluster, ns), "MetricsAvailable").get("status") == "False",
                timeout=120,
            )
            # With data, the idle service would go down once the scale-down window has passed
            # since the load stopped, at the next evaluation: wait past that, then no value
            # other than the peak may have been written meanwhile.
            time.sleep(SCALE_DOWN_WINDOW_S + EVALUATION_S)
            assert desired.alive and desired.values[outage:] in ([], [peak]), desired.values
            assert status(cluster, ns)["autoscaling"]["desiredReplicas"] == peak
            recovered = len(desired.values)
            prometheus.start()
            phase[0] = "idle"
            wait_for(
                "MetricsAvailable True again",
                lambda: condition(status(cluster, ns), "MetricsAvailable").get("status") == "True",
                timeout=60,
            )

            # 3. No traffic: down after the window, one step at a time, to minReplicas (every
            #    value written, from the watch).
            wait_for(
                "back to minReplicas",
                lambda: desired.values[-1:] == [1],
                timeout=240,
                interval=1,
            )
            seen = [peak, *desired.values[recovered:]]
            steps = [a - b for a, b in itertools.pairwise(seen)]
            assert steps and all(step == 1 for step in steps), seen

            # 4. An HPA on the same Deployment: reported, not fought.
            deployment = get_json(
                cluster, "deployments", "-n", ns, "-l", "tts.cosyvoice.dev/service=tts"
            )["items"][0]["metadata"]["name"]
            cluster.kubectl(
                "autoscale", "deployment", deployment, "-n", ns, "--min=1", "--max=3",
                "--cpu-percent=50", "--name=rival",
            )  # fmt: skip
            conflict = wait_for(
                "ScalingConflict",
                lambda: (
                    condition(status(cluster, ns), "ScalingConflict").get("status") == "True"
                    and condition(status(cluster, ns), "ScalingConflict")
                ),
                timeout=120,
            )
            assert "rival" in conflict["message"]
            cluster.kubectl("delete", "hpa", "rival", "-n", ns)

            # 5. DryRun: decisions reported, the Deployments left alone. First the Tritons of
            #    the pods just removed must be gone: a load sent to a server being stopped
            #    fails for the harness's sake, not the operator's.
            wait_for("one Triton left", lambda: len(servers.live()) == 1, timeout=60)
            cluster.kubectl(
                "patch", "cvs", "tts", "-n", ns, "--type=merge",
                "-p", json.dumps({"spec": {"autoscaling": {"mode": "DryRun"}}}),
            )  # fmt: skip
            phase[0] = "8 streams (dry run)"
            load.set_concurrency(8)
            wait_for(
                "a dry-run decision to scale up",
                lambda: (
                    (status(cluster, ns).get("autoscaling") or {}).get("desiredReplicas", 1) > 1
                ),
                timeout=60,
            )
            assert deployment_replicas(cluster, ns) == 1  # spec.replicas, untouched
            assert condition(status(cluster, ns), "ScalingActive").get("reason") == "DryRun"
            load.set_concurrency(0)
        # The decisions are in the operator's own metrics too.
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            exported = r.read().decode()
        ups = re.findall(
            r'cosyvoice_autoscaler_decisions_total\{direction="up",mode="Active"\} (\S+)', exported
        )
        assert ups and float(ups[0]) >= 1, exported[-2000:]
        assert 'cosyvoice_service_desired_replicas{namespace="' + ns in exported
        assert "cosyvoice_autoscaler_metrics_unavailable_total" in exported
        print(timeline.table())
        (tmp_path / "timeline.json").write_text(json.dumps(timeline.rows, indent=1))
        summary = load.summary()
        assert summary.completed > 0
        assert summary.failed == 0, summary.errors
    finally:
        if watch is not None:
            watch.close()
        load.close()
        servers.stop()
        prometheus.stop()
        op.stop()
        print(op.log())


SERVING_PODS = "tts.cosyvoice.dev/service=tts,app.kubernetes.io/component!=router"
ROUTER_PODS = "tts.cosyvoice.dev/service=tts,app.kubernetes.io/component=router"


def test_the_routers_figures_drive_replicas_through_one_channel(
    cluster: Cluster, loop_ns: str, tmp_path: Path
) -> None:
    """Mode Router, as a cluster runs it (issue 30): the operator's rendered router config
    (ConfigMap cvs-tts-router) on a real HAProxy, the Triton twins found by DNS SRV each on
    an address of its own, the load on ONE channel through the router, Prometheus scraping
    HAProxy as the Ready router pod. The queue forms in the router; the replicas rise; the new
    pods serve streams on the same channel; the scale-down under a light load drains its pod
    and cuts no stream."""
    from cosyvoice_operator.devtools.closedloop.router import FleetRouter

    ns = loop_ns
    body = json.loads(
        service(
            "tts",
            replicas=1,
            serving={"nodeSelector": L20},
            # The twin's pods hold 2 streams (2 instances): the router's maxconn says so.
            autoscaling={**AUTOSCALING, "maxReplicas": 3, "slo": {"slotsPerPod": 2}},
            routing={"mode": "Router", "router": {"replicas": 1}},
        )
    )
    svc = parse(body["spec"])
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    (tmp_path / "prom").mkdir()
    prometheus = Prometheus(tmp_path / "prom", targets, scrape_interval=1.0)
    fleet = FleetRouter(tmp_path / "router", service="tts", namespace=ns)
    routers = ready_pods(cluster, ns, ROUTER_PODS)

    def router_target() -> dict[str, tuple[str, str]]:
        names = routers()
        [(address, _)] = fleet.targets().items()
        return {address: (ns, names[0])} if names else {}

    servers = PodServers(
        svc,
        tmp_path / "pods",
        targets,
        namespace=ns,
        pods=ready_pods(cluster, ns, SERVING_PODS),
        service_seconds=0.4,
        max_instances=2,
        addresses=fleet.block,
        directory=fleet.directory,
        drained=fleet.drained,
        extra_targets=router_target,
    )
    prometheus.start()
    op = OperatorProcess(
        cluster,
        ns,
        tmp_path,
        COSYVOICE_PROMETHEUS_URL=prometheus.url,
        COSYVOICE_METRICS_WINDOW_SECONDS="10",
    ).start()
    load: LoadGenerator | None = None
    try:
        fleet.start(router=False)
        servers.start()
        cluster.apply(ns, json.dumps(body))

        def rendered() -> str | None:
            proc = cluster.kubectl(
                "get", "configmap", "cvs-tts-router", "-n", ns, "-o", "json", check=False
            )
            return json.loads(proc.stdout)["data"]["haproxy.cfg"] if proc.returncode == 0 else None

        fleet.use_rendered(wait_for("the router's rendered config", rendered, timeout=60))
        assert "server-template pod 1-3 " in fleet.haproxy.config_text  # maxReplicas
        assert " maxconn 2 " in fleet.haproxy.config_text
        fleet.haproxy.start()
        wait_for("one Triton live", lambda: len(servers.live()) == 1, timeout=120)
        fleet.haproxy.wait_servers(set(servers.addresses_of().values()), timeout=30)
        wait_for("a Ready router pod", routers, timeout=60)

        load = LoadGenerator(list, "cosyvoice3", through=fleet.grpc)
        load.set_concurrency(6)  # 3x one pod's slots: 4 wait in the router
        wait_for(
            "the router's queue read by the autoscaler: desired replicas > 1",
            lambda: (status(cluster, ns).get("autoscaling") or {}).get("desiredReplicas", 1) > 1,
            timeout=120,
        )
        wait_for("new Tritons live", lambda: len(servers.live()) > 1, timeout=120)

        def every_pod_served() -> dict[str, int] | None:
            served = fleet.served_per_pod(servers.addresses_of())
            return served if len(served) > 1 and min(served.values()) > 0 else None

        served = wait_for("streams on the new pods, same channel", every_pod_served, timeout=60)
        print(f"\n{fleet.summary(servers.addresses_of())}\nserved per pod: {served}")

        load.set_concurrency(1)  # light load: the fleet shrinks under it
        wait_for("a scale-in: its pod drained, then stopped", servers.stopped, timeout=150)
        gone = servers.stopped()[0].pod
        mark = time.monotonic()
        wait_for("3 more streams", lambda: load.summary(since=mark).completed >= 3, timeout=60)
        load.stop()
        print(f"{gone} went; {fleet.summary(servers.addresses_of())}")
        summary = load.summary()
        assert summary.failed == 0, summary
        assert summary.completed > 20, summary
    finally:
        if load is not None:
            load.close()
        servers.stop()
        fleet.stop()
        prometheus.stop()
        op.stop()
