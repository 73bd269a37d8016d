"""The GPU sweep, run on the device (``bench/README.md`` has the command).

For each point of ``build/points.json`` (or ``--points``): start ``tritonserver`` on the
point's repository, warm it up, find its capacity with a short closed-loop run (as many
clients as the orchestrator has instances), then offer open-loop Poisson load at fractions of
that capacity until the p95 first chunk misses the SLO. A point's goodput is the good
requests per second (first chunk within the SLO, no error) of the highest rate that met the
SLO with no error. GPU utilisation and memory come from Triton's own metrics, sampled each
second. Results are written after every point, so a run cut short keeps what it measured.

Standard library only (the device has no tritonclient); Python 3.11+.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen

MODEL = "cosyvoice2"
HOST = "127.0.0.1"
HTTP_PORT, GRPC_PORT, METRICS_PORT = 18000, 18001, 18002
# Issue 32: a point's goodput is searched over rates of a fixed geometric ladder (RATE_BASE x
# RATE_FACTOR^k req/s), each step a fixed number of Poisson arrivals (--step-requests, >= 100),
# from --start-rps: up one rung after a pass, down one after a failure, until a passing rung
# and the failing rung above it are both measured. A step passes when the lower end of the
# Wilson interval of its attainment (first chunk within the SLO, failures counted as misses)
# reaches --attainment; it stops early, its decision made, once it has had one miss more than
# that allows (loadgen.misses_allowed). Every step's seed differs, and so does every repeat's.
RATE_BASE = 0.4
PROFILE_AUDIO_SECONDS = 8.0  # the trace's mean (8.4 s)
RATE_FACTOR = 1.25


def rung(rate: float) -> int:
    """The ladder's rung nearest ``rate``."""
    return round(math.log(rate / RATE_BASE) / math.log(RATE_FACTOR))


def rung_rate(k: int) -> float:
    return round(RATE_BASE * RATE_FACTOR**k, 4)


def next_rung(outcomes: dict[int, bool], last: int, lowest: int = -4) -> int | None:
    """The rung to measure after ``last`` given every measured rung's outcome (True: passed),
    or None when the goodput is bracketed (a pass with a measured failure one rung above it),
    or no rung down to ``lowest`` passes."""
    passed = [k for k, ok in outcomes.items() if ok]
    if passed and outcomes.get(max(passed) + 1) is False:
        return None
    step = last + 1 if outcomes[last] else last - 1
    if step < lowest or step in outcomes:
        return None
    return step


def step_seed(repeat: int, index: int) -> int:
    """A distinct seed for every step of every repeat of a point."""
    return 1000 * repeat + 10 + index


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read().decode()
    except Exception as exc:
        return 0, str(exc)


