"""Benchmark of the control loop at fleet scale, on the local cluster (issue 7; issue 31:
interleaved pairs, load recorded, every run kept).

    python bench/control_loop.py [--services 1000] [--nodes 250] [--pairs 3] [--steady 60]
                                 [--no-restart] [--chaos 100] [--seeds 3] [--first-seed S]

The timed part is --pairs pairs of two phases, interleaved (floor, operator, floor,
operator, ...), each on a fresh local cluster (wiped and started again, CRDs applied), so
that no phase inherits the objects, etcd history or controller backlog of the one before:

A. floor: the objects the operator would make for N services (one distinct engine each),
   created directly (`kubectl create`, 100 per call): the services themselves (in a
   namespace no operator serves), the build Jobs, until every Job is Complete, then the
   engine records, then the serving objects (the Triton repository ConfigMap, Deployment,
   Service, PodDisruptionBudget and NetworkPolicy, rendered by the operator's own `render`
   code): what the API server, the Job controller, the scheduler and kwok take without the
   operator.
B. operator: N services applied the same way to a namespace the operator serves; the time
   until every service reads EngineReady=True and has its serving Deployments (the same
   milestone as the floor's end). Target: the median ratio over the pairs within 1.5x of
   the floor. Also the time to EngineReady alone, and the operator's writes per service up
   to that service's own EngineReady (from a log of its requests, each attributed to the
   service whose effect made it: `bench/request_log_operator.py`).

Each phase records the load average (/proc/loadavg) at its start and end, and the CPU
seconds the cluster's processes (and the operator) spent in it. Then, once, on the last
operator phase's cluster after its timed milestones:

3. steady state (--steady seconds, 0 skips it and 4): with everything Ready,
   `apiserver_request_total` (the API server's own counter) for what only the operator
   touches, and the operator's own count of its requests by verb. Target: zero beyond watches.
4. memory: the operator's resident set (VmRSS) then. Target: < 200 MB.
5. restart storm (--no-restart skips it): the operator SIGKILLed and started again with N
   services; the time until every service has been looked at, and its requests: one list
   per kind, no write.
6. chaos (--chaos services, 0 skips it; --seeds runs, seeds from --first-seed on, by default
   a new one per run, recorded): services rolled out while the operator is SIGKILLed at
   random moments: duplicate Jobs, orphans, and whether every service converges.

Every run is written whole to bench/results/control_loop/<UTC time>.json (never
overwritten), and its summary (each pair's ratio, the median and range, the loads) to
bench/results/control_loop.json, with the list of every kept run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from cosyvoice_operator.api import engine_identity, labels, spec
from cosyvoice_operator.cli import render_command
from cosyvoice_operator.devtools.localcluster import LocalCluster
from cosyvoice_operator.devtools.localcluster.binaries import kubectl_path
from cosyvoice_operator.devtools.localcluster.cluster import State
from cosyvoice_operator.render import build_job
from cosyvoice_operator.shell import config
from cosyvoice_operator.shell.kube import resource_of

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench/results"
PRODUCT = "NVIDIA-H100-80GB-HBM3"
KEY_LABEL = labels.KEY_LABEL
WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE"}
APISERVER_WRITE_VERBS = {"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION"}
OPERATOR_RESOURCES = {"cosyvoiceservices", "jobs", "configmaps", "persistentvolumeclaims",
                      "secrets", "events", "pods", "nodes"}  # fmt: skip


class Bench:
    def __init__(self, name: str) -> None:
        self.local = LocalCluster(name)
        self.env = dict(os.environ, KUBECONFIG=str(self.local.paths.kubeconfig))

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 600) -> str:
        proc = subprocess.run(
            [str(kubectl_path()), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])}: {proc.stderr.strip()[:500]}")
        return proc.stdout

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def create_many(self, namespace: str, objects: list[dict[str, Any]]) -> None:
        for i in range(0, len(objects), 100):
            chunk = {"apiVersion": "v1", "kind": "List", "items": objects[i : i + 100]}
            self.kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(chunk))

    def namespace_with_claim(self, namespace: str) -> str:
        self.kubectl("create", "namespace", namespace)
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "cosyvoice-engines", "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": "",
                "resources": {"requests": {"storage": "100Gi"}},
            },
        }
        self.kubectl("create", "-f", "-", stdin=json.dumps(claim))
        uid = wait("the claim", lambda: self.get("pvc", "cosyvoice-engines", "-n", namespace)
                   ["metadata"]["uid"], 30)  # fmt: skip
        return str(uid)

    def apiserver_requests(self) -> Counter[tuple[str, str]]:
        text = self.kubectl("get", "--raw", "/metrics")
        found: Counter[tuple[str, str]] = Counter()
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            found[(labels.get("verb", ""), resource)] += int(float(line.rsplit(" ", 1)[1]))
        return found


def wait(what: str, probe: Any, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except (RuntimeError, KeyError, ValueError) as exc:
            last = None
            print(f"  ({what}: {exc})", file=sys.stderr)
        if last:
            return last
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


def service_body(name: str, revision: str) -> dict[str, Any]:
    return {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "variant": "cosyvoice3",
                "uri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
                "revision": revision,
            },
            "serving": {"nodeSelector": {"nvidia.com/gpu.product": PRODUCT}},
        },
    }


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages of the machine."""
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Operator:
    """The operator as a process, through `request_log_operator.py`: its requests are
    logged, one JSON line each, to `requests`."""

    def __init__(self, bench: Bench, namespace: str, log: Path, requests: Path) -> None:
        self.port = free_port()
        self.requests_log = requests
        env = dict(bench.env, COSYVOICE_BUILD_BACKOFF_LIMIT="0", BENCH_REQUEST_LOG=str(requests))
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "bench/request_log_operator.py"), "run", "-n", namespace,
             "--liveness", f"http://127.0.0.1:{self.port}/healthz"],
            env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip

    def report(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
                found: dict[str, Any] = json.loads(r.read())["controlLoop"]
                return found
        except (OSError, ValueError, KeyError):
            return None

    def requests(self) -> Counter[str]:
        """What this operator asked of the API server so far, by verb and resource."""
        report = wait("the operator's report", self.report, 30)
        return Counter(report["requests"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()


def engine_ready(items: list[dict[str, Any]]) -> int:
    n = 0
    for s in items:
        for c in s.get("status", {}).get("conditions", []):
            if c["type"] == "EngineReady" and c["status"] == "True":
                n += 1
    return n


def floor(bench: Bench, n: int) -> dict[str, Any]:
    ns = "floor"
    uid = bench.namespace_with_claim(ns)
    cache = build_job.CacheClaim("cosyvoice-engines", uid)
    settings = build_job.BuildSettings(backoff_limit=0)
    svcs = [spec.parse(service_body(f"f{i}", f"rev-f{i}")["spec"]) for i in range(n)]
    jobs = []
    for svc in svcs:
        target = engine_identity.EngineTarget(
            engine_identity.identity(svc, "sm_90", settings.default_builder_image), (PRODUCT,)
        )
        jobs.append((target, build_job.render_job(target, svc, ns, 1, settings, cache)))
    # The services themselves, in a namespace no operator serves: what applying them costs
    # the API server (schema and CEL validation) is part of what a user waits for too.
    api_before = bench.apiserver_requests()
    started = time.monotonic()
    bench.create_many(ns, [service_body(f"f{i}", f"rev-f{i}") for i in range(n)])
    services_seconds = time.monotonic() - started
    started = time.monotonic()
    bench.create_many(ns, [j for _, j in jobs])
    created = time.monotonic() - started

    def complete() -> bool:
        items = bench.get("jobs", "-n", ns)["items"]
        done = sum(1 for j in items if j.get("status", {}).get("succeeded"))
        print(f"  floor: {done}/{n} Jobs complete", file=sys.stderr)
        return done == n

    wait("every floor Job complete", complete, 1800, interval=2)
    records = [
        build_job.render_record(t.identity, ns, j["metadata"]["name"], "", dt_now(), cache)
        for t, j in jobs
    ]
    bench.create_many(ns, records)
    recorded = time.monotonic() - started
    # The serving objects, as `cosyvoice-operator render` prints them (its code is the
    # operator's), without owner references: the services' uids differ, and the garbage
    # collector would delete what they name.
    cfg = config.load({})
    serving: list[dict[str, Any]] = []
    for i in range(n):
        for obj in render_command.render_service(
            service_body(f"f{i}", f"rev-f{i}"), [PRODUCT], cfg, ns
        ):
            if obj["kind"] != "Job":
                obj["metadata"].pop("ownerReferences", None)
                serving.append(obj)
    bench.create_many(ns, serving)
    total = time.monotonic() - started
    api_writes = writes_of(api_before, bench.apiserver_requests())
    print(
        f"floor: {n} services created in {services_seconds:.1f}s; then {n} Jobs created in "
        f"{created:.1f}s, all complete and recorded in {recorded:.1f}s, serving objects "
        f"created at {total:.1f}s"
    )
    return {
        "jobs": n,
        "services_create_seconds": round(services_seconds, 2),
        "create_seconds": round(created, 2),
        "recorded_seconds": round(recorded, 2),
        "serving_objects": len(serving),
        "total_seconds": round(total, 2),
        "total_with_services_seconds": round(total + services_seconds, 2),
        "apiserver_writes": api_writes,
    }


def deployments_per_service() -> int:
    """The Deployments the operator renders for one of the benchmark's services."""
    rendered = render_command.render_service(
        service_body("probe", "rev-probe"), [PRODUCT], config.load({}), "probe"
    )
    return sum(1 for obj in rendered if obj["kind"] == "Deployment")


def writes_of(before: Counter[tuple[str, str]], after: Counter[tuple[str, str]]) -> dict[str, Any]:
    """The writes the API server took between two readings, by every client: in all, and by
    resource (the ten largest)."""
    found: Counter[str] = Counter()
    for (verb, resource), count in (after - before).items():
        if verb in APISERVER_WRITE_VERBS:
            found[resource] += count
    return {"total": sum(found.values()), "by_resource": dict(found.most_common(10))}


def dt_now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.UTC)


def operator_run(
    bench: Bench, n: int, logs: Path, tag: str, steady: float = 0, restart: bool = False
) -> dict[str, Any]:
    """Phase B (its logs named after `tag`); with `steady` (seconds) and `restart`, phases
    3-5 after its milestones."""
    ns = "fleet"
    bench.namespace_with_claim(ns)
    requests_log = logs / f"requests-fleet-{tag}.jsonl"
    op = Operator(bench, ns, logs / f"operator-fleet-{tag}.log", requests_log)
    out: dict[str, Any] = {"services": n}
    try:
        wait("the operator", op.report, 60)
        cpu_before = cpu_seconds(op.proc.pid)
        bodies = [service_body(f"s{i}", f"rev-s{i}") for i in range(n)]
        api_before = bench.apiserver_requests()
        started = time.monotonic()
        bench.create_many(ns, bodies)
        out["apply_seconds"] = round(time.monotonic() - started, 2)

        def all_ready() -> bool:
            items = bench.get("cvs", "-n", ns)["items"]
            ready = engine_ready(items)
            print(f"  operator: {ready}/{n} EngineReady", file=sys.stderr)
            return ready == n

        wait("every service EngineReady", all_ready, 1800, interval=2)
        out["apply_to_engine_ready_seconds"] = round(time.monotonic() - started, 2)
        out["operator_cpu_seconds_to_engine_ready"] = round(
            cpu_seconds(op.proc.pid) - cpu_before, 1
        )
        # Everything the operator wrote on the way (creates, applies, patches, status,
        # Events), serving included for the services whose engines were Ready before the
        # last one: not a per-service cost (see per_service below).
        writes = {k: v for k, v in op.requests().items() if k.split(" ")[0] in WRITE_VERBS}
        out["writes_until_all_engine_ready"] = dict(sorted(writes.items()))
        out["writes_until_all_engine_ready_per_service"] = round(sum(writes.values()) / n, 2)
        # Each service's writes up to its own EngineReady (issue 31, F4).
        out["writes_to_own_engine_ready"] = writes_per_service(read_lines(requests_log), ns)

        # Every Deployment the renderer makes for the services (Triton's, and the router's
        # in spec.routing mode Router): as many as the floor creates.
        expected = n * deployments_per_service()

        def all_serving() -> bool:
            deployments = bench.get("deployments", "-n", ns)["items"]
            print(f"  operator: {len(deployments)}/{expected} Deployments", file=sys.stderr)
            return len(deployments) >= expected

        wait("every service's serving Deployment", all_serving, 600, interval=2)
        out["apply_to_ready_seconds"] = round(time.monotonic() - started, 2)
        out["operator_cpu_seconds_to_ready"] = round(cpu_seconds(op.proc.pid) - cpu_before, 1)
        # Every client's writes meanwhile (the Job, Deployment and ReplicaSet controllers',
        # the scheduler's, kwok's): what the API server did, next to the floor's.
        out["apiserver_writes_to_ready"] = writes_of(api_before, bench.apiserver_requests())
        own = out["writes_to_own_engine_ready"]
        print(f"operator: {n} services applied -> all EngineReady in "
              f"{out['apply_to_engine_ready_seconds']:.1f}s, every serving Deployment in "
              f"{out['apply_to_ready_seconds']:.1f}s (operator CPU "
              f"{out['operator_cpu_seconds_to_ready']:.0f}s)")  # fmt: skip
        print(f"operator writes per service up to its own EngineReady: median "
              f"{own['median']}, mean {own['mean']}, range {own['min']}-{own['max']}, "
              f"{own['histogram']}; until the last service's EngineReady (all services): "
              f"{out['writes_until_all_engine_ready_per_service']}")  # fmt: skip
        requests = op.requests()
        writes = {k: v for k, v in requests.items() if k.split(" ")[0] in WRITE_VERBS}
        out["writes_to_serving"] = dict(sorted(writes.items()))
        out["writes_per_service_to_serving"] = round(sum(writes.values()) / n, 2)
        out["requests_to_serving"] = dict(sorted(requests.items()))
        out["request_outcomes_to_serving"] = outcomes(read_lines(requests_log))
        print(f"... and until every serving Deployment: {out['writes_per_service_to_serving']} "
              f"per service {out['writes_to_serving']}")  # fmt: skip
        if steady > 0:
            steady_state(bench, op, ns, steady, out)
        if restart:
            op.kill()
            started = time.monotonic()
            op = Operator(bench, ns, logs / f"operator-fleet-{tag}.log",
                          logs / f"requests-restart-{tag}.jsonl")  # fmt: skip

            def caught_up() -> dict[str, Any] | None:
                r = op.report()
                return r if r and r["passes"] >= n and r["queued"] == 0 else None

            report = wait("the restarted operator to look at every service", caught_up, 600)
            out["restart_seconds"] = round(time.monotonic() - started, 2)
            out["restart_requests"] = report["requests"]
            out["restart_rss_mb"] = round(rss_mb(op.proc.pid), 1)
            print(f"restart storm: {n} services looked at in {out['restart_seconds']:.1f}s "
                  f"with requests {report['requests']}")  # fmt: skip
    finally:
        op.stop()
    return out


def steady_state(bench: Bench, op: Operator, ns: str, steady: float, out: dict[str, Any]) -> None:
    """Phases 3 and 4, into `out`."""
    wait("an idle queue", lambda: (op.report() or {}).get("queued", 1) == 0, 120)
    time.sleep(5)
    before_api, before_op = bench.apiserver_requests(), op.requests()
    time.sleep(steady)
    after_api, after_op = bench.apiserver_requests(), op.requests()
    api = {f"{v} {r}": c for (v, r), c in (after_api - before_api).items()
           if r.split("/")[0] in OPERATOR_RESOURCES}  # fmt: skip
    own = dict(after_op - before_op)
    non_watch = {k: v for k, v in own.items() if not k.startswith("WATCH ")}
    out["steady_seconds"] = steady
    out["steady_operator_requests"] = own
    out["steady_operator_requests_per_minute_excluding_watch"] = round(
        sum(non_watch.values()) * 60 / steady, 2
    )
    out["steady_apiserver_requests_on_these_resources"] = api
    out["operator_rss_mb"] = round(rss_mb(op.proc.pid), 1)
    print(f"steady state ({steady:.0f}s): operator requests {own or 'none'}; "
          f"API server on the operator's resources: {api}")  # fmt: skip
    print(f"operator resident memory: {out['operator_rss_mb']} MB")


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The request log's lines (a last line cut short by a kill is skipped)."""
    found = []
    for line in path.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def writes_per_service(lines: list[dict[str, Any]], namespace: str) -> dict[str, Any]:
    """The operator's writes per service in `namespace` up to that service's own
    EngineReady: each service's writes (its effects' requests, sent, in the order answered)
    up to and including the first accepted status write that set EngineReady=True. Writes
    not made for a service of the namespace are counted apart (`unattributed`)."""
    by_service: dict[str, list[dict[str, Any]]] = {}
    unattributed = 0
    for line in lines:
        if line["verb"] not in WRITE_VERBS:
            continue
        service = line.get("service")
        if not service or not service.startswith(namespace + "/"):
            unattributed += 1
            continue
        by_service.setdefault(service, []).append(line)
    counts: list[int] = []
    kinds: Counter[str] = Counter()
    refused = 0
    never_ready = 0
    for writes in by_service.values():
        upto = next(
            (i + 1 for i, w in enumerate(writes) if w["engine_ready"] and 0 < w["status"] < 400),
            None,
        )
        if upto is None:
            never_ready += 1
            continue
        counts.append(upto)
        for w in writes[:upto]:
            kinds[f"{w['verb']} {resource_of(w['path'])}"] += 1
            refused += w["status"] >= 400 or w["status"] == 0
    if not counts:
        raise SystemExit(f"no service of {namespace} has an EngineReady write in the log")
    return {
        "services": len(counts),
        "services_without_an_engine_ready_write": never_ready,
        "mean": round(statistics.fmean(counts), 2),
        "median": statistics.median(counts),
        "min": min(counts),
        "max": max(counts),
        "histogram": {str(k): v for k, v in sorted(Counter(counts).items())},
        "by_request_per_service": {k: round(v / len(counts), 3) for k, v in sorted(kinds.items())},
        "refused_or_conflicting": refused,
        "unattributed_writes": unattributed,
    }


def outcomes(lines: list[dict[str, Any]]) -> dict[str, int]:
    """The operator's logged requests by verb, resource and HTTP status (409: a status
    write whose resourceVersion precondition failed, or a create of an existing object)."""
    found: Counter[str] = Counter(
        f"{line['verb']} {resource_of(line['path'])} {line['status']}" for line in lines
    )
    return dict(sorted(found.items()))


def chaos(bench: Bench, n: int, seed: int, logs: Path) -> dict[str, Any]:
    rng = random.Random(seed)
    ns = f"chaos-{seed}"
    bench.namespace_with_claim(ns)
    log = logs / f"operator-{ns}.log"
    requests = logs / f"requests-{ns}.jsonl"
    op = Operator(bench, ns, log, requests)
    kills = []
    try:
        wait("the operator", op.report, 60)
        started = time.monotonic()
        bench.create_many(ns, [service_body(f"c{i}", f"rev-{seed}-{i}") for i in range(n)])
        ready_at_kill = []
        for _ in range(4):
            time.sleep(rng.uniform(0.5, 3.0))
            kills.append(round(time.monotonic() - started, 2))
            op.kill()
            # How far the rollout was when the operator died (proves it died mid-rollout).
            ready_at_kill.append(engine_ready(bench.get("cvs", "-n", ns)["items"]))
            op = Operator(bench, ns, log, requests)

        def converged() -> list[dict[str, Any]] | None:
            items = bench.get("cvs", "-n", ns)["items"]
            return items if engine_ready(items) == n else None

        items = wait("every chaos service EngineReady", converged, 900, interval=2)
        seconds = time.monotonic() - started
        keys = {s["status"]["engines"][0]["key"] for s in items}
        jobs = bench.get("jobs", "-n", ns, "-l", "app.kubernetes.io/component=engine-build")
        per_key = Counter(j["metadata"]["labels"][KEY_LABEL] for j in jobs["items"])
        records = bench.get("configmaps", "-n", ns, "-l", KEY_LABEL)["items"]
        record_keys = Counter(r["metadata"]["labels"][KEY_LABEL] for r in records)
        result = {
            "seed": seed,
            "services": n,
            "kills_at_seconds": kills,
            "ready_services_at_each_kill": ready_at_kill,
            "converged_seconds": round(seconds, 2),
            "duplicate_jobs": sum(c - 1 for c in per_key.values() if c > 1),
            "orphan_jobs": sum(1 for k in per_key if k not in keys),
            "orphan_records": sum(1 for k in record_keys if k not in keys),
            "missing_records": sum(1 for k in keys if k not in record_keys),
            "converged": True,
        }
        print(f"chaos seed {seed}: {result}")
        return result
    finally:
        op.stop()


def fresh_cluster(bench: Bench, nodes: int) -> None:
    """A new local cluster (the last one's data wiped), the CRDs established."""
    bench.local.down(quiet=True, wipe=True)
    bench.local.up(gpu_nodes={PRODUCT: nodes}, gpus_per_node=8)
    bench.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))

    def established() -> bool:
        # Polled (not `kubectl wait`, which fails on a CRD that has no conditions yet).
        crd = bench.get("crd", "cosyvoiceservices.tts.cosyvoice.dev")
        conditions = crd.get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait("the CRD established", established, 60, interval=0.5)


