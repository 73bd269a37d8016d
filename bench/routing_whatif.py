"""A what-if behind issue 22's blocked verdict: how much of a fleet's cost is the way requests
are spread over its pods rather than when pods are added and removed.

On the conversation trace's second half (the benchmark's plant, pods, cold start and seeds),
each policy as ``bench/sim.py`` chose it on the training half (round-robin, from
``results/sim.json``), our SLO points, and the fewest static pods that hold 99 %, run with
the plant's two routings (`plant.ROUTINGS`): round-robin, what a Kubernetes Service in front
of Triton gives, and least-loaded, a router that sends each request to the pod whose first
slot frees soonest. The policies are not re-tuned for least-loaded routing (their training
choice is kept), so their column says what the router alone changes.

    .venv/bin/python bench/routing_whatif.py      # a few minutes on 2 cores

Writes results/routing-whatif.{json,md}. Deterministic per seed (a second run repeats every
number); the spread reported is over the seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from cosyvoice_operator.devtools.sim import experiment as ex
from cosyvoice_operator.devtools.sim.command import default_trace
from cosyvoice_operator.devtools.sim.engine import SimConfig, simulate
from cosyvoice_operator.devtools.sim.plant import ROUTINGS
from cosyvoice_operator.devtools.sim.policies import make

RESULTS = Path(__file__).resolve().parent / "results"
TRACE = "azure_llm_2023_conv.csv#eval"
BASELINES = ("hpa-concurrency", "keda", "llmd", "kpa", "cosyvoice")
VARIABILITIES = (0.15, 0.2, 0.3)


def configurations(sim: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, policy, params): the training choices of ``sim.json`` and our SLO points."""
    chosen = sim["summary"]["chosen_on_train"]
    out = [(f"{p} as chosen on training", p, chosen[p]["params"]) for p in BASELINES]
    slo = {}
    for r in sim["runs"]:
        params = r["params"]
        ours = r["trace"] == TRACE and r["policy"] == "cosyvoice" and "slo_ms" in params
        if ours and "seasonal_h" not in params:
            slo[params["variability"]] = params
    out += [(f"ours, SLO at variability {v}", "cosyvoice", slo[v]) for v in VARIABILITIES]
    return out


def run(
    task: tuple[str, str, dict[str, Any], ex.TraceRecipe, int, str, SimConfig],
) -> dict[str, Any]:
    label, policy, params, recipe, seed, routing, config = task
    trace = recipe.build(seed)
    cfg = replace(config, routing=routing)
    if policy == "static":  # the fewest pods that hold 99 %
        n = max(1, int(ex.mean_load_pods(trace, cfg)))
        while True:
            o = simulate(trace, make("static", {"replicas": n}), cfg)
            if o.slo_attainment >= ex.GOAL_ATTAINMENT:
                break
            n += 1
        params = {"replicas": n}
    else:
        o = simulate(trace, make(policy, dict(params), cfg.slo_s), cfg)
    return {
        "label": label,
        "policy": policy,
        "params": params,
        "seed": seed,
        "routing": routing,
        "attainment": o.slo_attainment,
        "gpu_hours": o.gpu_hours,
        "scale_events": o.scale_events,
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| configuration | " + " | ".join(f"{r}: SLO met, GPU-h (range)" for r in ROUTINGS) + " |",
        "|---|" + "---|" * len(ROUTINGS),
    ]
    for label in dict.fromkeys(r["label"] for r in rows):
        cells = []
        for routing in ROUTINGS:
            mine = [r for r in rows if r["label"] == label and r["routing"] == routing]
            gpu = [r["gpu_hours"] for r in mine]
            met = statistics.mean(r["attainment"] for r in mine)
            extra = ""
            if mine[0]["policy"] == "static":
                extra = " (" + ", ".join(str(r["params"]["replicas"]) for r in mine) + " pods)"
            cells.append(
                f"{100 * met:.2f} %, {statistics.mean(gpu):.1f} ({min(gpu):.1f}-{max(gpu):.1f})"
                + extra
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sim", type=Path, default=RESULTS / "sim.json")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    exp = ex.default_experiment(str(default_trace()), 5.0, args.seeds)
    recipe = exp.evals[0]
    config = replace(exp.config, initial_replicas=ex.initial_replicas(recipe.build(0), exp.config))
    configs = configurations(json.loads(args.sim.read_text()))
    configs.append(("static, fewest pods at 99 %", "static", {}))
    tasks = [
        (label, policy, params, recipe, seed, routing, config)
        for label, policy, params in configs
        for routing in ROUTINGS
        for seed in range(args.seeds)
    ]
    started = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(run, tasks, chunksize=1))
    table = markdown(rows)
    document = {"trace": TRACE, "rows": rows, "elapsed_s": round(time.monotonic() - started, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "routing-whatif.json").write_text(json.dumps(document, indent=1))
    (args.out / "routing-whatif.md").write_text(table + "\n")
    print(table)
    print(f"{len(rows)} runs in {document['elapsed_s']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
