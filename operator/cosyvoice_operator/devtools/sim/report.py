"""The benchmark's report: verdicts per evaluation trace, the JSON document, the text table
and the Markdown page (``bench/results/sim.*``), all from an experiment's `Result`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from cosyvoice_operator.devtools.sim.experiment import (
    GOAL_ATTAINMENT,
    Result,
    Summary,
    _key,
)
from cosyvoice_operator.devtools.sim.policies import Params


def lookup(result: Result, trace: str, policy: str, params: Params) -> Summary | None:
    key = _key(params)
    for s in result.summaries:
        if s.trace == trace and s.policy == policy and _key(s.params) == key:
            return s
    return None


# Issue 22's goal: at most 0.75x the GPU-hours of the cheapest train-tuned baseline at 99 %,
# and fewer scale events than the calmest train-tuned autoscaler at 99 %.
GPU_GOAL = 0.75
EVENTS_GOAL = 1.0  # strictly below


@dataclass(frozen=True)
class Verdict:
    """The goal of issue 22 on one evaluation trace, for one configuration of ours."""

    trace: str
    ours_attainment: float
    attainment_ok: bool
    gpu_ratio: float | None  # ours / the cheapest train-tuned baseline reaching 99 %
    gpu_ok: bool
    events_ratio: float | None  # ours / fewest among train-tuned autoscalers reaching 99 %
    events_ok: bool
    missing_ok: bool
    compared_with: tuple[str, ...]  # the train-tuned baselines that reached 99 %
    oracle_ratio: float | None = None  # the oracle schedule / the same cheapest baseline
    work_ratio: float | None = None  # the work bound (a true lower bound) / the same

    @property
    def met(self) -> bool:
        return self.attainment_ok and self.gpu_ok and self.events_ok and self.missing_ok


def verdicts(result: Result, ours: Params | None = None) -> list[Verdict]:
    """The goal on every evaluation trace for ``ours`` (by default, as chosen on training)."""
    out: list[Verdict] = []
    if ours is None:
        if "cosyvoice" not in result.chosen:
            return out
        ours = result.chosen["cosyvoice"].params
    for recipe in result.experiment.evals:
        mine = lookup(result, recipe.name, "cosyvoice", ours)
        if mine is None:
            continue
        reaching = []
        for policy, chosen in result.chosen.items():
            if policy == "cosyvoice":
                continue
            s = lookup(result, recipe.name, policy, chosen.params)
            if s is not None and s.slo_attainment >= GOAL_ATTAINMENT:
                reaching.append(s)
        gpu_ratio = max(mine.gpu_hours / s.gpu_hours for s in reaching) if reaching else None
        cheapest = min((s.gpu_hours for s in reaching), default=None)
        bound = bound_summary(result, recipe.name)
        oracle_ratio = work_ratio = None
        if bound is not None and cheapest:
            oracle_ratio = bound.gpu_hours / cheapest
            work_ratio = bound.work_bound_gpu_hours / cheapest
        autoscalers = [s for s in reaching if s.policy != "static"]
        fewest = min((s.scale_events for s in autoscalers), default=None)
        events_ratio = None
        if fewest is not None:
            events_ratio = mine.scale_events / fewest if fewest > 0 else math.inf
        out.append(
            Verdict(
                trace=recipe.name,
                ours_attainment=mine.slo_attainment,
                attainment_ok=mine.slo_attainment >= GOAL_ATTAINMENT,
                gpu_ratio=gpu_ratio,
                gpu_ok=gpu_ratio is None or gpu_ratio <= GPU_GOAL,
                events_ratio=events_ratio,
                events_ok=events_ratio is None or events_ratio < EVENTS_GOAL,
                missing_ok=mine.missing_data_scale_downs == 0,
                compared_with=tuple(s.policy for s in reaching),
                oracle_ratio=oracle_ratio,
                work_ratio=work_ratio,
            )
        )
    return out


@dataclass(frozen=True)
class BoundSummary:
    """The clairvoyant bounds of one trace over the seeds (`oracle`)."""

    trace: str
    slo_attainment: float  # the oracle schedule's, pooled over the seeds' requests
    attainment_range: tuple[float, float]
    gpu_hours: float  # the oracle schedule's, mean over the seeds
    gpu_hours_range: tuple[float, float]
    scale_events: float
    p95_first_audio_s: float
    work_bound_gpu_hours: float  # mean over the seeds
    work_bound_range: tuple[float, float]
    miss: tuple[float, ...]  # the per-bucket share m chosen, per seed


def bound_summary(result: Result, trace: str) -> BoundSummary | None:
    mine = [b for b in result.bounds if b.trace == trace]
    if not mine:
        return None
    o = [b.outcome for b in mine]
    requests = sum(x.requests for x in o)
    work = [b.work_bound_gpu_hours for b in mine]
    return BoundSummary(
        trace=trace,
        slo_attainment=sum(x.slo_attainment * x.requests for x in o) / max(requests, 1),
        attainment_range=(min(x.slo_attainment for x in o), max(x.slo_attainment for x in o)),
        gpu_hours=sum(x.gpu_hours for x in o) / len(o),
        gpu_hours_range=(min(x.gpu_hours for x in o), max(x.gpu_hours for x in o)),
        scale_events=sum(x.scale_events for x in o) / len(o),
        p95_first_audio_s=sum(x.p95_first_audio_s for x in o) / len(o),
        work_bound_gpu_hours=sum(work) / len(work),
        work_bound_range=(min(work), max(work)),
        miss=tuple(round(b.miss, 5) for b in mine),
    )


def ours_points(result: Result) -> list[Params]:
    """Every configuration of ours that ran, in the order of the sweep."""
    seen: dict[str, Params] = {}
    for r in result.runs:
        if r.policy == "cosyvoice":
            seen.setdefault(_key(r.params), r.params)
    return list(seen.values())


def to_json(result: Result) -> dict[str, Any]:
    """The ``--json`` document: every run of every sweep (one per seed), then the summary."""
    exp = result.experiment
    chosen_keys = {(p, _key(s.params)) for p, s in result.chosen.items()}
    oracle_keys = {(t, p, _key(s.params)) for (t, p), s in result.oracle.items()}
    runs = []
    routing = exp.config.routing_json()
    for r in result.runs:
        key = _key(r.params)
        if (r.policy, key) in chosen_keys and r.trace != exp.train.name:
            tuned_on, selection = exp.train.name, "train"
        elif (r.trace, r.policy, key) in oracle_keys or (
            r.trace == exp.train.name and (r.policy, key) in chosen_keys
        ):
            tuned_on, selection = r.trace, "oracle" if r.trace != exp.train.name else "train"
        else:
            tuned_on, selection = "", "sweep"
        o = r.outcome
        runs.append(
            {
                "trace": r.trace,
                "policy": r.policy,
                "params": r.params,
                "tuned_on": tuned_on,
                "slo_attainment": round(o.slo_attainment, 6),
                "gpu_hours": round(o.gpu_hours, 4),
                "scale_events": o.scale_events,
                "reversals": o.reversals,
                "missing_data_scale_downs": o.missing_data_scale_downs,
                "p95_first_audio_s": round(o.p95_first_audio_s, 4),
                "seed": r.seed,
                "selection": selection,
                "role": "train" if r.trace == exp.train.name else "eval",
                "p50_first_audio_s": round(o.p50_first_audio_s, 4),
                "p99_first_audio_s": round(o.p99_first_audio_s, 4),
                "minutes_in_violation": o.minutes_in_violation,
                "max_replicas": o.max_replicas,
                "requests": o.requests,
                "refused": o.refused,
                "routing": routing,
            }
        )
    bounds = [
        {"trace": b.trace, "seed": b.seed, "miss": b.miss}
        | {k: v for k, v in asdict(b.outcome).items() if k != "timeline"}
        | {"work_bound_gpu_hours": b.work_bound_gpu_hours, "tried": [list(t) for t in b.tried]}
        for b in result.bounds
    ]
    return {
        "runs": runs,
        "bounds": bounds,
        "summary": {
            "train": exp.train.name,
            "evals": [r.name for r in exp.evals],
            "seeds": list(exp.seeds),
            "defaults": {
                "slo_first_audio_s": exp.config.slo_s,
                "cold_start_s": exp.config.cold_start_s,
                "load_multiplier": exp.train.multiplier,
                "give_up_s": exp.config.give_up_s,
                "warmup_s": exp.config.warmup_s,
                "service": asdict(exp.config.service),
                "prometheus": asdict(exp.config.prometheus),
                "goal_attainment": GOAL_ATTAINMENT,
                "routing": routing,
            },
            "train_mean_load_pods": round(result.train_load_pods, 3),
            "initial_replicas": result.initial,
            "ours": dict(exp.ours),
            "chosen_on_train": {
                p: {
                    "params": s.params,
                    "slo_attainment": round(s.slo_attainment, 6),
                    "gpu_hours": round(s.gpu_hours, 4),
                }
                for p, s in result.chosen.items()
            },
            "table": [_row(s, role) for s, role in table_rows(result)],
            "goal": [asdict(v) | {"met": v.met} for v in verdicts(result)],
            "bounds": [
                asdict(b)
                for r in exp.evals
                if (b := bound_summary(result, r.name)) is not None  # type: ignore[arg-type]
            ],
        },
    }


def _row(s: Summary, role: str) -> dict[str, Any]:
    return {
        "trace": s.trace,
        "policy": s.policy,
        "tuned": role,
        "params": s.params,
        "slo_attainment": round(s.slo_attainment, 5),
        "attainment_range": [round(x, 5) for x in s.attainment_range],
        "gpu_hours": round(s.gpu_hours, 3),
        "gpu_hours_range": [round(x, 3) for x in s.gpu_hours_range],
        "scale_events": round(s.scale_events, 2),
        "reversals": round(s.reversals, 2),
        "missing_data_scale_downs": s.missing_data_scale_downs,
        "p95_first_audio_s": round(s.p95_first_audio_s, 3),
    }


def table_rows(result: Result) -> list[tuple[Summary, str]]:
    """Per evaluation trace: ours, each baseline as tuned on the training trace, and each
    baseline's oracle; the training trace first."""
    exp = result.experiment
    rows: list[tuple[Summary, str]] = []
    for trace in [exp.train.name, *(r.name for r in exp.evals)]:
        for policy, chosen in result.chosen.items():
            s = lookup(result, trace, policy, chosen.params)
            if s is not None:
                rows.append((s, "train"))
            if trace != exp.train.name:
                oracle = result.oracle.get((trace, policy))
                if oracle is not None and _key(oracle.params) != _key(chosen.params):
                    rows.append((oracle, "oracle"))
    return rows


