"""`serve`: the compatibility gate, the model repository, the servers and their signals.

The engines are real: built by the builder's own pipeline (with its stand-in tools), so
the gate reads manifests exactly as the builder writes them. nvidia-smi, tritonserver,
trtllm-serve and mpirun are stand-ins on PATH: small scripts that run
:func:`standin_main` below, log each event to ``$SERVE_CALL_LOG`` and behave as the
``FAKE_*`` variables say. The trtllm-serve stand-in really serves ``/health`` on its
port, and the tritonserver stand-in probes those ports when it starts and while it
drains, so the tests see the order in which things happened.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import cosyvoice_engine_builder
from cosyvoice_engine_builder import cli
from cosyvoice_engine_builder.serving import command, supervisor
from cosyvoice_engine_builder.serving.options import (
    DEFAULT_MODEL_VIEW,
    ServeOptions,
    build_parser,
    parse_llm_groups,
)
from cosyvoice_engine_builder.serving.repository import (
    REPOSITORY_MARKER,
    assemble_repository,
    plan_repository,
)
from cosyvoice_engine_builder.serving.supervisor import exit_code_of
from tests.engine_builder.conftest import (
    KEY,
    KEY2,
    TRT_VERSION,
    TRTLLM_VERSION,
    Builder,
    copy_engines,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_ROOT = str(Path(cosyvoice_engine_builder.__file__).resolve().parents[1])
H100 = "9.0, NVIDIA H100 80GB HBM3"
L4 = "8.9, NVIDIA L4"
CV3_MODELS = ("audio_tokenizer", "cosyvoice3", "speaker_embedding", "token2wav", "vocoder")
CV2_MODELS = ("audio_tokenizer", "cosyvoice2", "speaker_embedding", "tensorrt_llm", "token2wav")


# ------------------------------------------------------------------------ stand-ins


def _log(event: str, **fields: Any) -> None:
    record = {
        "tool": Path(sys.argv[0]).name,
        "event": event,
        "t": time.time(),
        "pid": os.getpid(),
        **fields,
    }
    with open(os.environ["SERVE_CALL_LOG"], "a", encoding="utf-8") as log:
        log.write(json.dumps(record) + "\n")


def _opt(argv: list[str], name: str) -> str:
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise SystemExit(f"stand-in: {name} missing from {argv}")


def _llm_health(ports: str) -> dict[str, bool]:
    result = {}
    for port in filter(None, ports.split(",")):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                result[port] = r.status == 200
        except OSError:
            result[port] = False
    return result


def _wait_for_signal(on_signal: Any) -> None:
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    while not received:
        time.sleep(0.05)
    on_signal(received[0])


def _standin_nvidia_smi(argv: list[str]) -> None:
    if os.environ.get("FAKE_SMI_FAIL"):
        print("NVIDIA-SMI has failed because it couldn't communicate with the driver")
        raise SystemExit(9)
    assert argv == ["--query-gpu=compute_cap,name", "--format=csv,noheader"], argv
    for line in filter(None, os.environ.get("FAKE_GPUS", H100).split(";")):
        print(line)


def _standin_mpirun(argv: list[str]) -> None:
    _log("start", argv=argv)
    rest = list(argv)
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] == "-np" else rest[1:]
    os.execvp(rest[0], rest)


# trtllm-serve serve's options (tensorrt_llm/commands/serve.py, the click options of
# ``serve``: NVIDIA/TensorRT-LLM 00209af, the code index's stored version; 0.20's is not
# stored there and has a subset of these, each flag cosyvoice-serve passes among them).
# Switches take no value; click answers any other option with "No such option" (exit 2).
TRTLLM_SERVE_SWITCHES = frozenset(
    {"--trust_remote_code", "--fail_fast_on_attention_window_too_large", "--enable_chunked_prefill"}
)
TRTLLM_SERVE_OPTIONS = TRTLLM_SERVE_SWITCHES | frozenset(
    {
        "--tokenizer",
        "--custom_tokenizer",
        "--host",
        "--port",
        "--backend",
        "--custom_module_dirs",
        "--log_level",
        "--max_beam_width",
        "--max_batch_size",
        "--max_num_tokens",
        "--max_seq_len",
        "--tensor_parallel_size",
        "--tp_size",
        "--pipeline_parallel_size",
        "--pp_size",
        "--context_parallel_size",
        "--cp_size",
        "--moe_expert_parallel_size",
        "--ep_size",
        "--moe_cluster_parallel_size",
        "--cluster_size",
        "--gpus_per_node",
        "--free_gpu_memory_fraction",
        "--kv_cache_free_gpu_memory_fraction",
        "--num_postprocess_workers",
        "--revision",
        "--config",
        "--extra_llm_api_options",
        "--reasoning_parser",
        "--tool_parser",
        "--metadata_server_config_file",
        "--server_role",
        "--otlp_traces_endpoint",
        "--disagg_cluster_uri",
        "--media_io_kwargs",
        "--chat_template",
    }
)


def trtllm_serve_usage_error(argv: list[str]) -> str | None:
    """click's complaint about a ``trtllm-serve`` command line, or None when it takes it:
    ``serve MODEL`` and options it has, each but a switch with its value."""
    if argv[:1] != ["serve"] or len(argv) < 2 or argv[1].startswith("-"):
        return "Error: Missing argument 'MODEL'."
    rest = argv[2:]
    while rest:
        name = rest[0].partition("=")[0]
        if name not in TRTLLM_SERVE_OPTIONS:
            return f"Error: No such option: {name}"
        if name in TRTLLM_SERVE_SWITCHES or "=" in rest[0]:
            rest = rest[1:]
        elif len(rest) < 2:
            return f"Error: Option '{name}' requires an argument."
        else:
            rest = rest[2:]
    return None


def _standin_trtllm_serve(argv: list[str]) -> None:
    refused = trtllm_serve_usage_error(argv)
    if refused is not None:
        _log("refused", argv=argv, error=refused)
        print(f"Usage: trtllm-serve serve [OPTIONS] MODEL\n{refused}", file=sys.stderr)
        raise SystemExit(2)
    port = int(_opt(argv, "--port"))
    _log("start", argv=argv, cuda=os.environ.get("CUDA_VISIBLE_DEVICES"), port=port)
    print(f"trtllm-serve stand-in loading on port {port}", flush=True)
    exit_now = os.environ.get("FAKE_LLM_EXIT", "")
    if exit_now.startswith(f"{port}:"):
        time.sleep(0.3)
        print("RuntimeError: simulated engine load failure", flush=True)
        raise SystemExit(int(exit_now.split(":")[1]))

    def on_signal(signum: int) -> None:
        _log("signal", port=port, signal=signal.Signals(signum).name)
        raise SystemExit(0)

    if os.environ.get("FAKE_LLM_NO_HEALTH"):
        _wait_for_signal(on_signal)
        return

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    time.sleep(float(os.environ.get("FAKE_LLM_HEALTH_DELAY", "0.5")))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    later = os.environ.get("FAKE_LLM_EXIT_AFTER", "")
    if later.startswith(f"{port}:"):
        _, seconds, code = later.split(":")

        def crash() -> None:
            time.sleep(float(seconds))
            _log("crash", port=port)
            os._exit(int(code))

        threading.Thread(target=crash, daemon=True).start()
    _wait_for_signal(on_signal)


def _standin_tritonserver(argv: list[str]) -> None:
    repo = Path(_opt(argv, "--model-repository"))
    models = {
        p.name: {
            "config": (p / "config.pbtxt").read_text(),
            "code": os.readlink(p / "1"),
            "has_model_py": (p / "1" / "model.py").is_file(),
        }
        for p in sorted(repo.iterdir())
        if p.is_dir()
    }
    ports = os.environ.get("FAKE_LLM_PORTS", "")
    _log("start", argv=argv, models=models, llm_health=_llm_health(ports))
    if "FAKE_TRITON_EXIT" in os.environ:
        time.sleep(0.3)
        raise SystemExit(int(os.environ["FAKE_TRITON_EXIT"]))

    def on_signal(signum: int) -> None:
        _log("signal", signal=signal.Signals(signum).name)
        time.sleep(float(os.environ.get("FAKE_TRITON_DRAIN", "0.5")))
        # In-flight streams still reach their LLM servers while Triton drains.
        _log("drained", llm_health=_llm_health(ports))
        raise SystemExit(int(os.environ.get("FAKE_TRITON_TERM_EXIT", "0")))

    _wait_for_signal(on_signal)


def standin_main() -> None:
    tool = Path(sys.argv[0]).name
    {
        "nvidia-smi": _standin_nvidia_smi,
        "mpirun": _standin_mpirun,
        "trtllm-serve": _standin_trtllm_serve,
        "tritonserver": _standin_tritonserver,
    }[tool](sys.argv[1:])


# -------------------------------------------------------------------------- fixtures


def _free_base_port() -> int:
    """A port p with p, p+1 and p+2 free (two LLM groups; p+2: serve's --health-port, see
    :meth:`Pod.argv`)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base > 65000:
            continue
        try:
            with socket.socket() as other, socket.socket() as third:
                other.bind(("127.0.0.1", base + 1))
                third.bind(("127.0.0.1", base + 2))
            return base
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


