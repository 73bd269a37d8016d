"""Issue 10's benchmark at full size: `cosyvoice-operator sim`'s default experiment (the
conversation trace split in time, a synthesized 24-hour day, a burst, a step, a ramp and a
Prometheus outage; 3 seeds; every sweep), written to bench/results/sim.{json,txt,md,png}.

    .venv/bin/python bench/sim.py                      # ~70 CPU-minutes: use many cores
    .venv/bin/python bench/sim.py --small --seeds 1    # the CI size, seconds

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

from cosyvoice_operator.devtools.sim import experiment as ex
from cosyvoice_operator.devtools.sim import report
from cosyvoice_operator.devtools.sim.command import default_trace

RESULTS = Path(__file__).resolve().parent / "results"


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(default_trace()))
    parser.add_argument("--multiplier", type=float, default=5.0)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--pickle", action="store_true", help="also write sim.pkl (the Result)")
    parser.add_argument("--from-pickle", type=Path, help="write the files from a saved Result")
    args = parser.parse_args()
    if args.from_pickle:
        saved = pickle.loads(args.from_pickle.read_bytes())
        write(saved["result"], args.out, saved["elapsed"])
        return 0
    exp = ex.default_experiment(args.trace, args.multiplier, args.seeds, args.small)
    exp = replace(exp, jobs=args.jobs)
    started = time.monotonic()
    result = ex.run_experiment(exp, timelines=True)
    elapsed = time.monotonic() - started
    if args.pickle:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sim.pkl").write_bytes(pickle.dumps({"result": result, "elapsed": elapsed}))
    write(result, args.out, elapsed)
    print(f"{len(result.runs)} runs in {elapsed:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
