"""Facts about the image and the node the build runs on.

The TensorRT and TensorRT-LLM versions go into the manifest and into plan names, because
a plan or engine deserialised by a different TensorRT fails (or, worse, loads and
produces silence: upstream issues #1831, #954, #1686). The GPU check exists because an
engine built on the wrong architecture would be published under a key that claims
another one; better to fail the Job than to poison the cache.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cosyvoice_engine_builder import __version__
from cosyvoice_engine_builder.runner import Command, CommandFailed, Runner

_VERSION_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")

_TENSORRT_PROBE = "import tensorrt; print(tensorrt.__version__)"
# Importing tensorrt_llm takes seconds, prints a banner and initialises CUDA/MPI; the
# installed distribution's metadata answers the same question for free.
_TENSORRT_LLM_PROBE = "import importlib.metadata as m; print(m.version('tensorrt_llm'))"


class ToolchainError(Exception):
    """The image or node cannot produce the requested engine; the message says why."""


@dataclass(frozen=True)
class Versions:
    tensorrt: str
    tensorrt_llm: str
    builder: str = __version__


def _checked(value: str, what: str) -> str:
    if not _VERSION_RE.match(value):
        raise ToolchainError(f"{what} version {value!r} is not a plain version string")
    return value


def _probe(runner: Runner, python: str, code: str, env: Mapping[str, str], what: str) -> str:
    try:
        result = runner.run(Command((python, "-c", code), env=env, timeout=120), echo_output=False)
    except CommandFailed as exc:
        detail = "\n".join(exc.tail()[-5:])
        raise ToolchainError(f"cannot determine the {what} version: {exc}\n{detail}") from exc
    lines = [line.strip() for line in result.stdout_tail if line.strip()]
    if not lines:
        raise ToolchainError(f"cannot determine the {what} version: the probe printed nothing")
    return _checked(lines[-1], what)


def probe_versions(
    runner: Runner, python: str, environ: Mapping[str, str], tool_env: Mapping[str, str]
) -> Versions:
    """Versions from ``TENSORRT_VERSION`` / ``TRTLLM_VERSION`` if set, else from the image."""
    tensorrt = environ.get("TENSORRT_VERSION") or _probe(
        runner, python, _TENSORRT_PROBE, tool_env, "TensorRT"
    )
    tensorrt_llm = environ.get("TRTLLM_VERSION") or _probe(
        runner, python, _TENSORRT_LLM_PROBE, tool_env, "TensorRT-LLM"
    )
    return Versions(
        tensorrt=_checked(tensorrt, "TensorRT"), tensorrt_llm=_checked(tensorrt_llm, "TensorRT-LLM")
    )


def find_executable(name: str, environ: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=environ.get("PATH"))


def require_executable(name: str, env_var: str, environ: Mapping[str, str]) -> None:
    if find_executable(name, environ) is None:
        raise ToolchainError(f"{name} not found or not executable (set {env_var} to its path)")


def require_script(path: str, env_var: str) -> None:
    if not Path(path).is_file():
        raise ToolchainError(f"{path} does not exist (set {env_var} to the script's path)")


def check_gpu_arch(
    runner: Runner, expected: str, environ: Mapping[str, str], tool_env: Mapping[str, str]
) -> str:
    """Fail if a visible GPU is of another architecture; return what was checked.

    A missing or failing nvidia-smi is reported, not fatal: TensorRT itself will fail
    loudly without a usable GPU, and a CPU-only dry environment still gets its plan.
    """
    smi = environ.get("NVIDIA_SMI") or "nvidia-smi"
    if find_executable(smi, environ) is None:
        return f"{smi} not found; GPU architecture not checked"
    try:
        result = runner.run(
            Command((smi, "--query-gpu=compute_cap", "--format=csv,noheader"), env=tool_env),
            echo_output=False,
        )
    except CommandFailed as exc:
        return f"{smi} failed ({exc}); GPU architecture not checked"
    found = []
    for line in result.stdout_tail:
        major, dot, minor = line.strip().partition(".")
        if dot and major.isdigit() and minor.isdigit():
            found.append(f"sm_{major}{minor}")
    if not found:
        return f"{smi} reported no GPU; GPU architecture not checked"
    # sm_90a and sm_90 are the same silicon; the suffix is a compilation target.
    wanted = expected.rstrip("abcdefghijklmnopqrstuvwxyz")
    wrong = sorted({arch for arch in found if arch != wanted})
    if wrong:
        raise ToolchainError(
            f"this Job was pinned to {expected} but the visible GPU(s) are {', '.join(found)}; "
            "an engine built here would not run where the key says it does"
        )
    return f"GPU architecture {', '.join(found)} matches {expected}"