def _params_text(params: Params) -> str:
    short = {
        "target_ms": "target",
        "min_replicas": "min",
        "down_window_s": "down",
        "up_step": "up+",
        "down_step": "down-",
        "replicas": "n",
    }
    return " ".join(
        f"{short.get(k, k)}={v:g}" if isinstance(v, float) else f"{short.get(k, k)}={v}"
        for k, v in params.items()
    )


def table(result: Result) -> str:
    """The readable report."""
    exp = result.experiment
    lines = [
        f"SLO: first audio <= {exp.config.slo_s:g} s; cold start {exp.config.cold_start_s:g} s; "
        f"load x{exp.train.multiplier:g}; seeds {len(exp.seeds)}; training trace "
        f"{exp.train.name} (mean load {result.train_load_pods:.1f} pods)",
        exp.config.service.describe(),
        "",
        f"{'trace':<26} {'policy':<16} {'tuned':<7} {'SLO met':>8} {'GPU-h':>8} "
        f"{'events':>7} {'revers':>6} {'miss-dn':>7} {'p95 s':>7}  params",
    ]
    previous = ""
    for s, role in table_rows(result):
        if s.trace != previous and previous:
            lines.append("")
        previous = s.trace
        lines.append(
            f"{s.trace[:26]:<26} {s.policy:<16} {role:<7} {100 * s.slo_attainment:>7.2f}% "
            f"{s.gpu_hours:>8.2f} {s.scale_events:>7.1f} {s.reversals:>6.1f} "
            f"{s.missing_data_scale_downs:>7d} {s.p95_first_audio_s:>7.2f}  "
            f"{_params_text(s.params)}"
        )
    lines.append("")
    for r in exp.evals:
        b = bound_summary(result, r.name)
        if b is not None:
            lines.append(
                f"{b.trace[:26]:<26} {'oracle schedule':<16} {'future':<7} "
                f"{100 * b.slo_attainment:>7.2f}% {b.gpu_hours:>8.2f} {b.scale_events:>7.1f} "
                f"{'':>6} {0:>7d} {b.p95_first_audio_s:>7.2f}  work bound "
                f"{b.work_bound_gpu_hours:.2f} GPU-h, m={'/'.join(f'{m:g}' for m in b.miss)}"
            )
    lines.append("")
    lines.append(f"Goal (ours >= 99 %, <= {GPU_GOAL:g}x the GPU-hours of the cheapest train-tuned")
    lines.append("baseline at 99 %, fewer scale events than the calmest of them, no missing-data")
    lines.append("scale-down):")
    for v in verdicts(result):
        gpu = f"{v.gpu_ratio:.2f}" if v.gpu_ratio is not None else "n/a"
        ev = (
            f"{v.events_ratio:.2f}"
            if v.events_ratio is not None and math.isfinite(v.events_ratio)
            else ("n/a" if v.events_ratio is None else "inf")
        )
        lines.append(
            f"  {v.trace:<26} {'MET' if v.met else 'not met':<8} attainment "
            f"{100 * v.ours_attainment:.2f}%, GPU-h ratio {gpu} (oracle schedule "
            f"{_ratio(v.oracle_ratio)}, work bound {_ratio(v.work_ratio)}), events ratio {ev}, "
            f"vs {', '.join(v.compared_with) or 'none at 99 %'}"
        )
    return "\n".join(lines)


