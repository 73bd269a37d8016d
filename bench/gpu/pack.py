"""Prepare the GPU sweep's carried files (run here, not on the device): ``bench/gpu/build/``.

- ``triton.tar.xz``: the ``tritonserver`` of the nvidia-pytriton wheel, repacked as
  ``../shared/docs/gpu.md`` says (bin, backends with the Python 3.12 stub, caches, libs);
- ``site.tar.xz``: the Python packages the model code needs beyond the device's own
  (upstream's library from PyPI, ``token2wav-cosyvoice``, and what its modules import; NumPy
  1.26 for the wheel's Python 3.12 stub), installed for CPython 3.12 and packed;
- ``repos/<point>/``: for every sweep point, the model repository the operator renders
  (``cosyvoice_operator.render.triton.render_repository``) for a CosyVoice2 service with that
  point's serving fields. With ``--code ours`` (the default since issue 20) the orchestrator
  and ``token2wav`` run the project's own model code (``serving-models/models``: upstream's
  flow and HiFT, the estimator as CUDA graphs) on a full-size synthetic release that
  ``full_release.py`` writes on the device at :data:`RELEASE` (``model_dir`` and
  ``llm_tokenizer_dir`` point there, as the serving pod's model view would); ``tensorrt_llm``,
  ``audio_tokenizer`` and ``speaker_embedding`` stay GPU stand-ins (``bench/gpu/standins``),
  ``tensorrt_llm``'s backend switched to ``python``. With ``--code standins`` every model is a
  stand-in (the sweeps of issue 12);
- ``points.json``: the points in run order; ``trace.csv``: the conversation trace.

    .venv/bin/python bench/gpu/pack.py [--code ours|standins] [--grid issue20|issue12]
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
MODEL_CODE = ROOT / "serving-models" / "models"
OURS = ("cosyvoice2", "token2wav")
RELEASE = "/tmp/cv2-release"
# What the model code imports beyond the device's packages (KINDS.md's list), pinned: upstream's
# library as the probe of ../shared/probes/gpu-upstream-flow ran it on torch 2.11, and what
# matcha.utils' __init__ pulls in. NumPy 1.26: the wheel's 3.12 stub misreads BYTES under 2.5.
WHEELS = (
    "numpy==1.26.4",
    "token2wav-cosyvoice==0.1.0",
    "HyperPyYAML==1.2.2",
    "ruamel.yaml==0.18.6",
    "ruamel.yaml.clib==0.2.15",
    "omegaconf==2.3.0",
    "hydra-core==1.3.2",
    "conformer==0.3.2",
    "diffusers==0.42.1",
    "gdown==6.5.1",
    "beautifulsoup4==4.15.0",
    "soupsieve==4.1.4",
    "importlib-metadata==10.2.0",
)
SDISTS = ("antlr4-python3-runtime==4.9.3", "wget==3.2")  # no wheels on PyPI: built here
WHEEL_CACHE = Path.home() / ".cache" / "cosyvoice-operator" / "gpu-wheels"
# The orchestrator is the one model that reads BYTES inputs (target_text, reference_text),
# which this Triton's Python 3.12 stub misreads under NumPy 2 (run 0, bench/README.md); the
# GPU models need the device's NumPy 2 (its SciPy, which HiFT imports, is built for it). So
# the orchestrator alone gets NumPy 1.26 first, through the Python backend's per-model stub:
# a ``triton_python_backend_stub`` in the model's directory, here a wrapper around the real one.
# COSYVOICE_ORCHESTRATOR_NUMPY is a venv whose site-packages holds NumPy 1.26: the stub's
# isolated interpreter (it ignores PYTHONPATH) takes its site from the python3 on PATH, and the
# model code's COSYVOICE_MODELS_PATH names it again under ``numpy126`` (a link), ahead of the
# torch site (orchestrator_numpy.py says why). orchestrator_numpy.py checks this on the device
# and rewrites the wrapper with the variant that worked there.
ORCHESTRATOR_STUB = """#!/bin/sh
env="${COSYVOICE_ORCHESTRATOR_NUMPY:?}"
export PATH="$env/bin:$PATH"
export COSYVOICE_MODELS_PATH="$env/numpy126:$COSYVOICE_MODELS_PATH"
exec "${COSYVOICE_PYTHON_STUB:?}" "$@"
"""
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


def grid_issue20() -> list[dict[str, Any]]:
    """Issue 20's points: orchestrator instances, token2wav instances per GPU, max queue delay
    and engine max batch size; the first is the operator's rendering of a default spec."""
    rows = [  # (orchestrator per GPU, instancesPerGpu, delay us, maxBatchSize)
        (16, 1, 500, 16),
        (16, 2, 500, 16),
        (16, 4, 500, 16),
        (16, 8, 500, 16),  # token2wav is where upstream's networks saturate (run 10)
        (16, 4, 4000, 16),
        (32, 4, 500, 16),  # more streams than LLM slots: the orchestrator count alone
        (32, 4, 500, 32),
        (32, 8, 500, 32),
        (64, 8, 500, 64),
    ]
    return [
        {"orchestratorPerGpu": o, "instancesPerGpu": i, "maxQueueDelayUs": d, "maxBatchSize": m}
        for o, i, d, m in rows
    ]