def cluster_cpu(bench: Bench) -> dict[str, float]:
    """CPU seconds so far of each of the cluster's processes."""
    return {c: cpu_seconds(pid) for c, pid in State.load(bench.local.paths.state).pids.items()}


def phase(bench: Bench, nodes: int, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One timed phase on a fresh cluster, with the machine's load and the cluster's CPU
    seconds from its start to its end."""
    fresh_cluster(bench, nodes)
    load_start, cpu_start = loadavg(), cluster_cpu(bench)
    out = run()
    cpu_end = cluster_cpu(bench)
    out["loadavg_start"], out["loadavg_end"] = load_start, loadavg()
    out["cluster_cpu_seconds"] = {c: round(cpu_end[c] - cpu_start.get(c, 0.0), 1)
                                  for c in cpu_end}  # fmt: skip
    return out


def pair_summary(index: int, floor_: dict[str, Any], op: dict[str, Any]) -> dict[str, Any]:
    """One pair's ratios (operator / floor) and loads."""
    return {
        "pair": index,
        "floor_seconds": floor_["total_seconds"],
        "operator_seconds": op["apply_to_ready_seconds"],
        "ratio_to_floor": round(op["apply_to_ready_seconds"] / floor_["total_seconds"], 3),
        # Like for like: both clocks start at the first service created.
        "ratio_to_floor_with_services": round(
            op["apply_to_ready_seconds"] / floor_["total_with_services_seconds"], 3
        ),
        "ratio_engines_only_with_services": round(
            op["apply_to_engine_ready_seconds"]
            / (floor_["recorded_seconds"] + floor_["services_create_seconds"]),
            3,
        ),
        "operator_writes_to_own_engine_ready_median": op["writes_to_own_engine_ready"]["median"],
        "loadavg_floor": [floor_["loadavg_start"], floor_["loadavg_end"]],
        "loadavg_operator": [op["loadavg_start"], op["loadavg_end"]],
    }


def spread(values: list[float]) -> dict[str, float]:
    """The median and range of a few values (no percentile: there are too few)."""
    return {"median": round(statistics.median(values), 3), "min": min(values), "max": max(values)}


def summary(result: dict[str, Any], path: Path) -> dict[str, Any]:
    """control_loop.json: this run's pairs, median and range, and every kept run's."""
    pairs = result.get("pairs", [])
    keys = ("date", "started", "machine", "nodes", "gpus_per_node", "services")
    doc: dict[str, Any] = {k: result[k] for k in keys if k in result}
    doc["method"] = result["method"]
    doc["run_file"] = path.name
    doc["pairs"] = pairs
    for key in ("ratio_to_floor", "ratio_to_floor_with_services",
                "ratio_engines_only_with_services"):  # fmt: skip
        if pairs:
            doc[key] = spread([p[key] for p in pairs])
    if pairs:
        doc["target"] = "median ratio_to_floor <= 1.5"
        doc["met"] = doc["ratio_to_floor"]["median"] <= 1.5
    last = result.get("last_operator_phase", {})
    for key in ("writes_to_own_engine_ready", "writes_until_all_engine_ready_per_service",
                "steady_operator_requests_per_minute_excluding_watch", "operator_rss_mb",
                "restart_seconds", "restart_rss_mb"):  # fmt: skip
        if key in last:
            doc[key] = last[key]
    if "chaos" in result:
        kept_keys = ("seed", "converged", "converged_seconds", "duplicate_jobs", "orphan_jobs",
                     "orphan_records", "missing_records")  # fmt: skip
        doc["chaos"] = [{k: c[k] for k in kept_keys} for c in result["chaos"]]
    runs = []
    for kept in sorted(path.parent.glob("*.json")):
        data = json.loads(kept.read_text())
        ratios = [p["ratio_to_floor"] for p in data.get("pairs", [])]
        runs.append({"file": kept.name, "services": data.get("services"),
                     "pairs": len(ratios), **(spread(ratios) if ratios else {}),
                     "complete": data.get("complete", False)})  # fmt: skip
    doc["every_kept_run"] = runs  # in run_file's folder
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=250)
    parser.add_argument("--pairs", type=int, default=3, help="floor/operator pairs (ABAB)")
    parser.add_argument("--steady", type=float, default=60, help="seconds; 0 skips it")
    parser.add_argument("--no-restart", action="store_true", help="skip the restart storm")
    parser.add_argument("--chaos", type=int, default=100, help="services; 0 skips chaos")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, help="default: a new one per run (recorded)")
    parser.add_argument("--name", default="bench-loop")
    parser.add_argument("--out", type=Path, default=RESULTS / "control_loop.json")
    parser.add_argument("--runs", type=Path, default=RESULTS / "control_loop",
                        help="the folder every run is kept in")  # fmt: skip
    args = parser.parse_args()
    if args.pairs < 1 or args.services < 1:
        parser.error("--pairs and --services must be at least 1")
    first_seed = args.first_seed if args.first_seed is not None else int(time.time()) % 100_000
    stamp = time.strftime("%Y-%m-%dT%H-%M-%SZ", time.gmtime())
    run_file = args.runs / f"{stamp}.json"
    run_file.parent.mkdir(parents=True, exist_ok=True)
    bench = Bench(args.name)
    logs = bench.local.paths.root.parent / f"{args.name}-logs-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "started": stamp,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "loadavg_before": loadavg(),
        "chaos_first_seed": first_seed,
        "nodes": args.nodes,
        "gpus_per_node": 8,
        "services": args.services,
        "method": (
            f"{args.pairs} pairs, interleaved floor, operator, floor, operator, ...; each "
            "phase on a fresh local cluster (wiped, started again, CRDs applied); the ratio "
            "is each pair's operator time (apply -> every service EngineReady with its "
            "serving Deployment) over its floor time (Jobs created -> serving objects "
            "created); median and range over the pairs"
        ),
        "pairs": [],
        "floor": [],
        "operator": [],
        "complete": False,
    }

    def write() -> None:
        run_file.write_text(json.dumps(result, indent=2) + "\n")
        args.out.write_text(json.dumps(summary(result, run_file), indent=2) + "\n")

    try:
        for index in range(1, args.pairs + 1):
            last = index == args.pairs
            f = phase(bench, args.nodes, partial(floor, bench, args.services))
            result["floor"].append(f)
            steady = args.steady if last else 0
            restart = last and not args.no_restart
            o = phase(bench, args.nodes, partial(operator_run, bench, args.services, logs,
                                                 f"pair{index}", steady, restart))  # fmt: skip
            result["operator"].append(o)
            pair = pair_summary(index, f, o)
            result["pairs"].append(pair)
            if last:
                result["last_operator_phase"] = o
            print(f"pair {index}: operator / floor {pair['ratio_to_floor']:.2f}x "
                  f"({pair['operator_seconds']:.1f}s / {pair['floor_seconds']:.1f}s); like for "
                  f"like {pair['ratio_to_floor_with_services']:.2f}x; loads floor "
                  f"{pair['loadavg_floor']}, operator {pair['loadavg_operator']}")  # fmt: skip
            write()
        ratios = [p["ratio_to_floor"] for p in result["pairs"]]
        print(f"operator / floor over {len(ratios)} pairs: median "
              f"{statistics.median(ratios):.2f}x, range {min(ratios):.2f}-{max(ratios):.2f}x "
              f"(target: median <= 1.5x)")  # fmt: skip
        if args.chaos > 0:
            # On the last operator phase's cluster, as it is.
            seeds = range(first_seed, first_seed + args.seeds)
            result["chaos"] = [chaos(bench, args.chaos, s, logs) for s in seeds]
        result["complete"] = True
    finally:
        result["loadavg_after"] = loadavg()
        write()
        print(f"written to {run_file} and {args.out}; logs in {logs}")
        bench.local.down(quiet=True, wipe=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