@dataclass
class Outcome:
    code: int
    out: str
    err: str
    termination: dict[str, Any] | None


@dataclass
class Pod:
    """A serving pod's view: an engine, a repository ConfigMap, the image's model code."""

    builder: Builder
    tmp: Path
    env: dict[str, str]
    config_dir: Path
    model_code: Path
    repository: Path
    view: Path
    call_log: Path
    termination_path: Path
    llm_base_port: int

    def argv(self, variant: str = "cosyvoice3", **overrides: Any) -> list[str]:
        values: dict[str, Any] = {
            "engine-dir": self.builder.cache / (KEY if variant == "cosyvoice3" else KEY2),
            "key": KEY if variant == "cosyvoice3" else KEY2,
            "variant": variant,
            "repository-config": self.config_dir / variant,
            "model-code": self.model_code,
            "model-repository": self.repository,
            "model-view": self.view,
            "llm-base-port": self.llm_base_port,
            "exit-timeout-seconds": 20,
        }
        groups = overrides.get("llm_groups", "0,1;2,3" if variant == "cosyvoice3" else None)
        if not groups or groups.count(";") < 2:
            # Beyond two groups' LLM ports; more groups are refused before any server starts.
            values["health-port"] = self.llm_base_port + 2
        if variant == "cosyvoice3":
            values["llm-groups"] = "0,1;2,3"
        flags = [k for k, v in overrides.items() if v is True]
        values.update({k.replace("_", "-"): v for k, v in overrides.items() if v is not True})
        argv = ["serve"]
        for name, value in values.items():
            if value is not None:
                argv += [f"--{name}", str(value)]
        return argv + [f"--{k.replace('_', '-')}" for k in flags]

    def run(self, argv: list[str], **env_extra: str) -> Outcome:
        """In-process, for everything that stops before a server is started."""
        return self._run(cli.main, argv, env_extra)

    def run_cosyvoice_serve(self, argv: list[str], **env_extra: str) -> Outcome:
        """The same, through ``cosyvoice-serve``: ``argv`` without the leading ``serve``."""
        return self._run(command.main, argv, env_extra)

    def _run(self, main: Callable[..., int], argv: list[str], env_extra: dict[str, str]) -> Outcome:
        self.termination_path.unlink(missing_ok=True)
        self.builder.readouterr()
        code = main(argv, environ={**self.env, **env_extra})
        captured = self.builder.readouterr()
        return Outcome(code, captured.out, captured.err, self.termination())

    def start(
        self, argv: list[str], module: str = "cosyvoice_engine_builder", **env_extra: str
    ) -> subprocess.Popen[str]:
        """The real process, as the container runs it (``module``: ``python -m`` what)."""
        self.termination_path.unlink(missing_ok=True)
        env = {**self.env, **env_extra}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p
        )
        return subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def termination(self) -> dict[str, Any] | None:
        if not self.termination_path.exists():
            return None
        data: dict[str, Any] = json.loads(self.termination_path.read_text())
        return data

    def calls(self, tool: str | None = None, event: str | None = None) -> list[dict[str, Any]]:
        if not self.call_log.exists():
            return []
        records = [json.loads(line) for line in self.call_log.read_text().splitlines()]
        return [
            r
            for r in records
            if (tool is None or r["tool"] == tool) and (event is None or r["event"] == event)
        ]

    def wait_for(self, tool: str, event: str, count: int = 1, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.calls(tool, event)) < count:
            assert time.monotonic() < deadline, f"no {event} of {tool}: {self.calls()}"
            time.sleep(0.05)


