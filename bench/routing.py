"""Issue 30's benchmark: our autoscaler behind the operator's router against every baseline as
deployed today behind a Service, and against the same baselines and a static fleet behind the
same router (and a static fleet and ours behind Envoy's P2C, the Gateway API option).

Traces: the conversation trace (the packaged Azure LLM 2023 conversation trace, x5), its first
half for training and its second half for evaluation (``experiment.default_experiment``'s
split). Every configuration is chosen on the training trace (the cheapest whose attainment,
pooled over the training seeds, reaches 99 %; else the highest attainment) and reported on the
evaluation trace over ``--seeds`` seeds:

- behind a Service (round-robin, the plant's default): each baseline (HPA on queue time, HPA on
  concurrency, KEDA, KPA, llm-d's rule), static and ours as ``bench/sim.py`` chose them on the
  training half (``results/sim.json``'s ``chosen_on_train``: 3 training seeds, the full grids);
- behind the router (`plant.ROUTER`, R replicas, streams spread over them at random, `timeout
  queue` as the operator renders it: the SLO's wait budget, 1500 - 1107 = 393 ms): the same
  baselines on a smaller grid at R = 2 (the operator's default), chosen here on training;
  static (the fewest pods reaching 99 % on training) and
  ours (SLO sizing at variabilities 0.15/0.2/0.3, each pod's slots as the routers let it use
  them: R x floor(slots / R)) at R = 1, 2 and 3;
- behind Envoy's P2C (`plant.P2C`): static and ours (SLO points), chosen on training.

A seed changes the load's draws: the arrival times of the trace's copies (each original request
is kept 5 times, the 4 copies moved up to ``trace.COPY_JITTER_S`` and given an audio length drawn
from the trace) and, through the trace, the router's random draws (the replica a stream reaches,
P2C's two pods). The same seed gives every configuration the same load, so the ratios are paired
per seed: their mean over the seeds with a 95 % t interval.

    .venv/bin/python bench/routing.py --jobs 2           # ~15 minutes on 2 busy cores

Writes results/routing/routing.json (every run: trace, seed, routing, params, outcome) and
results/routing/routing.md (the tables, the ratios, the targets of issue 30 met or not).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from cosyvoice_operator.devtools.sim import experiment as ex
from cosyvoice_operator.devtools.sim import oracle, policies
from cosyvoice_operator.devtools.sim.command import default_trace
from cosyvoice_operator.devtools.sim.engine import SimConfig, simulate
from cosyvoice_operator.devtools.sim.plant import P2C, ROUND_ROBIN, ROUTER, RouterModel

RESULTS = Path(__file__).resolve().parent / "results"
BASELINES = ("hpa", "hpa-concurrency", "keda", "kpa", "llmd")
VARIABILITIES = (0.15, 0.2, 0.3)
REPLICAS = (1, 2, 3)
BASELINE_REPLICAS = 2  # the operator's default router replicas
# The evaluation traces (`experiment.default_experiment`'s evals): the conversation trace's
# second half, the 24-hour day, the deep-trough day, the week.
EVALS = {"conv": 0, "day": 1, "deep": 6, "week": 7}
# The baselines' grid behind the router (smaller than bench/sim.py's: 3 targets x 2 floors x
# one scale-down window of 300 s, which sim.json's choices all have but HPA's).
GRID_TARGETS = {
    "hpa": (50.0, 200.0, 1000.0),
    "hpa-concurrency": (1.5, 2.0, 3.0),
    "keda": (1.5, 2.0, 3.0),
    "kpa": (1.5, 2.0, 3.0),
    "llmd": (0.6, 0.75, 0.9),
}
GRID_FLOORS = (0.0, 1.0)  # multiples of the training trace's mean load in pods (0: one pod)
STATIC_FACTORS = {  # static counts tried on training, in multiples of the mean load
    (ROUTER, 1): tuple(round(1.3 + 0.1 * k, 1) for k in range(9)),
    (ROUTER, 2): tuple(round(1.3 + 0.1 * k, 1) for k in range(9)),
    (ROUTER, 3): tuple(round(1.7 + 0.15 * k, 2) for k in range(9)),
    (P2C, 1): tuple(round(1.5 + 0.1 * k, 1) for k in range(11)),
}
# t quantiles (0.975) for the 95 % interval of a mean of n paired ratios (df = n - 1).
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
T975 |= {9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}
T975 |= {19: 2.093, 24: 2.064, 29: 2.045}


def t975(df: int) -> float:
    if df in T975:
        return T975[df]
    below = [k for k in T975 if k <= df]
    return T975[max(below)] if df < 30 else 1.96


Task = tuple[str, str, str, dict[str, Any], str, int, str, int]
# (phase, group, policy, params, routing, router replicas, trace part, seed)


def config_for(routing: str, replicas: int, base: SimConfig) -> SimConfig:
    return replace(base, routing=routing, router=RouterModel(replicas))


def run(task: Task) -> dict[str, Any]:
    phase, group, policy, params, routing, replicas, part, seed = task
    exp = ex.default_experiment(str(default_trace()), 5.0, 1)
    recipe = exp.train if part == "train" else exp.evals[int(part.removeprefix("eval:"))]
    trace = recipe.build(seed)
    base = replace(exp.config, initial_replicas=ex.initial_replicas(recipe.build(0), exp.config))
    config = config_for(routing, replicas, base)
    started = time.monotonic()
    outcome = simulate(trace, policies.make(policy, dict(params), config.slo_s), config)
    row = {
        "phase": phase,
        "group": group,
        "trace": recipe.name,
        "seed": seed,
        "policy": policy,
        "params": params,
        "routing": config.routing_json(),
        "seconds": round(time.monotonic() - started, 2),
    }
    row |= {k: v for k, v in asdict(outcome).items() if k != "timeline"}
    return row


def _ours(slots: int) -> list[dict[str, Any]]:
    return [{**ex.OURS_SLO, "variability": v, "slots": slots} for v in VARIABILITIES]


def training_tasks(load: float, seeds: Sequence[int]) -> list[Task]:
    tasks: list[Task] = []

    def add(group: str, policy: str, params: dict[str, Any], routing: str, r: int) -> None:
        tasks.extend(("train", group, policy, params, routing, r, "train", s) for s in seeds)

    floors = sorted({max(1, round(f * load)) for f in GRID_FLOORS})
    for policy in BASELINES:
        for target in GRID_TARGETS[policy]:
            for low in floors if policy != "llmd" else floors[:1]:
                params = {"target": target, "min_replicas": low, "down_window_s": 300.0}
                add(f"{policy} behind the router", policy, params, ROUTER, BASELINE_REPLICAS)
    slots = SimConfig().service.slots
    for r in REPLICAS:
        usable = r * RouterModel(r).slots_per_pod(slots)
        for params in _ours(usable):
            add(f"ours behind the router, R={r}", "cosyvoice", params, ROUTER, r)
    for (routing, r), factors in STATIC_FACTORS.items():
        label = f"static behind the router, R={r}" if routing == ROUTER else "static behind P2C"
        for n in sorted({max(1, round(f * load)) for f in factors}):
            add(label, "static", {"replicas": n}, routing, r)
    for params in _ours(slots):
        add("ours behind P2C", "cosyvoice", params, P2C, 1)
    return tasks


def pooled(rows: Sequence[dict[str, Any]]) -> float:
    requests = sum(int(r["requests"]) for r in rows)
    return sum(float(r["slo_attainment"]) * int(r["requests"]) for r in rows) / requests


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def choose(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per group, the params `experiment.select`'s rule picks on the training rows."""
    chosen: dict[str, dict[str, Any]] = {}
    for group in dict.fromkeys(r["group"] for r in rows):
        points: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            if r["group"] == group:
                points.setdefault(_key(r["params"]), []).append(r)
        summary = [
            (pooled(p), statistics.mean(x["gpu_hours"] for x in p), k, p[0])
            for k, p in points.items()
        ]
        reaching = [s for s in summary if s[0] >= ex.GOAL_ATTAINMENT]
        pick = min(reaching, key=lambda s: (s[1], s[2])) if reaching else max(summary)
        first = pick[3]
        chosen[group] = {
            "policy": first["policy"],
            "params": first["params"],
            "routing": first["routing"],
            "train_attainment": pick[0],
            "train_gpu_hours": pick[1],
            "reached_goal_on_train": bool(reaching),
        }
    return chosen


