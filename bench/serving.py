"""Benchmark of serving at fleet scale, on the local cluster (issue 8).

    python bench/serving.py [--services 200] [--nodes 50] [--steady 60]
                            [--out bench/results/serving.json]

1. floor: for N services, the objects the operator would make (one build Job each, then,
   once the Jobs are Complete, the engine records, the model-repository ConfigMaps, the
   Deployments of one replica, the Services and PodDisruptionBudgets, all rendered by the
   operator's own renderers) created directly with `kubectl create` (100 per call), until
   every Deployment has its replica ready: what the API server, the controllers, the
   scheduler and kwok take without the operator.
2. operator: N CosyVoiceServices applied the same way; the time until every one reads
   phase Ready. Target: within 2x of the floor.
3. steady state: the API server's own `apiserver_request_total` over --steady seconds, write
   verbs on what the operator writes, and the operator's own count. Target: zero writes.
4. memory: the operator's resident set then. Target: < 200 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from control_loop import (
    PRODUCT,
    REPO,
    Bench,
    Operator,
    dt_now,
    rss_mb,
    service_body,
    wait,
)

from cosyvoice_operator.api import engine_identity, spec
from cosyvoice_operator.render import build_job, workloads

WRITES = ("POST", "PATCH", "APPLY", "DELETE")
MINE = {"cosyvoiceservices/status", "deployments", "services", "poddisruptionbudgets",
        "configmaps", "jobs", "events"}  # fmt: skip


def phases(items: list[dict[str, Any]]) -> Counter[str]:
    return Counter(s.get("status", {}).get("phase", "") for s in items)


def floor(bench: Bench, n: int) -> dict[str, Any]:
    ns = "serving-floor"
    uid = bench.namespace_with_claim(ns)
    cache = build_job.CacheClaim("cosyvoice-engines", uid)
    settings = build_job.BuildSettings(backoff_limit=0)
    started = time.monotonic()
    bodies = [service_body(f"f{i}", f"rev-f{i}") for i in range(n)]
    for b in bodies:
        b["metadata"].update(namespace=ns, uid=f"00000000-0000-0000-0000-{len(b):012d}")
    targets = []
    jobs = []
    for b in bodies:
        svc = spec.parse(b["spec"])
        target = engine_identity.EngineTarget(
            engine_identity.identity(svc, "sm_90", settings.default_builder_image), (PRODUCT,)
        )
        targets.append((b, svc, target))
        jobs.append(build_job.render_job(target, svc, ns, 1, settings, cache))
    bench.create_many(ns, jobs)

    def complete() -> bool:
        done = sum(1 for j in bench.get("jobs", "-n", ns)["items"]
                   if j.get("status", {}).get("succeeded"))  # fmt: skip
        print(f"  floor: {done}/{n} Jobs complete", file=sys.stderr)
        return done == n

    wait("every floor Job complete", complete, 1800, interval=2)
    objects: list[dict[str, Any]] = []
    for (b, svc, target), job in zip(targets, jobs, strict=True):
        objects.append(
            build_job.render_record(
                target.identity, ns, job["metadata"]["name"], "", dt_now(), cache
            )
        )
        for obj in (
            *workloads.render_architecture(
                b, svc, workloads.ArchServing("sm_90", target.key, (PRODUCT,), 1), ns,
                workloads.ServingSettings(),
            ),
            workloads.render_service(b, ns),
            workloads.render_disruption_budget(b, ns),
        ):  # fmt: skip
            obj["metadata"].pop("ownerReferences", None)  # no service objects in the floor
            objects.append(obj)
    bench.create_many(ns, objects)

    def ready() -> bool:
        items = bench.get("deployments", "-n", ns)["items"]
        done = sum(1 for d in items if d.get("status", {}).get("readyReplicas") == 1)
        print(f"  floor: {done}/{n} Deployments ready", file=sys.stderr)
        return done == n

    wait("every floor Deployment ready", ready, 1800, interval=2)
    total = time.monotonic() - started
    print(f"floor: {n} builds and Deployments made directly, all ready in {total:.1f}s")
    return {"services": n, "total_seconds": round(total, 2)}


def operator_run(bench: Bench, n: int, steady: float, logs: Path) -> dict[str, Any]:
    ns = "serving-fleet"
    bench.namespace_with_claim(ns)
    op = Operator(bench, ns, logs / "operator-serving.log")
    out: dict[str, Any] = {"services": n}
    try:
        wait("the operator", op.report, 60)
        started = time.monotonic()
        bench.create_many(ns, [service_body(f"s{i}", f"rev-s{i}") for i in range(n)])

        def all_ready() -> bool:
            counts = phases(bench.get("cvs", "-n", ns)["items"])
            print(f"  operator: {dict(counts)}", file=sys.stderr)
            return counts.get("Ready", 0) == n

        wait("every service Ready", all_ready, 1800, interval=2)
        out["apply_to_ready_seconds"] = round(time.monotonic() - started, 2)
        print(f"operator: {n} services applied -> all phase Ready in "
              f"{out['apply_to_ready_seconds']:.1f}s")  # fmt: skip
        wait("an idle queue", lambda: (op.report() or {}).get("queued", 1) == 0, 120)
        time.sleep(5)
        before_api, before_op = bench.apiserver_requests(), op.requests()
        time.sleep(steady)
        after_api, after_op = bench.apiserver_requests(), op.requests()
        writes = {f"{v} {r}": c for (v, r), c in (after_api - before_api).items()
                  if v in WRITES and r in MINE}  # fmt: skip
        own = dict(after_op - before_op)
        out["steady_seconds"] = steady
        out["steady_apiserver_writes"] = writes
        out["steady_writes_per_minute"] = round(sum(writes.values()) * 60 / steady, 2)
        out["steady_operator_requests"] = own
        out["operator_rss_mb"] = round(rss_mb(op.proc.pid), 1)
        print(f"steady state ({steady:.0f}s): API server writes on the operator's objects "
              f"{writes or 'none'}; operator requests {own or 'none'}")  # fmt: skip
        print(f"operator resident memory: {out['operator_rss_mb']} MB")
    finally:
        op.stop()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--services", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--steady", type=float, default=60)
    parser.add_argument("--name", default="bench-serving")
    parser.add_argument("--out", default=str(REPO / "bench/results/serving.json"))
    args = parser.parse_args()
    bench = Bench(args.name)
    bench.local.down(quiet=True, wipe=True)
    bench.local.up(gpu_nodes={PRODUCT: args.nodes}, gpus_per_node=8)
    logs = bench.local.paths.root / "bench-logs"
    logs.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "nodes": args.nodes,
        "gpus_per_node": 8,
    }
    try:
        bench.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        bench.kubectl("wait", "--for=condition=Established",
                      "crd/cosyvoiceservices.tts.cosyvoice.dev")  # fmt: skip
        result["floor"] = floor(bench, args.services)
        result["operator"] = operator_run(bench, args.services, args.steady, logs)
        ratio = result["operator"]["apply_to_ready_seconds"] / result["floor"]["total_seconds"]
        result["ratio_to_floor"] = round(ratio, 3)
        print(f"operator / floor: {ratio:.2f}x (target <= 2x)")
    finally:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"written to {args.out}")
        bench.local.down(quiet=True, wipe=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