def _write_standins(bin_dir: Path) -> None:
    bin_dir.mkdir()
    for tool in ("nvidia-smi", "mpirun", "trtllm-serve", "tritonserver"):
        path = bin_dir / tool
        path.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
            "from tests.engine_builder.test_serve import standin_main\nstandin_main()\n"
        )
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _write_repository_config(root: Path, variant: str, models: tuple[str, ...]) -> None:
    config = root / variant
    config.mkdir(parents=True)
    for model in models:
        (config / f"{model}.pbtxt").write_text(f'name: "{model}"\nbackend: "python"\n')
    # What a ConfigMap volume holds besides its keys.
    (config / "..data").mkdir()


def _write_model_code(root: Path, variant: str, models: tuple[str, ...]) -> None:
    for model in models:
        code = root / variant / model / "1"
        code.mkdir(parents=True)
        if model != "tensorrt_llm":  # upstream's is an empty directory (.gitkeep)
            (code / "model.py").write_text(f"# upstream {variant}/{model}\n")


@pytest.fixture
def pod(builder: Builder, serving_engines: Path) -> Pod:
    copy_engines(serving_engines, builder.cache)
    tmp = builder.tmp / "pod"
    tmp.mkdir()
    _write_standins(tmp / "bin")
    for variant, models in (("cosyvoice2", CV2_MODELS), ("cosyvoice3", CV3_MODELS)):
        _write_repository_config(tmp / "config", variant, models)
        _write_model_code(tmp / "code", variant, models)
    env = dict(builder.env)
    env.pop("NVIDIA_SMI", None)
    env["PATH"] = f"{tmp / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["SERVE_CALL_LOG"] = str(tmp / "calls.jsonl")
    env["TERMINATION_MESSAGE_PATH"] = str(tmp / "termination-log")
    env["FAKE_GPUS"] = ";".join([H100] * 4)
    base = _free_base_port()
    env["FAKE_LLM_PORTS"] = f"{base},{base + 1}"
    for name in [
        k for k in env if k.startswith("FAKE_") and k not in ("FAKE_GPUS", "FAKE_LLM_PORTS")
    ]:
        env.pop(name)
    return Pod(
        builder=builder,
        tmp=tmp,
        env=env,
        config_dir=tmp / "config",
        model_code=tmp / "code",
        repository=tmp / "model_repository",
        view=tmp / "model_view",
        call_log=tmp / "calls.jsonl",
        termination_path=tmp / "termination-log",
        llm_base_port=base,
    )


@pytest.fixture
def running(pod: Pod) -> Iterator[list[subprocess.Popen[str]]]:
    """Processes a test starts; they and their servers are killed if the test fails."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
    for pid in {c["pid"] for c in pod.calls()}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for process in processes:
        process.communicate(timeout=30)


def _layout(engine: Path) -> dict[str, str]:
    layout: dict[str, str] = json.loads((engine / "manifest.json").read_text())["layout"]
    return layout


def _finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


# ----------------------------------------------------------------- dry run and the gate


def test_dry_run_prints_the_checks_and_the_commands_and_starts_nothing(pod: Pod) -> None:
    result = pod.run(pod.argv(dry_run=True))
    assert result.code == 0, result.err
    assert result.termination is None
    assert not pod.repository.exists() and not pod.view.exists()
    assert [c["tool"] for c in pod.calls()] == []  # nvidia-smi logs nothing; no server ran
    engine = pod.builder.cache / KEY
    base = pod.llm_base_port
    lines = result.out.splitlines()
    assert (
        f"[gate] engine: key {KEY}, cosyvoice3, bfloat16, tp 2, max batch 16, sm_90, "
        f"TensorRT {TRT_VERSION}, TensorRT-LLM {TRTLLM_VERSION}," in result.out
    )
    assert (
        f"[gate] pod: sm_90 (4x NVIDIA H100 80GB HBM3), TensorRT {TRT_VERSION}, "
        f"TensorRT-LLM {TRTLLM_VERSION}" in lines
    )
    assert "[gate] ok: the engine was built for this GPU architecture and TensorRT" in lines
    for model in CV3_MODELS:
        assert (
            f"[repository] would assemble {pod.repository / model}: config.pbtxt from "
            f"{pod.config_dir / 'cosyvoice3' / (model + '.pbtxt')}, 1 -> "
            f"{pod.model_code / 'cosyvoice3' / model / '1'}" in lines
        )
    flow = engine / _layout(engine)["flowEstimatorPlan"]
    speaker = engine / _layout(engine)["speakerEmbeddingPlan"]
    assert f"[repository]   campplus.l20.fp32.trt -> {speaker}" in lines
    for device in range(4):
        assert (
            f"[repository]   flow.decoder.estimator.autocast_fp16.{device}.plan -> {flow}" in lines
        )
    for index, gpus in enumerate(("0,1", "2,3")):
        assert (
            f"[llm] would start trtllm-serve llm{index} (GPUs {gpus}, port {base + index}): "
            f"CUDA_VISIBLE_DEVICES={gpus} mpirun -np 1 --allow-run-as-root --oversubscribe "
            f"trtllm-serve serve {engine / 'llm'} --tokenizer {engine / 'model' / 'llm'} "
            f"--host 127.0.0.1 --port {base + index} --max_batch_size 16 --tp_size 2 "
            f"--kv_cache_free_gpu_memory_fraction 0.4; then wait for "
            f"http://127.0.0.1:{base + index}/health" in lines
        )
    # Issue 21: the APIs no client needs are restricted to the pod's own key, masked here.
    restricted = "shared-memory,model-repository,logging,trace:cosyvoice-admin-key=***"
    assert (
        f"[triton] would run: tritonserver --model-repository={pod.repository} "
        "--http-port=8000 --grpc-port=8001 --metrics-port=8002 --allow-metrics=true "
        "--metrics-config=summary_latencies=true --exit-timeout-secs=20 "
        f"--http-restricted-api={restricted} --grpc-restricted-protocol={restricted}" in lines
    )


def test_dry_run_reports_a_failing_gate_with_its_exit_code(pod: Pod) -> None:
    result = pod.run(pod.argv(dry_run=True), FAKE_GPUS=L4)
    assert result.code == 3
    assert "is not sm_90" in result.err
    assert "[triton] would run:" in result.out
    assert result.termination is None  # a dry run reports on the console only


def _refused(result: Outcome, *fields: str) -> str:
    """The gate's refusal: exit 3, one message, the same on stderr and in the pod status."""
    assert result.code == 3, result.out + result.err
    assert result.termination is not None
    message = str(result.termination["message"])
    assert result.termination["result"] == "failed"
    assert result.termination["step"] == "compatibility"
    assert result.termination["key"] == KEY
    assert result.termination["reason"] == "EngineIncompatible"
    assert result.termination["mismatches"] == sorted(fields)
    assert result.err.strip() == f"error: {message}"
    return message


