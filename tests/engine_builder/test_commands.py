"""The exact command lines per precision, tensor parallelism and variant (pure functions)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyvoice_engine_builder import commands
from cosyvoice_engine_builder.commands import ToolPaths
from cosyvoice_engine_builder.request import Precision, Variant

TOOLS = ToolPaths(
    python="python3",
    convert_script="/x/convert_checkpoint.py",
    quantize_script="/x/quantize.py",
    trtllm_build="trtllm-build",
    trtexec="trtexec",
    calib_dataset=None,
)
LLM, WEIGHTS, ENGINES = Path("/m/llm"), Path("/w/trt_weights"), Path("/w/trt_engines")
CONVERT_HEAD = ["python3", "/x/convert_checkpoint.py", "--model_dir", "/m/llm"]
CONVERT_OUT = ["--output_dir", "/w/trt_weights"]


@pytest.mark.parametrize(
    ("precision", "tp", "expected"),
    [
        (
            Precision.BFLOAT16,
            1,
            [*CONVERT_HEAD, *CONVERT_OUT, "--dtype", "bfloat16", "--tp_size", "1"],
        ),
        (
            Precision.FLOAT16,
            2,
            [*CONVERT_HEAD, *CONVERT_OUT, "--dtype", "float16", "--tp_size", "2"],
        ),
        (
            Precision.INT8_WEIGHT_ONLY,
            1,
            [
                *CONVERT_HEAD,
                *CONVERT_OUT,
                "--dtype",
                "bfloat16",
                "--tp_size",
                "1",
                "--use_weight_only",
                "--weight_only_precision",
                "int8",
            ],
        ),
        (
            Precision.INT4_WEIGHT_ONLY,
            4,
            [
                *CONVERT_HEAD,
                *CONVERT_OUT,
                "--dtype",
                "bfloat16",
                "--tp_size",
                "4",
                "--use_weight_only",
                "--weight_only_precision",
                "int4",
            ],
        ),
        (
            Precision.FP8,
            2,
            [
                "python3",
                "/x/quantize.py",
                "--model_dir",
                "/m/llm",
                *CONVERT_OUT,
                "--dtype",
                "bfloat16",
                "--qformat",
                "fp8",
                "--kv_cache_dtype",
                "fp8",
                "--tp_size",
                "2",
            ],
        ),
    ],
)
def test_convert_command_per_precision(precision: Precision, tp: int, expected: list[str]) -> None:
    assert list(commands.convert_argv(TOOLS, precision, LLM, WEIGHTS, tp)) == expected


def test_fp8_calibration_dataset_comes_from_the_environment() -> None:
    tools = ToolPaths.from_environ({"TRTLLM_CALIB_DATASET": "/data/calib"})
    argv = commands.convert_argv(tools, Precision.FP8, LLM, WEIGHTS, 1)
    assert argv[-2:] == ("--calib_dataset", "/data/calib")
    # Only fp8 calibrates.
    assert "--calib_dataset" not in commands.convert_argv(
        tools, Precision.BFLOAT16, LLM, WEIGHTS, 1
    )


@pytest.mark.parametrize(
    ("precision", "gemm"),
    [
        (Precision.BFLOAT16, ["--gemm_plugin", "bfloat16"]),
        (Precision.FLOAT16, ["--gemm_plugin", "float16"]),
        (Precision.INT8_WEIGHT_ONLY, ["--gemm_plugin", "bfloat16"]),
        (Precision.INT4_WEIGHT_ONLY, ["--gemm_plugin", "bfloat16"]),
        (Precision.FP8, []),
    ],
)
def test_build_command_per_precision(precision: Precision, gemm: list[str]) -> None:
    argv = commands.build_argv(TOOLS, precision, WEIGHTS, ENGINES, 64, 32768)
    assert list(argv) == [
        "trtllm-build",
        "--checkpoint_dir",
        "/w/trt_weights",
        "--output_dir",
        "/w/trt_engines",
        "--max_batch_size",
        "64",
        "--max_num_tokens",
        "32768",
        *gemm,
    ]


def test_tool_defaults_and_overrides() -> None:
    defaults = ToolPaths.from_environ({})
    assert defaults.convert_script == "/opt/tensorrt_llm/examples/qwen/convert_checkpoint.py"
    assert defaults.quantize_script == "/opt/tensorrt_llm/examples/quantization/quantize.py"
    assert (defaults.trtllm_build, defaults.trtexec, defaults.python) == (
        "trtllm-build",
        "trtexec",
        "python3",
    )
    custom = ToolPaths.from_environ({"TRTLLM_BUILD": "/b/build", "TRTEXEC": "/b/trtexec"})
    assert (custom.trtllm_build, custom.trtexec) == ("/b/build", "/b/trtexec")


def test_cosyvoice2_flow_plan_is_fp16_with_fp16_io_and_upstream_shapes() -> None:
    spec = commands.FLOW_ESTIMATOR_PLANS[Variant.COSYVOICE2]
    assert spec.onnx_name == "flow.decoder.estimator.fp32.onnx"
    name = spec.plan_name("sm_90", "10.10.0.31")
    assert name == "flow.decoder.estimator.fp16.sm_90.trt10.10.0.31.plan"
    argv = commands.trtexec_argv(TOOLS, spec, Path("/m/est.onnx"), Path(f"/p/{name}"))
    assert argv[:3] == ("trtexec", "--onnx=/m/est.onnx", f"--saveEngine=/p/{name}")
    assert "--fp16" in argv
    assert "--inputIOFormats=" + ",".join(["fp16:chw"] * 6) in argv
    assert "--outputIOFormats=fp16:chw" in argv
    assert "--minShapes=x:2x80x4,mask:2x1x4,mu:2x80x4,cond:2x80x4" in argv
    assert "--optShapes=x:2x80x500,mask:2x1x500,mu:2x80x500,cond:2x80x500" in argv
    assert "--maxShapes=x:2x80x3000,mask:2x1x3000,mu:2x80x3000,cond:2x80x3000" in argv
    assert "--memPoolSize=workspace:4096M" in argv
    assert argv[-1] == "--skipInference"


def test_cosyvoice3_flow_plan_is_strongly_typed_from_the_autocast_export() -> None:
    spec = commands.FLOW_ESTIMATOR_PLANS[Variant.COSYVOICE3]
    assert spec.onnx_name == "flow.decoder.estimator.autocast_fp16.onnx"
    assert spec.plan_name("sm_89", "10.10.0.31") == (
        "flow.decoder.estimator.autocast_fp16.sm_89.trt10.10.0.31.plan"
    )
    argv = commands.trtexec_argv(TOOLS, spec, Path("/m/a.onnx"), Path("/p/a.plan"))
    assert "--stronglyTyped" in argv
    assert "--fp16" not in argv
    assert not any(a.startswith("--inputIOFormats") for a in argv)


def test_speaker_embedding_plan_is_fp32() -> None:
    spec = commands.SPEAKER_EMBEDDING_PLAN
    assert spec.plan_name("sm_90", "10.10.0.31") == "campplus.fp32.sm_90.trt10.10.0.31.plan"
    argv = commands.trtexec_argv(TOOLS, spec, Path("/m/campplus.onnx"), Path("/p/c.plan"))
    assert "--fp16" not in argv
    assert "--minShapes=input:1x4x80" in argv
    assert "--optShapes=input:1x500x80" in argv
    assert "--maxShapes=input:1x3000x80" in argv
