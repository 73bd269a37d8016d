"""Fixtures for the engine builder: stand-in tools, a model directory, a runnable CLI.

Everything external (TensorRT-LLM's converter and builder, trtexec, nvidia-smi, the AWS
CLI) is replaced by small scripts in ``tmp_path`` that log their argv to a call log, so
the tests see the builder's real command lines, order and resumption behaviour.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _pytest.capture import CaptureResult

from cosyvoice_engine_builder import cli
from cosyvoice_engine_builder.fetch import Downloaders
from cosyvoice_engine_builder.redaction import SECRET_ENV_VARS

HERE = Path(__file__).resolve().parent
KEY = "0123456789abcdef0123"
TRT_VERSION = "10.10.0.31"
TRTLLM_VERSION = "0.20.0"


def _write_tool(path: Path, tool: str, *, executable: bool) -> Path:
    header = f"#!{sys.executable}\n" if executable else ""
    path.write_text(
        f"{header}import sys\nsys.path.insert(0, {str(HERE)!r})\n"
        f"import standin_tool\nstandin_tool.main({tool!r})\n"
    )
    if executable:
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def make_model(
    root: Path,
    variant: str = "cosyvoice2",
    *,
    llm_subdir: bool = True,
    omit: Sequence[str] = (),
) -> Path:
    """A model directory in the layout the builder documents (contents are stand-ins)."""
    llm = root / "llm" if llm_subdir else root
    llm.mkdir(parents=True, exist_ok=True)
    files = {
        "llm/config.json"
        if llm_subdir
        else "config.json": '{"architectures": ["Qwen2ForCausalLM"]}',
        "llm/model.safetensors" if llm_subdir else "model.safetensors": "llm weights",
        "llm/tokenizer.json" if llm_subdir else "tokenizer.json": "{}",
        "campplus.onnx": "campplus onnx",
        "flow.pt": "flow weights",
        "hift.pt": "hift weights",
        f"{variant}.yaml": "yaml",
        f"speech_tokenizer_v{variant[-1]}.onnx": "speech tokenizer onnx",
        ".cache/huggingface/download/flow.pt.metadata": "hub bookkeeping",
    }
    if variant == "cosyvoice2":
        files["flow.decoder.estimator.fp32.onnx"] = "fp32 estimator onnx"
    else:
        files["flow.decoder.estimator.autocast_fp16.onnx"] = "autocast estimator onnx"
    for rel, content in files.items():
        if rel in omit:
            continue
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


@dataclass
class Result:
    code: int
    out: str
    err: str
    termination: dict[str, Any] | None
    termination_raw: str | None


@dataclass
class Builder:
    """Runs the CLI in-process against stand-in tools."""

    tmp: Path
    cache: Path
    pvc_root: Path
    env: dict[str, str]
    # None outside a test (a fixture shared by many): output is then captured here.
    capsys: pytest.CaptureFixture[str] | None
    downloaders: Downloaders | None = None
    call_log: Path = field(init=False)
    termination_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.call_log = Path(self.env["CALL_LOG"])
        self.termination_path = Path(self.env["TERMINATION_MESSAGE_PATH"])

    def args(self, **overrides: Any) -> list[str]:
        values: dict[str, Any] = {
            "key": KEY,
            "cache-dir": self.cache,
            "variant": "cosyvoice2",
            "model-uri": "pvc://models/cosyvoice2",
            "revision": "",
            "precision": "bfloat16",
            "tensor-parallel-size": 1,
            "max-batch-size": 16,
            "max-num-tokens": 32768,
            "gpu-arch": "sm_90",
            "pvc-root": self.pvc_root,
        }
        flags = {k: v for k, v in overrides.items() if isinstance(v, bool)}
        values.update({k.replace("_", "-"): v for k, v in overrides.items() if k not in flags})
        argv = ["build"]
        for name, value in values.items():
            if value is not None:
                argv += [f"--{name}", str(value)]
        argv += [f"--{k.replace('_', '-')}" for k, v in flags.items() if v]
        return argv

    def readouterr(self) -> CaptureResult[str]:
        """What the test printed since the last call (a test's own builder only)."""
        assert self.capsys is not None
        return self.capsys.readouterr()

    def run(self, argv: list[str], *, env: dict[str, str] | None = None) -> Result:
        self.termination_path.unlink(missing_ok=True)
        if self.capsys is None:
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = cli.main(argv, environ=env or self.env, downloaders=self.downloaders)
            captured = (out.getvalue(), err.getvalue())
        else:
            self.capsys.readouterr()
            code = cli.main(argv, environ=env or self.env, downloaders=self.downloaders)
            captured = self.capsys.readouterr()
        raw = self.termination_path.read_text() if self.termination_path.exists() else None
        return Result(code, captured[0], captured[1], json.loads(raw) if raw else None, raw)

    def build(self, *, env_extra: dict[str, str] | None = None, **overrides: Any) -> Result:
        env = {**self.env, **(env_extra or {})}
        return self.run(self.args(**overrides), env=env)

    def calls(self) -> list[dict[str, Any]]:
        if not self.call_log.exists():
            return []
        return [json.loads(line) for line in self.call_log.read_text().splitlines()]

    def tools_called(self) -> list[str]:
        return [c["tool"] for c in self.calls()]

    def reset_calls(self) -> None:
        self.call_log.unlink(missing_ok=True)

    @property
    def engine_dir(self) -> Path:
        return self.cache / KEY

    def manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.engine_dir / "manifest.json").read_text())
        return data