def repository(
    params: dict[str, Any], root: Path, code: str = "ours", release: str = RELEASE
) -> dict[str, str]:
    svc = specs.parse(point_spec(params))
    rendered = triton.render_repository(svc, ENGINE_DIR)
    operator_count = triton.orchestrator_instances(svc)
    paths = {"model_dir": release, "llm_tokenizer_dir": f"{release}/llm"}
    out: dict[str, str] = {}
    for name, text in rendered.items():
        config = text_format.Parse(text, mc.ModelConfig())
        if config.backend == "tensorrtllm":
            config.backend = "python"
        wanted = params["orchestratorPerGpu"] * params.get("gpus", 1)
        if name == "cosyvoice2" and wanted != operator_count:
            config.instance_group[0].count = wanted
        if code == "ours":  # where the serving pod's model view would be
            for key, value in paths.items():
                if key in config.parameters:
                    config.parameters[key].string_value = value
        out[name] = text_format.MessageToString(config)
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(out[name])
        if code == "ours" and name in OURS:
            shutil.copy(MODEL_CODE / name / "model.py", root / name / "1" / "model.py")
            if name == "cosyvoice2":
                stub = root / name / "triton_python_backend_stub"  # the model's directory
                stub.write_text(ORCHESTRATOR_STUB)
                stub.chmod(0o755)
        elif name == "cosyvoice2":
            cpu_twin.place_standin(name, root / name / "1")
        else:
            shutil.copy(STANDINS / name / "model.py", root / name / "1" / "model.py")
    return out


def pack_site(into: Path) -> None:
    """The pinned packages, installed for CPython 3.12 (x86-64) and packed: ``site/`` (what the
    model code imports beyond the device's packages) and ``np126/`` (NumPy 1.26 alone, which
    only the orchestrator's stub puts first: see :data:`ORCHESTRATOR_STUB`)."""
    import subprocess
    import tempfile

    pip = [sys.executable, "-m", "pip"]
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    platform = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
    for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"):
        platform += ["--platform", tag]
    subprocess.run(
        [*pip, "download", "-q", "--no-deps", *platform, "-d", str(WHEEL_CACHE), *WHEELS],
        check=True,
    )
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(WHEEL_CACHE), *SDISTS], check=True)

    def wheels(specs: tuple[str, ...]) -> list[str]:
        names = {n.split("==")[0].lower().replace("-", "_").replace(".", "_") for n in specs}
        return [
            str(w)
            for w in WHEEL_CACHE.glob("*.whl")
            if w.name.split("-")[0].lower().replace(".", "_") in names
        ]

    numpy = tuple(w for w in WHEELS if w.startswith("numpy=="))
    rest = tuple(w for w in WHEELS if w not in numpy) + SDISTS
    with tempfile.TemporaryDirectory() as tmp:
        for folder, specs in (("site", rest), ("np126", numpy)):
            install = [*pip, "install", "-q", "--no-deps", "--no-compile"]
            subprocess.run(
                [*install, "--target", f"{tmp}/{folder}", *platform, *wheels(specs)], check=True
            )
        with tarfile.open(into, "w:xz", preset=6) as tar:
            for folder in ("site", "np126"):
                tar.add(
                    f"{tmp}/{folder}",
                    arcname=folder,
                    filter=lambda t: (
                        None if "/tests/" in f"/{t.name}/" or "__pycache__" in t.name else t
                    ),
                )


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
    parser.add_argument("--code", choices=("ours", "standins"), default="ours")
    parser.add_argument("--grid", choices=("issue20", "issue12"), default="issue20")
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        for child in out.iterdir():
            if child.name not in ("triton.tar.xz", "site.tar.xz"):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "triton.tar.xz").exists():
        pack_triton(out / "triton.tar.xz")
    if not (out / "site.tar.xz").exists():
        pack_site(out / "site.tar.xz")
    shutil.copytree(STANDINS, out / "standins", ignore=shutil.ignore_patterns("__pycache__"))
    # The model code's package, as of this pack (the sweep and the scripts import this copy).
    shutil.copytree(
        MODEL_CODE.parent / "cosyvoice_serving_models",
        out / "serving-models" / "cosyvoice_serving_models",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    points = []
    chosen = multi_gpu() if args.multi_gpu else grid_issue20() if args.grid == "issue20" else grid()
    for params in chosen:
        name = name_of(params)
        repository(params, out / "repos" / name, args.code)
        points.append({"name": name, "params": params})
    (out / "points.json").write_text(json.dumps({"code": args.code, "points": points}, indent=1))
    shutil.copy(TRACE, out / "trace.csv")
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{len(points)} points, {size / 2**20:.1f} MiB in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
