"""The CPU twin of the operator's Triton model repository, in the real ``tritonserver``.

(Used by the tests, ``tests/triton_twin/``, and by ``cosyvoice-operator demo``'s closed loop.)

The operator renders the repository for GPUs; this module turns it into one that loads on a
machine without any (:func:`to_cpu`), lays it out with the Python stand-ins of
``standins/<model>/model.py`` (:func:`write_repository`), runs the ``tritonserver`` binary
that the ``nvidia-pytriton`` wheel ships (:class:`TritonServer`), and serves the OpenAI
chat-completions call CosyVoice3's orchestrator makes to trtllm-serve (:class:`LlmStandIn`).

What a CPU cannot show: GPU placement, device memory, real latencies, the TensorRT-LLM
backend. What it does show: that Triton itself accepts every config as rendered (names,
inputs, outputs, batching, priorities, decoupled policy, parameters, instance counts), and that
streams flow through the orchestrator's BLS calls in order.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

STANDINS = Path(__file__).parent / "standins"
# The project's own Triton model code (serving-models/ of this checkout); absent from an
# installed wheel, where the twin runs the stand-ins alone.
SERVING_MODELS = Path(__file__).resolve().parents[4] / "serving-models"


def to_cpu(repository: Mapping[str, str]) -> dict[str, str]:
    """The same repository with every ``KIND_GPU`` instance group made ``KIND_CPU``.

    The one transform between what the operator renders and what the twin loads:

    - an instance group of kind ``KIND_GPU`` becomes ``KIND_CPU`` and loses its ``gpus``
      list; its ``count`` is kept (on a GPU it means ``count`` instances on each listed GPU,
      on the CPU ``count`` instances in all);
    - the ``tensorrtllm`` backend (CosyVoice2's ``tensorrt_llm``) becomes ``python``: the
      TensorRT-LLM backend is not in the pytriton wheel, and ``standins/tensorrt_llm``
      stands in for it under the same name, interface and parameters.

    Nothing else changes: every other field of every config is kept as parsed (the text is
    written again by protobuf, so its layout is protobuf's).
    """
    twin: dict[str, str] = {}
    for name, text in repository.items():
        config = text_format.Parse(text, mc.ModelConfig())
        for group in config.instance_group:
            if group.kind == mc.ModelInstanceGroup.KIND_GPU:
                group.kind = mc.ModelInstanceGroup.KIND_CPU
                del group.gpus[:]
        if config.backend == "tensorrtllm":
            config.backend = "python"
        twin[name] = text_format.MessageToString(config)
    return twin


def place_standin(name: str, version_dir: Path) -> None:
    """Model ``name``'s stand-in as ``version_dir/model.py``, with the modules the stand-ins
    share (``standins/*.py``) beside it: the Python backend's stub puts the version directory
    on ``sys.path``."""
    standin = STANDINS / name / "model.py"
    if not standin.is_file():
        raise FileNotFoundError(f"no stand-in for model {name!r}: expected {standin}")
    shutil.copy(standin, version_dir / "model.py")
    for shared in STANDINS.glob("*.py"):
        shutil.copy(shared, version_dir / shared.name)


def our_model_code(name: str) -> Path | None:
    """The project's own ``model.py`` for model ``name`` (``serving-models/models``), if this
    checkout has it."""
    path = SERVING_MODELS / "models" / name / "model.py"
    return path if path.is_file() else None


def write_orchestrator_files(variant: str, model_dir: Path) -> Path:
    """What the project's orchestrator of ``variant`` opens in ``model_dir``: the release's
    yaml (its prompt-mel check reads ``feat_extractor``) and ``llm/tokenizer.json``, those of
    the tiny synthetic release (``cosyvoice_serving_models.tiny_release``; needs only the
    ``tokenizers`` package, no torch)."""
    env = dict(os.environ, PYTHONPATH=str(SERVING_MODELS))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cosyvoice_serving_models.tiny_release",
            "--orchestrator-files",
            variant,
            str(model_dir),
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return model_dir


def with_parameters(text: str, values: Mapping[str, str]) -> str:
    """A model config with the string values of some of its parameters replaced (only keys
    it has)."""
    config = text_format.Parse(text, mc.ModelConfig())
    for key, value in values.items():
        if key in config.parameters:
            config.parameters[key].string_value = value
    return text_format.MessageToString(config)


def write_repository(repository: Mapping[str, str], root: Path) -> Path:
    """``root/<model>/config.pbtxt``, and ``root/<model>/1/`` holding its stand-in
    (:func:`place_standin`)."""
    for name, text in repository.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(text)
        place_standin(name, root / name / "1")
    return root


REFERENCE_TEXT = "A short reference."


def request_inputs(target: str, reference_text: str = REFERENCE_TEXT) -> list[Any]:
    """The orchestrator's inputs for one request: a 2-second reference (a tone), its text and
    the text to speak (what every variant's orchestrator takes)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    reference = np.sin(np.arange(16000 * 2, dtype=np.float32) / 7.0).reshape(1, -1)
    values: list[tuple[str, Any, str]] = [
        ("reference_wav", reference.astype(np.float32), "FP32"),
        ("reference_wav_len", np.array([[reference.shape[1]]], dtype=np.int32), "INT32"),
        ("reference_text", np.array([[reference_text.encode()]], dtype=object), "BYTES"),
        ("target_text", np.array([[target.encode()]], dtype=object), "BYTES"),
    ]
    inputs = []
    for name, value, dtype in values:
        tensor = grpcclient.InferInput(name, list(value.shape), dtype)
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now (all held open together, so they differ)."""
    with contextlib.ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]


def _pytriton_dir() -> Path:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "nvidia-pytriton (the wheel that ships tritonserver) is not installed: "
            "make setup, or pip install -e '.[test]'"
        )
    return Path(spec.origin).parent


def _python_backend(into: Path) -> Path:
    """A backend directory whose Python backend embeds this interpreter's Python version.

    The wheel ships the backend without its stub; the stub built for each Python version is
    beside it (``python_backend_stubs/<major.minor>``) and is copied in, as pytriton does.
    """
    dist = _pytriton_dir() / "tritonserver"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise RuntimeError(f"the pytriton wheel has no Python backend stub for Python {version}")
    python = into / "python"
    shutil.copytree(
        dist / "backends" / "python", python, ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(stub, python / "triton_python_backend_stub")
    (python / "triton_python_backend_stub").chmod(0o755)
    return into


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def server_command(work: Path) -> tuple[list[str], dict[str, str]]:
    """The pytriton wheel's ``tritonserver`` with the flags every twin server needs (its
    Python backend under ``work/backends``, configs loaded as rendered, loopback addresses,
    shared memory of its own), and the environment it runs in. Ports, repository and exit
    timeout are the caller's (:class:`TritonServer`, or ``cosyvoice-serve`` through a
    wrapper script in the serving tests)."""
    pytriton = _pytriton_dir()
    backends = _python_backend(work / "backends")
    env = dict(os.environ)
    # The server's own libraries, then this interpreter's libpython: the stub embeds the
    # Python that runs the tests (the system's libpython3.X is the fallback).
    libs = [str(pytriton.parent / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [*libs, env.get("LD_LIBRARY_PATH")]))
    # The embedded Python finds its prefix (and so the venv's NumPy) from PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    command = [
        str(pytriton / "tritonserver" / "bin" / "tritonserver"),
        f"--backend-directory={backends}",
        # Configs load as rendered: no field filled in by the backends.
        "--disable-auto-complete-config",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--allow-gpu-metrics=false",
        # Shared-memory regions of this server only (the default prefix is global).
        f"--backend-config=python,shm-region-prefix-name=cvtwin{os.getpid()}{secrets.token_hex(3)}",
    ]
    return command, env


class TritonServer:
    """``tritonserver`` from the pytriton wheel on free 127.0.0.1 ports, for one repository;
    or on ``host`` (a loopback address of its own, a pod's) with the given ``ports`` (HTTP,
    gRPC, metrics: Triton's 8000, 8001, 8002 where each pod has its own address)."""

    def __init__(
        self,
        repository: Path,
        work: Path,
        env: Mapping[str, str] | None = None,
        *,
        host: str = "127.0.0.1",
        ports: tuple[int, int, int] | None = None,
    ) -> None:
        self.repository = repository
        self.work = work
        self.host = host
        self.http_port, self.grpc_port, self.metrics_port = ports or free_ports(3)
        self.log = work / "tritonserver.log"
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def http(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def start(self, ready_timeout: float = 90.0) -> None:
        command, env = server_command(self.work)
        env = {**env, **self.extra_env}
        argv = [
            *command,
            f"--model-repository={self.repository}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            "--strict-readiness=true",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            # Python-backend instances unload one after the other, about a second each; a
            # test has no use for a graceful unload (the stubs end with the server).
            "--exit-timeout-secs=3",
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                if _get(f"{self.http}/v2/health/ready")[0] == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"tritonserver not ready after {ready_timeout:.0f}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        # The CUDA/NVML complaints of a machine without a GPU are noise here.
        kept = [line for line in text.splitlines() if "NVML" not in line and "CUDA" not in line]
        return "\n".join(kept[-lines:])

    def model_config(self, model: str) -> dict[str, Any]:
        """The config Triton loaded, as its HTTP API returns it (JSON)."""
        status, body = _get(f"{self.http}/v2/models/{model}/config")
        if status != 200:
            raise AssertionError(f"GET config of {model}: {status} {body[:300]!r}")
        loaded: dict[str, Any] = json.loads(body)
        return loaded

    def model_ready(self, model: str) -> bool:
        return _get(f"{self.http}/v2/models/{model}/ready")[0] == 200

    def metrics(self) -> str:
        status, body = _get(self.metrics_url)
        if status != 200:
            raise AssertionError(f"GET {self.metrics_url}: {status}")
        return body.decode()


@contextlib.contextmanager
def running(server: TritonServer) -> Iterator[TritonServer]:
    try:
        server.start()
        yield server
    finally:
        server.stop()


# ---- trtllm-serve's side of CosyVoice3 ---------------------------------------------------

TOKENS_PER_CHARACTER = 3
MIN_TOKENS = 20
TOKENS_PER_EVENT = 3
EVENT_SECONDS = 0.002

# What trtllm-serve's chat-completions endpoint accepts, as TensorRT-LLM declares it in
# tensorrt_llm/serve/openai_protocol.py: ``class ChatCompletionRequest(OpenAIBaseModel)``,
# where ``OpenAIBaseModel`` has ``model_config = ConfigDict(extra="forbid",
# populate_by_name=True)``; ``messages`` and ``model`` have no default (required); every other
# field below is optional; ``max_completion_tokens`` has ``validation_alias='max_tokens'``
# (both names accepted with populate_by_name). Read in the code index of public sources: the
# release tag v0.20.0 (NVIDIA/TensorRT-LLM 7965842954628b0b5456a2f7d59786d3dcd41647, the
# commit triton-inference-server/tensorrtllm_backend v0.20.0 pins as its submodule) is not
# stored there, so the field list is that of the oldest stored version found (code-index
# file 2541217336, 24,359 characters: no reasoning_effort, cache_salt or agent_hierarchy,
# which later versions add); the required fields and extra="forbid" are the same in every
# stored version read (NVIDIA/TensorRT-LLM 0076e939, forks at 1a8bf5f, 5382fd3, 28d536f,
# 20ad93a, 04ee342). FastAPI turns a body the model refuses into a RequestValidationError,
# and trtllm-serve's ``OpenAIServer`` installs its own handler for it: HTTP 400 with
# ``{"error": str(exc)}`` (tensorrt_llm/serve/openai_server.py, NVIDIA/TensorRT-LLM 0005772
# and a fork at 280e525; FastAPI's default would be 422).
CHAT_REQUIRED = ("messages", "model")
CHAT_OPTIONAL = frozenset(
    {
        "prompt_token_ids",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "max_tokens",
        "max_completion_tokens",
        "n",
        "presence_penalty",
        "response_format",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "user",
        # doc: chat-completion-sampling-params
        "best_of",
        "use_beam_search",
        "top_k",
        "top_p_min",
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "early_stopping",
        "stop_token_ids",
        "include_stop_str_in_output",
        "ignore_eos",
        "min_tokens",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "lora_request",
        # doc: chat-completion-extra-params
        "echo",
        "add_generation_prompt",
        "add_special_tokens",
        "documents",
        "chat_template",
        "chat_template_kwargs",
        "disaggregated_params",
    }
)
VALIDATION_STATUS = 400
# CosyVoice3's LLM needs <|endofprompt|> in its text (upstream's cosyvoice/llm/llm.py asserts
# token 151646; its Triton orchestrator prepends 'You are a helpful assistant.<|endofprompt|>'
# to a reference text without it). trtllm-serve itself would run such a prompt: the stand-in
# refuses it (with the same 400) so that no test passes on a prompt outside the LLM's format.
END_OF_PROMPT = "<|endofprompt|>"


def chat_request_problems(body: object, cosyvoice3: bool = True) -> list[str]:
    """Why trtllm-serve (TensorRT-LLM 0.20's ``ChatCompletionRequest``) would refuse this
    chat-completions body, or, with ``cosyvoice3``, why CosyVoice3's LLM could not take its
    prompt; empty when it is accepted."""
    if not isinstance(body, dict):
        return ["the body is not a JSON object"]
    problems = [f"{name}: Field required" for name in CHAT_REQUIRED if name not in body]
    known = frozenset(CHAT_REQUIRED) | CHAT_OPTIONAL
    problems += [f"{name}: Extra inputs are not permitted" for name in body if name not in known]
    if "max_tokens" in body and "max_completion_tokens" in body:
        problems.append("max_tokens and max_completion_tokens: one field, given twice")
    if "model" in body and not isinstance(body["model"], str):
        problems.append("model: Input should be a valid string")
    messages = body.get("messages")
    if "messages" in body and not (
        isinstance(messages, list)
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages)
    ):
        problems.append("messages: Input should be a list of messages, each with a role")
    if body.get("stream_options") is not None and not body.get("stream"):
        problems.append("stream_options can only be set if stream is true")
    if problems or not cosyvoice3:
        return problems
    user = [m for m in messages if m["role"] == "user"] if isinstance(messages, list) else []
    if not user or END_OF_PROMPT not in str(user[0].get("content", "")):
        problems.append(
            f"CosyVoice3: the user message lacks {END_OF_PROMPT} (upstream's LLM asserts "
            "token 151646 in the text)"
        )
    return problems


def speech_token_count(user_text: str, max_tokens: int) -> int:
    """How many speech tokens the stand-in LLM answers for a prompt text (the text after its
    instruction: the reference and target texts)."""
    spoken = user_text.rsplit(END_OF_PROMPT, 1)[-1]
    return min(max_tokens, max(MIN_TOKENS, TOKENS_PER_CHARACTER * len(spoken)))


class _ChatHandler(http.server.BaseHTTPRequestHandler):
    server: _ChatServer

    def _answer(self, status: int, payload: object) -> None:
        answer = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_POST(self) -> None:
        if self.path != "/v1/chat/completions":
            self.send_error(404)
            return
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            self.server.refuse(raw.decode("utf-8", "replace"))
            self._answer(VALIDATION_STATUS, {"error": f"JSON decode error: {exc}"})
            return
        problems = chat_request_problems(body, self.server.cosyvoice3)
        if problems:
            # As trtllm-serve's RequestValidationError handler answers (see CHAT_REQUIRED).
            self.server.refuse(body)
            head = f"{len(problems)} validation errors for ChatCompletionRequest\n"
            self._answer(VALIDATION_STATUS, {"error": head + "\n".join(problems)})
            return
        self.server.record(body)
        user = next(m for m in body["messages"] if m["role"] == "user")
        limit = body.get("max_tokens", body.get("max_completion_tokens"))
        count = speech_token_count(str(user.get("content", "")), int(limit or MIN_TOKENS))
        tokens = [f"<|s_{i}|>" for i in range(count)]
        if not body.get("stream"):
            reply = {"role": "assistant", "content": "".join(tokens)}
            self._answer(200, {"choices": [{"index": 0, "message": reply}]})
            return
        # Server-sent events, as trtllm-serve streams them; the connection ends the stream.
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        events = -(-count // TOKENS_PER_EVENT)
        pause = self.server.stream_seconds / events if self.server.stream_seconds else 0.0
        for i in range(0, count, TOKENS_PER_EVENT):
            time.sleep(pause or self.server.event_seconds)
            delta = {"choices": [{"index": 0, "delta": {"content": "".join(tokens[i : i + 3])}}]}
            self.wfile.write(f"data: {json.dumps(delta)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reports what matters."""


class _ChatServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self, port: int, event_seconds: float, stream_seconds: float, cosyvoice3: bool
    ) -> None:
        super().__init__(("127.0.0.1", port), _ChatHandler)
        self.requests: list[dict[str, Any]] = []
        self.refused: list[object] = []
        self.lock = threading.Lock()
        self.event_seconds = event_seconds
        self.stream_seconds = stream_seconds
        self.cosyvoice3 = cosyvoice3

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-stream (its Triton stopped: a pod removed, the demo
        stopping) is no error; anything else is printed as the base class does."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)

    def record(self, body: dict[str, Any]) -> None:
        with self.lock:
            self.requests.append(body)

    def refuse(self, body: object) -> None:
        with self.lock:
            self.refused.append(body)


class LlmStandIn:
    """One stand-in trtllm-serve per rendered LLM URL, each on a free port.

    ``remap`` maps each rendered URL (``http://localhost:8010/...``) to its stand-in; the
    tritonserver environment hands it to the orchestrator stand-in
    (``COSYVOICE_TWIN_LLM_REMAP``), so that the repository itself is left as rendered and
    concurrent test runs do not fight over port 8010.
    """

    def __init__(
        self,
        urls: list[str],
        event_seconds: float = EVENT_SECONDS,
        stream_seconds: float = 0.0,
        cosyvoice3: bool = True,
    ) -> None:
        """``event_seconds``: the pause before each streamed event of 3 tokens (the LLM's
        speed); ``stream_seconds`` (when > 0): instead, each streamed answer takes this long
        in all, spread evenly over its events (the closed loop's service time when the
        project's orchestrator runs). Every body is validated as trtllm-serve validates it
        (:func:`chat_request_problems`: 400 for a missing ``model`` or ``messages`` or an
        unknown field) and, with ``cosyvoice3``, refused when its user message lacks
        ``<|endofprompt|>``; accepted bodies are in each server's ``requests``, refused ones
        in its ``refused``. trtllm-serve does not compare ``model`` with the name it serves,
        and neither does the stand-in."""
        self.urls = urls
        self.servers = [
            _ChatServer(port, event_seconds, stream_seconds, cosyvoice3)
            for port in free_ports(len(urls))
        ]
        self.threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in self.servers]

    @property
    def remap(self) -> dict[str, str]:
        return {
            url: f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
            for url, server in zip(self.urls, self.servers, strict=True)
        }

    @property
    def env(self) -> dict[str, str]:
        return {"COSYVOICE_TWIN_LLM_REMAP": json.dumps(self.remap)}

    def requests_per_server(self) -> list[int]:
        return [len(s.requests) for s in self.servers]

    def __enter__(self) -> LlmStandIn:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()