def test_another_gpu_architecture_is_refused_naming_both_sides(pod: Pod) -> None:
    result = pod.run(pod.argv(), FAKE_GPUS=";".join([L4] * 4))
    message = _refused(result, "gpuArch")
    assert message.startswith(
        f"engine {KEY} was built for sm_90 with TensorRT {TRT_VERSION} and TensorRT-LLM "
        f"{TRTLLM_VERSION}; this pod has sm_89 (4x NVIDIA L4), TensorRT {TRT_VERSION} and "
        f"TensorRT-LLM {TRTLLM_VERSION}: GPU architecture sm_89 is not sm_90. "
        "Schedule this pod only on sm_90 nodes"
    )
    assert "let the operator build an engine for sm_89" in message
    assert pod.calls("tritonserver") == [] and pod.calls("trtllm-serve") == []
    assert not pod.repository.exists()


def test_one_gpu_of_another_architecture_is_enough_to_refuse(pod: Pod) -> None:
    result = pod.run(pod.argv(), FAKE_GPUS=";".join([H100, H100, L4, H100]))
    message = _refused(result, "gpuArch")
    assert "this pod has sm_90 (3x NVIDIA H100 80GB HBM3), sm_89 (NVIDIA L4)" in message


def test_another_tensorrt_version_is_refused(pod: Pod) -> None:
    result = pod.run(pod.argv(), TENSORRT_VERSION="10.11.0.33")
    message = _refused(result, "tensorrt")
    assert (
        f"this pod has sm_90 (4x NVIDIA H100 80GB HBM3), TensorRT 10.11.0.33 and "
        f"TensorRT-LLM {TRTLLM_VERSION}: TensorRT {TRT_VERSION} built it, this image has "
        "TensorRT 10.11.0.33. An engine loads only under the TensorRT that built it"
    ) in message


def test_another_tensorrt_llm_version_is_refused(pod: Pod) -> None:
    result = pod.run(pod.argv(), TRTLLM_VERSION="1.0.0")
    message = _refused(result, "tensorrtLlm")
    assert f"TensorRT-LLM {TRTLLM_VERSION} built it, this image has TensorRT-LLM 1.0.0" in message


def test_every_mismatch_is_in_the_one_message(pod: Pod) -> None:
    result = pod.run(pod.argv(), FAKE_GPUS=L4, TENSORRT_VERSION="10.11.0.33")
    message = _refused(result, "gpuArch", "llmGroups", "tensorrt")
    assert "sm_89 is not sm_90; TensorRT 10.10.0.31 built it" in message
    assert "--llm-groups names GPU 1, 2, 3; this pod sees 1 GPU(s)" in message


def test_the_versions_are_probed_from_the_image_as_the_builder_does(pod: Pod) -> None:
    fake = pod.tmp / "site"
    (fake / "tensorrt").mkdir(parents=True)
    (fake / "tensorrt" / "__init__.py").write_text('__version__ = "10.9.0.34"\n')
    dist = fake / "tensorrt_llm-0.20.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 0.20.0\n")
    env = {k: v for k, v in pod.env.items() if k not in ("TENSORRT_VERSION", "TRTLLM_VERSION")}
    env["PYTHONPATH"] = str(fake)
    pod.termination_path.unlink(missing_ok=True)
    pod.builder.readouterr()
    code = cli.main(pod.argv(), environ=env)
    captured = pod.builder.readouterr()
    message = _refused(Outcome(code, captured.out, captured.err, pod.termination()), "tensorrt")
    assert "TensorRT 10.10.0.31 built it, this image has TensorRT 10.9.0.34" in message


def test_an_engine_of_another_key_is_refused(pod: Pod) -> None:
    result = pod.run(pod.argv(engine_dir=pod.builder.cache / KEY2))
    message = _refused(result, "key", "llmGroups", "variant")
    assert f"{pod.builder.cache / KEY2} holds engine '{KEY2}', not '{KEY}'" in message
    assert message.startswith(f"engine {KEY2} was built for sm_90")
    assert "The Deployment mounts the wrong directory of the engine cache" in message
    assert "the engine is a cosyvoice2 engine, this pod serves cosyvoice3" in message


