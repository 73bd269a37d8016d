"""The benchmark: sweeps on a training trace, selection, and every policy on evaluation traces.

For each baseline (``hpa``, ``hpa-concurrency``, ``keda``, ``kpa``, ``static``) every point
of its sweep (target x minReplicas floor x scale-down window; the static count) runs on the
training trace over every seed; the configuration chosen is the cheapest (fewest mean
GPU-hours) whose attainment, pooled over the seeds, reaches ``goal_attainment`` (99 %). The
chosen configuration then runs unchanged on each evaluation trace; every sweep point runs
there too, and the one the same rule picks on the evaluation trace itself is reported as
the oracle. Our policy is treated the same way on a deliberately small grid: its target
queue latency only (`Sweep.ours_targets`), the rest fixed in advance (`OURS`: no floor
above one replica); it never sees an evaluation trace before its parameters are fixed.

Floors and static counts are given in pods relative to the training trace's mean offered
load ``L`` (Erlangs per pod's slots): a floor of 0.8 is ``round(0.8 * L)`` pods.

Runs are independent and go to a process pool (``jobs``); traces are rebuilt in each
worker from their recipe (`TraceRecipe`), cached there.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cosyvoice_operator.devtools.sim import policies
from cosyvoice_operator.devtools.sim import trace as tr
from cosyvoice_operator.devtools.sim.engine import Minute, Outcome, SimConfig, simulate
from cosyvoice_operator.devtools.sim.oracle import Bound, search
from cosyvoice_operator.devtools.sim.policies import Params

GOAL_ATTAINMENT = GOAL = 0.99
# Our policy's settings besides the target (see docs/benchmarks/autoscaling.md): no floor
# beyond one replica, a scale-up step sized for fleets of tens of pods, and the tuning
# guide's 10-minute scale-down window.
OURS: Params = {
    "min_replicas": 1,
    "up_step": 10,
    "down_window_s": 600,
    "down_step": 1,
}


# Issue 22's SLO sizing (spec.autoscaling.slo), added to our grid beside the targets: the
# benchmark's SLO (first audio 1.5 s for 99 % of requests), the pod's first chunk with every
# slot busy (L20: 1.107 s) and its slots (L20: 4; the operator renders them, so it knows them;
# both follow the simulated pod, ServiceModel.slo_sizing), the 3-minute cold start as the
# forecast's horizon, one std deviation of forecast headroom, a 60 s scale-up window (the
# lowest recommendation of a minute: one noisy sample does not buy pods for 5 minutes), a 300 s
# scale-down window with one step of any size per window; the grid is the variability factor
# (ours_variability), chosen on training.
OURS_SLO: Params = {
    "min_replicas": 1,
    "up_step": 10,
    "up_window_s": 60,
    "down_window_s": 300,
    "down_step": 1000,
    "target_ms": 393,  # the wait the SLO leaves: 1500 - 1107 ms
    "slo_ms": 1500,
    "attainment": 99.0,
    "first_chunk_ms": 1107,
    "cold_start_s": 180,
    "z": 1.0,
    "slots": 4,  # the orchestrator instances per pod, which the operator renders itself
}


@dataclass(frozen=True)
class Sweep:
    """The grids of the baselines. Targets: ms of queue time (hpa), requests per pod
    (hpa-concurrency, keda, keda-fallback, kpa: for a pod of ``grid_slots`` slots, scaled to
    the simulated pod's). Floors and static counts: multiples of the training trace's mean
    load in pods (0 means minReplicas 1)."""

    grid_slots: int = 4  # upstream's L20 pod, which the grids were made for

    ours_targets: tuple[float, ...] = (10.0, 25.0, 50.0)
    ours_variability: tuple[float, ...] = (0.15, 0.2, 0.3)
    # Issue 22's seasonal foresight (off, or a 24-hour profile with its floor at 100 % of
    # what the last day needed): it cannot act on a 29-minute training trace (no history),
    # so it is fixed in advance, the issue's own rule, and reported per point.
    ours_seasonal: tuple[tuple[int, float], ...] = ((0, 100.0), (24, 100.0))
    # The new baselines' grids (issue 22, item 6), smaller than the others' (each of their
    # points runs on the 24-hour day): KEDA with fallback (F = the fallback replicas, in
    # multiples of the training trace's mean load: 2.2 is the static fleet of 51 that holds
    # 99 % there, what an SRE would fall back to), llm-d's saturation thresholds.
    fallback_targets: tuple[float, ...] = (1.5, 2.0, 2.5)
    fallback_replicas: float = 2.2
    llmd_targets: tuple[float, ...] = (0.6, 0.75, 0.9)
    new_floors: tuple[float, ...] = (0.0, 1.0)
    new_down_windows_s: tuple[float, ...] = (300.0,)
    # The deep-trough day and the week run (after selection) ours as chosen, our SLO points at
    # these variabilities, every baseline as chosen but HPA on queue time (for cost: its swings
    # to ~1000 replicas make a 7-day run minutes; it stayed below 92 % on every trace).
    later_variability: tuple[float, ...] = (0.2, 0.3)
    later_skip: tuple[str, ...] = ("hpa",)
    hpa_targets: tuple[float, ...] = (50.0, 200.0, 500.0, 1000.0, 2000.0)
    concurrency_targets: tuple[float, ...] = (1.5, 2.0, 2.5, 3.0, 3.5)
    floors: tuple[float, ...] = (0.0, 0.5, 0.8, 1.0)
    down_windows_s: tuple[float, ...] = (60.0, 300.0, 600.0)
    kpa_delays_s: tuple[float, ...] = (0.0, 300.0, 600.0)
    static_counts: tuple[float, ...] = tuple(round(1.0 + 0.1 * k, 1) for k in range(16))


SMALL_SWEEP = Sweep(
    ours_targets=(25.0, 50.0),
    ours_variability=(0.2,),
    hpa_targets=(200.0, 1000.0),
    concurrency_targets=(2.0, 3.0),
    floors=(0.0, 1.0),
    down_windows_s=(300.0,),
    kpa_delays_s=(0.0,),
    static_counts=(1.0, 1.4, 1.8),
    ours_seasonal=((0, 100.0), (24, 100.0)),
    fallback_targets=(2.0,),
    llmd_targets=(0.75,),
    new_floors=(0.0,),
)


@dataclass(frozen=True)
class TraceRecipe:
    """How to build one trace: a CSV (or a part of it), scaled, reshaped, with outages."""

    name: str
    path: str
    size_column: str = "GeneratedTokens"
    size_per_second: float = 25.0
    part: str = "all"  # "all" | "train" | "eval"
    multiplier: float = 1.0
    shape: str = "flat"  # "flat" | "day" | "burst" | "step" | "ramp"
    outages: tuple[tuple[float, float], ...] = ()
    day_hours: float = 24.0  # hours of the day (or days) kept
    trough: float = 0.2  # the day's trough, relative to its peak
    days: int = 1  # a week: 7 (the first a Monday)
    weekend: float = 1.0  # Saturdays' and Sundays' load relative to a weekday
    sweep: bool = True  # every sweep point runs here (for the oracle); False: the chosen only

    def build(self, seed: int) -> tr.Trace:
        return _build(self, seed)


@functools.lru_cache(maxsize=4)
def _source(path: str, size_column: str, size_per_second: float) -> tr.Trace:
    return tr.load_csv(path, size_column, size_per_second)


@functools.lru_cache(maxsize=8)
def _build(recipe: TraceRecipe, seed: int) -> tr.Trace:
    base = _source(recipe.path, recipe.size_column, recipe.size_per_second)
    if recipe.part != "all":
        train, evaluation = tr.split(base)
        base = train if recipe.part == "train" else evaluation
    if recipe.shape == "day":
        day = tr.diurnal_day(
            base,
            seed,
            peak_factor=recipe.multiplier,
            name=recipe.name,
            trough=recipe.trough,
            days=recipe.days,
            weekend=recipe.weekend,
        )
        if recipe.day_hours < 24.0 * recipe.days:
            cut = recipe.day_hours * 3600.0
            keep = sum(1 for t in day.arrivals if t < cut)
            day = tr.Trace(day.name, day.arrivals[:keep], day.audio[:keep], cut)
        shaped = day
    else:
        minutes = 60.0
        factor = {
            "flat": lambda t: recipe.multiplier,
            "burst": lambda t: recipe.multiplier * tr.burst(12 * minutes, 2 * minutes, 3.0)(t),
            "step": lambda t: recipe.multiplier * tr.step(10 * minutes, 1.0, 2.0)(t),
            "ramp": lambda t: recipe.multiplier * tr.ramp(5 * minutes, 25 * minutes, 0.5, 2.0)(t),
        }[recipe.shape]
        shaped = tr.modulate(base, factor, seed, name=recipe.name)
    for start, length in recipe.outages:
        shaped = tr.with_outage(shaped, start, length)
    return replace(shaped, name=recipe.name)


@dataclass(frozen=True)
class Experiment:
    train: TraceRecipe
    evals: tuple[TraceRecipe, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    config: SimConfig = field(default_factory=SimConfig)
    sweep: Sweep = field(default_factory=Sweep)
    ours: tuple[tuple[str, float], ...] = tuple(OURS.items())  # besides target_ms
    jobs: int = 0  # 0: every CPU
    log: bool = False  # one line per finished run on stderr (with jobs 1)
    bounds: bool = False  # the clairvoyant bounds of every evaluation trace (`oracle`)
    known_bounds: tuple[Bound, ...] = ()  # bounds computed before (same plant and traces)


def default_experiment(
    path: str, multiplier: float = 5.0, seeds: int = 3, small: bool = False
) -> Experiment:
    """The conversation trace split in time (training: the first half), the second half as
    it is, a synthesized day, a burst, a step, a ramp and a Prometheus outage on it."""
    name = Path(path).name.removesuffix(".gz")  # the same trace, compressed or not
    ev = functools.partial(TraceRecipe, path=path, part="eval", multiplier=multiplier)
    evals = [
        ev(name=f"{name}#eval"),
        ev(name="diurnal-day", shape="day", day_hours=3.0 if small else 24.0),
        ev(name="burst-3x-2min", shape="burst"),
        ev(name="step-2x", shape="step"),
        ev(name="ramp-0.5x-2x", shape="ramp"),
        ev(name="prometheus-outage-10min", outages=((600.0, 600.0),)),
    ]
    # Issue 22: a deep-trough day and a week (weekends at half a weekday's load), run with
    # the configurations chosen on training only (no oracle sweep: a week is 7 days of runs).
    hours = 3.0 if small else 24.0
    evals += [
        ev(name="diurnal-day-deep", shape="day", trough=0.05, day_hours=hours, sweep=False),
        ev(name="diurnal-week", shape="day", days=7, weekend=0.5, day_hours=7 * 24.0, sweep=False),
    ]
    if small:
        evals = [evals[0], evals[1], evals[5], evals[6]]
    return Experiment(
        train=TraceRecipe(name=f"{name}#train", path=path, part="train", multiplier=multiplier),
        evals=tuple(evals),
        seeds=tuple(range(seeds)),
        sweep=SMALL_SWEEP if small else Sweep(),
        bounds=True,
    )


def files_experiment(
    train: str,
    evals: Sequence[str],
    multiplier: float,
    seeds: int,
    size_column: str,
    size_per_second: float,
    outages: tuple[tuple[float, float], ...] = (),
) -> Experiment:
    """Training on one CSV, evaluation on others (each with the outages given)."""

    def recipe(path: str, with_outages: bool) -> TraceRecipe:
        return TraceRecipe(
            name=Path(path).name,
            path=path,
            size_column=size_column,
            size_per_second=size_per_second,
            multiplier=multiplier,
            outages=outages if with_outages else (),
        )

    return Experiment(
        train=recipe(train, False),
        evals=tuple(recipe(p, True) for p in evals),
        seeds=tuple(range(seeds)),
    )


@dataclass(frozen=True)
class Task:
    recipe: TraceRecipe
    seed: int
    policy: str
    params: tuple[tuple[str, float], ...]
    config: SimConfig
    timeline: bool = False


@dataclass(frozen=True)
class Run:
    trace: str
    seed: int
    policy: str
    params: Params
    outcome: Outcome


def _run(task: Task) -> Run:
    trace = task.recipe.build(task.seed)
    params = dict(task.params)
    outcome = simulate(trace, policies.make(task.policy, params, task.config.slo_s), task.config)
    if not task.timeline:
        outcome = replace(outcome, timeline=())
    return Run(task.recipe.name, task.seed, task.policy, params, outcome)


def _execute(tasks: Sequence[Task], jobs: int, log: bool = False) -> list[Run]:
    workers = jobs or os.cpu_count() or 1
    if workers == 1 or len(tasks) <= 1:
        return [_logged(_run(t), k, len(tasks), log) for k, t in enumerate(tasks)]
    # Long traces first, so that the pool does not end on one long run.
    order = sorted(range(len(tasks)), key=lambda i: -_weight(tasks[i]))
    with ProcessPoolExecutor(workers) as pool:
        done = list(pool.map(_run, [tasks[i] for i in order], chunksize=1))
    runs: list[Run | None] = [None] * len(tasks)
    for i, run in zip(order, done, strict=True):
        runs[i] = run
    return [r for r in runs if r is not None]


def _logged(run: Run, k: int, n: int, log: bool) -> Run:
    if log:
        o = run.outcome
        print(
            f"run {k + 1}/{n} {run.trace} {run.policy} seed {run.seed} {_key(run.params)}: "
            f"{100 * o.slo_attainment:.3f} % {o.gpu_hours:.2f} GPU-h {o.scale_events} events "
            f"{o.missing_data_scale_downs} missing-data downs",
            file=sys.stderr,
            flush=True,
        )
    return run


def _weight(task: Task) -> float:
    return (task.recipe.day_hours * 3600 if task.recipe.shape == "day" else 1800.0) * (
        3.0 if task.policy == "kpa" else 1.0
    )


def mean_load_pods(trace: tr.Trace, config: SimConfig) -> float:
    """The trace's mean offered load, in pods' worth of slots."""
    model = config.service
    erlangs = tr.offered_load(trace, model.service_seconds, 0.0, trace.duration_s)
    return erlangs / model.slots


def initial_replicas(trace: tr.Trace, config: SimConfig) -> int:
    """The fleet every policy starts from: the first 5 minutes' load at 60 % of the slots."""
    model = config.service
    erlangs = tr.offered_load(trace, model.service_seconds, 0.0, min(300.0, trace.duration_s))
    return max(1, math.ceil(erlangs / (model.slots * 0.6)))


def sweep_points(
    sweep: Sweep, load_pods: float, ours: Params | None = None, pod: Mapping[str, int] | None = None
) -> list[tuple[str, Params]]:
    """Every configuration of the sweep, ours first; ``pod``: ServiceModel.slo_sizing."""

    def floor(f: float) -> int:
        return max(1, round(f * load_pods))

    per_pod = (pod or {}).get("slots", sweep.grid_slots) / sweep.grid_slots
    concurrency = [round(t * per_pod, 2) for t in sweep.concurrency_targets]
    floors = sorted({floor(f) for f in sweep.floors})
    points: list[tuple[str, Params]] = [
        ("cosyvoice", {"target_ms": target, **(ours if ours is not None else OURS)})
        for target in sweep.ours_targets
    ]
    points += [
        ("cosyvoice", {**OURS_SLO, **(pod or {}), "variability": k, **_seasonal(period, floor_pct)})
        for period, floor_pct in sweep.ours_seasonal
        for k in sweep.ours_variability
    ]
    for target, low, window in itertools.product(sweep.hpa_targets, floors, sweep.down_windows_s):
        points.append(("hpa", {"target": target, "min_replicas": low, "down_window_s": window}))
    for policy in ("hpa-concurrency", "keda"):
        for target, low, window in itertools.product(concurrency, floors, sweep.down_windows_s):
            points.append(
                (policy, {"target": target, "min_replicas": low, "down_window_s": window})
            )
    new_floors = sorted({floor(f) for f in sweep.new_floors})
    fallback = floor(sweep.fallback_replicas)
    fallback_targets = [round(t * per_pod, 2) for t in sweep.fallback_targets]
    for target, low, window in itertools.product(
        fallback_targets, new_floors, sweep.new_down_windows_s
    ):
        params: Params = {"target": target, "min_replicas": low, "down_window_s": window}
        points.append(("keda-fallback", {**params, "fallback": fallback}))
    for target, low, window in itertools.product(
        sweep.llmd_targets, new_floors, sweep.new_down_windows_s
    ):
        points.append(("llmd", {"target": target, "min_replicas": low, "down_window_s": window}))
    for target, low, delay in itertools.product(concurrency, floors, sweep.kpa_delays_s):
        points.append(("kpa", {"target": target, "min_replicas": low, "down_window_s": delay}))
    for count in sorted({max(1, round(f * load_pods)) for f in sweep.static_counts}):
        points.append(("static", {"replicas": count}))
    return points


def _seasonal(period: int, floor_pct: float) -> Params:
    """Our seasonal parameters (none when off, so that the points keep their old keys)."""
    return {"seasonal_h": period, "floor_pct": floor_pct} if period else {}


@dataclass(frozen=True)
class Summary:
    """One configuration on one trace, over the seeds."""

    trace: str
    policy: str
    params: Params
    slo_attainment: float  # pooled over the seeds' requests
    gpu_hours: float  # mean over the seeds
    scale_events: float
    reversals: float
    missing_data_scale_downs: int  # total
    p95_first_audio_s: float  # mean of the seeds' p95
    attainment_range: tuple[float, float]
    gpu_hours_range: tuple[float, float]


def summarize(runs: Sequence[Run]) -> list[Summary]:
    groups: dict[tuple[str, str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.trace, r.policy, _key(r.params)), []).append(r)
    out = []
    for (trace, policy, _), members in groups.items():
        o = [m.outcome for m in members]
        requests = sum(x.requests for x in o)
        met = sum(x.slo_attainment * x.requests for x in o)
        out.append(
            Summary(
                trace=trace,
                policy=policy,
                params=members[0].params,
                slo_attainment=met / requests if requests else 1.0,
                gpu_hours=sum(x.gpu_hours for x in o) / len(o),
                scale_events=sum(x.scale_events for x in o) / len(o),
                reversals=sum(x.reversals for x in o) / len(o),
                missing_data_scale_downs=sum(x.missing_data_scale_downs for x in o),
                p95_first_audio_s=sum(x.p95_first_audio_s for x in o) / len(o),
                attainment_range=(
                    min(x.slo_attainment for x in o),
                    max(x.slo_attainment for x in o),
                ),
                gpu_hours_range=(min(x.gpu_hours for x in o), max(x.gpu_hours for x in o)),
            )
        )
    return out


def _key(params: Params) -> str:
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def select(summaries: Iterable[Summary], goal: float = GOAL_ATTAINMENT) -> Summary | None:
    """The cheapest configuration reaching ``goal``; else the one closest to it (the highest
    attainment, then the cheapest); None for no configuration."""
    candidates = list(summaries)
    if not candidates:
        return None
    reaching = [s for s in candidates if s.slo_attainment >= goal]
    if reaching:
        return min(reaching, key=lambda s: (s.gpu_hours, s.scale_events, _key(s.params)))
    return max(candidates, key=lambda s: (s.slo_attainment, -s.gpu_hours))


@dataclass
class Result:
    experiment: Experiment
    train_load_pods: float
    initial: dict[str, int]
    runs: list[Run]
    summaries: list[Summary]
    chosen: dict[str, Summary] = field(default_factory=dict)  # policy -> on the training trace
    oracle: dict[tuple[str, str], Summary] = field(default_factory=dict)  # (trace, policy)
    timelines: dict[tuple[str, str], tuple[Minute, ...]] = field(default_factory=dict)
    bounds: list[Bound] = field(default_factory=list)  # per evaluation trace and seed


Reuse = dict[tuple[str, int, str, str], Outcome]  # (trace, seed, policy, params key)


def run_key(trace: str, seed: int, policy: str, params: Params) -> tuple[str, int, str, str]:
    return (trace, seed, policy, _key(params))


def reusable(document: dict[str, Any], policies_kept: Sequence[str]) -> Reuse:
    """The outcomes of ``policies_kept`` in a ``--json`` document (`report.to_json`), for
    `run_experiment`'s ``reuse``: only valid while those policies, the plant and the traces
    are the code that made them (the timelines are not in the document)."""
    out: Reuse = {}
    for r in document["runs"]:
        if r["policy"] not in policies_kept:
            continue
        outcome = Outcome(
            requests=r["requests"],
            slo_attainment=r["slo_attainment"],
            gpu_hours=r["gpu_hours"],
            scale_events=r["scale_events"],
            reversals=r["reversals"],
            missing_data_scale_downs=r["missing_data_scale_downs"],
            p50_first_audio_s=r["p50_first_audio_s"],
            p95_first_audio_s=r["p95_first_audio_s"],
            p99_first_audio_s=r["p99_first_audio_s"],
            minutes_in_violation=r["minutes_in_violation"],
            max_replicas=r["max_replicas"],
            timeline=(),
        )
        out[run_key(r["trace"], r["seed"], r["policy"], r["params"])] = outcome
    return out


def run_experiment(exp: Experiment, timelines: bool = False, reuse: Reuse | None = None) -> Result:
    """Train, select, evaluate; with ``timelines``, seed 0 of the chosen configurations is run
    again on each evaluation trace for the plot. Traces with ``sweep`` run every point (the
    oracle is chosen there); the others run, after the selection on training, the chosen
    configurations and every SLO point of ours. ``reuse`` holds outcomes already simulated with
    the same code and configuration (`run_key`): those tasks are not run again."""
    config = exp.config
    train0 = exp.train.build(exp.seeds[0])
    load = mean_load_pods(train0, config)
    points = sweep_points(exp.sweep, load, dict(exp.ours), config.service.slo_sizing(config.slo_s))
    initial: dict[str, int] = {}
    known = reuse or {}

    def tasks_for(recipe: TraceRecipe, configs: Sequence[tuple[str, Params]]) -> list[Task]:
        built = recipe.build(exp.seeds[0])
        initial[recipe.name] = initial_replicas(built, config)
        cfg = replace(config, initial_replicas=initial[recipe.name])
        return [
            Task(recipe, seed, policy, tuple(params.items()), cfg)
            for policy, params in configs
            for seed in exp.seeds
        ]

    def execute(tasks: list[Task]) -> list[Run]:
        def reused(t: Task) -> Outcome | None:
            return known.get(run_key(t.recipe.name, t.seed, t.policy, dict(t.params)))

        fresh = [t for t in tasks if reused(t) is None]
        done = iter(_execute(fresh, exp.jobs, exp.log))
        return [
            Run(t.recipe.name, t.seed, t.policy, dict(t.params), o)
            if (o := reused(t)) is not None
            else next(done)
            for t in tasks
        ]

    tasks = tasks_for(exp.train, points)
    for recipe in (r for r in exp.evals if r.sweep):
        tasks += tasks_for(recipe, points)
    runs = execute(tasks)
    chosen = _choose(summarize(runs), exp.train.name)
    later = later_configs({p: s.params for p, s in chosen.items()}, points, exp.sweep)
    tasks = []
    for recipe in (r for r in exp.evals if not r.sweep):
        tasks += tasks_for(recipe, later)
    runs += execute(tasks)
    summaries = summarize(runs)
    result = Result(exp, load, initial, runs, summaries, chosen=chosen)
    by_trace_policy: dict[tuple[str, str], list[Summary]] = {}
    for s in summaries:
        by_trace_policy.setdefault((s.trace, s.policy), []).append(s)
    for policy in policies.POLICIES:
        for recipe in exp.evals:
            pick = select(by_trace_policy.get((recipe.name, policy), []))
            if pick is not None and recipe.sweep:
                result.oracle[(recipe.name, policy)] = pick
    if exp.bounds:
        old = {(b.trace, b.seed): b for b in exp.known_bounds}
        result.bounds = [
            old.get((r.name, s))
            or search(r.build(s), replace(config, initial_replicas=initial[r.name]), s, GOAL)
            for r in exp.evals
            for s in exp.seeds
        ]
    if timelines:
        extra = []
        for recipe in (r for r in exp.evals if r.sweep):  # a week's plot: not drawn
            cfg = replace(config, initial_replicas=initial[recipe.name])
            for policy, params in ((p, s.params) for p, s in result.chosen.items()):
                extra.append(
                    Task(recipe, exp.seeds[0], policy, tuple(params.items()), cfg, timeline=True)
                )
        for run in _execute(extra, exp.jobs):
            result.timelines[(run.trace, run.policy)] = run.outcome.timeline
    return result


def later_configs(
    chosen: dict[str, Params], points: Sequence[tuple[str, Params]], sweep: Sweep
) -> list[tuple[str, Params]]:
    """What the traces without a sweep run: every chosen configuration but later_skip's (ours
    whatever it is), and our SLO points at later_variability (once each)."""
    later = [(p, params) for p, params in chosen.items() if p not in sweep.later_skip]
    return later + [
        (p, params)
        for p, params in points
        if p == "cosyvoice" and "slo_ms" in params
        if params["variability"] in sweep.later_variability and (p, params) not in later
    ]


def _choose(summaries: Sequence[Summary], train: str) -> dict[str, Summary]:
    """Per policy, the configuration `select` picks on the training trace."""
    chosen: dict[str, Summary] = {}
    for policy in policies.POLICIES:
        pick = select(s for s in summaries if s.trace == train and s.policy == policy)
        if pick is not None:
            chosen[policy] = pick
    return chosen
