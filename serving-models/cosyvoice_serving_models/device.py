"""The device Triton gives a model instance, and the record of it."""

from __future__ import annotations

import json
import os
from pathlib import Path

RECORD_DIR_ENV = "COSYVOICE_DEVICE_RECORD_DIR"


def assigned_device(args: dict[str, str], cuda_available: bool) -> str:
    """``cuda:<model_instance_device_id>`` for a ``KIND_GPU`` instance, ``cpu`` otherwise.

    Triton starts one instance per (GPU, count) of the instance group and passes that GPU's
    index as ``model_instance_device_id``; a GPU instance without CUDA is an error, not a
    silent fall-back to the CPU.
    """
    kind = args.get("model_instance_kind", "CPU")
    if kind != "GPU":
        return "cpu"
    if not cuda_available:
        raise RuntimeError("a KIND_GPU instance, but torch sees no CUDA device")
    return f"cuda:{int(args['model_instance_device_id'])}"


def record(args: dict[str, str], device: str) -> None:
    """Write what Triton gave this instance and what it runs on, when a test asks for it."""
    directory = os.environ.get(RECORD_DIR_ENV)
    if not directory:
        return
    name = args.get("model_instance_name", "unknown")
    entry = {
        "instance": name,
        "kind": args.get("model_instance_kind", ""),
        "device_id": args.get("model_instance_device_id", ""),
        "device": device,
        "pid": os.getpid(),
    }
    Path(directory).mkdir(parents=True, exist_ok=True)
    (Path(directory) / f"{name}.json").write_text(json.dumps(entry))
