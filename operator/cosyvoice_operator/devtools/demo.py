"""``cosyvoice-operator demo``: the operator on the local cluster, with its autoscaler in a
closed loop of real parts.

What runs: the local cluster (``devtools.localcluster``), the CRD, the operator as a process,
both examples; for ``cosyvoice3`` (autoscaled) a real Prometheus and a real CPU ``tritonserver``
per Ready pod (``devtools.closedloop``), and a streaming load that rises and falls. A table,
redrawn in place on a terminal (on a pipe: only what changed), shows each service's phase,
ready / desired replicas, the Tritons behind them, the queue latency Prometheus reports and
the autoscaler's latest reason; above it, the router's queue and the streams per pod.

The load goes as a cluster's clients send it (issue 30): through the service's router, a real
HAProxy on the config the operator rendered (its ConfigMap, run on loopback:
``devtools.closedloop.router``), on ONE gRPC channel; the router finds the Tritons by DNS SRV
as in a cluster, each on an address of its own. A service in ``routing.mode: Service`` is
loaded without a router, round-robin over the Tritons, as before.

A run starts from an empty cluster unless ``--keep-state`` (the last run's services, engines
and Events otherwise look like this run's). ``--cycles N`` stops after N rises and falls that
each scaled up and back down (the test of the demo uses 1).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from cosyvoice_operator.api import labels
from cosyvoice_operator.devtools.localcluster import ClusterError, LocalCluster

AUTOSCALED = "cosyvoice3"  # the example whose pods get a Triton each, and the load
# Time compressed for a demo (examples/cosyvoice3.yaml: 15 s evaluations, a 300 s scale-down
# window, up to 8 replicas, a business-hours floor of 3); three Tritons fit on two cores.
DEMO_AUTOSCALING: dict[str, Any] = {
    "maxReplicas": 3,
    "targetQueueLatencyMilliseconds": 100,
    "evaluationIntervalSeconds": 5,
    "scaleDown": {"stabilizationWindowSeconds": 20, "maxStepReplicas": 1},
}
METRICS_WINDOW_SECONDS = 10  # the operator's rate window (COSYVOICE_METRICS_WINDOW_SECONDS)
SERVICE_SECONDS = 0.4  # each request holds an orchestrator instance this long
MAX_INSTANCES = 2  # per model of each twin: two streams at once per pod
# What the router is told (issue 30): each pod's slots are the twin's (slotsPerPod), one
# router pod (so the one HAProxy here is all of it).
DEMO_SLOTS: dict[str, Any] = {"slo": {"slotsPerPod": MAX_INSTANCES}}
DEMO_ROUTER: dict[str, Any] = {"replicas": 1}
# The load: (streams, seconds) while rising and falling; the peak holds until the fleet has
# grown to maxReplicas and the latency is back under the target.
RISE = ((2, 10.0), (4, 10.0))
PEAK = 6
PEAK_HOLD_SECONDS = 15.0
PEAK_MAX_SECONDS = 150.0
FALL = ((4, 10.0), (2, 10.0))
REFRESH_SECONDS = 2.0


class DemoError(RuntimeError):
    """The demo cannot run: the message says why and what to do."""


def repo_file(*parts: str) -> Path:
    """A file of the source checkout (CRDs, examples): the demo runs from a checkout."""
    return Path(__file__).resolve().parents[3].joinpath(*parts)


def closed_loop_missing() -> str | None:
    """Why the closed loop cannot run here, or None."""
    if shutil.which("prometheus") is None:
        return (
            "prometheus is not on PATH (make setup installs Debian's package: "
            "apt-get install -y --no-install-recommends prometheus)"
        )
    import importlib.util

    if importlib.util.find_spec("pytriton") is None:
        return "the nvidia-pytriton wheel (tritonserver) is not installed (make setup)"
    return None


def demo_services() -> list[dict[str, Any]]:
    """The examples as the demo applies them: cosyvoice3 with the demo's compressed timings."""
    services = []
    for path in sorted(repo_file("examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            if doc["metadata"]["name"] == AUTOSCALED:
                doc = copy.deepcopy(doc)
                autoscaling = doc["spec"]["autoscaling"]
                autoscaling.pop("schedules", None)
                for key, value in {**DEMO_AUTOSCALING, **DEMO_SLOTS}.items():
                    if isinstance(value, dict):
                        autoscaling.setdefault(key, {}).update(value)
                    else:
                        autoscaling[key] = value
                routing = doc["spec"].setdefault("routing", {})
                if routing.get("mode", "Router") == "Router":
                    routing.setdefault("router", {}).update(DEMO_ROUTER)
            services.append(doc)
    return services


def banner(prometheus_url: str | None, without_loop: str | None) -> str:
    a = DEMO_AUTOSCALING
    real = (
        "REAL: etcd, kube-apiserver, controller-manager and scheduler (built from source), the "
        "operator (this checkout, as a process), "
    )
    if without_loop is None:
        real += (
            f"Prometheus (Debian's, {prometheus_url}) and one tritonserver per Ready "
            f"{AUTOSCALED} pod (Triton 2.51 from the pytriton wheel, on CPU) loading the model "
            "repository the operator rendered, fed a streaming gRPC load by this process on "
            "one channel through the service's router (Debian's HAProxy on the config the "
            "operator rendered, the pods found by DNS SRV)."
        )
    else:
        real += f"nothing else: the closed loop is off ({without_loop})."
    simulated = (
        "SIMULATED: the GPU nodes and the pods (kwok marks them Running and Ready; no "
        "container runs), the engine builds (a build pod 'succeeds' after 3 s; no engine is "
        "built), the GPU models and trtllm-serve (Python stand-ins behind the project's own "
        f"cosyvoice3 orchestrator: each stream takes {SERVICE_SECONDS} s of the LLM stand-in, "
        f"{MAX_INSTANCES} instances per model, audio is a tone). "
        "cosyvoice2 (fixed at 2 replicas) has no Triton behind its pods."
    )
    compressed = (
        f"TIME COMPRESSED: {AUTOSCALED} evaluates every {a['evaluationIntervalSeconds']} s "
        f"over a {METRICS_WINDOW_SECONDS} s rate window, scales down after "
        f"{a['scaleDown']['stabilizationWindowSeconds']} s, up to {a['maxReplicas']} "
        f"replicas, target {a['targetQueueLatencyMilliseconds']} ms of queue "
        "(examples/cosyvoice3.yaml: 15 s, 300 s, 8, 50 ms, and a business-hours floor)."
    )
    return "\n".join(_wrap(p) for p in (real, simulated, compressed))


def _wrap(text: str, width: int = 96) -> str:
    import textwrap

    return textwrap.fill(text, width, subsequent_indent="  ")


@dataclass
class Row:
    name: str
    phase: str = ""
    ready: str = ""
    desired: str = ""
    tritons: str = "-"
    queue_ms: str = ""
    target_ms: str = "-"
    reason: str = ""

    def cells(self) -> list[str]:
        return [
            self.name,
            self.phase,
            self.ready,
            self.desired,
            self.tritons,
            self.queue_ms,
            self.target_ms,
            self.reason,
        ]


HEADER = ["NAME", "PHASE", "READY", "DESIRED", "TRITONS", "QUEUE-MS", "TARGET", "AUTOSCALER"]


def row_of(svc: Mapping[str, Any], tritons: int | None) -> Row:
    """One service's line, from its status (what `kubectl get cvs -o json` returns)."""
    spec = svc.get("spec") or {}
    st = svc.get("status") or {}
    a = spec.get("autoscaling") or {}
    auto = st.get("autoscaling") or {}
    row = Row(str(svc["metadata"]["name"]))
    row.phase = str(st.get("phase", ""))
    row.ready = str(st.get("readySummary", ""))
    row.tritons = "-" if tritons is None else str(tritons)
    if not a.get("enabled"):
        row.desired = str(spec.get("replicas", ""))
        row.reason = "autoscaling off: spec.replicas"
        return row
    row.desired = str(auto.get("desiredReplicas", ""))
    latency = auto.get("lastQueueLatencyMilliseconds")
    row.queue_ms = "" if latency is None else f"{float(latency):.0f}"
    row.target_ms = str(a.get("targetQueueLatencyMilliseconds", ""))
    metrics = next(
        (c for c in st.get("conditions") or [] if c.get("type") == "MetricsAvailable"), None
    )
    latest = auto.get("lastEvaluation") or auto.get("lastDecision") or {}
    reason = str(latest.get("reason", ""))
    if metrics is not None and metrics.get("status") == "False":
        reason = f"holding: {metrics.get('reason')}: {metrics.get('message', '')}"
    row.reason = reason
    return row


def table(rows: list[Row], width: int | None = None) -> list[str]:
    """Aligned columns; the last one cut to ``width`` (a terminal's) when given."""
    cells = [HEADER] + [r.cells() for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER) - 1)]
    lines = []
    for c in cells:
        line = "  ".join(v.ljust(w) for v, w in zip(c, widths, strict=False)) + "  " + c[-1]
        if width is not None and len(line) > width:
            line = line[: max(0, width - 1)] + "…"
        lines.append(line.rstrip())
    return lines


