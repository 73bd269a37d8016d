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
# The open-loop steps, as fractions of the closed-loop capacity: from 0.6 up while the SLO
# holds; if 0.6 misses it, down until a step holds it (the real networks' knee is far below
# their saturated throughput). A rung's seed is fixed by its fraction, so a point's steps are
# the same requests in every run.
UP = (0.6, 0.8, 0.95, 1.1)
DOWN = (0.45, 0.3, 0.15)
SEEDS = {f: 10 + i for i, f in enumerate(UP + DOWN)}


def next_fraction(fraction: float, ok: bool, passed: bool) -> float | None:
    """The step after a step at ``fraction`` (``ok``: it met the SLO; ``passed``: some step
    of this point already had), or None when the point is measured."""
    if ok and fraction in UP:
        i = UP.index(fraction)
        return UP[i + 1] if i + 1 < len(UP) else None
    if not ok and not passed and fraction in (UP[0], *DOWN):
        i = DOWN.index(fraction) + 1 if fraction in DOWN else 0
        return DOWN[i] if i < len(DOWN) else None
    return None


PROFILE_CONCURRENCY = (1, 4, 16)
PROFILE_AUDIO_SECONDS = 8.0  # the trace's mean (8.4 s)


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


def measure(lengths: list[float], concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    slo = args.slo_ms / 1000
    warm = asyncio.run(loadgen.closed_loop(HOST, HTTP_PORT, MODEL, 2, 3.0, lengths, seed=1))
    if not any(not r.error for r in warm):
        raise RuntimeError(f"warm-up failed: {[r.error for r in warm][:3]}")
    probe = asyncio.run(
        loadgen.closed_loop(
            HOST, HTTP_PORT, MODEL, concurrency, args.probe_seconds, lengths, seed=2
        )
    )
    capacity = sum(1 for r in probe if not r.error) / args.probe_seconds
    steps: list[dict[str, Any]] = []
    best: dict[str, Any] | None = None
    fraction: float | None = UP[0]
    while fraction is not None:
        rate = max(0.2, fraction * capacity)
        with GpuSampler() as gpu:
            results = asyncio.run(
                loadgen.open_loop(
                    HOST, HTTP_PORT, MODEL, rate, args.step_seconds, lengths, SEEDS[fraction]
                )
            )
        step = {
            "fraction": fraction,
            "rate_rps": round(rate, 3),
            **loadgen.summarize(results, args.step_seconds, slo),
            **gpu.summary(),
        }
        steps.append(step)
        log(
            f"  rate {rate:.2f}/s: p95 first {step['p95_first_chunk_ms']} ms, "
            f"errors {step['errors']}, good {step['good_rps']}/s, "
            f"gpu {step['gpu_utilization_mean']}"
        )
        ok = loadgen.meets_slo(step, args.slo_ms)
        fraction = next_fraction(fraction, ok, best is not None)
        if ok:
            best = step
    profile = concurrency_profile(args)
    every = [*warm, *probe]
    return {
        "requests": sum(s["requests"] for s in steps) + len(every) + profile.pop("_requests"),
        "lost_streams": sum(s["errors"] for s in steps)
        + sum(1 for r in every if r.error)
        + profile.pop("_errors"),
        "concurrency_profile": profile,
        "closed_loop_rps": round(capacity, 3),
        "closed_loop_errors": sum(1 for r in probe if r.error),
        "closed_loop_p95_first_chunk_ms": loadgen.summarize(probe, args.probe_seconds, slo)[
            "p95_first_chunk_ms"
        ],
        "steps": steps,
        "goodput_rps": best["good_rps"] if best else 0.0,
        "p95_first_chunk_ms": best["p95_first_chunk_ms"] if best else None,
        "p95_total_ms": best["p95_total_ms"] if best else None,
        "gpu_utilization_mean": best["gpu_utilization_mean"] if best else None,
        "gpu_memory_max_gib": max((s["gpu_memory_max_gib"] or 0) for s in steps) or None,
        "model_stats": model_stats(),
    }


def concurrency_profile(args: argparse.Namespace) -> dict[str, Any]:
    """First chunk p50/p95 and real-time factor per stream (synthesis time / audio length)
    with 1, 4 and 16 streams kept in flight, each of the trace's mean length."""
    out: dict[str, Any] = {"_requests": 0, "_errors": 0}
    for clients in PROFILE_CONCURRENCY:
        results = asyncio.run(
            loadgen.closed_loop(
                HOST,
                HTTP_PORT,
                MODEL,
                clients,
                args.profile_seconds,
                [PROFILE_AUDIO_SECONDS],
                seed=20 + clients,
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
            "p50_first_chunk_ms": ms(loadgen.percentile(firsts, 50)),
            "p95_first_chunk_ms": ms(loadgen.percentile(firsts, 95)),
            "p50_rtf": None if not rtf else round(loadgen.percentile(rtf, 50) or 0, 3),
        }
        out["_requests"] += len(results)
        out["_errors"] += len(results) - len(ok)
        log(f"  {clients} streams: {out[str(clients)]}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triton", type=Path, required=True)
    parser.add_argument("--build", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--points", default="", help="comma-separated point names (default: all)")
    parser.add_argument("--slo-ms", type=float, default=1000.0)
    parser.add_argument("--probe-seconds", type=float, default=6.0)
    parser.add_argument("--step-seconds", type=float, default=8.0)
    parser.add_argument("--profile-seconds", type=float, default=5.0)
    parser.add_argument("--stub-prefix", default="", help="venv whose Python the stubs embed")
    parser.add_argument(
        "--keep-going", action="store_true", help="go on after a point fails to start"
    )
    parser.add_argument(
        "--deadline", type=float, default=540.0, help="stop starting points after this many seconds"
    )
    parser.add_argument(
        "--logs", type=Path, help="keep each point's server log here (NN-<point>.log)"
    )
    args = parser.parse_args()
    began = time.monotonic()
    packed = json.loads((args.build / "points.json").read_text())
    points = packed["points"] if isinstance(packed, dict) else packed
    code = packed.get("code", "standins") if isinstance(packed, dict) else "standins"
    if code == "ours":  # the project's orchestrator needs a voice (it has no default one)
        loadgen.REFERENCE = loadgen.reference_fields()
    if args.points:
        wanted = args.points.split(",")
        points = [p for name in wanted for p in points if p["name"] == name]
    lengths = loadgen.audio_lengths(args.build / "trace.csv")
    device = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    report: dict[str, Any] = {
        "device": device,
        "code": code,
        "slo_first_chunk_ms": args.slo_ms,
        "step_seconds": args.step_seconds,
        "audio_seconds_mean": round(sum(lengths) / len(lengths), 2),
        "points": [],
    }
    seen: dict[str, int] = {}
    for index, point in enumerate(points):
        if time.monotonic() - began > args.deadline:
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
            entry["ready_s"] = round(server.start(timeout=240), 1)
            concurrency = point["params"]["orchestratorPerGpu"]
            entry.update(measure(lengths, concurrency, args))
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[-2000:]
            entry["log_tail"] = server.tail()[-1500:]
            log(f"{point['name']}: FAILED {entry['error'][:300]}")
        finally:
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
