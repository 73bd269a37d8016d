"""The benchmark's picture: per evaluation trace, load, first-audio p95 and replicas over
time for each policy as tuned on the training trace (seed 0). Needs matplotlib (the
``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosyvoice_operator.devtools.sim.experiment import Result

COLORS = {
    "cosyvoice": "#d62728",
    "hpa": "#1f77b4",
    "hpa-concurrency": "#17becf",
    "keda": "#9467bd",
    "keda-fallback": "#e377c2",
    "llmd": "#2ca02c",
    "kpa": "#ff7f0e",
    "static": "#7f7f7f",
}


class PlotError(RuntimeError):
    pass


def draw(result: Result, path: str | Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(
            "matplotlib is not installed: pip install 'cosyvoice-operator[plot]'"
        ) from None
    traces = [r.name for r in result.experiment.evals if r.sweep]  # a week is not drawn
    if not traces:
        raise PlotError("no evaluation trace to draw (the week and the deep day are not drawn)")
    slo = result.experiment.config.slo_s
    fig, axes = plt.subplots(3, len(traces), figsize=(4.2 * len(traces), 8.5), squeeze=False)
    for col, trace in enumerate(traces):
        load_ax: Any = axes[0][col]
        lat_ax: Any = axes[1][col]
        rep_ax: Any = axes[2][col]
        drawn_load = False
        for policy, color in COLORS.items():
            timeline = result.timelines.get((trace, policy))
            if not timeline:
                continue
            hours = [m.t / 3600.0 for m in timeline]
            if not drawn_load:
                load_ax.plot(hours, [m.arrivals for m in timeline], color="black", lw=0.8)
                drawn_load = True
            lat_ax.plot(hours, [m.p95_s for m in timeline], color=color, lw=0.8, label=policy)
            rep_ax.plot(hours, [m.replicas for m in timeline], color=color, lw=0.8, label=policy)
        for outage in _outages(result, trace):
            for ax in (load_ax, lat_ax, rep_ax):
                ax.axvspan(outage[0] / 3600.0, outage[1] / 3600.0, color="#ffdddd", lw=0)
        load_ax.set_title(trace, fontsize=9)
        lat_ax.axhline(slo, color="black", ls="--", lw=0.6)
        lat_ax.set_yscale("log")
        rep_ax.set_yscale("log")  # the HPA on queue time reaches its maximum; the rest tens
        if col == 0:
            load_ax.set_ylabel("arrivals / min")
            lat_ax.set_ylabel("first-audio p95 / min (s)")
            rep_ax.set_ylabel("replicas (log)")
        rep_ax.set_xlabel("hours")
    axes[2][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(
        "Policies as tuned on the training trace (seed 0); dashed: the first-audio SLO",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _outages(result: Result, trace: str) -> tuple[tuple[float, float], ...]:
    for recipe in result.experiment.evals:
        if recipe.name == trace:
            return tuple((a, a + length) for a, length in recipe.outages)
    return ()
