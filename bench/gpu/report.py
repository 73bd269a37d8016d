"""``bench/results/gpu-sweep.json`` and ``gpu-sweep.png`` from a sweep's raw output.

    .venv/bin/python bench/gpu/report.py RAW.json [RAW2.json ...]

Several raw files (or a point named twice in one) are runs of the same points: a point's
``goodput_rps`` is its first run's, ``repeat_goodput_rps`` the others', and the best point and
the operator's choice are compared on the mean over runs (``mean_goodput_rps``). ``requests``
and ``lost_streams`` (streams that ended in an error, whatever their latency) sum over runs.

A point's goodput at SLO is the good requests per second (first chunk within the target, no
error) of the highest load step that met the SLO (p95 first chunk within the target, failed
requests counted as misses; ``loadgen.meets_slo``). The operator's choice is the point whose
serving fields are what the operator renders for a default CosyVoice2 service
(``cosyvoice_operator.render.triton.orchestrator_instances`` and the CRD's defaults).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen
import pack

from cosyvoice_operator.api import spec
from cosyvoice_operator.render import triton

RESULTS = Path(__file__).resolve().parents[1] / "results"


def operator_choice() -> dict[str, Any]:
    """The serving fields a default CosyVoice2 service renders to (one GPU)."""
    svc = spec.parse({"model": pack.BASE["model"], "engine": {"cacheClaimName": "engines"}})
    return {
        "orchestratorPerGpu": triton.orchestrator_instances(svc),
        "instancesPerGpu": svc.serving.instances_per_gpu,
        "maxQueueDelayUs": svc.serving.dynamic_batching.max_queue_delay_microseconds,
        "maxBatchSize": svc.engine.max_batch_size,
    }


# What ran for each model in the issue-20 sweep (pack.py --code ours on full_release.py).
NETWORKS = {
    "cosyvoice2": "ours (serving-models/models/cosyvoice2): orchestrator, one stream per instance",
    "token2wav": (
        "ours on upstream's flow and HiFT (token2wav-cosyvoice 0.1.0 modules) at the release's"
        " dimensions, random weights; the flow estimator as CUDA graphs (fp16), encoder and"
        " HiFT eager"
    ),
    "tensorrt_llm": (
        "stand-in: Qwen2-0.5B-shaped torch decoder, CUDA-graph decode, in-flight batching,"
        " random weights (TensorRT-LLM cannot be carried)"
    ),
    "audio_tokenizer": "stand-in (bench/gpu/standins), once per voice (the speaker cache)",
    "speaker_embedding": "stand-in (bench/gpu/standins), once per voice (the speaker cache)",
}


def lost_streams(raw: dict[str, Any]) -> int:
    """Requests that ended in an error anywhere in a point's run (sweep.py counts them)."""
    if "lost_streams" in raw:
        return int(raw["lost_streams"])
    return sum(s["errors"] for s in raw.get("steps", []))


def searched(raw: dict[str, Any]) -> dict[str, Any]:
    """A point of issue 32's sweep (``sweep.py``'s rate search, steps of fixed request counts,
    the decision on the attainment's lower bound): its goodput is the search's, with the
    decisive steps; the per-request samples stay in the raw file."""
    steps = [{k: v for k, v in s.items() if k != "samples"} for s in raw.get("steps", [])]
    profile = {
        level: {k: v for k, v in row.items() if k != "samples"}
        for level, row in (raw.get("concurrency_profile") or {}).items()
    }
    best = raw.get("decisive", {}).get("passed")
    above = raw.get("decisive", {}).get("failed_above")
    return {
        "name": raw["name"],
        "params": raw["params"],
        "repeat": raw.get("repeat", 1),
        "goodput_rps": raw.get("goodput_rps", 0.0),
        "goodput_rate_rps": raw.get("goodput_rate_rps", 0.0),
        # the goodput's interval: the passing rung's rate up to the failing rung's above it
        "goodput_interval_rps": [best["rate_rps"], above["rate_rps"]] if best and above else None,
        "bracketed": raw.get("bracketed", False),
        "decisive": raw.get("decisive"),
        "p95_first_chunk_ms": raw.get("p95_first_chunk_ms"),
        "p95_total_ms": raw.get("p95_total_ms"),
        "closed_loop_rps": None,
        "error_rate": round(raw["lost_streams"] / raw["requests"], 4)
        if raw.get("requests")
        else None,
        "gpu_utilization_mean": raw.get("gpu_utilization_mean"),
        "gpu_memory_max_gib": raw.get("gpu_memory_max_gib"),
        "ready_s": raw.get("ready_s"),
        "requests": raw.get("requests", 0),
        "lost_streams": lost_streams(raw),
        "concurrency_profile": profile or None,
        "steps": steps,
        "model_stats": raw.get("model_stats"),
        **({"error": raw["error"]} if "error" in raw else {}),
    }


