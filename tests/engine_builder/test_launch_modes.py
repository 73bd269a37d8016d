"""How ``cosyvoice-serve`` starts the servers for the TensorRT-LLM backend (issue 19, item 8):
tritonserver in leader mode for one LLM group and under ``mpirun -n 1`` in orchestrator mode,
the mode chosen from the environment the operator renders; ``trtllm-serve --backend tensorrt``
only where the engine's TensorRT-LLM needs it."""

from __future__ import annotations

import dataclasses
import stat
from pathlib import Path
from typing import Any

import pytest

from cosyvoice_engine_builder.serving import launch
from cosyvoice_engine_builder.serving.options import ServeOptions
from cosyvoice_operator.render import triton
from tests.unit.objects import service


def options(**changes: Any) -> ServeOptions:
    values: dict[str, object] = {f.name: None for f in dataclasses.fields(ServeOptions)}
    values.update(
        model_repository="/tmp/r",
        http_port=8000,
        grpc_port=8001,
        metrics_port=8002,
        exit_timeout_seconds=20,
        engine_dir=Path("/engines/k"),
        kv_cache_fraction=0.4,
    )
    values.update(changes)
    return ServeOptions(**values)  # type: ignore[arg-type]


@pytest.fixture
def mpirun_path(tmp_path: Path) -> dict[str, str]:
    """A PATH holding an executable named mpirun (the launch only looks it up)."""
    exe = tmp_path / "mpirun"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return {"PATH": str(tmp_path)}


def test_leader_mode_starts_tritonserver_directly(mpirun_path: dict[str, str]) -> None:
    argv = launch.tritonserver_argv(options(), mpirun_path)
    assert argv[0] == "tritonserver"
    assert "--disable-auto-complete-config" not in argv
    off = launch.tritonserver_argv(options(), {**mpirun_path, "TRTLLM_ORCHESTRATOR": "0"})
    assert off[0] == "tritonserver" and "--disable-auto-complete-config" not in off


def test_orchestrator_mode_runs_triton_as_one_mpi_rank(mpirun_path: dict[str, str]) -> None:
    env = {**mpirun_path, "TRTLLM_ORCHESTRATOR": "1"}
    argv = launch.tritonserver_argv(options(), env)
    # TensorRT-LLM's launch_triton_server.py get_cmd() for world size 1.
    assert argv[:5] == ("mpirun", "--allow-run-as-root", "-n", "1", "tritonserver")
    assert argv[-2:] == (
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
    )
    assert "--model-repository=/tmp/r" in argv
    # MPIRUN names another mpirun; MPIRUN="" runs tritonserver itself (same flags).
    direct = launch.tritonserver_argv(options(), {**env, "MPIRUN": ""})
    assert direct[0] == "tritonserver" and "--disable-auto-complete-config" in direct


def test_the_mode_is_the_one_the_operator_renders() -> None:
    one_group = service(model={"variant": "cosyvoice2"})
    two_groups = service(model={"variant": "cosyvoice2"}, serving={"gpusPerReplica": 2})
    tp_group = service(
        model={"variant": "cosyvoice2"},
        serving={"gpusPerReplica": 2},
        engine={"tensorParallelSize": 2},
    )
    cv3 = service(model={"variant": "cosyvoice3"}, serving={"gpusPerReplica": 2})
    assert launch.orchestrator_mode(triton.server_environment(two_groups))
    assert launch.orchestrator_mode(triton.server_environment(tp_group))
    for svc in (one_group, cv3):
        assert not launch.orchestrator_mode(triton.server_environment(svc))


@pytest.mark.parametrize(
    ("built_with", "flag"),
    [("0.20.0", False), ("0.21.0rc1", False), ("1.0.0", True), ("1.2.0rc4", True), (None, False)],
)
def test_trtllm_serve_gets_backend_tensorrt_from_1_0(built_with: str | None, flag: bool) -> None:
    manifest: dict[str, Any] = {"tensorParallelSize": 1, "maxBatchSize": 16}
    if built_with is not None:
        manifest["versions"] = {"tensorrtLlm": built_with}
    argv = launch.trtllm_serve_argv(options(), manifest, 8010, {"MPIRUN": ""})
    assert argv[0] == "trtllm-serve"
    has = "--backend" in argv
    assert has == flag
    if has:
        assert argv[argv.index("--backend") + 1] == "tensorrt"
    assert argv[argv.index("--host") + 1] == triton.LLM_HOST


def test_the_rendered_llm_model_name_is_the_basename_trtllm_serve_is_started_on() -> None:
    """The orchestrator names the model trtllm-serve serves (its chat request schema requires
    ``model``): the operator renders ``llm_model_name``; trtllm-serve answers under the
    basename of the engine directory it is started on (TensorRT-LLM's ``OpenAIServer`` takes
    ``Path(model).name`` for a directory), which is the manifest's llmEngineDir."""
    manifest: dict[str, Any] = {
        "tensorParallelSize": 1,
        "maxBatchSize": 16,
        "layout": {"llmEngineDir": triton.ENGINE_LLM_DIR},
    }
    argv = launch.trtllm_serve_argv(options(), manifest, 8010, {"MPIRUN": ""})
    served = Path(argv[argv.index("serve") + 1])
    rendered = triton.llm_model_name(triton.engine_paths("/engines/k"))
    assert served.name == rendered == "llm"
