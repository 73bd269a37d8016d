"""The orchestrator's BLS path under load on a CPU: does a Python-backend stub die?

The GPU sweep lost streams with "Stub process 'cosyvoice2_0_N' is not healthy" (issue 20).
The cause is the pytriton wheel's Triton 2.51 (python_backend r24.10) freeing a decoupled BLS
call's responses off the GIL (``let_go_after_cleanup`` in the CPU twin's CosyVoice2 stand-in,
which is also the sweep's orchestrator). This runs the CPU twin of a default streaming
CosyVoice2 service (the CPU stand-ins, no torch) in the wheel's ``tritonserver`` with the
Python-backend stub of a chosen Python (the device runs the 3.12 stub), ``--runs`` times, each a
fresh server loaded by ``--streams`` closed-loop clients (the sweep's HTTP ``generate_stream``
load) for ``--seconds``, and counts failed requests and dead stubs. ``--orchestrator REV``
takes the orchestrator stand-in from a git revision instead of the working tree (the one
before the fix: ``021c38d^``).

    .venv/bin/python bench/gpu/stub_stress.py --runs 8 [--orchestrator 021c38d^] \\
        --stub-python /root/.pyenv/versions/3.12.1/bin/python3.12 \\
        --numpy-wheel bench/gpu/build/wheels/numpy-1.26.4-cp312-*.whl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import loadgen

from cosyvoice_operator.api import spec
from cosyvoice_operator.devtools.closedloop import cpu_twin, harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ORCHESTRATOR = "operator/cosyvoice_operator/devtools/closedloop/standins/cosyvoice2/model.py"
DIED = "is not healthy"


def stub_python(python: str) -> tuple[str, str, str]:
    """(major.minor, its bin directory, its LIBDIR) of a Python interpreter."""
    code = "import sys,sysconfig;print(f'{sys.version_info[0]}.{sys.version_info[1]}');"
    code += "print(sysconfig.get_config_var('LIBDIR'))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    version, libdir = out.stdout.split()
    return version, str(Path(python).absolute().parent), libdir


def backends(into: Path, version: str) -> Path:
    dist = cpu_twin._pytriton_dir() / "tritonserver"
    python = into / "python"
    shutil.copytree(dist / "backends" / "python", python)
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    shutil.copy(stub, python / "triton_python_backend_stub")
    (python / "triton_python_backend_stub").chmod(0o755)
    return into


def repository(root: Path, instances: int, orchestrator: str) -> Path:
    svc = spec.parse(
        {
            "model": {"variant": "cosyvoice2", "uri": "hf://FunAudioLLM/CosyVoice2-0.5B"},
            "serving": {"streaming": True},
        }
    )
    cpu_twin.write_repository(harness.twin_repository(svc, instances), root)
    if orchestrator:
        code = subprocess.run(
            ["git", "show", f"{orchestrator}:{ORCHESTRATOR}"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        (root / "cosyvoice2" / "1" / "model.py").write_bytes(code)
    return root


def serve(repo: Path, work: Path, python: tuple[str, str, str]) -> subprocess.Popen[bytes]:
    version, bindir, libdir = python
    pytriton = cpu_twin._pytriton_dir()
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join([str(pytriton.parent / "nvidia_pytriton.libs"), libdir])
    env["PATH"] = f"{bindir}:{env.get('PATH', '')}"  # the stub's Python finds its prefix here
    port = cpu_twin.free_ports(3)
    argv = [
        str(pytriton / "tritonserver" / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={backends(work / 'backends', version)}",
        "--disable-auto-complete-config",
        "--strict-readiness=true",
        "--http-address=127.0.0.1",
        f"--http-port={port[0]}",
        "--grpc-address=127.0.0.1",
        f"--grpc-port={port[1]}",
        "--metrics-address=127.0.0.1",
        f"--metrics-port={port[2]}",
        "--allow-gpu-metrics=false",
        f"--backend-config=python,shm-region-prefix-name=stress{os.getpid()}{secrets.token_hex(3)}",
        "--exit-timeout-secs=3",
    ]
    log = (work / "tritonserver.log").open("wb")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    process.http_port = port[0]  # type: ignore[attr-defined]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(_failure(work / "tritonserver.log"))
        if loadgen_ready(port[0]):
            return process
        time.sleep(0.3)
    process.kill()
    raise TimeoutError((work / "tritonserver.log").read_text(errors="replace")[-3000:])


def _failure(log: Path) -> str:
    lines = log.read_text(errors="replace").splitlines()
    return "\n".join(x[:300] for x in lines if x[:1] in "EW" or "rror" in x)[-3000:]


def loadgen_ready(port: int) -> bool:
    import urllib.request

    try:
        url = f"http://127.0.0.1:{port}/v2/health/ready"
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def one_run(args: argparse.Namespace, python: tuple[str, str, str], seed: int) -> Any:
    with tempfile.TemporaryDirectory(prefix="stub-stress-") as tmp:
        work = Path(tmp)
        repo = repository(work / "repo", args.instances, args.orchestrator)
        process = serve(repo, work, python)
        try:
            lengths = [min(args.max_audio, s) for s in loadgen.audio_lengths(args.trace)]
            results = asyncio.run(
                loadgen.closed_loop(
                    "127.0.0.1",
                    process.http_port,  # type: ignore[attr-defined]
                    "cosyvoice2",
                    args.streams,
                    args.seconds,
                    lengths,
                    seed=seed,
                    limit_s=30.0,
                )
            )
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    failed = [r for r in results if r.error]
    return {
        "requests": len(results),
        "failed": len(failed),
        "stub_died": sum(1 for r in failed if DIED in r.error),
        "errors": sorted({r.error[:160] for r in failed})[:3],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stub-python", default=sys.executable)
    parser.add_argument("--numpy-wheel", type=Path, help="unpacked onto the stub's PYTHONPATH")
    parser.add_argument("--orchestrator", default="", help="a git revision (default: this tree)")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--instances", type=int, default=2, help="per model (the twin's cap)")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--max-audio", type=float, default=6.0, help="cap on a request's audio")
    parser.add_argument(
        "--trace", type=Path, default=ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="stub-stress-env-") as prefix:
        if args.numpy_wheel:
            # A venv of the stub's Python (as the device's sweep makes one), NumPy in it: the
            # stub's embedded Python finds it from PATH and takes its site-packages.
            subprocess.run([args.stub_python, "-m", "venv", "--without-pip", prefix], check=True)
            python = stub_python(f"{prefix}/bin/python3")
            site = f"{prefix}/lib/python{python[0]}/site-packages"
            with zipfile.ZipFile(args.numpy_wheel) as wheel:
                wheel.extractall(site)
        else:  # an environment that has NumPy already (this venv, by default)
            python = stub_python(args.stub_python)
        runs = []
        for i in range(args.runs):
            run = one_run(args, python, seed=100 + i)
            runs.append(run)
            print(json.dumps({"run": i, **run}), file=sys.stderr, flush=True)
    summary = {
        "stub_python": python[0],
        "orchestrator": args.orchestrator or "working tree",
        "streams": args.streams,
        "instances": args.instances,
        "seconds": args.seconds,
        "runs": len(runs),
        "runs_with_a_dead_stub": sum(1 for r in runs if r["stub_died"]),
        "requests": sum(r["requests"] for r in runs),
        "failed": sum(r["failed"] for r in runs),
        "per_run": runs,
    }
    text = json.dumps(summary, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
