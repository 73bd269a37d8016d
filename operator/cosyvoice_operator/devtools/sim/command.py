"""``cosyvoice-operator sim``: the autoscaling benchmark from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from cosyvoice_operator.api import pod_profiles
from cosyvoice_operator.devtools.sim.plant import (
    ROUND_ROBIN,
    ROUTINGS,
    SPREAD_RANDOM,
    SPREADS,
    RouterModel,
    ServiceModel,
)

DEFAULT_TRACE_ENV = "COSYVOICE_SIM_TRACE"


# The Azure LLM inference trace 2023 (conversation), shipped in the package, gzipped; CC-BY-4.0,
# Patel et al., "Splitwise", ISCA 2024: data/README.md has the attribution and the source.
PACKAGED_TRACE = Path(__file__).resolve().parent / "data" / "azure_llm_2023_conv.csv.gz"


def default_trace() -> Path:
    """The conversation trace: ``$COSYVOICE_SIM_TRACE``, else the copy in the package."""
    if os.environ.get(DEFAULT_TRACE_ENV):
        return Path(os.environ[DEFAULT_TRACE_ENV])
    return PACKAGED_TRACE


def _positive(kind: type[float] | type[int]) -> Callable[[str], float | int]:
    def parse(text: str) -> float | int:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def _outage(text: str) -> tuple[float, float]:
    try:
        start, length = (float(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected START:SECONDS, e.g. 600:300 (seconds from the trace's start)"
        ) from None
    if start < 0 or length <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: START must be >= 0 and SECONDS > 0")
    return start, length


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "sim",
        help="trace-driven autoscaling benchmark: our policy against HPA, KEDA, KPA, static",
        description=(
            "Simulate a CosyVoice fleet on Triton under a traffic trace and compare autoscaling "
            "policies. Each baseline's parameters are chosen on the training trace (the cheapest "
            "reaching 99% SLO attainment), then every policy runs unchanged on each evaluation "
            "trace. With no --train/--eval: the conversation trace split in time (first half "
            "training), plus a synthesized 24-hour day, a burst, a step, a ramp and a Prometheus "
            "outage built from its second half."
        ),
    )
    p.add_argument("--train", metavar="CSV", help="training trace (TIMESTAMP + size column)")
    p.add_argument("--eval", action="append", metavar="CSV", help="evaluation trace (repeatable)")
    p.add_argument("--json", action="store_true", help="print every run as JSON")
    p.add_argument("--plot", metavar="PNG", help="draw load, latency and replicas over time")
    p.add_argument(
        "--size-column", default="GeneratedTokens", help="the size column (default %(default)s)"
    )
    p.add_argument(
        "--size-per-second",
        type=_positive(float),
        default=25.0,
        help="size units per second of audio (default %(default)s: 25 speech tokens/s)",
    )
    p.add_argument(
        "--multiplier",
        type=_positive(float),
        default=5.0,
        help="load multiplier (default %(default)s: the conversation trace needs ~25 pods)",
    )
    p.add_argument("--seeds", type=_positive(int), default=3, help="seeds (default %(default)s)")
    p.add_argument(
        "--slo",
        type=_positive(float),
        default=1.5,
        help="first-audio SLO in seconds (default %(default)s)",
    )
    p.add_argument(
        "--cold-start",
        type=_positive(float),
        default=180.0,
        help="seconds from pod creation to Ready (default %(default)s)",
    )
    p.add_argument("--scrape-interval", type=_positive(float), default=15.0)
    p.add_argument("--rate-window", type=_positive(float), default=60.0)
    p.add_argument(
        "--metrics-lag",
        type=float,
        default=0.0,
        help="extra seconds before a scrape is visible to queries (default 0)",
    )
    p.add_argument(
        "--outage",
        action="append",
        type=_outage,
        metavar="START:SECONDS",
        help="a Prometheus outage on the evaluation traces given with --eval (repeatable)",
    )
    p.add_argument(
        "--pod",
        default="L20",
        metavar="GPU",
        help="the pod profile simulated: L20 (upstream's published benchmark, the default) or "
        "a GPU family this project's GPU sweep measured (api/pod_profiles.json: "
        f"{', '.join(sorted(pod_profiles.measured())) or 'none yet'}); the options below "
        "override its figures",
    )
    p.add_argument("--slots", type=_positive(int), help="streams per replica (L20: 4)")
    p.add_argument("--rtf", type=_positive(float), help="per-stream RTF (L20: 0.37)")
    p.add_argument("--overhead", type=float, help="seconds per request (L20: 0.05)")
    p.add_argument("--first-chunk", type=_positive(float), help="seconds at 1 stream (L20: 0.22)")
    p.add_argument(
        "--first-chunk-per-stream", type=float, help="seconds per other stream (L20: 0.296)"
    )
    p.add_argument(
        "--routing",
        choices=ROUTINGS,
        default=ROUND_ROBIN,
        help="how streams reach the pods (default %(default)s: a Service; router: the "
        "operator's HAProxy, one FIFO over the fleet's slots; p2c: Envoy's LeastRequest)",
    )
    p.add_argument(
        "--router-replicas", type=_positive(int), default=1, help="router replicas (default 1)"
    )
    p.add_argument(
        "--router-spread",
        choices=SPREADS,
        default=SPREAD_RANDOM,
        help="how streams reach the router replicas (default %(default)s)",
    )
    p.add_argument(
        "--queue-timeout",
        type=float,
        default=0.0,
        help="the router's timeout queue in seconds (default 0: as the operator derives it, "
        "the SLO's wait budget: first audio minus the pod's busy first chunk)",
    )
    p.add_argument("--jobs", type=int, default=0, help="worker processes (0: every CPU)")
    p.add_argument(
        "--small",
        action="store_true",
        help="a small sweep, a 3-hour day, fewer scenarios (for CI)",
    )
    p.set_defaults(func=run)


def service_model(args: argparse.Namespace) -> ServiceModel:
    """The pod of ``--pod`` with the figures given on the command line in place of its own.
    Raises ValueError for a GPU family without a profile."""
    try:
        model = ServiceModel.for_pod(pod_profiles.named(args.pod))
    except KeyError as exc:
        raise ValueError(f"--pod {args.pod}: {exc.args[0]}") from None
    given = {
        "slots": args.slots,
        "rtf": args.rtf,
        "overhead_s": args.overhead,
        "first_chunk_s": args.first_chunk,
        "first_chunk_per_stream_s": args.first_chunk_per_stream,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return model
    model = replace(model, **given)
    busy = model.first_chunk_s + model.first_chunk_per_stream_s * (model.slots - 1)
    return replace(
        model,
        first_chunk_busy_ms=round(1000 * busy),
        source=f"{model.source}, with {', '.join(f'{k}={v}' for k, v in given.items())}",
    )


def run(args: argparse.Namespace) -> int:
    from cosyvoice_operator.devtools.sim import experiment as ex
    from cosyvoice_operator.devtools.sim import report
    from cosyvoice_operator.devtools.sim.engine import SimConfig
    from cosyvoice_operator.devtools.sim.plant import PrometheusModel
    from cosyvoice_operator.devtools.sim.trace import TraceError

    if bool(args.train) != bool(args.eval):
        print("error: --train and --eval go together (or give neither)", file=sys.stderr)
        return 2
    try:
        if args.train:
            for path in [args.train, *args.eval]:
                if not Path(path).is_file():
                    raise TraceError(f"{path}: no such file")
            exp = ex.files_experiment(
                args.train,
                args.eval,
                args.multiplier,
                args.seeds,
                args.size_column,
                args.size_per_second,
                tuple(args.outage or ()),
            )
        else:
            trace = default_trace()
            if not trace.is_file():
                where = (
                    f"${DEFAULT_TRACE_ENV} names {trace}, which is not a file"
                    if os.environ.get(DEFAULT_TRACE_ENV)
                    else f"the packaged trace {trace} is missing (reinstall the package)"
                )
                raise TraceError(
                    f"{where}; the default trace is the Azure LLM inference trace 2023, "
                    "conversation service (CC-BY-4.0, Patel et al., Splitwise, ISCA 2024): "
                    "https://github.com/Azure/AzurePublicDataset, "
                    f"data/AzureLLMInferenceTrace_conv.csv; point {DEFAULT_TRACE_ENV} at it, or "
                    "give --train and --eval"
                )
            exp = ex.default_experiment(str(trace), args.multiplier, args.seeds, args.small)
        if args.small:
            exp = replace(exp, sweep=ex.SMALL_SWEEP)
        config = SimConfig(
            service=service_model(args),
            prometheus=PrometheusModel(args.scrape_interval, args.rate_window, args.metrics_lag),
            cold_start_s=args.cold_start,
            slo_s=args.slo,
            routing=args.routing,
            router=RouterModel(args.router_replicas, args.router_spread, args.queue_timeout),
        )
        exp = replace(exp, config=config, jobs=args.jobs)
        # Read every trace once here, so that a bad file is one clear line, not a worker's
        # traceback.
        for recipe in [exp.train, *exp.evals]:
            recipe.build(exp.seeds[0])
        config.service.slo_sizing(config.slo_s)  # a pod the SLO cannot hold: one clear line
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = ex.run_experiment(exp, timelines=bool(args.plot))
    if args.json:
        print(json.dumps(report.to_json(result), indent=1))
    else:
        print(report.table(result))
    if args.plot:
        from cosyvoice_operator.devtools.sim.plot import PlotError, draw

        try:
            draw(result, args.plot)
        except PlotError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