class Server:
    def __init__(
        self, triton: Path, repo: Path, standins: Path, logfile: Path, stub_prefix: str = ""
    ) -> None:
        self.triton, self.repo, self.standins, self.logfile = triton, repo, standins, logfile
        self.stub_prefix = stub_prefix
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float) -> float:
        import sysconfig

        import torch  # only to find the site-packages that the stubs must see

        site = str(Path(torch.__file__).resolve().parents[1])
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(
            [
                str(self.triton / "libs"),
                sysconfig.get_config_var("LIBDIR") or "",
                env.get("LD_LIBRARY_PATH", ""),
            ]
        )
        env["COSYVOICE_STANDIN_PATH"] = ":".join([str(self.standins), site])
        torch_site = site
        if self.stub_prefix:  # a Python prefix (venv) whose NumPy the stubs must use
            env["PATH"] = f"{self.stub_prefix}/bin:{env.get('PATH', '')}"
            site = f"{self.stub_prefix}/lib/python3.12/site-packages"
            # the packed library, then the machine's torch site (its NumPy: the GPU models need
            # NumPy 2; the orchestrator's stub puts 1.26 first, pack.ORCHESTRATOR_STUB)
            path = ":".join([site, torch_site, *filter(None, [env.get("PYTHONPATH")])])
            env["PYTHONPATH"] = path
        # The project's model code (serving-models) and upstream's library, as the serving
        # image's COSYVOICE_MODELS_PATH names them; torch from the machine's own site.
        env["COSYVOICE_PYTHON_STUB"] = str(
            self.triton / "backends/python/triton_python_backend_stub"
        )
        env["COSYVOICE_ORCHESTRATOR_NUMPY"] = os.environ.get("COSYVOICE_ORCHESTRATOR_NUMPY", "")
        code = self.repo.parents[1] / "serving-models"  # pack.py's copy of the package
        env["COSYVOICE_MODELS_PATH"] = ":".join(dict.fromkeys([str(code), site, torch_site]))
        argv = [
            str(self.triton / "bin" / "tritonserver"),
            f"--model-repository={self.repo}",
            f"--backend-directory={self.triton / 'backends'}",
            "--disable-auto-complete-config",
            "--strict-readiness=true",
            f"--http-address={HOST}",
            f"--http-port={HTTP_PORT}",
            f"--grpc-address={HOST}",
            f"--grpc-port={GRPC_PORT}",
            f"--metrics-address={HOST}",
            f"--metrics-port={METRICS_PORT}",
            "--metrics-interval-ms=1000",
            "--exit-timeout-secs=5",
        ]
        started = time.monotonic()
        self.process = subprocess.Popen(
            argv, env=env, stdout=self.logfile.open("wb"), stderr=subprocess.STDOUT
        )
        while time.monotonic() - started < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited {self.process.returncode}: {self.tail()}")
            if get(f"http://{HOST}:{HTTP_PORT}/v2/health/ready")[0] == 200:
                return time.monotonic() - started
            time.sleep(0.5)
        raise TimeoutError(f"not ready in {timeout:.0f}s: {self.tail()}")

    def tail(self) -> str:
        return self.logfile.read_text(errors="replace")[-3000:]

    def errors(self) -> list[str]:
        """The server log's lines that explain a failure (a stub's crash, a traceback)."""
        keys = ("terminate called", "what():", "Traceback", "Error", "error:", "Killed", "shm")
        lines = self.logfile.read_text(errors="replace").splitlines()
        hits = [x for x in lines if any(k in x for k in keys) and "CudaDriverHelper" not in x]
        return [x[:400] for x in hits[-12:]]

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        subprocess.run(["pkill", "-9", "-f", "triton_python_backend_stub"], check=False)


