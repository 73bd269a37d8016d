"""Benchmark of the local cluster: `cluster up` time (warm and cold) and resident memory.

    python bench/cluster_up.py [--runs 3] [--nodes 4,100] [--cold] [--out bench/results]

warm: binaries cached, a fresh cluster (no data) each run, timed from the command's start to
      its return (every component ready, every fake GPU node Ready and untainted).
cold: a fresh binary cache AND a fresh Go build cache and module cache, i.e. what a new machine
      pays once (network and CPU bound; ~15 min on 2 cores).
memory: summed VmRSS of etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok,
      read from /proc after the nodes have been Ready for a settle period.
Targets (issue 2): warm up < 20 s; 100 fake GPU nodes < 2 GB resident in all.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cosyvoice_operator.devtools.localcluster.cluster import COMPONENTS, LocalCluster, State

CLI = [sys.executable, "-m", "cosyvoice_operator", "cluster"]


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def up(name: str, nodes: int, env: dict[str, str] | None = None) -> float:
    started = time.monotonic()
    subprocess.run(
        [*CLI, "up", "--name", name, "--gpu-nodes", f"NVIDIA-H100-80GB-HBM3={nodes}"],
        check=True,
        stdout=subprocess.DEVNULL,
        env=env,
    )
    return time.monotonic() - started


def down(name: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        [*CLI, "down", "--name", name, "--wipe"], check=True, env=env, stderr=subprocess.DEVNULL
    )


def memory(name: str) -> dict[str, int]:
    pids = State.load(LocalCluster(name).paths.state).pids
    return {comp: rss_bytes(pids[comp]) for comp in COMPONENTS}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", default="4,100", help='node counts; "" skips the warm runs')
    parser.add_argument("--settle", type=float, default=30.0, help="seconds before reading RSS")
    parser.add_argument("--cold", action="store_true", help="also time a cold build (~15 min)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    name = "bench"
    results: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    if args.cold:
        with tempfile.TemporaryDirectory() as tmp:
            env = dict(
                os.environ,
                COSYVOICE_CACHE=f"{tmp}/cache",
                GOCACHE=f"{tmp}/gocache",
                GOMODCACHE=f"{tmp}/gomod",
            )
            started = time.monotonic()
            subprocess.run([*CLI, "build"], check=True, env=env)
            build = time.monotonic() - started
            first_up = up(name, 4, env)
            down(name, env)
            subprocess.run(
                ["chmod", "-R", "u+w", tmp], check=False
            )  # go's module cache is read-only
        results["cold"] = {"build_seconds": round(build, 1), "first_up_seconds": round(first_up, 1)}
        print(f"cold: build {build:.0f}s, then up {first_up:.1f}s", flush=True)

    warm: dict[str, object] = {}
    for nodes in (int(n) for n in args.nodes.split(",") if n):
        times = []
        for _ in range(args.runs):
            down(name)
            times.append(up(name, nodes))
        time.sleep(args.settle)
        mem = memory(name)
        total = sum(mem.values())
        warm[str(nodes)] = {
            "up_seconds": [round(t, 2) for t in times],
            "up_seconds_median": round(statistics.median(times), 2),
            "rss_bytes": mem,
            "rss_total_mib": round(total / 2**20, 1),
        }
        print(
            f"{nodes:>4} nodes: up median {statistics.median(times):.2f}s "
            f"(runs {', '.join(f'{t:.2f}' for t in times)}), "
            f"RSS {total / 2**20:.0f} MiB: "
            + ", ".join(f"{c} {b / 2**20:.0f}" for c, b in mem.items()),
            flush=True,
        )
        down(name)
    results["warm"] = warm
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = out / ("cluster_up_cold.json" if args.cold else "cluster_up.json")
    target.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