def markdown(result: Result) -> str:
    """The report as Markdown tables (for docs/benchmarks/autoscaling.md)."""
    lines = [
        f"Simulated {result.experiment.config.service.describe()}.",
        "",
        "| trace | policy | tuned on | SLO met (seeds' range) | GPU-h (range) | scale events "
        "| reversals | missing-data scale-downs | p95 first audio | parameters |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s, role in table_rows(result):
        lo, hi = s.attainment_range
        glo, ghi = s.gpu_hours_range
        lines.append(
            f"| {s.trace} | {s.policy} | {role} | {100 * s.slo_attainment:.2f} % "
            f"({100 * lo:.2f}-{100 * hi:.2f}) | {s.gpu_hours:.1f} ({glo:.1f}-{ghi:.1f}) "
            f"| {s.scale_events:.1f} | {s.reversals:.1f} | {s.missing_data_scale_downs} "
            f"| {s.p95_first_audio_s:.2f} s | {_params_text(s.params)} |"
        )
    lines += ["", *_bounds_markdown(result)]
    lines += [
        "",
        "| evaluation trace | goal | ours | GPU-h ratio | oracle schedule's ratio "
        "| work bound's ratio | events ratio | vs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts(result):
        gpu = f"{v.gpu_ratio:.2f}" if v.gpu_ratio is not None else "n/a"
        if v.events_ratio is None:
            ev = "n/a"
        else:
            ev = f"{v.events_ratio:.2f}" if math.isfinite(v.events_ratio) else "inf"
        lines.append(
            f"| {v.trace} | {'met' if v.met else 'not met'} | {100 * v.ours_attainment:.2f} % "
            f"| {gpu} | {_ratio(v.oracle_ratio)} | {_ratio(v.work_ratio)} | {ev} "
            f"| {', '.join(v.compared_with) or 'none at 99 %'} |"
        )
    lines += ["", *_points_markdown(result)]
    return "\n".join(lines)


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _bounds_markdown(result: Result) -> list[str]:
    """The clairvoyant bounds per evaluation trace (`oracle`): the oracle schedule run in the
    plant, and the work bound (a true lower bound)."""
    lines = [
        "| trace | policy | SLO met (seeds' range) | GPU-h (range) | scale events "
        "| p95 first audio | work bound GPU-h (range) | per-bucket share m per seed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result.experiment.evals:
        b = bound_summary(result, r.name)
        if b is None:
            continue
        lo, hi = b.attainment_range
        glo, ghi = b.gpu_hours_range
        wlo, whi = b.work_bound_range
        lines.append(
            f"| {b.trace} | oracle schedule | {100 * b.slo_attainment:.2f} % "
            f"({100 * lo:.2f}-{100 * hi:.2f}) | {b.gpu_hours:.1f} ({glo:.1f}-{ghi:.1f}) "
            f"| {b.scale_events:.1f} | {b.p95_first_audio_s:.2f} s "
            f"| {b.work_bound_gpu_hours:.1f} ({wlo:.1f}-{whi:.1f}) "
            f"| {', '.join(f'{m:g}' for m in b.miss)} |"
        )
    return lines if len(lines) > 2 else []


def _points_markdown(result: Result) -> list[str]:
    """Every configuration of ours on every evaluation trace, against the goal."""
    lines = [
        "| evaluation trace | ours | SLO met (seeds' range) | GPU-h (range) | events "
        "| missing-data downs | GPU-h ratio | events ratio | goal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for params in ours_points(result):
        for v in verdicts(result, params):
            s = lookup(result, v.trace, "cosyvoice", params)
            if s is None:
                continue
            lo, hi = s.attainment_range
            glo, ghi = s.gpu_hours_range
            gpu = f"{v.gpu_ratio:.2f}" if v.gpu_ratio is not None else "n/a"
            ev = "n/a" if v.events_ratio is None else f"{v.events_ratio:.2f}"
            lines.append(
                f"| {v.trace} | {_params_text(_short(params))} | {100 * s.slo_attainment:.2f} % "
                f"({100 * lo:.2f}-{100 * hi:.2f}) | {s.gpu_hours:.1f} ({glo:.1f}-{ghi:.1f}) "
                f"| {s.scale_events:.1f} | {s.missing_data_scale_downs} | {gpu} | {ev} "
                f"| {'met' if v.met else 'not met'} |"
            )
    return lines


def _short(params: Params) -> Params:
    """The parameters that tell our points apart."""
    keys = ("target_ms", "variability", "seasonal_h", "floor_pct")
    if "slo_ms" not in params:
        return {"target_ms": params["target_ms"]}
    return {k: params[k] for k in keys[1:] if k in params}
