"""The builder's stand-in tools refuse what the real tools refuse (issue 31, item 1): an option
the tool does not have, an option without its value, a value outside its choices, a missing
required option; and every command line the builder writes is one they take. The tables are
the real tools' (``standin_tool`` says from which source); the stand-ins run as the builder's
tests run them, as scripts through the wrappers ``conftest`` writes."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from cosyvoice_engine_builder import commands
from cosyvoice_engine_builder.commands import ToolPaths
from cosyvoice_engine_builder.request import KvCacheType, Precision, SmoothQuant, Variant
from tests.engine_builder import standin_tool
from tests.engine_builder.conftest import HERE, _write_tool

TOOLS = ToolPaths(
    python="python3",
    convert_script="/x/convert_checkpoint.py",
    quantize_script="/x/quantize.py",
    trtllm_build="trtllm-build",
    trtexec="trtexec",
    calib_dataset="/data/calib",
)
SPEAKER_PROMPT = (
    HERE.parents[1] / "serving-models" / "cosyvoice_serving_models" / "speaker_prompt.py"
)


def run_standin(tmp_path: Path, tool: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    script = _write_tool(tmp_path / tool, tool, executable=False)
    return subprocess.run(
        [sys.executable, str(script), *argv],
        env={"CALL_LOG": str(tmp_path / "calls.jsonl"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _problems(tool: str, argv: list[str]) -> list[str]:
    flags, choices, required = standin_tool.ARGPARSE_TOOLS[tool]
    return standin_tool.argparse_problems(argv, flags, choices, required)


@pytest.mark.parametrize(
    ("precision", "kv_cache"),
    [
        (p, k)
        for p, k in itertools.product(Precision, KvCacheType)
        if not (p is Precision.INT8_SMOOTHQUANT and k is KvCacheType.FP8)
    ],
)
@pytest.mark.parametrize("tp", [1, 2])
def test_every_command_line_the_builder_writes_is_taken(
    precision: Precision, kv_cache: KvCacheType, tp: int
) -> None:
    convert = commands.convert_argv(
        TOOLS,
        precision,
        Path("/m/llm"),
        Path("/w/ckpt"),
        tp,
        kv_cache,
        SmoothQuant() if precision is Precision.INT8_SMOOTHQUANT else None,
    )
    tool = "quantize" if commands.uses_quantize_script(precision, kv_cache) else "convert"
    assert convert[1] == (TOOLS.quantize_script if tool == "quantize" else TOOLS.convert_script)
    assert _problems(tool, list(convert[2:])) == []
    build = commands.build_argv(TOOLS, precision, Path("/w/ckpt"), Path("/w/engine"), 16, 4096)
    assert _problems("trtllm-build", list(build[1:])) == []


@pytest.mark.parametrize("variant", list(Variant))
def test_every_trtexec_command_line_the_builder_writes_is_taken(variant: Variant) -> None:
    for spec in (commands.FLOW_ESTIMATOR_PLANS[variant], commands.SPEAKER_EMBEDDING_PLAN):
        argv = commands.trtexec_argv(TOOLS, spec, Path("/m/x.onnx"), Path("/w/x.plan"))
        assert standin_tool.trtexec_problems(list(argv[1:])) == []


@pytest.mark.parametrize(
    ("tool", "argv", "error"),
    [
        # trtllm-serve's spelling, not trtllm-build's.
        (
            "trtllm-build",
            ["--checkpoint_dir", "/c", "--tp_size", "2"],
            "unrecognized arguments: --tp_size 2",
        ),
        ("trtllm-build", ["--checkpoint_dir"], "argument --checkpoint_dir: expected one argument"),
        ("trtllm-build", ["--strip_plan=yes"], "ignored explicit argument 'yes'"),
        ("convert", ["--tp_size", "1"], "required: --model_dir"),
        ("convert", ["--model_dir", "/m", "--qformat", "fp8"], "unrecognized arguments: --qformat"),
        ("convert", ["--model_dir", "/m", "--dtype", "fp8"], "invalid choice: 'fp8'"),
        ("convert", ["--model_dir", "/m", "--model", "/m"], "unrecognized arguments: --model"),
        ("quantize", ["--model_dir", "/m", "--qformat", "int8_smoothquant"], "invalid choice"),
        ("quantize", ["--model_dir", "/m", "--use_weight_only"], "unrecognized arguments"),
        ("speaker-prompt", ["--model-dir", "/m"], "required: --variant, --audio"),
    ],
)
def test_an_option_the_real_tool_refuses_exits_2_as_argparse_does(
    tmp_path: Path, tool: str, argv: list[str], error: str
) -> None:
    result = run_standin(tmp_path, tool, argv)
    assert result.returncode == 2, result
    assert f"{tool}: error: " in result.stderr
    assert error in result.stderr
    # It ran (the call is logged) and refused before doing anything.
    assert (tmp_path / "calls.jsonl").read_text().count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.jsonl", tool]


def test_trtexec_refuses_an_option_it_does_not_have_with_exit_1(tmp_path: Path) -> None:
    result = run_standin(
        tmp_path, "trtexec", ["--onnx=/m/x.onnx", "--saveEngine=/w/x.plan", "--workspace=4096"]
    )
    assert result.returncode == 1
    assert "Unknown option: --workspace=4096" in result.stderr
    # trtexec takes no positional argument either.
    assert standin_tool.trtexec_problems(["/m/x.onnx"]) == ["Unknown option: /m/x.onnx"]


def test_a_taken_command_line_still_does_the_work(tmp_path: Path) -> None:
    onnx = tmp_path / "x.onnx"
    onnx.write_bytes(b"onnx")
    plan = tmp_path / "x.plan"
    result = run_standin(
        tmp_path, "trtexec", [f"--onnx={onnx}", f"--saveEngine={plan}", "--skipInference"]
    )
    assert result.returncode == 0, result.stderr
    assert plan.read_bytes() == b"plan for onnx"


def test_the_speaker_prompt_table_is_the_tools_own_parser() -> None:
    """The stand-in's options are exactly those speaker_prompt.main() declares, all required
    (read from its source, as its parser is built inside main())."""
    declared: dict[str, bool] = {}
    for node in ast.walk(ast.parse(SPEAKER_PROMPT.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
        ):
            name = node.args[0]
            assert isinstance(name, ast.Constant)
            declared[str(name.value)] = any(
                k.arg == "required" and isinstance(k.value, ast.Constant) and k.value.value
                for k in node.keywords
            )
    assert declared == {name: True for name in standin_tool.SPEAKER_PROMPT_FLAGS}
    _, _, required = standin_tool.ARGPARSE_TOOLS["speaker-prompt"]
    assert set(required) == set(declared)


def test_a_negative_number_is_a_value_not_an_option() -> None:
    assert _problems("convert", ["--model_dir", "/m", "--moe_tp_size", "-1"]) == []