def evaluation_tasks(
    chosen: dict[str, dict[str, Any]],
    sim: dict[str, Any],
    seeds: Sequence[int],
    part: str = "eval:0",
    groups: Sequence[str] = (),
) -> list[Task]:
    """Every chosen configuration on the evaluation trace ``part`` (only ``groups``, when
    given: the long traces run a few)."""
    tasks: list[Task] = []
    on_train = sim["summary"]["chosen_on_train"]
    for policy in (*BASELINES, "static", "cosyvoice"):
        label = "ours" if policy == "cosyvoice" else policy
        params = on_train[policy]["params"]
        group = f"{label} behind a Service"
        tasks += [("eval", group, policy, params, ROUND_ROBIN, 1, part, s) for s in seeds]
    for group, c in chosen.items():
        routing = c["routing"]
        r = routing.get("router_replicas", 1)
        tasks += [
            ("eval", group, c["policy"], c["params"], routing["mode"], r, part, s) for s in seeds
        ]
    return [t for t in tasks if not groups or t[1] in groups]


def bound(task: tuple[str, int, int]) -> dict[str, Any]:
    """The clairvoyant schedule (`oracle.search`, one share per bucket, sized on one pooled
    queue behind the router) on one evaluation trace and seed, with the work bound."""
    part, replicas, seed = task
    exp = ex.default_experiment(str(default_trace()), 5.0, 1)
    recipe = exp.evals[int(part.removeprefix("eval:"))]
    trace = recipe.build(seed)
    base = replace(exp.config, initial_replicas=ex.initial_replicas(recipe.build(0), exp.config))
    config = config_for(ROUTER, replicas, base)
    b = oracle.search(trace, config, seed, ex.GOAL_ATTAINMENT)
    return {
        "group": f"clairvoyant schedule behind the router, R={replicas}",
        "trace": recipe.name,
        "seed": seed,
        "routing": config.routing_json(),
        "miss": b.miss,
        "work_bound_gpu_hours": b.work_bound_gpu_hours,
        "tried": [list(t) for t in b.tried],
    } | {k: v for k, v in asdict(b.outcome).items() if k != "timeline"}