@dataclass
class Load:
    """The load's shape: rise, a peak held until the fleet grew, fall, idle until it shrank."""

    phase: str = "warming"
    streams: int = 0
    since: float = field(default_factory=time.monotonic)
    step: int = 0  # which step of RISE / FALL
    peak_ok_since: float | None = None  # when the grown fleet brought the latency under target


@dataclass
class Observed:
    """What the demo saw of the autoscaled service, for the summary and for ``--cycles``."""

    desired: list[int] = field(default_factory=list)  # every distinct desired count, in order
    cycles: int = 0
    scaled_up: bool = False


class Demo:
    """The demo on a running local cluster, in one namespace. ``start``, then ``refresh``
    every few seconds (or ``run``), then ``stop``."""

    def __init__(
        self,
        cluster: LocalCluster,
        namespace: str = "default",
        *,
        out: TextIO = sys.stdout,
        tty: bool | None = None,
        closed_loop: bool = True,
        work: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.without_loop = None if closed_loop else "--no-load"
        if closed_loop:
            self.without_loop = closed_loop_missing()
        self.work = work or (cluster.paths.root / "demo")
        self.log_path = cluster.paths.logs / "operator-demo.log"
        self.operator: subprocess.Popen[bytes] | None = None
        self.prometheus: Any = None
        self.servers: Any = None
        self.load: Any = None
        self.fleet: Any = None  # the router (mode Router), once its config is rendered
        self.shape = Load()
        self.observed = Observed()
        self.min_replicas = 1
        self.max_replicas = int(DEMO_AUTOSCALING["maxReplicas"])
        self.target_ms = float(DEMO_AUTOSCALING["targetQueueLatencyMilliseconds"])
        self._drawn = 0
        self._last_rows: dict[str, list[str]] = {}
        self._last_decision: dict[str, Any] = {}
        self._history_seen = 0
        self._last_router_line = ""
        self._failures_seen = 0
        self.changes: list[str] = []

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.work.mkdir(parents=True, exist_ok=True)
        kubectl = self.cluster.kubectl
        kubectl("apply", "--server-side", "-f", str(repo_file("crds")))
        self.cluster.wait_established("cosyvoiceservices.tts.cosyvoice.dev")
        kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(_cache_claim()))
        services = demo_services()
        prometheus_url = None
        if self.without_loop is None:
            from cosyvoice_operator.api.spec import parse
            from cosyvoice_operator.devtools.closedloop.harness import PodServers
            from cosyvoice_operator.devtools.closedloop.prometheus import Prometheus

            targets = self.work / "targets.json"
            self.prometheus = Prometheus(self.work / "prometheus", targets, scrape_interval=1.0)
            self.prometheus.start()
            prometheus_url = self.prometheus.url
            [autoscaled] = [s for s in services if s["metadata"]["name"] == AUTOSCALED]
            a = autoscaled["spec"]["autoscaling"]
            self.min_replicas = int(a.get("minReplicas", 1))
            spec = parse(autoscaled["spec"])
            routed: dict[str, Any] = {}
            if spec.routing.mode == "Router":
                from cosyvoice_operator.devtools.closedloop.router import FleetRouter

                self.fleet = FleetRouter(
                    self.work / "router", service=AUTOSCALED, namespace=self.namespace
                ).start(router=False)  # its DNS now; HAProxy once the operator rendered it
                routed = {
                    "addresses": self.fleet.block,
                    "directory": self.fleet.directory,
                    "drained": self.fleet.drained,
                    "extra_targets": self._router_targets,
                }
            self.servers = PodServers(
                spec,
                self.work / "pods",
                targets,
                namespace=self.namespace,
                pods=self._ready_pods,
                service_seconds=SERVICE_SECONDS,
                max_instances=MAX_INSTANCES,
                **routed,
            ).start()
        self._start_operator(prometheus_url)
        kubectl("apply", "-n", self.namespace, "-f", "-", input=json.dumps(_list(services)))
        if self.servers is not None and self.fleet is None:
            from cosyvoice_operator.devtools.closedloop.load import LoadGenerator
            from cosyvoice_operator.render import triton

            self.load = LoadGenerator(self.servers.grpc_urls, triton.orchestrator(AUTOSCALED))
        self.out.write(banner(prometheus_url, self.without_loop) + "\n")
        self.out.write(
            f"Operator log: {self.log_path}\nIn another shell:\n"
            + "".join(f"  {line}\n" for line in self.cluster.exports().splitlines())
            + f"  kubectl get cvs -n {self.namespace} -w\n"
            + f"  kubectl get events -n {self.namespace} --field-selector "
            f"involvedObject.name={AUTOSCALED}\nCtrl-C stops the demo.\n\n"
        )
        self.out.flush()

    def _start_operator(self, prometheus_url: str | None) -> None:
        env = dict(os.environ, KUBECONFIG=str(self.cluster.paths.kubeconfig))
        env["PATH"] = f"{self.cluster.paths.bin}:{env.get('PATH', '')}"
        env["COSYVOICE_METRICS_WINDOW_SECONDS"] = str(METRICS_WINDOW_SECONDS)
        if prometheus_url:
            env["COSYVOICE_PROMETHEUS_URL"] = prometheus_url
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.operator = subprocess.Popen(
                [sys.executable, "-m", "cosyvoice_operator", "run", "--namespace", self.namespace],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        """Everything the demo started, in reverse; safe to call twice."""
        if self.load is not None:
            self.load.close()
            self.load = None
        if self.servers is not None:
            self.servers.stop()
            self.servers = None
        if self.fleet is not None:
            self.fleet.stop()
            self.fleet = None
        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                self.operator.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait(timeout=10)
        if self.prometheus is not None:
            self.prometheus.stop()
            self.prometheus = None

    def _ready_pods(self, component: str = f"!={labels.ROUTER_COMPONENT}") -> list[str]:
        """The Ready serving pods (the router's carry the service's label too: not these)."""
        selector = f"{labels.SERVICE_LABEL}={AUTOSCALED},{labels.COMPONENT_LABEL}{component}"
        out = self.cluster.kubectl(
            "get", "pods", "-n", self.namespace, "-l", selector, "-o", "json",
        )  # fmt: skip
        names = []
        for pod in json.loads(out)["items"]:
            ready = any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (pod.get("status") or {}).get("conditions") or []
            )
            if ready and not pod["metadata"].get("deletionTimestamp"):
                names.append(pod["metadata"]["name"])
        return sorted(names)

    def _router_targets(self) -> dict[str, tuple[str, str]]:
        """The router's exporter for Prometheus, labelled with the router pod's name (the
        autoscaler reads the Ready router pods' series)."""
        if self.fleet is None:
            return {}
        routers = self._ready_pods(f"={labels.ROUTER_COMPONENT}")
        if not routers:
            return {}
        [(address, _)] = self.fleet.targets().items()
        return {address: (self.namespace, routers[0])}

    def _start_router(self) -> None:
        """Once the operator has rendered the router's config: HAProxy on it, and the load
        through it on one channel."""
        if self.fleet is None or self.load is not None:
            return
        out = self.cluster.kubectl(
            "get", "configmap", f"cvs-{AUTOSCALED}-router", "-n", self.namespace, "-o", "json",
            check=False,
        )  # fmt: skip
        try:
            data = json.loads(out)["data"]
        except (ValueError, KeyError, TypeError):
            return
        rendered = next((v for k, v in data.items() if k.endswith(".cfg")), None)
        if rendered is None:
            return
        from cosyvoice_operator.devtools.closedloop.load import LoadGenerator
        from cosyvoice_operator.render import triton

        self.fleet.use_rendered(rendered)
        self.fleet.haproxy.start()
        self.load = LoadGenerator(list, triton.orchestrator(AUTOSCALED), through=self.fleet.grpc)
        self._change(
            f"router: HAProxy on the operator's config (configmap cvs-{AUTOSCALED}-router) at "
            f"{self.fleet.grpc}; the load goes through it on one channel"
        )

    def router_line(self) -> str:
        """The router's queue and streams per pod (empty without a router)."""
        if self.fleet is None or self.servers is None or not self.fleet.haproxy.running:
            return ""
        return str(self.fleet.summary(self.servers.addresses_of()))

    # ---- one refresh ---------------------------------------------------------------------

    def services(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl("get", "cvs", "-n", self.namespace, "-o", "json", check=False)
        try:
            items: list[dict[str, Any]] = json.loads(out)["items"]
        except (ValueError, KeyError):
            return []
        return sorted(items, key=lambda s: s["metadata"]["name"])

    def refresh(self) -> None:
        now = time.monotonic()
        if self.operator is not None and self.operator.poll() is not None:
            raise DemoError(
                f"the operator exited with {self.operator.returncode}; its log: {self.log_path}"
            )
        services = self.services()
        self._start_router()
        live = len(self.servers.live()) if self.servers is not None else None
        rows = []
        for svc in services:
            name = svc["metadata"]["name"]
            rows.append(row_of(svc, live if name == AUTOSCALED else None))
            if name == AUTOSCALED:
                self._follow(svc, live, now)
        self._note_tritons()
        self._draw(rows)

    def _follow(self, svc: Mapping[str, Any], live: int | None, now: float) -> None:
        """Notes the autoscaler's decisions and drives the load by what the fleet does."""
        st = svc.get("status") or {}
        auto = st.get("autoscaling") or {}
        decision = auto.get("lastDecision") or {}
        if decision and decision.get("time") != self._last_decision.get("time"):
            if self._last_decision or decision.get("from") != decision.get("to"):
                self._change(
                    f"{AUTOSCALED}: {decision.get('from')} -> {decision.get('to')} replicas: "
                    f"{decision.get('reason', '')}"
                )
            self._last_decision = dict(decision)
        desired = auto.get("desiredReplicas")
        if isinstance(desired, int) and (
            not self.observed.desired or self.observed.desired[-1] != desired
        ):
            self.observed.desired.append(desired)
        if self.load is None or live is None:
            return
        latency = auto.get("lastQueueLatencyMilliseconds")
        metrics_ok = any(
            c.get("type") == "MetricsAvailable" and c.get("status") == "True"
            for c in st.get("conditions") or []
        )
        s = self.shape
        if s.phase in ("warming", "pause"):
            wait = 0.0 if s.phase == "warming" else 10.0
            if live >= 1 and metrics_ok and now - s.since >= wait:
                self._load_to("rising", RISE[0][0], now)
        elif s.phase == "rising":
            if now - s.since >= RISE[s.step][1]:
                if s.step + 1 < len(RISE):
                    self._load_to("rising", RISE[s.step + 1][0], now, s.step + 1)
                else:
                    self._load_to("peak", PEAK, now)
        elif s.phase == "peak":
            grown = isinstance(desired, int) and desired >= self.max_replicas
            self.observed.scaled_up |= grown
            calm = grown and live >= self.max_replicas
            calm = calm and latency is not None and float(latency) < self.target_ms
            if calm and s.peak_ok_since is None:
                s.peak_ok_since = now
            held = s.peak_ok_since is not None and now - s.peak_ok_since >= PEAK_HOLD_SECONDS
            if held or now - s.since >= PEAK_MAX_SECONDS:
                self._load_to("falling", FALL[0][0], now)
        elif s.phase == "falling":
            if now - s.since >= FALL[s.step][1]:
                if s.step + 1 < len(FALL):
                    self._load_to("falling", FALL[s.step + 1][0], now, s.step + 1)
                else:
                    self._load_to("idle", 0, now)
        elif s.phase == "idle":
            self.observed.scaled_up |= isinstance(desired, int) and desired > self.min_replicas
            shrunk = desired == self.min_replicas and live == self.min_replicas
            shrunk = shrunk and st.get("readyReplicas") == self.min_replicas
            if shrunk and self.observed.scaled_up:
                self.observed.cycles += 1
                self.observed.scaled_up = False
                self._change(
                    f"cycle {self.observed.cycles} done: scaled up to "
                    f"{max(self.observed.desired)} under load and back to {self.min_replicas}"
                )
                self._load_to("pause", 0, now)

    def _load_to(self, phase: str, streams: int, now: float, step: int = 0) -> None:
        s = self.shape
        changed = (phase, streams) != (s.phase, s.streams)
        if phase != s.phase:
            s.peak_ok_since = None
        s.phase, s.streams, s.since, s.step = phase, streams, now, step
        if self.load is not None:
            self.load.set_concurrency(streams)
        if changed:
            self._change(f"load: {streams} streams ({phase})")

    def _note_tritons(self) -> None:
        if self.servers is None:
            return
        history = self.servers.history
        for _, pod, what in history[self._history_seen :]:
            self._change(
                f"tritonserver for pod {pod} "
                + ("serving, scraped by Prometheus" if what == "live" else "stopped (pod gone)")
            )
        self._history_seen = len(history)
        failures = list(self.servers.failures)
        for failure in failures[self._failures_seen :]:
            self._change(f"tritonserver failed: {failure}")
        self._failures_seen = len(failures)

    def _change(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        self.changes.append(line)
        if not self.tty:
            self.out.write(line + "\n")
            self.out.flush()

    def _draw(self, rows: list[Row]) -> None:
        load = f"load: {self.shape.streams} streams ({self.shape.phase})" if self.load else ""
        head = f"{time.strftime('%H:%M:%S')}  {load}".rstrip()
        routed = self.router_line()
        if routed and self.tty:
            head = f"{head}  |  {routed}"
        if self.tty:
            width = shutil.get_terminal_size((120, 40)).columns
            lines = [head, *table(rows, width), "", *[c[:width] for c in self.changes[-8:]]]
            if self._drawn:
                self.out.write(f"\x1b[{self._drawn}F\x1b[J")
            self.out.write("\n".join(lines) + "\n")
            self._drawn = len(lines)
        else:
            lines = table(rows)
            changed = {
                r.name: line
                for r, line in zip(rows, lines[1:], strict=True)
                if self._last_rows.get(r.name) != r.cells()
            }
            if changed:
                self.out.write(f"{time.strftime('%H:%M:%S')}  {lines[0]}\n")
                for line in changed.values():
                    self.out.write(f"          {line}\n")
            self._last_rows = {r.name: r.cells() for r in rows}
            if routed and routed != self._last_router_line:
                self.out.write(f"{time.strftime('%H:%M:%S')}  {routed}\n")
            self._last_router_line = routed
        self.out.flush()

    def run(
        self,
        stop: Callable[[], bool] = lambda: False,
        cycles: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Refreshes until ``stop()``, ``cycles`` completed cycles, or ``timeout`` seconds
        (then 1)."""
        started = time.monotonic()
        while not stop():
            self.refresh()
            if cycles is not None and self.observed.cycles >= cycles:
                return 0
            if timeout is not None and time.monotonic() - started > timeout:
                self._change(f"timed out after {timeout:.0f}s (desired: {self.observed.desired})")
                return 1
            deadline = time.monotonic() + REFRESH_SECONDS
            while time.monotonic() < deadline and not stop():
                time.sleep(0.1)
        return 0


def _cache_claim() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "cosyvoice-engines"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "100Gi"}},
        },
    }


def _list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


@contextlib.contextmanager
def _interrupts() -> Iterator[threading.Event]:
    """An Event set by Ctrl-C or SIGTERM (restored afterwards)."""
    stopped = threading.Event()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: stopped.set())
    try:
        yield stopped
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(
    name: str,
    *,
    keep_state: bool = False,
    keep_cluster: bool = False,
    closed_loop: bool = True,
    cycles: int | None = None,
    timeout: float | None = None,
) -> int:
    """The ``demo`` command: a clean cluster (unless ``keep_state``), the demo, Ctrl-C."""
    cluster = LocalCluster(name)
    log = sys.stderr
    if not keep_state and cluster.paths.root.exists():
        log.write(
            f"starting clean: the last demo's cluster {name!r} is wiped (--keep-state keeps it)\n"
        )
        cluster.down(quiet=True, wipe=True)
    demo: Demo | None = None
    try:
        cluster.up()
        demo = Demo(cluster, closed_loop=closed_loop)
        with _interrupts() as stopped:
            demo.start()
            code = demo.run(stopped.is_set, cycles=cycles, timeout=timeout)
        return code
    except (ClusterError, DemoError) as exc:
        log.write(f"error: {exc}\n")
        return 1
    finally:
        if demo is not None:
            log.write("stopping the demo ...\n")
            demo.stop()
        if not keep_cluster:
            cluster.down(quiet=True)
