"""What the router costs a stream (issue 30): the time to the first answer of a
``ModelStreamInfer`` stream through the operator's HAProxy router against straight to the pod,
on loopback.

One pod (``router.StandInPod``: grpcio, Triton's ``ModelStreamInfer``, answers at once, so the
figure is the path's, not a model's) on 127.a.b.2 and the router the operator renders
(``render.router.haproxy_config``: gRPC h2 in and out, leastconn, maxconn, the pod found by DNS
SRV) on 127.a.b.1; two client channels, one to each, both opened and warmed first (as a
client's long-lived channel is). Streams are sent one at a time, alternating direct and router
(ABAB: whatever the shared machine does at a moment lands on both), ``--pairs`` pairs per
round, ``--rounds`` rounds. Per stream: from the call to its first response. Reported: each
path's median and range, the per-pair difference (router minus direct) with its median, 10th
and 90th percentiles and range, and each round's median difference (the spread between rounds
says how steady the figure is on this machine). The load average at the start and end is kept.

``--twin``: the pod is a real ``tritonserver`` CPU twin (CosyVoice3, the project's
orchestrator, 0.4 s streams) and the time is to the first audio chunk of a real request (a
2-s reference, 128 KB): the router's cost beside a model's first chunk.

    .venv/bin/python bench/router_overhead.py            # -> bench/results/router-overhead.json
    .venv/bin/python bench/router_overhead.py --twin --rounds 1   # -> router-overhead-twin.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from cosyvoice_operator.devtools.closedloop.router import (
    FleetRouter,
    StandInPod,
    open_stream,
    stream_request,
)

RESULT = Path(__file__).resolve().parent / "results" / "router-overhead.json"
TWIN_RESULT = RESULT.with_name("router-overhead-twin.json")


def first_audio_ms(channel: grpc.Channel, request_id: str, model: str = "cosyvoice3") -> float:
    """To the first response carrying audio of one real request (read to the stream's end)."""
    from cosyvoice_operator.devtools.closedloop.cpu_twin import request_inputs

    request = stream_request(model, request_inputs("Hello from the benchmark."), request_id)
    started = time.perf_counter()
    first = None
    for message in open_stream(channel, request, timeout=60):
        if message.error_message:
            raise RuntimeError(message.error_message)
        response = message.infer_response
        names = [o.name for o in response.outputs]
        audio = "waveform" in names and response.raw_output_contents[names.index("waveform")]
        if first is None and audio:
            first = time.perf_counter()
    if first is None:
        raise RuntimeError("a stream ended without audio")
    return (first - started) * 1000.0


def first_answer_ms(channel: grpc.Channel, request_id: str) -> float:
    started = time.perf_counter()
    call = open_stream(channel, stream_request("tts", [], request_id), timeout=30)
    first = None
    for _ in call:
        if first is None:
            first = time.perf_counter()
    if first is None:
        raise RuntimeError("a stream ended without an answer")
    return (first - started) * 1000.0


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "p10": round(quantile(values, 0.1), 4),
        "p90": round(quantile(values, 0.9), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
        "n": len(values),
    }


def haproxy_version() -> str:
    out = subprocess.run(["haproxy", "-v"], capture_output=True, text=True, check=False).stdout
    return out.splitlines()[0] if out else "unknown"


def twin_spec() -> Any:
    """examples/cosyvoice3.yaml's spec, as the operator parses it."""
    import yaml

    from cosyvoice_operator.api.spec import parse

    example = Path(__file__).resolve().parents[1] / "examples" / "cosyvoice3.yaml"
    return parse(yaml.safe_load(example.read_text())["spec"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=100, help="pairs per round (>= 100)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--twin", action="store_true", help="a tritonserver twin as the pod")
    args = parser.parse_args(argv)
    out: Path = args.out or (TWIN_RESULT if args.twin else RESULT)

    rounds: list[dict[str, Any]] = []
    all_direct: list[float] = []
    all_routed: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="router-overhead-") as tmp,
        contextlib.ExitStack() as stack,
    ):
        fleet = FleetRouter(
            Path(tmp),
            service="bench",
            namespace="bench",
            slots_per_server=64,
            server_slots=2,
            queue_timeout_ms=10000,
        )
        measure: Callable[[grpc.Channel, str], float]
        if args.twin:
            from cosyvoice_operator.devtools.closedloop.harness import PodServers

            servers = PodServers(
                twin_spec(),
                Path(tmp) / "pods",
                Path(tmp) / "targets.json",
                namespace="bench",
                pods=lambda: ["pod-a"],
                service_seconds=0.4,
                addresses=fleet.block,
                directory=fleet.directory,
            )
            stack.enter_context(servers)
            servers.wait_live(["pod-a"], 120)
            address = servers.addresses_of()["pod-a"]
            measure, what = first_audio_ms, "CPU twin tritonserver (CosyVoice3, 0.4 s streams)"
        else:
            pod = StandInPod("pod-a", f"{fleet.block}.2", chunks=1).start()
            stack.callback(pod.stop, 0)
            fleet.directory.set({pod.name: pod.address})
            address = pod.address
            measure, what = first_answer_ms, "router.StandInPod (grpcio; answers at once)"
        load_before = os.getloadavg()
        stack.enter_context(fleet)
        fleet.haproxy.wait_servers({address}, timeout=30)
        direct = stack.enter_context(grpc.insecure_channel(f"{address}:8001"))
        routed = stack.enter_context(grpc.insecure_channel(fleet.grpc))
        for i in range(args.warmup):
            measure(direct, f"w{i}")
            measure(routed, f"w{i}")
        for r in range(args.rounds):
            a, b = [], []
            for i in range(args.pairs):
                a.append(measure(direct, f"a{r}-{i}"))
                b.append(measure(routed, f"b{r}-{i}"))
            diffs = [y - x for x, y in zip(a, b, strict=True)]
            rounds.append(
                {
                    "direct_median_ms": round(statistics.median(a), 4),
                    "router_median_ms": round(statistics.median(b), 4),
                    "added_median_ms": round(statistics.median(diffs), 4),
                }
            )
            all_direct += a
            all_routed += b
        served = sum(fleet.haproxy.view().total.values())
    load_after = os.getloadavg()
    diffs = [y - x for x, y in zip(all_direct, all_routed, strict=True)]
    result = {
        "what": "time to the first answer"
        + (" carrying audio" if args.twin else "")
        + " of a ModelStreamInfer stream, loopback, one stream at a time, direct to the pod "
        "vs through the operator's HAProxy router (ABAB)",
        "haproxy": haproxy_version(),
        "grpcio": grpc.__version__,
        "python": sys.version.split()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared)",
        "pod": what,
        "pairs_per_round": args.pairs,
        "rounds": args.rounds,
        "direct_ms": summary(all_direct),
        "router_ms": summary(all_routed),
        "added_ms": summary(diffs),
        "added_median_per_round_ms": [r["added_median_ms"] for r in rounds],
        "per_round": rounds,
        "router_streams_counted": served,
        "loadavg_start": [round(x, 2) for x in load_before],
        "loadavg_end": [round(x, 2) for x in load_after],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("direct_ms", "router_ms", "added_ms")}, indent=1))
    print(f"added median per round (ms): {result['added_median_per_round_ms']}")
    print(f"load average {result['loadavg_start']} -> {result['loadavg_end']}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