def sized(step: dict[str, Any] | None) -> dict[str, Any] | None:
    """A ladder step (runs before issue 32) as issue 32 reports a decisive step: its rate, its
    requests, those on time, the Wilson 90 % interval of that share, and whether its lower
    end reaches 95 % (the decision issue 32's sweep takes)."""
    if step is None or "rate_rps" not in step:
        return None
    n = int(step["requests"])
    if "good_requests" in step:
        good = int(step["good_requests"])
    else:  # good_rps is the good requests over the step's seconds (offered_rps: n over them)
        good = round(step["good_rps"] * n / step["offered_rps"]) if step["offered_rps"] else 0
    low, high = loadgen.wilson(good, n)
    return {
        "rate_rps": step["rate_rps"],
        "requests": n,
        "good_requests": good,
        "attainment_wilson90": [round(low, 4), round(high, 4)],
        "lower_bound_reaches_95": low >= 0.95,
    }


def holds(p: dict[str, Any]) -> bool:
    """Whether a point's goodput rests on a passed step of a sound decision."""
    if "decisive" in p:
        passed = (p["decisive"] or {}).get("passed")
        return bool(passed) and passed["attainment_wilson90"][0] >= 0.95
    passed = (p.get("decisive_steps") or {}).get("passed")
    return bool(passed) and bool(passed["lower_bound_reaches_95"])


def point(raw: dict[str, Any], slo_ms: float) -> dict[str, Any]:
    if "decisive" in raw or "bracketed" in raw:
        return searched(raw)
    steps = raw.get("steps", [])
    passing = [s for s in steps if loadgen.meets_slo(s, slo_ms)]
    best = max(passing, key=lambda s: s["good_rps"], default=None)
    errors = sum(s["errors"] for s in steps)
    requests = sum(s["requests"] for s in steps)
    rate = (best or {}).get("rate_rps")
    above = min(
        (s for s in steps if rate and s.get("rate_rps", 0) > rate and s not in passing),
        key=lambda s: s["rate_rps"],
        default=None,
    )
    return {
        # issue 32: the steps this goodput rests on, their sizes and attainment intervals
        "decisive_steps": {"passed": sized(best), "failed_above": sized(above)},
        "name": raw["name"],
        "params": raw["params"],
        "goodput_rps": best["good_rps"] if best else 0.0,
        "offered_rps_at_goodput": best["offered_rps"] if best else None,
        "p95_first_chunk_ms": best["p95_first_chunk_ms"] if best else None,
        "p95_total_ms": best["p95_total_ms"] if best else None,
        "closed_loop_rps": raw.get("closed_loop_rps"),
        "closed_loop_p95_first_chunk_ms": raw.get("closed_loop_p95_first_chunk_ms"),
        "error_rate": round(errors / requests, 4) if requests else None,
        "gpu_utilization_mean": best["gpu_utilization_mean"] if best else None,
        "gpu_memory_max_gib": raw.get("gpu_memory_max_gib"),
        "ready_s": raw.get("ready_s"),
        "requests": raw.get("requests", requests),
        "lost_streams": lost_streams(raw),
        "concurrency_profile": raw.get("concurrency_profile"),
        "steps": steps,
        "model_stats": raw.get("model_stats"),
        **({"error": raw["error"]} if "error" in raw else {}),
    }


