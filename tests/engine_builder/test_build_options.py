"""The builder's side of the article's levers: SmoothQuant and KV-cache command lines
(TensorRT-LLM's Qwen conversion options). (vLLM's artifacts, ``build --llm-runtime vllm`` and
``prefetch``, are gone: ``spec.model.llmRuntime: vllm`` is refused, issue 19 item 9.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyvoice_engine_builder import commands
from cosyvoice_engine_builder.commands import ToolPaths
from cosyvoice_engine_builder.request import (
    BuildRequest,
    InvalidRequest,
    KvCacheType,
    Precision,
    SmoothQuant,
)
from tests.engine_builder.conftest import KEY, Builder
from tests.engine_builder.test_serve import Pod
from tests.engine_builder.test_serve import pod as pod  # the fixture, by its name
from tests.precision_cases import KV_CACHE_ARCH_CASES

TOOLS = ToolPaths(
    python="python3",
    convert_script="/x/convert_checkpoint.py",
    quantize_script="/x/quantize.py",
    trtllm_build="trtllm-build",
    trtexec="trtexec",
    calib_dataset="/engines/.calibration/cnn_dailymail",
)
LLM, WEIGHTS = Path("/m/llm"), Path("/w/trt_weights")
CONVERT = [
    "python3",
    "/x/convert_checkpoint.py",
    "--model_dir",
    "/m/llm",
    "--output_dir",
    "/w/trt_weights",
]
CALIB = ["--calib_dataset", "/engines/.calibration/cnn_dailymail"]


def test_smoothquant_follows_the_qwen_example() -> None:
    argv = commands.convert_argv(
        TOOLS, Precision.INT8_SMOOTHQUANT, LLM, WEIGHTS, 1, smooth_quant=SmoothQuant(0.5)
    )
    assert list(argv) == [
        *CONVERT,
        "--dtype",
        "bfloat16",
        "--tp_size",
        "1",
        "--smoothquant",
        "0.5",
        "--per_token",
        "--per_channel",
        *CALIB,
    ]


def test_smoothquant_per_tensor_with_an_int8_kv_cache() -> None:
    argv = commands.convert_argv(
        TOOLS,
        Precision.INT8_SMOOTHQUANT,
        LLM,
        WEIGHTS,
        2,
        KvCacheType.INT8,
        SmoothQuant(0.8, per_token=False, per_channel=False),
    )
    assert list(argv[-5:]) == ["--smoothquant", "0.8", "--int8_kv_cache", *CALIB]
    assert "--per_token" not in argv and "--per_channel" not in argv


@pytest.mark.parametrize(
    ("precision", "extra"),
    [
        (Precision.BFLOAT16, []),
        (Precision.INT8_WEIGHT_ONLY, ["--use_weight_only", "--weight_only_precision", "int8"]),
    ],
)
def test_int8_kv_cache_is_a_convert_checkpoint_flag(precision: Precision, extra: list[str]) -> None:
    argv = commands.convert_argv(TOOLS, precision, LLM, WEIGHTS, 1, KvCacheType.INT8)
    assert list(argv[10:]) == [*extra, "--int8_kv_cache", *CALIB]
    assert commands.convert_script(TOOLS, precision, KvCacheType.INT8) == TOOLS.convert_script


@pytest.mark.parametrize(
    ("precision", "qformat"),
    [
        (Precision.BFLOAT16, "full_prec"),
        (Precision.FLOAT16, "full_prec"),
        (Precision.INT8_WEIGHT_ONLY, "int8_wo"),
        (Precision.INT4_WEIGHT_ONLY, "int4_wo"),
        (Precision.FP8, "fp8"),
    ],
)
def test_fp8_kv_cache_goes_through_quantize_keeping_the_weights(
    precision: Precision, qformat: str
) -> None:
    argv = commands.convert_argv(TOOLS, precision, LLM, WEIGHTS, 1, KvCacheType.FP8)
    assert argv[1] == "/x/quantize.py"
    assert list(argv[8:12]) == ["--qformat", qformat, "--kv_cache_dtype", "fp8"]
    assert list(argv[-2:]) == CALIB


def test_without_a_calibration_copy_no_calib_flag_is_passed() -> None:
    tools = ToolPaths(**{**TOOLS.__dict__, "calib_dataset": None})
    argv = commands.convert_argv(tools, Precision.INT8_SMOOTHQUANT, LLM, WEIGHTS, 1)
    assert "--calib_dataset" not in argv


def _request(**overrides: object) -> BuildRequest:
    values: dict[str, object] = {
        "key": KEY,
        "cache_dir": Path("/engines"),
        "variant": "cosyvoice3",
        "model_uri": "hf://a/b",
        "revision": "",
        "precision": "bfloat16",
        "tensor_parallel_size": 1,
        "max_batch_size": 16,
        "max_num_tokens": 32768,
        "gpu_arch": "sm_90",
        "work_dir": None,
        "pvc_root": Path("/models"),
    }
    values.update(overrides)
    return BuildRequest.create(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(("kv", "arch", "ok"), KV_CACHE_ARCH_CASES)
def test_kv_cache_must_run_on_the_architecture(kv: str, arch: str, ok: bool) -> None:
    # float16 runs everywhere: only the KV cache decides.
    if ok:
        got = _request(precision="float16", kv_cache_type=kv, gpu_arch=arch)
        assert got.kv_cache_type.value == kv
    else:
        with pytest.raises(InvalidRequest, match=f"--kv-cache-type {kv} needs sm_"):
            _request(precision="float16", kv_cache_type=kv, gpu_arch=arch)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"precision": "fp8", "kv_cache_type": "int8"}, "cannot go with --precision fp8"),
        (
            {"precision": "int8-smoothquant", "kv_cache_type": "fp8"},
            "cannot go with --precision int8-smoothquant",
        ),
        ({"smoothquant_alpha": 0.5}, "need --precision int8-smoothquant"),
        ({"precision": "int8-smoothquant", "smoothquant_alpha": 1.5}, "between 0 and 1"),
        ({"kv_cache_type": "fp16"}, "--kv-cache-type 'fp16'"),
    ],
)
def test_pairs_no_gpu_runs_are_refused(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        _request(**overrides)


def test_smoothquant_build_reaches_the_converter_and_the_manifest(builder: Builder) -> None:
    result = builder.build(
        precision="int8-smoothquant",
        kv_cache_type="int8",
        smoothquant_alpha="0.8",
        smoothquant_per_token=True,
        env_extra={"TRTLLM_CALIB_DATASET": "/engines/.calibration/cnn_dailymail"},
    )
    assert result.code == 0, result.out
    convert = builder.calls()[0]
    assert convert["tool"] == "convert"
    assert convert["argv"][8:] == [
        "--smoothquant",
        "0.8",
        "--per_token",
        "--int8_kv_cache",
        "--calib_dataset",
        "/engines/.calibration/cnn_dailymail",
    ]
    manifest = builder.manifest()
    assert manifest["precision"] == "int8-smoothquant"
    assert manifest["kvCacheType"] == "int8"
    assert manifest["smoothQuant"] == {"alpha": 0.8, "perToken": True, "perChannel": False}


def test_a_plain_build_writes_no_new_manifest_fields(builder: Builder) -> None:
    assert builder.build().code == 0
    manifest = builder.manifest()
    assert "kvCacheType" not in manifest and "smoothQuant" not in manifest
    assert "llmRuntime" not in manifest


def test_a_tensorrt_llm_build_still_needs_its_llm_options(builder: Builder) -> None:
    result = builder.build(precision=None)
    assert result.code == 2
    assert result.termination is not None
    assert "--precision" in result.termination["message"]
    assert builder.calls() == []


def test_vllm_builds_and_prefetch_are_usage_errors(builder: Builder) -> None:
    """``spec.model.llmRuntime: vllm`` is refused (issue 19, item 9): the builder has no
    plans-only build and no checkpoint download for it, and says so before doing anything."""
    result = builder.build(llm_runtime="vllm")
    assert result.code == 2
    assert "--llm-runtime" in result.err
    prefetch = builder.run(
        ["prefetch", "--key", KEY, "--cache-dir", str(builder.cache), "--variant", "cosyvoice2"]
    )
    assert prefetch.code == 2
    assert "prefetch" in prefetch.err
    assert builder.calls() == []
    assert not builder.engine_dir.exists()


@pytest.mark.parametrize(
    "flags",
    [
        {"llm_runtime": "vllm"},
        {"checkpoint_dir": "/engines/" + "2" * 40, "checkpoint_key": "2" * 40},
        {"llm_served_model_name": "cosyvoice-llm"},
    ],
)
def test_serve_has_no_vllm_mode(pod: Pod, flags: dict[str, str]) -> None:
    """``cosyvoice-serve``'s vLLM flags went with vLLM: a pod spec naming one is a usage
    error (exit 2), not a flag accepted and ignored."""
    result = pod.run(pod.argv(dry_run=True, **flags))
    assert result.code == 2
    assert "unrecognized arguments: --" + next(iter(flags)).replace("_", "-") in result.err
