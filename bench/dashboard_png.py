"""The chart's Grafana dashboard drawn with matplotlib, from Prometheus' answers to the
dashboard's own queries (a picture of what users get; Grafana itself is not run here).

tests/cluster/test_monitoring.py runs a real operator, real CPU Tritons under load and a
real Prometheus, asks Prometheus each panel's queries over the run (query_range) and calls
:func:`draw_panels`; with COSYVOICE_DASHBOARD_PNG=bench/results/dashboard.png the picture is
kept there:

    COSYVOICE_TEST_CLUSTER=obs COSYVOICE_DASHBOARD_PNG=bench/results/dashboard.png \\
        .venv/bin/python -m pytest tests/cluster/test_monitoring.py -k real_run
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Grafana units of the dashboard's panels -> (axis label, scale to apply)
UNITS = {
    "s": ("seconds", 1.0),
    "reqps": ("requests/s", 1.0),
    "ops": ("per second", 1.0),
    "short": ("", 1.0),
    "percentunit": ("%", 100.0),
}


@dataclass
class Series:
    legend: str
    points: list[tuple[float, float]]  # (seconds since the start of the run, value)


@dataclass
class Panel:
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)


def draw_panels(panels: Sequence[Panel], out: Path, title: str, columns: int = 4) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 3.1 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        label, scale = UNITS.get(panel.unit, (panel.unit, 1.0))
        drawn = 0
        for s in panel.series:
            finite = [(t, v * scale) for t, v in s.points if math.isfinite(v)]
            if not finite:
                continue
            ax.plot([t for t, _ in finite], [v for _, v in finite], label=s.legend, lw=1.4)
            drawn += 1
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=6, loc="upper left")
        else:
            ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes,
                    color="grey")  # fmt: skip
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run", fontsize=8)
    fig.suptitle(title, fontsize=13)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
