"""Prepare the GPU sweep's carried files (run here, not on the device): ``bench/gpu/build/``.

- ``triton.tar.xz``: the ``tritonserver`` of the nvidia-pytriton wheel, repacked as
  ``../shared/docs/gpu.md`` says (bin, backends with the Python 3.12 stub, caches, libs);
- ``repos/<point>/``: for every sweep point, the model repository the operator renders
  (``cosyvoice_operator.render.triton.render_repository``) for a CosyVoice2 service with that
  point's serving fields, each model's code being its GPU stand-in (``bench/gpu/standins``;
  the orchestrator is the CPU twin's, it runs on the CPU in the rendered config too) and
  ``tensorrt_llm``'s backend switched to ``python`` (the one change, as in the CPU twin);
- ``points.json``: the points in run order; ``trace.csv``: the conversation trace.

    .venv/bin/python bench/gpu/pack.py [--points grid|NAME,...]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import itertools
import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api import spec as specs
from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.render import triton

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STANDINS = HERE / "standins"
TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
ENGINE_DIR = "/engines/sweep"

BASE: dict[str, Any] = {
    "model": {"variant": "cosyvoice2", "uri": "hf://FunAudioLLM/CosyVoice2-0.5B"},
    "engine": {"precision": "bfloat16", "maxBatchSize": 16, "cacheClaimName": "engines"},
    "serving": {
        "gpusPerReplica": 1,
        "instancesPerGpu": 1,
        "streaming": True,
        "dynamicBatching": {"preferredBatchSizes": [4, 8, 16], "maxQueueDelayMicroseconds": 500},
    },
}


def point_spec(params: dict[str, Any]) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw["serving"]["instancesPerGpu"] = params["instancesPerGpu"]
    raw["serving"]["dynamicBatching"]["maxQueueDelayMicroseconds"] = params["maxQueueDelayUs"]
    raw["engine"]["maxBatchSize"] = params["maxBatchSize"]
    raw["serving"]["gpusPerReplica"] = params.get("gpus", 1)
    raw["serving"]["dynamicBatching"]["preferredBatchSizes"] = [
        s for s in (4, 8, 16, 32) if s <= params["maxBatchSize"]
    ]
    return raw


def name_of(params: dict[str, Any]) -> str:
    gpus = params.get("gpus", 1)
    return (
        f"orch{params['orchestratorPerGpu']}-inst{params['instancesPerGpu']}"
        f"-delay{params['maxQueueDelayUs']}-mbs{params['maxBatchSize']}"
        + (f"-gpus{gpus}" if gpus != 1 else "")
    )


def multi_gpu() -> list[dict[str, Any]]:
    """Issue 13's points (a 2-GPU machine): the operator's rendering for 1 and 2 GPUs per pod,
    1 and 2 instances per GPU; the orchestrator count as the operator renders it."""
    points = []
    for gpus, instances in itertools.product((1, 2), (1, 2)):
        raw = point_spec(
            {"instancesPerGpu": instances, "maxQueueDelayUs": 500, "maxBatchSize": 16, "gpus": gpus}
        )
        per_gpu = triton.orchestrator_instances(specs.parse(raw)) // gpus
        points.append(
            {
                "orchestratorPerGpu": per_gpu,
                "instancesPerGpu": instances,
                "maxQueueDelayUs": 500,
                "maxBatchSize": 16,
                "gpus": gpus,
            }
        )
    return points


def grid() -> list[dict[str, Any]]:
    points = [
        {"orchestratorPerGpu": o, "instancesPerGpu": i, "maxQueueDelayUs": d, "maxBatchSize": 16}
        for o, i, d in itertools.product((4, 16, 32), (1, 2), (500, 4000))
    ]
    points += [
        {"orchestratorPerGpu": 32, "instancesPerGpu": i, "maxQueueDelayUs": 500, "maxBatchSize": 32}
        for i in (1, 2)
    ]
    return points


def repository(params: dict[str, Any], root: Path) -> dict[str, str]:
    svc = specs.parse(point_spec(params))
    rendered = triton.render_repository(svc, ENGINE_DIR)
    operator_count = triton.orchestrator_instances(svc)
    out: dict[str, str] = {}
    for name, text in rendered.items():
        config = text_format.Parse(text, mc.ModelConfig())
        if config.backend == "tensorrtllm":
            config.backend = "python"
        wanted = params["orchestratorPerGpu"] * params.get("gpus", 1)
        if name == "cosyvoice2" and wanted != operator_count:
            config.instance_group[0].count = wanted
        out[name] = text_format.MessageToString(config)
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(out[name])
        if name == "cosyvoice2":
            cpu_twin.place_standin(name, root / name / "1")
        else:
            shutil.copy(STANDINS / name / "model.py", root / name / "1" / "model.py")
    return out


def pack_triton(into: Path) -> None:
    spec = importlib.util.find_spec("pytriton")
    assert spec is not None and spec.origin is not None, "nvidia-pytriton is not installed"
    pkg = Path(spec.origin).parent
    server = pkg / "tritonserver"
    libs = pkg.parent / "nvidia_pytriton.libs"
    with tarfile.open(into, "w:xz", preset=6) as tar:
        for part in ("bin", "backends", "caches"):
            tar.add(
                server / part, arcname=part, filter=lambda t: None if "__pycache__" in t.name else t
            )
        tar.add(
            server / "python_backend_stubs" / "3.12" / "triton_python_backend_stub",
            arcname="backends/python/triton_python_backend_stub",
        )
        tar.add(libs, arcname="libs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "build")
    parser.add_argument(
        "--multi-gpu", action="store_true", help="issue 13's points (1 and 2 GPUs per pod)"
    )
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        for child in out.iterdir():
            if child.name not in ("triton.tar.xz", "wheels"):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "triton.tar.xz").exists():
        pack_triton(out / "triton.tar.xz")
    shutil.copytree(STANDINS, out / "standins", ignore=shutil.ignore_patterns("__pycache__"))
    points = []
    for params in multi_gpu() if args.multi_gpu else grid():
        name = name_of(params)
        repository(params, out / "repos" / name)
        points.append({"name": name, "params": params})
    (out / "points.json").write_text(json.dumps(points, indent=1))
    shutil.copy(TRACE, out / "trace.csv")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{len(points)} points, {size / 2**20:.1f} MiB in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
