"""A re-run of sweep points, each run more than once, set against the sweep of record.

    .venv/bin/python bench/gpu/repro.py bench/results/gpu-runs/run4-repro-two-points.json

Reads a ``sweep.py`` output whose ``--points`` named each point several times and writes
``results/gpu-sweep-repro.json`` and ``results/gpu-sweep-repro.md``: per point and run the
closed-loop capacity, the goodput at SLO (``report.point``'s rule), the p95 first chunk at
that load, and every load step's requests split into lost streams (failed requests) and
latency misses (completed, first chunk over the SLO); per point the spread between runs and
the sweep of record's numbers (``results/gpu-sweep.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report

RESULTS = Path(__file__).resolve().parents[1] / "results"
LOST_GOAL = 0.005  # issue 20: fewer than 0.5% of the streams lost at every step


def steps(raw: dict[str, Any], step_seconds: float) -> list[dict[str, Any]]:
    out = []
    for s in raw.get("steps", []):
        good = round(s["good_rps"] * step_seconds)
        out.append(
            {
                "rate_rps": s["rate_rps"],
                "requests": s["requests"],
                "lost": s["errors"],
                "late": s["requests"] - s["errors"] - good,
                "good": good,
                "p50_first_chunk_ms": s["p50_first_chunk_ms"],
                "p95_first_chunk_ms": s["p95_first_chunk_ms"],
                "gpu_utilization_mean": s["gpu_utilization_mean"],
            }
        )
    return out


def spread(values: list[float]) -> dict[str, Any]:
    low, high = min(values), max(values)
    mean = sum(values) / len(values)
    return {
        "min": low,
        "max": high,
        "relative": round((high - low) / mean, 3) if mean else None,
    }


def summarize(raw: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    slo = float(raw["slo_first_chunk_ms"])
    step_seconds = float(raw["step_seconds"])
    recorded = {p["name"]: p for p in record.get("points", [])}
    points: dict[str, dict[str, Any]] = {}
    for entry in raw["points"]:
        scored = report.point(entry, slo)
        run_steps = steps(entry, step_seconds)
        requests = sum(s["requests"] for s in run_steps)
        lost = sum(s["lost"] for s in run_steps) + int(entry.get("closed_loop_errors") or 0)
        run = {
            "run": entry.get("repeat"),
            "capacity_rps": entry.get("closed_loop_rps"),
            "goodput_rps": scored["goodput_rps"],
            "p95_first_chunk_ms": scored["p95_first_chunk_ms"],
            "closed_loop_p95_first_chunk_ms": entry.get("closed_loop_p95_first_chunk_ms"),
            "open_loop_requests": requests,
            "closed_loop_errors": entry.get("closed_loop_errors"),
            "lost_streams": lost,
            "worst_step_lost_fraction": max(
                (s["lost"] / s["requests"] for s in run_steps if s["requests"]), default=None
            ),
            "steps": run_steps,
            **({"error": entry["error"]} if "error" in entry else {}),
        }
        point = points.setdefault(entry["name"], {"params": entry["params"], "runs": []})
        point["runs"].append(run)
    for name, point in points.items():
        runs = point["runs"]
        point["goodput_rps"] = spread([r["goodput_rps"] for r in runs])
        point["capacity_rps"] = spread([r["capacity_rps"] or 0.0 for r in runs])
        point["lost_streams"] = sum(r["lost_streams"] for r in runs)
        point["lost_below_goal_at_every_step"] = all(
            s["lost"] < LOST_GOAL * s["requests"] for r in runs for s in r["steps"]
        )
        old = recorded.get(name)
        point["record"] = (
            {
                "goodput_rps": old["goodput_rps"],
                "capacity_rps": old["closed_loop_rps"],
                "p95_first_chunk_ms": old["p95_first_chunk_ms"],
                "error_rate": old["error_rate"],
            }
            if old
            else None
        )
    return {
        "device": raw["device"],
        "slo_first_chunk_ms": slo,
        "step_seconds": step_seconds,
        "audio_seconds_mean": raw.get("audio_seconds_mean"),
        "record": record.get("source"),
        "points": points,
    }


def markdown(summary: dict[str, Any], source: str) -> str:
    lines = [
        "# GPU sweep: two points re-run twice (issue 20, item 1)",
        "",
        f"{summary['device']}; raw output `{source}`; SLO p95 first chunk <= "
        f"{summary['slo_first_chunk_ms']:.0f} ms; open-loop steps of "
        f"{summary['step_seconds']:.0f} s at 0.6, 0.8, 0.95, 1.1 x capacity until one misses.",
        "",
        "| point | run | capacity req/s (closed loop) | goodput at SLO req/s | "
        "p95 first chunk there | open-loop requests | lost streams | "
        "latency misses per step (late/requests) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, point in summary["points"].items():
        for run in point["runs"]:
            late = ", ".join(f"{s['late']}/{s['requests']}" for s in run["steps"])
            lines.append(
                f"| `{name}` | {run['run']} | {run['capacity_rps']} | {run['goodput_rps']} | "
                f"{run['p95_first_chunk_ms']} ms | {run['open_loop_requests']} | "
                f"{run['lost_streams']} | {late} |"
            )
        old = point["record"]
        if old:
            lines.append(
                f"| `{name}` | record | {old['capacity_rps']} | {old['goodput_rps']} | "
                f"{old['p95_first_chunk_ms']} ms | - | {old['error_rate']:.1%} of requests | - |"
            )
    lines += [
        "",
        "Lost streams count the open-loop steps' and the closed-loop probe's failed requests.",
        "Spread between the runs (max - min, over their mean), and the sweep of record:",
        "",
    ]
    for name, point in summary["points"].items():
        good, cap, old = point["goodput_rps"], point["capacity_rps"], point["record"]
        line = (
            f"- `{name}`: goodput {good['min']}-{good['max']} ({good['relative']:.1%}), "
            f"capacity {cap['min']}-{cap['max']} ({cap['relative']:.1%}); lost streams "
            f"{point['lost_streams']}"
        )
        if old:
            line += (
                f"; recorded goodput {old['goodput_rps']} "
                f"({good['min'] / old['goodput_rps'] - 1:+.0%} to "
                f"{good['max'] / old['goodput_rps'] - 1:+.0%}), capacity {old['capacity_rps']} "
                f"({cap['min'] / old['capacity_rps'] - 1:+.0%} to "
                f"{cap['max'] / old['capacity_rps'] - 1:+.0%})"
            )
        lines.append(line)
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="a sweep.py output")
    parser.add_argument("--record", type=Path, default=RESULTS / "gpu-sweep.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu-sweep-repro.json")
    args = parser.parse_args()
    raw = json.loads(args.raw.read_text())
    summary = summarize(raw, json.loads(args.record.read_text()))
    summary["source"] = str(args.raw)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    text = markdown(summary, str(args.raw))
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
