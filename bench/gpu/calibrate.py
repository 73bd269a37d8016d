"""Issue 20, item 6: the simulator's per-pod model fitted to the H200 sweep, and checked
against it. Writes ``bench/results/sim-calibration-h200.json``.

    .venv/bin/python bench/gpu/calibrate.py [--sweep bench/results/gpu-sweep.json] [--point NAME]

The fit (one pod on one H200, the point the operator renders by default unless ``--point``):

- ``slots``: the point's orchestrator instances (one stream each);
- ``first_chunk_s``: the p50 first chunk with one stream (the sweep's concurrency profile);
- ``first_chunk_per_stream_s``: the least-squares slope of the p50 first chunk over the other
  streams in flight (profile at 1, 4 and 16 streams, through the one-stream point);
- ``rtf``: seconds a stream holds its slot per second of audio, the p50 RTF per stream with
  every profiled stream busy (the plant's RTF does not fall with load: conservative below it);
- ``overhead_s``: 0 (the RTF is measured on whole requests).

The check is not circular: the sweep's open-loop steps (Poisson arrivals at a fixed rate for
``step_seconds``, from an idle pod, audio lengths from the conversation trace) are replayed
through the simulator's ``Plant`` with the fitted model, many seeds per step, and the measured
p95 first chunk is compared with the simulated p95's median and 10-90 % range. Steps with
lost streams are left out (the plant loses none).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from cosyvoice_operator.api import pod_profiles
from cosyvoice_operator.api.gpus import family
from cosyvoice_operator.devtools.sim.engine import quantile
from cosyvoice_operator.devtools.sim.plant import Plant, ServiceModel

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
sys.path.insert(0, str(HERE))
import loadgen  # noqa: E402

TRACE = HERE.parents[2] / "shared" / "traces" / "azure_llm_2023_conv.csv"


def fit(point: dict[str, Any]) -> ServiceModel:
    profile = {int(k): v for k, v in point["concurrency_profile"].items()}
    slots = int(point["params"]["orchestratorPerGpu"]) * int(point["params"].get("gpus", 1))
    one = profile[1]["p50_first_chunk_ms"] / 1000
    others = [(k - 1, v["p50_first_chunk_ms"] / 1000 - one) for k, v in profile.items() if k > 1]
    slope = sum(x * y for x, y in others) / sum(x * x for x, _ in others) if others else 0.0
    busiest = max(profile)
    return ServiceModel(
        slots=slots,
        rtf=round(float(profile[busiest]["p50_rtf"]), 4),
        overhead_s=0.0,
        first_chunk_s=round(one, 4),
        first_chunk_per_stream_s=round(max(0.0, slope), 5),
    )


def busy_first_chunk_ms(point: dict[str, Any], model: ServiceModel) -> int:
    """The first chunk with every slot busy: measured where the profile ran that many streams,
    else the fit's line at ``slots`` streams."""
    profile = {int(k): v for k, v in point["concurrency_profile"].items()}
    if model.slots in profile:
        return round(profile[model.slots]["p50_first_chunk_ms"])
    line = model.first_chunk_s + model.first_chunk_per_stream_s * (model.slots - 1)
    return round(1000 * line)