@pytest.fixture
def builder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Builder:
    return new_builder(tmp_path, capsys)


def new_builder(tmp_path: Path, capsys: pytest.CaptureFixture[str] | None) -> Builder:
    """A builder in ``tmp_path`` with stand-in tools and both variants' models."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    convert = _write_tool(bin_dir / "convert_checkpoint.py", "convert", executable=False)
    quantize = _write_tool(bin_dir / "quantize.py", "quantize", executable=False)
    trtllm_build = _write_tool(bin_dir / "trtllm-build", "trtllm-build", executable=True)
    trtexec = _write_tool(bin_dir / "trtexec", "trtexec", executable=True)
    _write_tool(bin_dir / "nvidia-smi", "nvidia-smi", executable=True)
    _write_tool(bin_dir / "aws", "aws", executable=True)
    speaker_prompt = _write_tool(bin_dir / "speaker-prompt", "speaker-prompt", executable=True)

    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV_VARS}
    env.update(
        {
            "TRTLLM_PYTHON": sys.executable,
            "TRTLLM_QWEN_CONVERT": str(convert),
            "TRTLLM_QUANTIZE": str(quantize),
            "TRTLLM_BUILD": str(trtllm_build),
            "TRTEXEC": str(trtexec),
            "COSYVOICE_SPEAKER_PROMPT": str(speaker_prompt),
            "TENSORRT_VERSION": TRT_VERSION,
            "TRTLLM_VERSION": TRTLLM_VERSION,
            "TERMINATION_MESSAGE_PATH": str(tmp_path / "termination-log"),
            "CALL_LOG": str(tmp_path / "calls.jsonl"),
            # No GPU here: by default the arch check finds no nvidia-smi and says so.
            "NVIDIA_SMI": str(tmp_path / "absent" / "nvidia-smi"),
            "AWS_CLI": str(tmp_path / "absent" / "aws"),
        }
    )
    for name in (
        "FAKE_FAIL",
        "FAKE_FAIL_ARG",
        "FAKE_FAIL_CODE",
        "FAKE_LEAK",
        "FAKE_NO_OUTPUT",
        "FAKE_SLEEP",
    ):
        env.pop(name, None)
    pvc_root = tmp_path / "models"
    make_model(pvc_root / "models" / "cosyvoice2", "cosyvoice2")
    make_model(pvc_root / "models" / "cosyvoice3", "cosyvoice3")
    return Builder(
        tmp=tmp_path, cache=tmp_path / "engines", pvc_root=pvc_root, env=env, capsys=capsys
    )


KEY2 = "fedcba9876543210fedc"


@pytest.fixture(scope="session")
def serving_engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cache with the two engines the serving tests serve, built once per session by the
    builder's own pipeline: ``KEY`` a cosyvoice3 engine of tensor-parallel size 2, ``KEY2``
    a cosyvoice2 engine. Tests get copies (:func:`copy_engines`): some break theirs."""
    builder = new_builder(tmp_path_factory.mktemp("serving-engines"), None)
    built = builder.build(
        variant="cosyvoice3", model_uri="pvc://models/cosyvoice3", tensor_parallel_size=2
    )
    assert built.code == 0, built.out + built.err
    built = builder.build(key=KEY2)
    assert built.code == 0, built.out + built.err
    return builder.cache


def copy_engines(engines: Path, cache: Path) -> None:
    for key in (KEY, KEY2):
        shutil.copytree(engines / key, cache / key, symlinks=True)
