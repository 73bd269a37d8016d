"""Issue 10's benchmark at full size: `cosyvoice-operator sim`'s default experiment (the
conversation trace split in time, a synthesized 24-hour day, a burst, a step, a ramp and a
Prometheus outage; 3 seeds; every sweep), written to bench/results/sim.{json,txt,md,png}.

    .venv/bin/python bench/sim.py                      # ~70 CPU-minutes: use many cores
    .venv/bin/python bench/sim.py --small --seeds 1    # the CI size, seconds
    .venv/bin/python bench/sim.py --reuse bench/results/sim.json   # baselines' runs kept
    .venv/bin/python bench/sim.py --sensitivity        # issue 22 item 7, to sim-sensitivity.*
    .venv/bin/python bench/sim.py --pod H200 --slo 2   # the measured pod, to results/sim-h200/

``--rerun-slo`` reuses every run but our SLO-sizing points' (the baselines' and our
target-tracking points' code unchanged), and the clairvoyant bounds of the documents given.

``--reuse`` takes the runs of the baselines whose code did not change (HPA on queue time and
on concurrency, KEDA, KPA, static: ``REUSABLE``) from an earlier ``sim.json`` instead of
simulating them again (they are deterministic per seed: a second run reproduces them); every
other run, ours and the new baselines included, is simulated. Only valid with the default
settings: a changed plant, trace or policy needs a run without it.

Only the standard library and the package are needed to run it (``PYTHONPATH=operator
python3 bench/sim.py --pickle`` on a bigger machine, then ``--from-pickle`` here to write
the files and draw the picture with matplotlib).
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from dataclasses import replace
from pathlib import Path

from cosyvoice_operator.api import pod_profiles
from cosyvoice_operator.devtools.sim import experiment as ex
from cosyvoice_operator.devtools.sim import oracle, report
from cosyvoice_operator.devtools.sim.command import default_trace
from cosyvoice_operator.devtools.sim.engine import SimConfig
from cosyvoice_operator.devtools.sim.plant import ROUND_ROBIN, ROUTINGS, ServiceModel
from cosyvoice_operator.devtools.sim.policies import POLICIES

RESULTS = Path(__file__).resolve().parent / "results"
REUSABLE = ("hpa", "hpa-concurrency", "keda", "kpa", "static")
# Issue 22, item 7: each variation of the default settings, trained and evaluated on the
# conversation trace's halves (the full sweep, as the default experiment).
VARIATIONS: tuple[tuple[str, dict[str, float]], ...] = (
    ("cold start 60 s", {"cold_start_s": 60.0}),
    ("cold start 180 s (default)", {}),
    ("cold start 600 s", {"cold_start_s": 600.0}),
    # Prometheus' rate() needs two samples in its range: with a 60 s scrape, a 240 s range
    # (4 scrapes, the usual advice); a 60 s range would hold no rate at all.
    ("scrape 60 s, rate window 240 s", {"scrape_interval_s": 60.0, "rate_window_s": 240.0}),
    ("load x1", {"multiplier": 1.0}),
    ("load x20", {"multiplier": 20.0}),
)


def write(result: ex.Result, out: Path, elapsed: float | None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = report.to_json(result)
    if elapsed is not None:
        document["summary"]["elapsed_s"] = round(elapsed, 1)
    (out / "sim.json").write_text(json.dumps(document, indent=None, separators=(",", ":")))
    text = report.table(result)
    (out / "sim.txt").write_text(text + "\n")
    (out / "sim.md").write_text(report.markdown(result) + "\n")
    print(text)
    try:
        from cosyvoice_operator.devtools.sim.plot import PlotError, draw

        draw(result, out / "sim.png")
    except PlotError as exc:
        print(f"no plot: {exc}", file=sys.stderr)


def pod_config(config: SimConfig, args: argparse.Namespace) -> SimConfig:
    """The experiment's configuration with ``--pod``'s profile and ``--slo`` (exits with the
    reason when the pod's busy first chunk leaves the SLO no wait)."""
    try:
        service = ServiceModel.for_pod(pod_profiles.named(args.pod))
    except KeyError as exc:
        raise SystemExit(f"--pod {args.pod}: {exc.args[0]}") from None
    try:
        service.slo_sizing(args.slo)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return replace(config, service=service, slo_s=args.slo)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(default_trace()))
    parser.add_argument("--multiplier", type=float, default=5.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", type=Path, help="default results/ (L20), results/sim-POD/")
    parser.add_argument(
        "--pod", default="L20", help="the pod simulated: L20, or a measured one (api/pod_profiles)"
    )
    parser.add_argument("--slo", type=float, default=1.5, help="first audio SLO, seconds")
    parser.add_argument("--pickle", action="store_true", help="also write sim.pkl (the Result)")
    parser.add_argument("--from-pickle", type=Path, help="write the files from a saved Result")
    parser.add_argument(
        "--reuse", type=Path, action="append", help="an earlier sim.json: baselines' runs kept"
    )
    parser.add_argument(
        "--reuse-all", action="store_true", help="reuse every policy's runs (same code only)"
    )
    parser.add_argument(
        "--rerun-slo",
        action="store_true",
        help="as --reuse-all, but our SLO-sizing points run again (their code changed)",
    )
    parser.add_argument("--evals", default="", help="comma-separated evaluation traces to keep")
    parser.add_argument("--log", action="store_true", help="a line per run on stderr (jobs 1)")
    parser.add_argument("--sensitivity", action="store_true", help="issue 22 item 7 instead")
    parser.add_argument(
        "--routing",
        choices=ROUTINGS,
        default=ROUND_ROBIN,
        help="how the plant spreads requests (least-loaded: a what-if, to sim-least-loaded/)",
    )
    parser.add_argument(
        "--no-bounds", action="store_true", help="skip the clairvoyant bounds (the costly part)"
    )
    args = parser.parse_args()
    if args.out is None:  # results/, results/sim-h200/, results/sim-least-loaded/ ...
        parts = ([] if args.pod == "L20" else [args.pod.lower()]) + (
            [] if args.routing == ROUND_ROBIN else [args.routing]
        )
        args.out = RESULTS / "-".join(["sim", *parts]) if parts else RESULTS
    if args.sensitivity:
        return sensitivity(args)
    if args.from_pickle:
        saved = pickle.loads(args.from_pickle.read_bytes())
        write(saved["result"], args.out, saved["elapsed"])
        return 0
    exp = ex.default_experiment(args.trace, args.multiplier, args.seeds, args.small)
    config = replace(pod_config(exp.config, args), routing=args.routing)
    exp = replace(exp, jobs=args.jobs, log=args.log, config=config)
    if args.evals:
        keep = args.evals.split(",")
        exp = replace(exp, evals=tuple(r for r in exp.evals if r.name in keep))
    started = time.monotonic()
    kept = POLICIES if args.reuse_all or args.rerun_slo else REUSABLE
    reuse: ex.Reuse = {}
    known: list[oracle.Bound] = []
    for earlier in args.reuse or []:
        document = json.loads(earlier.read_text())
        reuse.update(ex.reusable(document, kept))
        known += oracle.bounds_from_json(document)  # the bounds depend on no policy
    if args.rerun_slo:  # our SLO points (the keys with slo_ms) are simulated again
        reuse = {k: v for k, v in reuse.items() if not (k[2] == "cosyvoice" and "slo_ms=" in k[3])}
    exp = replace(exp, known_bounds=tuple(known), bounds=exp.bounds and not args.no_bounds)
    result = ex.run_experiment(exp, timelines=True, reuse=reuse)
    elapsed = time.monotonic() - started
    if args.pickle:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sim.pkl").write_bytes(pickle.dumps({"result": result, "elapsed": elapsed}))
    write(result, args.out, elapsed)
    print(f"{len(result.runs)} runs in {elapsed:.0f} s", file=sys.stderr)
    return 0


def sensitivity(args: argparse.Namespace) -> int:
    """Each variation: train and select on the conversation trace's first half, evaluate on
    its second; the verdicts and our points to sim-sensitivity.{json,md}."""
    started = time.monotonic()
    documents: dict[str, object] = {}
    lines: list[str] = []
    for label, change in VARIATIONS:
        multiplier = change.get("multiplier", args.multiplier)
        exp = ex.default_experiment(args.trace, multiplier, args.seeds, args.small)
        config = pod_config(exp.config, args)
        if "cold_start_s" in change:
            config = replace(config, cold_start_s=change["cold_start_s"])
        if "scrape_interval_s" in change:
            prom = replace(
                config.prometheus,
                scrape_interval_s=change["scrape_interval_s"],
                rate_window_s=change.get("rate_window_s", config.prometheus.rate_window_s),
            )
            config = replace(config, prometheus=prom)
        exp = replace(exp, evals=exp.evals[:1], config=config, jobs=args.jobs)
        result = ex.run_experiment(exp)
        documents[label] = report.to_json(result)["summary"]
        lines += [f"### {label}", "", report.markdown(result), ""]
        print(f"{label}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sim-sensitivity.json").write_text(json.dumps(documents, indent=1))
    (args.out / "sim-sensitivity.md").write_text("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