def test_the_groups_must_match_the_engines_tensor_parallel_size(pod: Pod) -> None:
    result = pod.run(pod.argv(llm_groups="0;1;2;3"))
    message = _refused(result, "llmGroups")
    assert (
        "the LLM GPU groups have 1 GPU(s); the engine was built for tensor-parallel size 2. "
        "Each --llm-groups group must hold exactly 2 GPU(s)."
    ) in message


def test_a_missing_manifest_is_its_own_message(pod: Pod) -> None:
    (pod.builder.cache / KEY / "manifest.json").unlink()
    result = pod.run(pod.argv())
    assert result.code == 3
    assert result.termination is not None
    assert result.termination["reason"] == "EngineMissing"
    assert result.termination["mismatches"] == []
    message = str(result.termination["message"])
    assert message.startswith(
        f"engine {KEY}: {pod.builder.cache / KEY / 'manifest.json'} is missing: the engine's "
        "build never completed in this cache (or it is being removed)"
    )
    assert "only for engines that are Ready" in message
    assert pod.calls() == []  # not even nvidia-smi: nothing to compare with


def test_a_missing_engine_directory_says_so(pod: Pod) -> None:
    result = pod.run(pod.argv(engine_dir=pod.builder.cache / "nothing-here"))
    assert result.code == 3
    assert result.termination is not None
    assert result.termination["reason"] == "EngineMissing"
    assert f"{pod.builder.cache / 'nothing-here'} does not exist" in result.termination["message"]


def test_an_unreadable_manifest_is_refused(pod: Pod) -> None:
    (pod.builder.cache / KEY / "manifest.json").write_text("{not json")
    result = pod.run(pod.argv())
    assert result.code == 3
    assert "manifest.json is unreadable" in result.err
    assert result.termination is not None
    assert result.termination["reason"] == "EngineInvalid"


def test_missing_and_resized_files_are_refused(pod: Pod) -> None:
    engine = pod.builder.cache / KEY
    (engine / "llm" / "rank1.engine").unlink()
    plan = next((engine / "plans").iterdir())
    plan.write_bytes(plan.read_bytes()[:5])
    result = pod.run(pod.argv())
    message = _refused(result, "files")
    assert (
        f"2 file(s) missing or changed since the build: llm/rank1.engine (missing), "
        f"plans/{plan.name} (size 5, built as "
    ) in message
    assert f"cosyvoice-engine-builder verify --cache-dir {pod.builder.cache} --key {KEY}" in message


def test_a_pod_without_a_visible_gpu_is_refused(pod: Pod) -> None:
    result = pod.run(pod.argv(), FAKE_GPUS="")
    message = _refused(result, "gpuArch")
    assert "this pod has no visible GPU (nvidia-smi listed no GPU)" in message
    assert "the pod must request nvidia.com/gpu" in message.lower()


def test_a_failing_nvidia_smi_is_refused_with_its_words(pod: Pod) -> None:
    result = pod.run(pod.argv(), FAKE_SMI_FAIL="1")
    message = _refused(result, "gpuArch")
    assert "nvidia-smi failed: nvidia-smi: exited with code 9" in message
    assert "couldn't communicate with the driver" in message


# --------------------------------------------------------------- repository and usage


def test_a_model_whose_code_is_not_in_the_image_exits_2(pod: Pod) -> None:
    config = pod.config_dir / "cosyvoice3"
    (config / "token2wav_dit.pbtxt").write_text('name: "token2wav_dit"\n')
    result = pod.run(pod.argv())
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "repository"
    expected = pod.model_code / "cosyvoice3" / "token2wav_dit" / "1"
    assert (
        f"names model(s) whose code is not in this image: token2wav_dit (expected {expected}); "
        f"the image has cosyvoice3 code for {', '.join(CV3_MODELS)}"
    ) in result.termination["message"]
    assert pod.calls("trtllm-serve") == [] and pod.calls("tritonserver") == []


def test_an_empty_repository_config_exits_2(pod: Pod) -> None:
    empty = pod.tmp / "empty"
    empty.mkdir()
    result = pod.run(pod.argv(repository_config=empty))
    assert result.code == 2
    assert f"no <model>.pbtxt in {empty}" in result.err


def test_the_repository_is_assembled_again_after_a_restart(pod: Pod) -> None:
    options = ServeOptions.from_args(cli.build_parser().parse_args(pod.argv()))
    entries = plan_repository(options)
    assemble_repository(pod.repository, entries)
    (pod.repository / "stale_model").mkdir()
    assemble_repository(pod.repository, entries[:2])
    assert sorted(p.name for p in pod.repository.iterdir()) == sorted(
        [REPOSITORY_MARKER, *CV3_MODELS[:2]]
    )
    model = pod.repository / CV3_MODELS[0]
    assert (model / "config.pbtxt").read_text() == f'name: "{CV3_MODELS[0]}"\nbackend: "python"\n'
    assert not (model / "config.pbtxt").is_symlink()
    assert (model / "1").resolve() == pod.model_code / "cosyvoice3" / CV3_MODELS[0] / "1"


def test_a_foreign_non_empty_directory_is_never_cleared(pod: Pod) -> None:
    foreign = pod.tmp / "somebody-elses"
    foreign.mkdir()
    (foreign / "precious").write_text("keep me")
    result = pod.run(pod.argv(model_repository=foreign))
    assert result.code == 2
    assert "is not empty and was not assembled by serve" in result.err
    assert (foreign / "precious").read_text() == "keep me"


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"llm_groups": "0,1;1,2"}, "GPU 1 is in more than one place"),
        ({"llm_groups": "0,,1"}, "expected GPU indices"),
        ({"llm_groups": "a"}, "expected GPU indices"),
        ({"llm_base_port": 7999}, "collide with Triton's port 8000"),
        ({"grpc_port": 8000}, "Triton's ports must differ"),
        ({"key": "../etc"}, "expected the operator's content key"),
        ({"variant": "cosyvoice1"}, "invalid choice"),
        ({"exit_timeout_seconds": -1}, "must be >= 0"),
    ],
)
def test_invalid_arguments_exit_2_with_a_termination_message(
    pod: Pod, overrides: dict[str, Any], words: str
) -> None:
    result = pod.run(pod.argv(**overrides))
    assert result.code == 2
    assert words in result.err
    assert result.termination is not None
    assert result.termination["step"] == "arguments"
    assert words in result.termination["message"]