def write_profile(path: Path, gpu: str, model: ServiceModel, busy_ms: int, source: str) -> None:
    """Record the fit as the GPU family's pod profile (``api/pod_profiles.py``)."""
    doc = json.loads(path.read_text()) if path.is_file() else {"profiles": {}}
    doc["profiles"][gpu] = {
        "slots": model.slots,
        "rtf": model.rtf,
        "overhead_s": model.overhead_s,
        "first_chunk_s": model.first_chunk_s,
        "first_chunk_per_stream_s": model.first_chunk_per_stream_s,
        "first_chunk_busy_ms": busy_ms,
        "source": source,
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def simulate_step(
    model: ServiceModel, rate: float, seconds: float, lengths: list[float], seed: int
) -> float:
    """The p95 first audio of one open-loop step from an idle pod (seconds)."""
    rng = random.Random(seed)
    plant = Plant(model, cold_start_s=0.0, initial_ready=1, give_up_s=1e9)
    plant.tick(0.0)
    t, firsts = rng.expovariate(rate), []
    while t < seconds:
        firsts.append(plant.dispatch(t, rng.choice(lengths)))
        t += rng.expovariate(rate)
    return quantile(sorted(firsts), 0.95)


def simulate_requests(
    model: ServiceModel, rate: float, count: int, lengths: list[float], seed: int, slo_s: float
) -> tuple[float, float]:
    """The p95 first audio (seconds) and the share within ``slo_s`` of ``count`` Poisson
    arrivals at ``rate`` on an idle pod: one of issue 32's steps, simulated."""
    rng = random.Random(seed)
    plant = Plant(model, cold_start_s=0.0, initial_ready=1, give_up_s=1e9)
    plant.tick(0.0)
    t, firsts = 0.0, []
    for _ in range(count):
        t += rng.expovariate(rate)
        firsts.append(plant.dispatch(t, rng.choice(lengths)))
    ranked = sorted(firsts)
    return quantile(ranked, 0.95), sum(1 for f in firsts if f <= slo_s) / len(firsts)


def agreements(
    point: dict[str, Any],
    model: ServiceModel,
    seconds: float,
    lengths: list[float],
    seeds: int,
    slo_s: float = 1.0,
    least: int = 100,
) -> list[dict[str, Any]]:
    """Each open-loop step (issue 32's: only those of at least ``least`` requests, none
    curtailed) against the simulator's replay of it, ``seeds`` times."""
    rows = []
    for index, step in enumerate(point["steps"]):
        if step["errors"] or not step["requests"] or step.get("p95_first_chunk_ms") is None:
            continue
        counted = "planned_requests" in step
        if counted and (step["requests"] < least or step.get("curtailed")):
            continue
        if counted:
            sims = [
                simulate_requests(
                    model, step["rate_rps"], step["requests"], lengths, 1000 * index + s, slo_s
                )
                for s in range(seeds)
            ]
            p95s = sorted(x for x, _ in sims)
            shares = sorted(y for _, y in sims)
        else:
            p95s = sorted(
                simulate_step(model, step["rate_rps"], seconds, lengths, 1000 * index + s)
                for s in range(seeds)
            )
            shares = []
        real = step["p95_first_chunk_ms"] / 1000
        row = {
            "rate_rps": step["rate_rps"],
            "requests": step["requests"],
            "real_p95_s": round(real, 3),
            "sim_p95_s_median": round(quantile(p95s, 0.5), 3),
            "sim_p95_s_10_90": [round(quantile(p95s, 0.1), 3), round(quantile(p95s, 0.9), 3)],
            "real_within_sim_10_90": quantile(p95s, 0.1) <= real <= quantile(p95s, 0.9),
        }
        if shares:
            attained = step["good_requests"] / step["requests"]
            row |= {
                "real_attainment": round(attained, 4),
                "sim_attainment_10_90": [
                    round(quantile(shares, 0.1), 4),
                    round(quantile(shares, 0.9), 4),
                ],
            }
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=Path, default=RESULTS / "gpu-sweep.json")
    parser.add_argument("--point", default="", help="default: the operator's choice")
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--out", type=Path, default=RESULTS / "sim-calibration-h200.json")
    parser.add_argument(
        "--held-out",
        type=Path,
        help="another sweep's raw or summary file whose runs of the point check the fit too",
    )
    parser.add_argument(
        "--profiles",
        type=Path,
        default=pod_profiles.MEASURED,
        help="the operator's measured pod profiles, updated with this fit (default: %(default)s)",
    )
    args = parser.parse_args()
    sweep = json.loads(args.sweep.read_text())
    name = args.point or sweep["operator_choice"]["name"]
    point = next(p for p in sweep["points"] if p["name"] == name)
    model = fit(point)
    lengths = loadgen.audio_lengths(TRACE)
    seconds = float(sweep.get("step_seconds", 6.0))
    slo_s = float(sweep.get("slo_first_chunk_ms", 1000.0)) / 1000
    rows = agreements(point, model, seconds, lengths, args.seeds, slo_s)
    held_out = []
    if args.held_out:
        other = json.loads(args.held_out.read_text())
        for run in (p for p in other["points"] if p["name"] == name):
            held_out += agreements(run, model, seconds, lengths, args.seeds, slo_s)
    doc = {
        "source": str(args.sweep),
        "device": sweep["device"],
        "point": name,
        "model": model.__dict__,
        "step_seconds": seconds,
        "seeds": args.seeds,
        "agreements": rows,
        "held_out": {"source": str(args.held_out), "agreements": held_out}
        if args.held_out
        else None,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    gpu = family(str(sweep["device"]).split(",")[0].strip().replace(" ", "-"))
    busy = busy_first_chunk_ms(point, model)
    write_profile(
        args.profiles,
        gpu,
        model,
        busy,
        f"this project's GPU sweep on one {gpu} ({args.sweep.name}, point {name}, "
        + (
            f"profile of {min(v['requests'] for v in point['concurrency_profile'].values())}+ "
            "requests per level, "
            if all("requests" in v for v in point["concurrency_profile"].values())
            else ""
        )
        + "fitted by bench/gpu/calibrate.py); the LLM stage a stand-in (Qwen2-0.5B-shaped torch "
        "decoder, CUDA-graph decode, random weights, not TensorRT-LLM), the reference-audio "
        "models stand-ins",
    )
    print(f"{gpu}: first chunk with all {model.slots} slots busy {busy} ms -> {args.profiles}")
    print(json.dumps(doc["model"]))
    for row in rows + held_out:
        print(
            f"rate {row['rate_rps']:.2f}/s ({row['requests']} requests): p95 real "
            f"{row['real_p95_s']:.3f} s, sim {row['sim_p95_s_median']:.3f} s "
            f"(10-90 % {row['sim_p95_s_10_90']})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