def refine_static(
    chosen: dict[str, dict[str, Any]], seeds: Sequence[int], jobs: int
) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Each static fleet behind the router or P2C, one pod fewer at a time while its pooled
    training attainment still reaches the goal: the choice and every training row run."""
    out = dict(chosen)
    rows: list[dict[str, Any]] = []
    for group, c in chosen.items():
        if c["policy"] != "static" or c["routing"]["mode"] == ROUND_ROBIN:
            continue
        mode, r = c["routing"]["mode"], c["routing"].get("router_replicas", 1)
        n = int(c["params"]["replicas"])
        while n > 1 and c["reached_goal_on_train"]:
            params = {"replicas": n - 1}
            tried = execute(
                [("train", group, "static", params, mode, r, "train", s) for s in seeds], jobs
            )
            rows += tried
            if pooled(tried) < ex.GOAL_ATTAINMENT:
                break
            n -= 1
            out[group] = {
                **c,
                "params": params,
                "train_attainment": pooled(tried),
                "train_gpu_hours": statistics.mean(x["gpu_hours"] for x in tried),
            }
    return out, rows


def execute(tasks: list[Task], jobs: int) -> list[dict[str, Any]]:
    order = sorted(range(len(tasks)), key=lambda i: tasks[i][2] != "kpa")  # slow ones first
    with ProcessPoolExecutor(jobs) as pool:
        done = list(pool.map(run, [tasks[i] for i in order], chunksize=1))
    rows: list[dict[str, Any] | None] = [None] * len(tasks)
    for i, row in zip(order, done, strict=True):
        rows[i] = row
    return [r for r in rows if r is not None]


def paired(
    mine: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]], field: str = "gpu_hours"
) -> dict[str, float]:
    """The per-seed ratio mine/other: mean, 95 % t interval, n."""
    theirs = {r["seed"]: r[field] for r in other}
    ratios = [r[field] / theirs[r["seed"]] for r in mine if theirs.get(r["seed"])]
    n = len(ratios)
    mean = statistics.mean(ratios)
    half = t975(n - 1) * statistics.stdev(ratios) / math.sqrt(n) if n > 1 else math.inf
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for group in dict.fromkeys(r["group"] for r in rows):
        mine = [r for r in rows if r["group"] == group]
        gpu = [r["gpu_hours"] for r in mine]
        out.append(
            {
                "group": group,
                "policy": mine[0]["policy"],
                "params": mine[0]["params"],
                "routing": mine[0]["routing"],
                "seeds": len(mine),
                "requests": sum(r["requests"] for r in mine),
                "attainment": pooled(mine),
                "attainment_min": min(r["slo_attainment"] for r in mine),
                "gpu_hours": statistics.mean(gpu),
                "gpu_hours_range": (min(gpu), max(gpu)),
                "scale_events": statistics.mean(r["scale_events"] for r in mine),
                "refused": sum(r["refused"] for r in mine),
                "p95_first_audio_s": statistics.mean(r["p95_first_audio_s"] for r in mine),
                "missing_data_scale_downs": sum(r["missing_data_scale_downs"] for r in mine),
            }
        )
    return out


def verdicts(rows: Sequence[dict[str, Any]], table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 30's targets, for ours behind the router at each R."""
    by_group = {s["group"]: s for s in table}
    holding = [s for s in table if s["attainment"] >= ex.GOAL_ATTAINMENT]
    service = [s for s in holding if s["group"].endswith("behind a Service")]
    service = [s for s in service if not s["group"].startswith("ours")]
    autoscalers = [
        s for s in holding if s["policy"] not in ("static", "cosyvoice") and "P2C" not in s["group"]
    ]
    cheapest_service = min(service, key=lambda s: s["gpu_hours"], default=None)
    calmest = min(autoscalers, key=lambda s: s["scale_events"], default=None)
    out = []
    for r in REPLICAS:
        ours = by_group.get(f"ours behind the router, R={r}")
        if ours is None:
            continue
        same_router = [
            s
            for s in holding
            if s["routing"]["mode"] == ROUTER
            and s["routing"].get("router_replicas") in (r, BASELINE_REPLICAS)
            and s["policy"] != "cosyvoice"
            and (s["policy"] != "static" or s["routing"].get("router_replicas") == r)
        ]
        cheapest_router = min(same_router, key=lambda s: s["gpu_hours"], default=None)
        mine = [x for x in rows if x["group"] == ours["group"]]
        entry: dict[str, Any] = {
            "replicas": r,
            "ours": ours["group"],
            "attainment": ours["attainment"],
            "holds_99": ours["attainment"] >= ex.GOAL_ATTAINMENT,
            "scale_events": ours["scale_events"],
        }
        for name, other, bound in (
            ("vs_service", cheapest_service, 0.6),
            ("vs_router", cheapest_router, 0.9),
        ):
            if other is None:
                entry[name] = None
                continue
            theirs = [x for x in rows if x["group"] == other["group"]]
            ratio = paired(mine, theirs)
            entry[name] = {"against": other["group"], "bound": bound, **ratio}
            entry[name]["met"] = ratio["mean"] <= bound
            entry[name]["met_at_interval_high"] = ratio["high"] <= bound
        if calmest is not None:
            entry["calmest"] = {"group": calmest["group"], "scale_events": calmest["scale_events"]}
            entry["fewer_events"] = ours["scale_events"] < calmest["scale_events"]
        out.append(entry)
    return out


