"""Issue 10's calibration: the simulator's per-replica model (streams, RTF, overhead) measured
on one real CPU Triton (CosyVoice3's twin), and the first-audio p50/p95 of the same Poisson
arrivals, real and simulated, at several loads. Writes bench/results/sim_calibration.json.

    .venv/bin/python bench/sim_calibration.py      # ~4 min
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.closed_loop.calibration import calibrate  # noqa: E402

RESULTS = REPO / "bench" / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--service-seconds", type=float, default=1.0)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.8, 1.2, 1.6])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=RESULTS / "sim_calibration.json")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sim-calibration-") as work:
        result = calibrate(
            Path(work), args.service_seconds, rates=tuple(args.rates), seconds=args.seconds
        )
    doc = result.to_json()
    doc["machine"] = {
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    doc["elapsed_s"] = round(time.monotonic() - started, 1)
    doc["date"] = time.strftime("%Y-%m-%d")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for a in result.agreements:
        print(
            f"rate {a.rate_per_s:g}/s ({a.requests} requests): p95 real {a.real_p95_s:.3f} s, "
            f"sim {a.sim_p95_s:.3f} s ({100 * a.gap:+.1f} %); p50 real {a.real_p50_s:.3f}, "
            f"sim {a.sim_p50_s:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