class GpuSampler:
    """Triton's nv_gpu_utilization (0..1) and nv_gpu_memory_used_bytes, once a second, summed
    over the GPUs and per GPU (its ``gpu_uuid`` label)."""

    def __init__(self) -> None:
        self.util: list[float] = []
        self.memory: list[float] = []
        self.per_gpu: dict[str, dict[str, list[float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            status, text = get(f"http://{HOST}:{METRICS_PORT}/metrics")
            if status != 200:
                continue
            for name, into, key in (
                ("nv_gpu_utilization", self.util, "util"),
                ("nv_gpu_memory_used_bytes", self.memory, "memory"),
            ):
                found = re.findall(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M)
                for labels, value in found:
                    uuid = re.search(r'gpu_uuid="([^"]*)"', labels)
                    gpu = self.per_gpu.setdefault(uuid.group(1) if uuid else "?", {})
                    gpu.setdefault(key, []).append(float(value))
                if found:
                    into.append(sum(float(v) for _, v in found))

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        return {
            "gpu_utilization_mean": round(sum(self.util) / len(self.util), 3)
            if self.util
            else None,
            "gpu_memory_max_gib": round(max(self.memory) / 2**30, 2) if self.memory else None,
            "per_gpu": {
                uuid: {
                    "utilization_mean": round(sum(v["util"]) / len(v["util"]), 3)
                    if v.get("util")
                    else None,
                    "memory_max_gib": round(max(v["memory"]) / 2**30, 2)
                    if v.get("memory")
                    else None,
                }
                for uuid, v in self.per_gpu.items()
            },
        }


def model_stats() -> dict[str, Any]:
    """Per model: requests, executions (so the mean batch), mean queue and compute time."""
    status, text = get(f"http://{HOST}:{HTTP_PORT}/v2/models/stats", timeout=5)
    if status != 200:
        return {}
    out: dict[str, Any] = {}
    for model in json.loads(text).get("model_stats", []):
        stats = model.get("inference_stats", {})
        count = int(stats.get("success", {}).get("count", 0))
        executions = int(model.get("execution_count", 0))
        if not count:
            continue
        out[model["name"]] = {
            "requests": count,
            "mean_batch": round(int(model.get("inference_count", 0)) / max(1, executions), 2),
            "mean_queue_ms": round(int(stats.get("queue", {}).get("ns", 0)) / count / 1e6, 2),
            "mean_compute_ms": round(
                int(stats.get("compute_infer", {}).get("ns", 0)) / count / 1e6, 2
            ),
        }
    return out


def run_step(
    lengths: list[float], rate: float, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    slo = args.slo_ms / 1000
    allowed = loadgen.misses_allowed(args.step_requests, args.attainment)
    began = time.monotonic()
    with GpuSampler() as gpu:
        results, span = asyncio.run(
            loadgen.open_loop_requests(
                HOST,
                HTTP_PORT,
                MODEL,
                rate,
                args.step_requests,
                lengths,
                seed,
                slo,
                stop_after_misses=allowed + 1,
            )
        )
    n = len(results)
    good = sum(1 for r in results if not loadgen.is_miss(r, slo))
    low, high = loadgen.wilson(good, n)
    step = {
        "rate_rps": rate,
        "seed": seed,
        "planned_requests": args.step_requests,
        "curtailed": n < args.step_requests,
        "misses_allowed": allowed,
        **loadgen.summarize(results, max(span, 1e-9), slo),
        "arrival_seconds": round(span, 1),
        "wall_seconds": round(time.monotonic() - began, 1),
        "attainment_wilson90": [round(low, 4), round(high, 4)],
        # the decision: the one-sided 95 % lower bound of the attainment reaches the target
        "passed": n >= args.step_requests and low >= args.attainment,
        "samples": loadgen.samples(results, began),
        **gpu.summary(),
    }
    return step


def measure(
    lengths: list[float], start_rps: float, args: argparse.Namespace, repeat: int, profile: bool
) -> dict[str, Any]:
    warm = asyncio.run(loadgen.closed_loop_requests(HOST, HTTP_PORT, MODEL, 2, 4, lengths, seed=1))
    if not any(not r.error for r in warm):
        raise RuntimeError(f"warm-up failed: {[r.error for r in warm][:3]}")
    steps: list[dict[str, Any]] = []
    outcomes: dict[int, bool] = {}
    k: int | None = rung(start_rps)
    while k is not None:
        rate = rung_rate(k)
        step = run_step(lengths, rate, step_seed(repeat, len(steps)), args)
        steps.append(step)
        outcomes[k] = step["passed"]
        log(
            f"  rate {rate:.3f}/s: {step['good_requests']}/{step['requests']} good "
            f"(90% {step['attainment_wilson90']}), passed {step['passed']}, "
            f"p95 first {step['p95_first_chunk_ms']} ms, {step['wall_seconds']} s, "
            f"gpu {step['gpu_utilization_mean']}"
        )
        k = next_rung(outcomes, k)
        if k is not None and (
            time.monotonic() - args.began + args.step_requests / rung_rate(k) + 15 > args.stop_at
        ):
            log("  deadline: no further step")
            break
    passed = [s for s in steps if s["passed"]]
    best = max(passed, key=lambda s: s["rate_rps"]) if passed else None
    above = (
        next((s for s in steps if s["rate_rps"] == rung_rate(rung(best["rate_rps"]) + 1)), None)
        if best
        else None
    )
    bracketed = best is not None and above is not None and not above["passed"]
    out: dict[str, Any] = {}
    if profile:
        out["concurrency_profile"] = concurrency_profile(args, repeat)
    every = [*warm]
    profiled = out.get("concurrency_profile", {})
    return {
        "requests": sum(s["requests"] for s in steps)
        + len(every)
        + sum(v["requests"] for v in profiled.values()),
        "lost_streams": sum(s["errors"] for s in steps)
        + sum(1 for r in every if r.error)
        + sum(v["errors"] for v in profiled.values()),
        **out,
        "steps": steps,
        # the highest passing rung's good requests per second, and its decisive steps
        "goodput_rps": best["good_rps"] if best else 0.0,
        "goodput_rate_rps": best["rate_rps"] if best else 0.0,
        "bracketed": bracketed,
        "decisive": {
            "passed": _decisive(best),
            "failed_above": _decisive(above) if bracketed else None,
        },
        "p95_first_chunk_ms": best["p95_first_chunk_ms"] if best else None,
        "p95_total_ms": best["p95_total_ms"] if best else None,
        "gpu_utilization_mean": best["gpu_utilization_mean"] if best else None,
        "gpu_memory_max_gib": max((s["gpu_memory_max_gib"] or 0) for s in steps) or None,
        "model_stats": model_stats(),
    }


def _decisive(step: dict[str, Any] | None) -> dict[str, Any] | None:
    if step is None:
        return None
    keys = ("rate_rps", "requests", "good_requests", "attainment_wilson90", "curtailed")
    return {k: step[k] for k in keys}


def concurrency_profile(args: argparse.Namespace, repeat: int) -> dict[str, Any]:
    """First chunk p50/p95 and real-time factor per stream (time to the last chunk / audio
    length) with N streams kept in flight, --profile-requests requests per level; one stream
    with --profile-one-seconds of audio (a stream's first chunk does not wait for its length),
    more with the trace's mean length."""
    out: dict[str, Any] = {}
    for clients in args.profile_levels:
        seconds = args.profile_one_seconds if clients == 1 else PROFILE_AUDIO_SECONDS
        began = time.monotonic()
        results = asyncio.run(
            loadgen.closed_loop_requests(
                HOST,
                HTTP_PORT,
                MODEL,
                clients,
                args.profile_requests,
                [seconds],
                seed=1000 * repeat + 500 + clients,
            )
        )
        ok = [r for r in results if not r.error and r.first is not None and r.done is not None]
        firsts = [r.first - r.sent for r in ok]
        rtf = [(r.done - r.sent) / r.audio_seconds for r in ok]

        def ms(v: float | None) -> float | None:
            return None if v is None else round(1000 * v, 1)

        out[str(clients)] = {
            "requests": len(results),
            "errors": len(results) - len(ok),
            "audio_seconds": seconds,
            "p50_first_chunk_ms": ms(loadgen.percentile_or_none(firsts, 50)),
            "p95_first_chunk_ms": ms(loadgen.percentile_or_none(firsts, 95)),
            "p50_rtf": None if not rtf else round(loadgen.percentile_or_none(rtf, 50) or 0, 3),
            "wall_seconds": round(time.monotonic() - began, 1),
            "samples": loadgen.samples(results, began),
        }
        log(
            f"  {clients} streams: "
            + str({k: v for k, v in out[str(clients)].items() if k != "samples"})
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triton", type=Path, required=True)
    parser.add_argument("--build", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--points", default="", help="comma-separated point names (default: all)")
    parser.add_argument("--slo-ms", type=float, default=1000.0)
    parser.add_argument("--step-requests", type=int, default=100, help="arrivals per step")
    parser.add_argument("--attainment", type=float, default=0.95, help="the SLO's share on time")
    parser.add_argument(
        "--profile-points", default="", help="points that also get the concurrency profile"
    )
    parser.add_argument(
        "--profile-levels",
        type=lambda v: [int(x) for x in v.split(",")],
        default=[1, 16],
        help="streams in flight per profile level",
    )
    parser.add_argument("--profile-requests", type=int, default=100)
    parser.add_argument("--profile-one-seconds", type=float, default=1.0)
    parser.add_argument("--start-rps", type=float, default=0.625, help="first step's rate")
    parser.add_argument(
        "--attach", type=int, default=0, help="measure the server on this HTTP port (no start)"
    )
    parser.add_argument("--stub-prefix", default="", help="venv whose Python the stubs embed")
    parser.add_argument(
        "--keep-going", action="store_true", help="go on after a point fails to start"
    )
    parser.add_argument(
        "--stop-at",
        type=float,
        default=540.0,
        help="start no step that would end (by its planned length) after this many seconds",
    )
    parser.add_argument(
        "--logs", type=Path, help="keep each point's server log here (NN-<point>.log)"
    )
    args = parser.parse_args()
    if loadgen.misses_allowed(args.step_requests, args.attainment) < 0:
        parser.error(f"no step of {args.step_requests} requests can show {args.attainment}")
    began = time.monotonic()
    packed = json.loads((args.build / "points.json").read_text())
    points = packed["points"] if isinstance(packed, dict) else packed
    code = packed.get("code", "standins") if isinstance(packed, dict) else "standins"
    if code == "ours":  # the project's orchestrator needs a voice (it has no default one)
        loadgen.REFERENCE = loadgen.reference_fields()
    starts: list[float] = []
    if args.points:  # NAME or NAME@RATE (the first step's rate), a name twice runs twice
        wanted = [w.split("@") for w in args.points.split(",")]
        chosen = []
        for name, *rate in wanted:
            chosen += [p for p in points if p["name"] == name]
            starts += [float(rate[0]) if rate else args.start_rps]
        points = chosen
    else:
        starts = [args.start_rps] * len(points)
    profiled = set(filter(None, args.profile_points.split(",")))
    global HTTP_PORT
    if args.attach:
        HTTP_PORT = args.attach
    lengths = loadgen.audio_lengths(args.build / "trace.csv")
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    device = (
        subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
        if shutil.which("nvidia-smi")
        else "cpu (no nvidia-smi)"
    )
    report: dict[str, Any] = {
        "device": device,
        "code": code,
        "slo_first_chunk_ms": args.slo_ms,
        "step_requests": args.step_requests,
        "attainment_target": args.attainment,
        "decision": "a step passes when the one-sided 95 % lower bound (Wilson) of its "
        "attainment reaches the target, over all its planned requests",
        "audio_seconds_mean": round(sum(lengths) / len(lengths), 2),
        "points": [],
    }
    seen: dict[str, int] = {}
    args.began = began
    for index, point in enumerate(points):
        if time.monotonic() - began + 60 + args.step_requests / starts[index] > args.stop_at:
            log(f"deadline: skipping {point['name']}")
            continue
        repo = args.build / "repos" / point["name"]
        server = Server(
            args.triton,
            repo,
            args.build / "standins",
            Path("/tmp") / f"{point['name']}.log",
            args.stub_prefix,
        )
        entry: dict[str, Any] = {"name": point["name"], "params": point["params"]}
        seen[point["name"]] = entry["repeat"] = seen.get(point["name"], 0) + 1  # named twice
        log(f"{point['name']}: starting")
        try:
            entry["ready_s"] = 0.0 if args.attach else round(server.start(timeout=240), 1)
            profile = point["name"] in profiled
            entry.update(measure(lengths, starts[index], args, entry["repeat"], profile))
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
            entry["log_tail"] = server.tail()[-1500:]
            log(f"{point['name']}: FAILED {entry['error'][:300]}")
        finally:
            if not args.attach:
                server.stop()
        if entry.get("error") or any(s.get("errors") for s in entry.get("steps", [])):
            entry["server_errors"] = server.errors()
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            shutil.copy(server.logfile, args.logs / f"{index:02d}-{point['name']}.log")
        report["points"].append(entry)
        args.out.write_text(json.dumps(report, indent=1))
        log(f"{point['name']}: goodput {entry.get('goodput_rps')} rps")
        if (
            "error" in entry
            and not args.keep_going
            and not any("error" not in p for p in report["points"])
        ):
            log("the first point failed: stopping (the rest would fail the same way)")
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