@pytest.mark.parametrize(
    ("text", "groups"),
    [
        ("0", (("0",),)),
        ("0,1;2,3", (("0", "1"), ("2", "3"))),
        (" 0 , 1 ; 2 , 3 ", (("0", "1"), ("2", "3"))),
        ("3;2;1;0", (("3",), ("2",), ("1",), ("0",))),
    ],
)
def test_llm_groups_parse(text: str, groups: tuple[tuple[str, ...], ...]) -> None:
    assert parse_llm_groups(text) == groups


def test_cosyvoice3_defaults_to_one_group_of_the_engines_tensor_parallel_size(pod: Pod) -> None:
    result = pod.run(pod.argv(llm_groups=None, dry_run=True))
    assert result.code == 0, result.err
    assert "[llm] would start trtllm-serve llm0 (GPUs 0,1," in result.out
    assert "llm1" not in result.out


def test_cosyvoice_serve_is_the_same_command_as_the_alias(pod: Pod) -> None:
    argv = pod.argv(dry_run=True)
    assert argv[0] == "serve"
    alias = pod.run(argv, FAKE_GPUS=L4)
    own = pod.run_cosyvoice_serve(argv[1:], FAKE_GPUS=L4)
    assert own.code == alias.code == 3
    assert own.out == alias.out and "[triton] would run:" in own.out
    assert own.err == alias.err and "is not sm_90" in own.err


def test_cosyvoice_serve_usage_errors_name_it(pod: Pod) -> None:
    result = pod.run_cosyvoice_serve(["--variant", "cosyvoice1"])
    assert result.code == 2
    assert result.err.startswith("usage: cosyvoice-serve ")
    assert "invalid choice: 'cosyvoice1'" in result.err
    assert result.termination is not None
    assert result.termination["step"] == "arguments"
    assert "invalid choice" in result.termination["message"]


def test_both_entry_points_take_model_view_with_the_same_default() -> None:
    """The operator's model_dir parameters point at --model-view: /tmp/model_view."""
    required = ["--engine-dir", "/e", "--key", KEY, "--variant", "cosyvoice2"]
    required += ["--repository-config", "/c"]
    assert Path("/tmp/model_view") == DEFAULT_MODEL_VIEW
    for parser, prefix in ((build_parser(), []), (cli.build_parser(), ["serve"])):
        assert parser.parse_args([*prefix, *required]).model_view == DEFAULT_MODEL_VIEW
        flagged = parser.parse_args([*prefix, *required, "--model-view", "/v"])
        assert flagged.model_view == Path("/v")


# Run in a process of its own (reap_orphans collects any exited child of its caller, which in
# pytest's process could be another test's): made a child subreaper, as PID 1 in a container
# is, it inherits a real orphan (a shell's background job, the shell gone) beside a child it
# tracks; it waits until both have exited (waitid with WNOWAIT: still zombies) before reaping.
REAP_SCRIPT = """
import ctypes, json, os, subprocess, sys
from cosyvoice_engine_builder.serving.supervisor import reap_orphans
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
ours = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
shell = subprocess.run(
    ["sh", "-c", "sleep 0 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
)
orphan = int(shell.stdout)
for pid in (ours.pid, orphan):
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
first = reap_orphans(known={ours.pid})
ours_code = ours.wait(timeout=5)
second = reap_orphans(known=set())
print(json.dumps({"ours": ours.pid, "orphan": orphan, "first": first, "second": second,
                  "ours_code": ours_code}))
"""


def test_orphans_are_reaped_and_our_children_are_left_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", REAP_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["ours"] not in got["first"]
    # Our child's exit status was left for its owner to collect.
    assert got["ours_code"] == 3
    # The orphan is reaped, once, by one of the two calls.
    assert sorted(got["first"] + got["second"]) == [got["orphan"]]


@pytest.mark.parametrize(("returncode", "code"), [(0, 0), (5, 5), (-15, 143), (-9, 137)])
def test_exit_codes_of_children_read_like_a_shells(returncode: int, code: int) -> None:
    assert exit_code_of(returncode) == code


# ---------------------------------------------------------------- the servers, for real