def markdown(points: list[dict[str, Any]]) -> str:
    """Issue 32's table: per searched point, the goodput with its interval and the decisive
    steps' sizes and attainment intervals (Wilson, 90 % two-sided)."""

    def step(d: dict[str, Any] | None) -> str:
        if not d:
            return "-"
        low, high = d["attainment_wilson90"]
        cut = ", curtailed" if d.get("curtailed") else ""
        return (
            f"{d['rate_rps']:.3f}/s: {d['good_requests']}/{d['requests']} on time "
            f"[{low:.3f}, {high:.3f}]{cut}"
        )

    rows = [
        "| point (orch, t2w inst, delay, mbs) | goodput req/s (interval) | passed step | "
        "failed step above | p95 first chunk at goodput | lost / requests | ready s |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in points:
        if "decisive" not in p:
            continue
        q = p["params"]
        name = f"{q['orchestratorPerGpu']}, {q['instancesPerGpu']}, {q['maxQueueDelayUs']} us, "
        name += f"{q['maxBatchSize']}" + (
            f" (repeat {p['repeat']})" if p.get("repeat", 1) > 1 else ""
        )
        interval = p.get("goodput_interval_rps")
        shown = f"{p['goodput_rps']:.3f}" + (
            f" [{interval[0]:.3f}, {interval[1]:.3f})" if interval else " (not bracketed)"
        )
        decisive = p.get("decisive") or {}
        rows.append(
            f"| {name} | {shown} | {step(decisive.get('passed'))} | "
            f"{step(decisive.get('failed_above'))} | {p.get('p95_first_chunk_ms')} ms | "
            f"{p['lost_streams']} / {p['requests']} | {p.get('ready_s')} |"
        )
    return "\n".join(rows)


def one_device(raws: list[dict[str, Any]]) -> str | None:
    """Why these raw runs cannot be merged (latencies on different cards, or a different SLO,
    are not repeats of one another), or None when they can."""
    devices = sorted({str(r.get("device", "")).split(",")[0] for r in raws})
    if len(devices) > 1:
        return f"runs from different GPUs cannot be merged: {', '.join(devices)}"
    slos = sorted({float(r["slo_first_chunk_ms"]) for r in raws})
    if len(slos) > 1:
        return f"runs with different first-chunk SLOs cannot be merged: {slos}"
    return None


def merge_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per point: its first run, with the other runs' goodput beside it, the mean
    and the spread ((max - min) / mean), and requests and lost streams summed over runs."""
    merged: dict[str, dict[str, Any]] = {}
    for run in runs:
        first = merged.get(run["name"])
        if first is None:
            merged[run["name"]] = {**run, "repeat_goodput_rps": []}
            continue
        first["repeat_goodput_rps"].append(run["goodput_rps"])
        first["requests"] += run["requests"]
        first["lost_streams"] += run["lost_streams"]
    for entry in merged.values():
        values = [entry["goodput_rps"], *entry["repeat_goodput_rps"]]
        mean = sum(values) / len(values)
        entry["mean_goodput_rps"] = round(mean, 3)
        entry["goodput_spread"] = round((max(values) - min(values)) / mean, 3) if mean else None
        entry["lost_stream_rate"] = (
            round(entry["lost_streams"] / entry["requests"], 4) if entry["requests"] else None
        )
    return list(merged.values())


def multi_gpu(points: list[dict[str, Any]], memory_floor_gib: float = 1.0) -> dict[str, Any]:
    """Issue 13's summary: the best goodput with one GPU per pod and with two (same serving
    fields otherwise), how many GPUs held instances (device memory above ``memory_floor_gib``
    in Triton's per-GPU metrics while the two-GPU pod served), and the failed requests."""

    def best(gpus: int) -> dict[str, Any] | None:
        mine = [p for p in points if p["params"].get("gpus", 1) == gpus]
        return max(mine, key=lambda p: p["goodput_rps"], default=None)

    one, two = best(1), best(2)
    used: set[str] = set()
    for step in (two or {}).get("steps", []):
        for uuid, gpu in (step.get("per_gpu") or {}).items():
            if (gpu.get("memory_max_gib") or 0) > memory_floor_gib:
                used.add(uuid)
    one_rps = one["goodput_rps"] if one else 0.0
    two_rps = two["goodput_rps"] if two else 0.0
    return {
        "one_gpu_goodput_rps": one_rps,
        "two_gpu_goodput_rps": two_rps,
        "ratio": round(two_rps / one_rps, 3) if one_rps else None,
        "gpus_with_instances": len(used),
        "errors": sum(s["errors"] for p in points for s in p.get("steps", [])),
        "one_gpu_point": one["name"] if one else None,
        "two_gpu_point": two["name"] if two else None,
    }


def plot(points: list[dict[str, Any]], choice: str, out: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = sorted(points, key=lambda p: p["closed_loop_rps"] or p["goodput_rps"])
    names = [p["name"] for p in ordered]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(names) + 1.8))
    y = range(len(names))
    searched_ = [p for p in ordered if p.get("goodput_interval_rps")]
    ax.barh(
        [i + 0.2 for i in y],
        [
            (p.get("goodput_interval_rps") or [0, 0])[1]
            if searched_
            else (p["closed_loop_rps"] or 0)
            for p in ordered
        ],
        height=0.4,
        color="#c9d6e8",
        label="first failing rate (100-request steps)" if searched_ else "capacity (closed loop)",
    )
    ax.barh(
        [i - 0.2 for i in y],
        [p["goodput_rps"] for p in ordered],
        height=0.4,
        color=["#d9822b" if p["name"] == choice else "#3465a4" for p in ordered],
        label="goodput at SLO (p95 first chunk <= 1 s, errors as misses)",
    )
    for i, p in enumerate(ordered):
        if p["error_rate"]:
            ax.text(0.1, i - 0.2, f"errors {p['error_rate']:.0%}", va="center", fontsize=7)
    ax.set_yticks(list(y), names, fontsize=8)
    ax.set_xlabel("requests per second, one GPU (mean audio 8.4 s)")
    ax.set_title(
        f"CosyVoice2-shaped stand-ins in the operator's repository, {device}\n"
        "orange: the operator's choice",
        fontsize=9,
    )
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, nargs="+", help="sweep.py outputs (runs of one build)")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu-sweep.json")
    parser.add_argument(
        "--multi-gpu", action="store_true", help="issue 13: write results/multi-gpu.json instead"
    )
    args = parser.parse_args()
    raws = [json.loads(path.read_text()) for path in args.raw]
    raw = raws[0]
    mixed = one_device(raws)
    if mixed:
        parser.error(mixed)
    slo = float(raw["slo_first_chunk_ms"])
    points = merge_runs([point(p, slo) for r in raws for p in r["points"]])
    if args.multi_gpu:
        out = args.out if args.out != RESULTS / "gpu-sweep.json" else RESULTS / "multi-gpu.json"
        summary = {"device": raw["device"], **multi_gpu(points), "points": points}
        out.write_text(json.dumps(summary, indent=1) + "\n")
        print(json.dumps({k: v for k, v in summary.items() if k != "points"}))
        return 0
    wanted = operator_choice()
    chosen = next((p for p in points if p["params"] == wanted), None)
    best = max(points, key=lambda p: p["mean_goodput_rps"])
    report = {
        "device": raw["device"],
        "source": [str(path) for path in args.raw],
        "code": raw.get("code", "standins"),
        "networks": NETWORKS if raw.get("code") == "ours" else "stand-ins (bench/gpu/standins)",
        "slo_first_chunk_ms": slo,
        "audio_seconds_mean": raw.get("audio_seconds_mean"),
        "step_seconds": raw.get("step_seconds"),
        **{k: raw[k] for k in ("step_requests", "attainment_target", "decision") if k in raw},
        "requests": sum(p["requests"] for p in points),
        "lost_streams": sum(p["lost_streams"] for p in points),
        # issue 32: the points whose goodput rests on a passed step whose attainment's lower
        # bound (Wilson, one-sided 95 %) reaches 95 %: the goodputs that hold
        "goodput_holds_for": [p["name"] for p in points if holds(p)],
        "points": points,
        "best": {
            "name": best["name"],
            "params": best["params"],
            "goodput_rps": best["mean_goodput_rps"],
        },
        "operator_choice": {
            "params": wanted,
            "name": chosen["name"] if chosen else None,
            "goodput_rps": chosen["mean_goodput_rps"] if chosen else None,
            "closed_loop_rps": chosen["closed_loop_rps"] if chosen else None,
            # issue 32: the same rung passes for both (the best's goodput interval holds it)
            "within_best_interval": (
                chosen.get("goodput_rate_rps") == best.get("goodput_rate_rps")
                if chosen and "goodput_rate_rps" in best
                else None
            ),
            "fraction_of_best": (
                round(chosen["mean_goodput_rps"] / best["mean_goodput_rps"], 3)
                if chosen and best["mean_goodput_rps"]
                else None
            ),
        },
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(points, chosen["name"] if chosen else "", args.out.with_suffix(".png"), raw["device"])
    for p in sorted(points, key=lambda p: -p["mean_goodput_rps"]):
        print(
            f"{p['name']:32} goodput {p['goodput_rps']:5.2f}/s {p['repeat_goodput_rps']}  capacity "
            f"{p['closed_loop_rps'] or 0:5.2f}/s  p95 first {p['p95_first_chunk_ms']} ms  "
            f"lost {p['lost_streams']}/{p['requests']}"
        )
    print("operator choice:", json.dumps(report["operator_choice"]))
    if any("decisive" in p for p in points):
        print(markdown(points))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
