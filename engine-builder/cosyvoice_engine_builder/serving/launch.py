"""The command lines of the servers: ``trtllm-serve`` per GPU group, and Triton.

Pure functions of the options, the manifest and the environment (which may name other
executables); nothing here starts a process. :func:`plan_llm_servers` is what the
supervisor starts and what ``--dry-run`` prints.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosyvoice_engine_builder.layout import ENGINE_LLM_DIR, ENGINE_MODEL_DIR, LLM_SUBDIR
from cosyvoice_engine_builder.serving.gate import effective_llm_groups, layout_path
from cosyvoice_engine_builder.serving.options import ServeOptions
from cosyvoice_engine_builder.toolchain import find_executable


def trtllm_serve_argv(
    options: ServeOptions,
    manifest: Mapping[str, Any],
    port: int,
    environ: Mapping[str, str],
) -> tuple[str, ...]:
    """One LLM server as upstream's run_cosyvoice3.sh starts it, on the engine's paths."""
    engine = layout_path(options.engine_dir, manifest, "llmEngineDir", ENGINE_LLM_DIR)
    tokenizer = layout_path(
        options.engine_dir, manifest, "tokenizerDir", f"{ENGINE_MODEL_DIR}/{LLM_SUBDIR}"
    )
    tp = manifest.get("tensorParallelSize", 1)
    argv: list[str] = []
    # Upstream runs it under `mpirun -np 1`: TensorRT-LLM's executor then spawns its
    # tensor-parallel workers inside that MPI job. MPIRUN="" runs it directly.
    mpirun = _mpirun(environ)
    if mpirun:
        argv += [mpirun, "-np", "1", "--allow-run-as-root", "--oversubscribe"]
    argv += [
        environ.get("TRTLLM_SERVE") or "trtllm-serve",
        "serve",
        str(engine),
        "--tokenizer",
        str(tokenizer),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max_batch_size",
        str(manifest.get("maxBatchSize")),
        "--tp_size",
        str(tp),
        "--kv_cache_free_gpu_memory_fraction",
        str(options.kv_cache_fraction),
    ]
    if needs_tensorrt_backend_flag(manifest):
        argv += ["--backend", "tensorrt"]
    return tuple(argv)


def _mpirun(environ: Mapping[str, str]) -> str | None:
    """The mpirun to wrap a server in: MPIRUN (default ``mpirun``) when it is found; MPIRUN=""
    runs the server directly."""
    mpirun = environ.get("MPIRUN", "mpirun")
    return mpirun if mpirun and find_executable(mpirun, environ) is not None else None


def _major(version: object) -> int | None:
    if not isinstance(version, str):
        return None
    head = version.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else None


def needs_tensorrt_backend_flag(manifest: Mapping[str, Any]) -> bool:
    """Whether ``trtllm-serve`` must be told ``--backend tensorrt`` to load an engine directory.

    From TensorRT-LLM 1.0 its ``--backend`` defaults to ``pytorch``, which cannot load an
    engine; before (0.20, the pinned image) the option only accepts ``pytorch`` and its
    absence means the engine path, so the flag would be refused there. The version is the one
    the engine was built with (the manifest's ``versions.tensorrtLlm``), which the start-up
    gate has already required to be this image's.
    """
    versions = manifest.get("versions")
    built = versions.get("tensorrtLlm") if isinstance(versions, dict) else None
    major = _major(built)
    return major is not None and major >= 1


# Triton APIs no client of a CosyVoice fleet needs, and through which a client could reach
# what it must not: the shared-memory registration of NVIDIA's August 2025 bulletin
# (CVE-2025-23319/23320/23334 chain through it), loading and unloading models
# (model-repository; CVE-2025-23316 is in its model-name handling), the server's log and
# trace settings. Triton answers them only to a request carrying the header below with the
# pod's own key: a random one per server start unless COSYVOICE_TRITON_ADMIN_KEY gives one.
# Health, metadata, inference, model config and statistics stay open (the NetworkPolicy
# the operator renders decides who reaches the ports at all).
RESTRICTED_APIS = ("shared-memory", "model-repository", "logging", "trace")
ADMIN_HEADER = "cosyvoice-admin-key"
ADMIN_KEY_ENV = "COSYVOICE_TRITON_ADMIN_KEY"
_PROCESS_ADMIN_KEY = secrets.token_hex(32)


def admin_key(environ: Mapping[str, str]) -> str:
    return environ.get(ADMIN_KEY_ENV) or _PROCESS_ADMIN_KEY


# The operator's pod environment for the TensorRT-LLM backend's orchestrator mode
# (operator render/triton.py server_environment(): CosyVoice2 with more than one LLM GPU).
ORCHESTRATOR_ENV = "TRTLLM_ORCHESTRATOR"


def orchestrator_mode(environ: Mapping[str, str]) -> bool:
    value = environ.get(ORCHESTRATOR_ENV, "").strip()
    return value.isdigit() and int(value) != 0


def tritonserver_argv(options: ServeOptions, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Triton's command line. In the TensorRT-LLM backend's orchestrator mode it runs as one
    MPI rank, as TensorRT-LLM's own launcher starts it (``mpirun --allow-run-as-root -n 1
    tritonserver ... --disable-auto-complete-config --backend-config=python,shm-region-prefix-
    name=prefix0_``; NVIDIA/TensorRT-LLM ``triton_backend/scripts/launch_triton_server.py``,
    ``get_cmd``): the backend spawns its executor workers from that MPI job. Leader mode (one
    LLM group, or no ``tensorrt_llm`` model) starts tritonserver directly, as upstream's
    run.sh does. docs/concepts/triton-repository.md says which of the launcher's flags are left
    out."""
    restricted = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}={admin_key(environ)}"
    prefix: tuple[str, ...] = ()
    suffix: tuple[str, ...] = ()
    if orchestrator_mode(environ):
        mpirun = _mpirun(environ)
        if mpirun:
            prefix = (mpirun, "--allow-run-as-root", "-n", "1")
        suffix = (
            "--disable-auto-complete-config",
            "--backend-config=python,shm-region-prefix-name=prefix0_",
        )
    return (
        *prefix,
        environ.get("TRITONSERVER") or "tritonserver",
        f"--model-repository={options.model_repository}",
        f"--http-port={options.http_port}",
        f"--grpc-port={options.grpc_port}",
        f"--metrics-port={options.metrics_port}",
        "--allow-metrics=true",
        # Queue and compute latency summaries (quantiles) next to the counters: the
        # autoscaler reads queue time, and averages hide the tail that users hear.
        "--metrics-config=summary_latencies=true",
        f"--exit-timeout-secs={options.exit_timeout_seconds}",
        f"--http-restricted-api={restricted}",
        f"--grpc-restricted-protocol={restricted}",
        *suffix,
    )


def display(argv: Sequence[str]) -> str:
    """A command line as logs show it: the restricted APIs' key masked."""
    marker = f"{ADMIN_HEADER}="
    return " ".join(a.split(marker, 1)[0] + marker + "***" if marker in a else a for a in argv)


@dataclass(frozen=True)
class LlmServer:
    index: int
    gpus: tuple[str, ...]
    port: int
    argv: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"llm{self.index}"

    def describe(self) -> str:
        return f"trtllm-serve {self.name} (GPUs {','.join(self.gpus)}, port {self.port})"


def plan_llm_servers(
    options: ServeOptions, manifest: Mapping[str, Any], environ: Mapping[str, str]
) -> list[LlmServer]:
    servers = []
    for index, gpus in enumerate(effective_llm_groups(options, manifest) or ()):
        port = options.llm_base_port + index
        argv = trtllm_serve_argv(options, manifest, port, environ)
        servers.append(LlmServer(index, gpus, port, argv))
    return servers