def test_cosyvoice3_waits_for_every_llm_then_runs_triton_and_drains_first_on_sigterm(
    pod: Pod, running: list[subprocess.Popen[str]]
) -> None:
    process = pod.start(pod.argv(), FAKE_LLM_HEALTH_DELAY="1.5")
    running.append(process)
    pod.wait_for("tritonserver", "start")
    base = pod.llm_base_port
    llms = sorted(pod.calls("trtllm-serve", "start"), key=lambda c: int(c["port"]))
    assert [(c["cuda"], c["port"]) for c in llms] == [("0,1", base), ("2,3", base + 1)]
    engine = pod.builder.cache / KEY
    assert llms[0]["argv"] == [
        *("serve", str(engine / "llm"), "--tokenizer", str(engine / "model" / "llm")),
        *("--host", "127.0.0.1", "--port", str(base), "--max_batch_size", "16"),
        *("--tp_size", "2", "--kv_cache_free_gpu_memory_fraction", "0.4"),
    ]
    assert len(pod.calls("mpirun", "start")) == 2
    triton = pod.calls("tritonserver", "start")[0]
    # Triton started only when both LLM servers answered /health.
    assert triton["llm_health"] == {str(base): True, str(base + 1): True}
    assert sorted(triton["models"]) == sorted(CV3_MODELS)
    assert triton["models"]["vocoder"]["code"] == str(pod.model_code / "cosyvoice3/vocoder/1")
    assert all(m["has_model_py"] for m in triton["models"].values())

    process.send_signal(signal.SIGTERM)
    code, out, err = _finish(process)
    assert code == 0, out + err
    assert [c["signal"] for c in pod.calls("tritonserver", "signal")] == ["SIGTERM"]
    # The LLM servers were still up while Triton drained, and were stopped after it.
    assert pod.calls("tritonserver", "drained")[0]["llm_health"] == {
        str(base): True,
        str(base + 1): True,
    }
    llm_stops = pod.calls("trtllm-serve", "signal")
    assert sorted(c["port"] for c in llm_stops) == [base, base + 1]
    drained_at = pod.calls("tritonserver", "drained")[0]["t"]
    assert all(c["t"] > drained_at for c in llm_stops)
    assert f"[llm0] trtllm-serve stand-in loading on port {base}" in out
    layout = _layout(engine)
    for device in range(4):  # one name per CUDA device a token2wav instance may run on
        plan = pod.view / f"flow.decoder.estimator.autocast_fp16.{device}.plan"
        assert plan.resolve() == engine / layout["flowEstimatorPlan"]
    assert (pod.view / "cosyvoice3.yaml").resolve() == engine / "model" / "cosyvoice3.yaml"
    assert "is healthy after" in out
    assert "[serve] Triton exited with code 0 after SIGTERM" in out
    assert pod.termination() is None


def test_tritons_exit_code_is_the_pods(pod: Pod, running: list[subprocess.Popen[str]]) -> None:
    process = pod.start(pod.argv(), FAKE_TRITON_EXIT="5")
    running.append(process)
    code, out, err = _finish(process)
    assert code == 5, out + err
    assert "[serve] Triton exited with code 5" in out
    # Nothing left behind: both LLM servers were stopped.
    assert sorted(c["port"] for c in pod.calls("trtllm-serve", "signal")) == [
        pod.llm_base_port,
        pod.llm_base_port + 1,
    ]


def test_cosyvoice2_runs_triton_alone_and_forwards_sigint(
    pod: Pod, running: list[subprocess.Popen[str]]
) -> None:
    argv = pod.argv("cosyvoice2", llm_groups="0,1")
    process = pod.start(argv, FAKE_TRITON_TERM_EXIT="7")
    running.append(process)
    pod.wait_for("tritonserver", "start")
    triton = pod.calls("tritonserver", "start")[0]
    assert sorted(triton["models"]) == sorted(CV2_MODELS)
    assert not triton["models"]["tensorrt_llm"]["has_model_py"]
    process.send_signal(signal.SIGINT)
    code, out, err = _finish(process)
    assert code == 7, out + err
    assert [c["signal"] for c in pod.calls("tritonserver", "signal")] == ["SIGINT"]
    assert pod.calls("trtllm-serve") == []
    assert "--llm-groups ignored: cosyvoice2's LLM runs inside Triton" in out
    # The model view: the engine's model directory, and its prebuilt plans under the names
    # upstream's token2wav and speaker_embedding load (instead of building them).
    engine = pod.builder.cache / KEY2
    layout = _layout(engine)
    view = {p.name: p.resolve() for p in pod.view.iterdir() if p.is_symlink()}
    assert view["flow.decoder.estimator.fp16.mygpu.plan"] == engine / layout["flowEstimatorPlan"]
    assert view["campplus.l20.fp32.trt"] == engine / layout["speakerEmbeddingPlan"]
    model = engine / "model"
    for entry in model.iterdir():
        assert view[entry.name] == entry
    assert len(view) == len(list(model.iterdir())) + 2


def test_cosyvoice_serve_runs_as_its_own_program(
    pod: Pod, running: list[subprocess.Popen[str]]
) -> None:
    argv = pod.argv("cosyvoice2")[1:]
    process = pod.start(argv, module="cosyvoice_engine_builder.serving", FAKE_TRITON_EXIT="5")
    running.append(process)
    code, out, err = _finish(process)
    assert code == 5, out + err
    assert "[gate] ok: the engine was built for this GPU architecture and TensorRT" in out
    assert "[serve] Triton exited with code 5" in out
    assert sorted(pod.calls("tritonserver", "start")[0]["models"]) == sorted(CV2_MODELS)


def test_an_llm_server_that_exits_while_starting_stops_everything(
    pod: Pod, running: list[subprocess.Popen[str]]
) -> None:
    failing = pod.llm_base_port + 1
    process = pod.start(pod.argv(), FAKE_LLM_EXIT=f"{failing}:4", FAKE_LLM_HEALTH_DELAY="0.2")
    running.append(process)
    code, out, err = _finish(process)
    assert code == 4, out + err
    assert pod.calls("tritonserver") == []
    assert [c["port"] for c in pod.calls("trtllm-serve", "signal")] == [pod.llm_base_port]
    message = pod.termination()
    assert message is not None
    assert message["step"] == "llm"
    assert message["message"].startswith(
        f"trtllm-serve llm1 (GPUs 2,3, port {failing}) exited with code 4 before it "
        "answered /health\n"
    )
    assert "RuntimeError: simulated engine load failure" in message["message"]


def test_an_llm_server_that_never_answers_times_out(
    pod: Pod, running: list[subprocess.Popen[str]]
) -> None:
    argv = pod.argv(llm_startup_timeout_seconds=2)
    process = pod.start(argv, FAKE_LLM_NO_HEALTH="1")
    running.append(process)
    code, out, err = _finish(process)
    assert code == 1, out + err
    assert pod.calls("tritonserver") == []
    assert len(pod.calls("trtllm-serve", "signal")) == 2
    message = pod.termination()
    assert message is not None
    assert message["message"].startswith(
        f"trtllm-serve llm0 (GPUs 0,1, port {pod.llm_base_port}), trtllm-serve llm1 "
        f"(GPUs 2,3, port {pod.llm_base_port + 1}) did not answer /health within 2s "
        "(--llm-startup-timeout-seconds)"
    )