def bound_ratios(
    rows: Sequence[dict[str, Any]], bounds: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Ours behind the router (same R) over the clairvoyant schedule, paired per seed."""
    out = []
    for group in dict.fromkeys(b["group"] for b in bounds):
        mine = [b for b in bounds if b["group"] == group]
        r = mine[0]["routing"]["router_replicas"]
        ours = [x for x in rows if x["group"] == f"ours behind the router, R={r}"]
        entry: dict[str, Any] = {
            "group": group,
            "seeds": len(mine),
            "attainment": pooled(mine),
            "gpu_hours": statistics.mean(b["gpu_hours"] for b in mine),
            "work_bound_gpu_hours": statistics.mean(b["work_bound_gpu_hours"] for b in mine),
        }
        if ours:
            entry["ours_over_bound"] = paired(ours, mine)
        out.append(entry)
    return out


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        f"Evaluation trace: {doc['eval_trace']}, {doc['eval_seeds']} seeds (paired); choices on "
        f"{doc['train_trace']} ({doc['train_seeds']} seeds for the router's and P2C's groups; "
        f"results/sim.json's for the Service's). Ours behind the router reads the router's "
        "figures (policy rule 4c).",
        "",
        "| configuration (chosen on training) | params | SLO met (pooled; worst seed) | "
        "GPU-h mean (range) | scale events | refused | p95 first audio s |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in doc["table"]:
        params = ", ".join(f"{k}={v}" for k, v in s["params"].items() if k not in ex.OURS_SLO)
        if s["policy"] == "cosyvoice" and "variability" in s["params"]:
            params = f"SLO sizing, variability {s['params']['variability']}"
        lo, hi = s["gpu_hours_range"]
        lines.append(
            f"| {s['group']} | {params} | {100 * s['attainment']:.2f} % "
            f"({100 * s['attainment_min']:.2f} %) | {s['gpu_hours']:.1f} ({lo:.1f}-{hi:.1f}) | "
            f"{s['scale_events']:.1f} | {s['refused']} | {s['p95_first_audio_s']:.3f} |"
        )
    lines += [
        "",
        "Issue 30's targets (paired per-seed GPU-hour ratios, mean [95 % t interval]):",
        "",
    ]
    for v in doc["verdicts"]:
        parts = [
            f"- R={v['replicas']}: {100 * v['attainment']:.2f} % "
            f"({'holds' if v['holds_99'] else 'misses'} 99 %)"
        ]
        for name, label in (
            ("vs_service", "cheapest behind a Service"),
            ("vs_router", "cheapest behind the router"),
        ):
            c = v.get(name)
            if c:
                parts.append(
                    f"{c['mean']:.3f}x [{c['low']:.3f}, {c['high']:.3f}] of the {label} "
                    f"({c['against']}; target <= {c['bound']}: {'met' if c['met'] else 'NOT met'})"
                )
        if "calmest" in v:
            parts.append(
                f"{v['scale_events']:.1f} scale events against the calmest autoscaler's "
                f"{v['calmest']['scale_events']:.1f} ({v['calmest']['group']}: "
                f"{'fewer' if v['fewer_events'] else 'NOT fewer'})"
            )
        lines.append("; ".join(parts))
    for b in doc.get("bound_ratios", []):
        line = (
            f"- {b['group']}: {100 * b['attainment']:.2f} %, {b['gpu_hours']:.1f} GPU-h "
            f"({b['seeds']} seeds; work bound {b['work_bound_gpu_hours']:.1f})"
        )
        if "ours_over_bound" in b:
            c = b["ours_over_bound"]
            line += f"; ours / it: {c['mean']:.3f}x [{c['low']:.3f}, {c['high']:.3f}]"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _git(*args: str) -> str:
    """The checkout's state the numbers come from (the policy is shared, others edit it)."""
    done = subprocess.run(
        ["git", *args], cwd=RESULTS.parent.parent, capture_output=True, text=True, check=False
    )
    return done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="evaluation seeds")
    parser.add_argument("--train-seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sim", type=Path, default=RESULTS / "sim.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "routing")
    parser.add_argument(
        "--commit", default="", help="the commit of a snapshot run (default: this checkout's)"
    )
    parser.add_argument(
        "--eval", choices=tuple(EVALS), default="conv", help="the evaluation trace (default conv)"
    )
    parser.add_argument(
        "--chosen",
        type=Path,
        help="take the training choices of an earlier routing.json instead of training again",
    )
    parser.add_argument(
        "--groups", default="", help="evaluate only these groups (';'-separated labels)"
    )
    parser.add_argument(
        "--refine-static",
        action="store_true",
        help="with --chosen: step each static fleet behind the router or P2C down one pod at a "
        "time while it still reaches 99 %% on training (the grid's step is ~2 pods), then "
        "evaluate the changed ones and rewrite the tables with the earlier run's other rows",
    )
    parser.add_argument(
        "--bound",
        default="",
        help="router replicas (e.g. '1,2') to run the clairvoyant schedule behind, per seed",
    )
    args = parser.parse_args()
    started = time.monotonic()
    exp = ex.default_experiment(str(default_trace()), 5.0, 1)
    load = ex.mean_load_pods(exp.train.build(0), exp.config)
    kept: list[dict[str, Any]] = []  # an earlier run's evaluation rows, kept (--refine-static)
    if args.chosen:
        earlier = json.loads(args.chosen.read_text())
        chosen, train_rows = earlier["chosen_on_train"], []
        train_seeds = earlier["train_seeds"]
    else:
        train_rows = execute(training_tasks(load, range(args.train_seeds)), args.jobs)
        chosen, train_seeds = choose(train_rows), args.train_seeds
    groups = tuple(g for g in args.groups.split(";") if g)
    if args.refine_static:
        if not args.chosen:
            parser.error("--refine-static takes the run to refine from --chosen")
        refined, refine_rows = refine_static(chosen, range(train_seeds), args.jobs)
        train_rows = [r for r in earlier["runs"] if r["phase"] == "train"] + refine_rows
        changed = [g for g in refined if refined[g]["params"] != chosen[g]["params"]]
        chosen = refined
        kept = [r for r in earlier["runs"] if r["phase"] == "eval" and r["group"] not in changed]
        groups = tuple(changed) or ("nothing changed",)
    print(f"training: {len(train_rows)} runs, {time.monotonic() - started:.0f} s", file=sys.stderr)
    sim = json.loads(args.sim.read_text())
    part = f"eval:{EVALS[args.eval]}"
    eval_rows = kept + execute(
        evaluation_tasks(chosen, sim, range(args.seeds), part, groups), args.jobs
    )
    bound_tasks = [(part, int(r), s) for r in args.bound.split(",") if r for s in range(args.seeds)]
    with ProcessPoolExecutor(args.jobs) as pool:
        bounds = list(pool.map(bound, bound_tasks, chunksize=1))
    table = summarize(eval_rows)
    doc = {
        "train_trace": exp.train.name,
        "eval_trace": exp.evals[EVALS[args.eval]].name,
        "train_seeds": train_seeds,
        "eval_seeds": args.seeds,
        "train_mean_load_pods": load,
        "commit": args.commit or _git("rev-parse", "HEAD"),
        "uncommitted_autoscaling": _git(
            "status", "--porcelain", "--", "operator/cosyvoice_operator/autoscaling"
        ),
        "chosen_on_train": chosen,
        "table": table,
        "verdicts": verdicts(eval_rows, table),
        "bounds": bounds,
        "bound_ratios": bound_ratios(eval_rows, bounds),
        "elapsed_s": round(time.monotonic() - started, 1),
        "runs": train_rows + eval_rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "routing" if args.eval == "conv" else f"routing-{args.eval}"
    (args.out / f"{name}.json").write_text(json.dumps(doc, indent=1))
    text = markdown(doc)
    (args.out / f"{name}.md").write_text(text)
    print(text)
    print(f"{len(train_rows) + len(eval_rows)} runs in {doc['elapsed_s']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