def test_an_llm_server_that_dies_while_serving_stops_triton(
    pod: Pod, running: list[subprocess.Popen[str]]
) -> None:
    dying = pod.llm_base_port
    process = pod.start(pod.argv(), FAKE_LLM_EXIT_AFTER=f"{dying}:2:6")
    running.append(process)
    code, out, err = _finish(process)
    assert code == 6, out + err
    assert pod.calls("tritonserver", "start")
    assert [c["signal"] for c in pod.calls("tritonserver", "signal")] == ["SIGTERM"]
    assert [c["port"] for c in pod.calls("trtllm-serve", "signal")] == [dying + 1]
    message = pod.termination()
    assert message is not None
    assert message["message"].startswith(
        f"trtllm-serve llm0 (GPUs 0,1, port {dying}) exited with code 6 while Triton was serving"
    )


def test_sigterm_while_waiting_for_the_llms_stops_them_and_exits_143(
    pod: Pod, running: list[subprocess.Popen[str]]
) -> None:
    process = pod.start(pod.argv(), FAKE_LLM_NO_HEALTH="1")
    running.append(process)
    pod.wait_for("trtllm-serve", "start", count=2)
    process.send_signal(signal.SIGTERM)
    code, out, err = _finish(process)
    assert code == 143, out + err
    assert "SIGTERM before Triton started; stopping the LLM servers" in out
    assert pod.calls("tritonserver") == []
    assert sorted(c["signal"] for c in pod.calls("trtllm-serve", "signal")) == ["SIGTERM"] * 2


def test_a_tritonserver_missing_from_the_image_exits_1(pod: Pod) -> None:
    result = pod.run(pod.argv("cosyvoice2"), TRITONSERVER=str(pod.tmp / "absent" / "tritonserver"))
    assert result.code == 1
    assert "tritonserver: cannot start" in result.err
    assert result.termination is not None
    assert result.termination["step"] == "start"


def test_progress_lines_while_the_llms_load(pod: Pod, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor, "_PROGRESS_EVERY_SECONDS", 0.5)
    monkeypatch.setattr(supervisor, "_HEALTH_POLL_SECONDS", 0.2)
    result = pod.run(pod.argv(), FAKE_LLM_HEALTH_DELAY="1.5", FAKE_TRITON_EXIT="0")
    assert result.code == 0, result.out + result.err
    base = pod.llm_base_port
    waiting = [line for line in result.out.splitlines() if "to answer /health:" in line]
    assert any(
        line.startswith(f"[serve] waiting for trtllm-serve llm1 (GPUs 2,3, port {base + 1})")
        and line.endswith("s of 600s")
        for line in waiting
    ), result.out
    healthy = result.out.index(f"trtllm-serve llm1 (GPUs 2,3, port {base + 1}) is healthy")
    assert healthy < result.out.index("[serve] starting Triton:")


def test_triton_restricts_the_apis_no_client_needs_to_a_key_nobody_is_shown() -> None:
    """Issue 21 H1: shared memory, model repository, logging and trace answer only a request
    with the pod's key (checked against Triton 2.51's flag syntax: the CPU twin's server
    answers 403 without it, 200 with it); a random key per start unless one is given."""
    import dataclasses

    from cosyvoice_engine_builder.serving import launch
    from cosyvoice_engine_builder.serving.options import ServeOptions

    values: dict[str, object] = {f.name: None for f in dataclasses.fields(ServeOptions)}
    values.update(
        model_repository="/tmp/r",
        http_port=8000,
        grpc_port=8001,
        metrics_port=8002,
        exit_timeout_seconds=20,
    )
    options = ServeOptions(**values)  # type: ignore[arg-type]
    argv = launch.tritonserver_argv(options, {})
    [http] = [a for a in argv if a.startswith("--http-restricted-api=")]
    [grpc] = [a for a in argv if a.startswith("--grpc-restricted-protocol=")]
    apis, _, header = http.split("=", 1)[1].partition(":")
    assert set(apis.split(",")) == {"shared-memory", "model-repository", "logging", "trace"}
    name, _, key = header.partition("=")
    assert name == "cosyvoice-admin-key" and len(key) == 64
    assert grpc.split("=", 1)[1] == http.split("=", 1)[1]
    # Inference, health, metadata, model config and statistics stay open.
    assert not {"inference", "health", "metadata"} & set(apis.split(","))
    assert key not in launch.display(argv) and "cosyvoice-admin-key=***" in launch.display(argv)
    given = launch.tritonserver_argv(options, {"COSYVOICE_TRITON_ADMIN_KEY": "k" * 40})
    assert any(a.endswith("cosyvoice-admin-key=" + "k" * 40) for a in given)


def test_the_trtllm_serve_standin_refuses_what_click_refuses() -> None:
    """The stand-in takes what cosyvoice-serve starts and refuses an option trtllm-serve does
    not have (exit 2, as click's usage errors), so a misspelt flag cannot pass here."""
    good = ["serve", "/e/llm", "--tokenizer", "/e/model/llm", "--host", "127.0.0.1"]
    assert trtllm_serve_usage_error([*good, "--port", "8010", "--tp_size", "2"]) is None
    assert trtllm_serve_usage_error([*good, "--kv_cache_free_gpu_memory_fraction", "0.4"]) is None
    assert trtllm_serve_usage_error([*good, "--served_model_name", "x"]) == (
        "Error: No such option: --served_model_name"
    )
    assert trtllm_serve_usage_error([*good, "--port"]) == (
        "Error: Option '--port' requires an argument."
    )
    assert trtllm_serve_usage_error(["serve", "--port", "1"]) == "Error: Missing argument 'MODEL'."
