"""The builder's side of the article's levers: SmoothQuant and KV-cache command lines
(TensorRT-LLM's Qwen conversion options), and vLLM's two artifacts (the plans alone, and
the architecture-free checkpoint of ``prefetch``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyvoice_engine_builder import commands
from cosyvoice_engine_builder.commands import ToolPaths
from cosyvoice_engine_builder.request import (
    Artifact,
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


def test_vllm_plans_build_skips_the_llm_and_publishes_the_plans_alone(builder: Builder) -> None:
    result = builder.build(
        llm_runtime="vllm",
        precision=None,
        tensor_parallel_size=None,
        max_batch_size=None,
        max_num_tokens=None,
    )
    assert result.code == 0, result.out
    assert builder.tools_called() == ["trtexec", "trtexec"]
    manifest = builder.manifest()
    assert (manifest["llmRuntime"], manifest["artifact"]) == ("vllm", "plans")
    assert "precision" not in manifest
    assert set(manifest["layout"]) == {"flowEstimatorPlan", "speakerEmbeddingPlan"}
    paths = {f["path"] for f in manifest["files"]}
    assert paths and all(p.startswith("plans/") for p in paths)


def test_a_tensorrt_llm_build_still_needs_its_llm_options(builder: Builder) -> None:
    result = builder.build(precision=None)
    assert result.code == 2
    assert result.termination is not None
    assert "--precision" in result.termination["message"]
    assert builder.calls() == []


def test_prefetch_fetches_and_publishes_the_model_without_any_tool(builder: Builder) -> None:
    argv = [
        "prefetch",
        "--key",
        KEY,
        "--cache-dir",
        str(builder.cache),
        "--variant",
        "cosyvoice2",
        "--model-uri",
        "pvc://models/cosyvoice2",
        "--pvc-root",
        str(builder.pvc_root),
    ]
    result = builder.run(argv)
    assert result.code == 0, result.out + result.err
    assert builder.tools_called() == []  # no GPU, no TensorRT: a download and a publish
    manifest = builder.manifest()
    assert (manifest["artifact"], manifest["gpuArch"]) == ("checkpoint", "")
    assert manifest["layout"]["modelDir"] == "model"
    assert manifest["layout"]["tokenizerDir"] == "model/llm"
    assert (builder.engine_dir / "model" / "llm").is_dir()
    assert not (builder.engine_dir / "plans").exists()
    assert (
        BuildRequest.prefetch(
            key=KEY,
            cache_dir=builder.cache,
            variant="cosyvoice2",
            model_uri="hf://a/b",
            revision="",
            work_dir=None,
            pvc_root=Path("/models"),
        ).artifact
        is Artifact.CHECKPOINT
    )


KEY_PLANS = "1111111111111111111111111111111111111111"
KEY_CKPT = "2222222222222222222222222222222222222222"


def test_serve_dry_run_starts_vllm_per_group_on_the_checkpoint(pod: Pod) -> None:
    """A vLLM pod: the plans' engine directory, the checkpoint beside it, one `vllm serve`
    per GPU group, the TensorRT-LLM version not compared (vLLM's image need not have it)."""
    builder = pod.builder
    built = builder.build(
        key=KEY_PLANS,
        variant="cosyvoice3",
        model_uri="pvc://models/cosyvoice3",
        llm_runtime="vllm",
        precision=None,
        tensor_parallel_size=None,
        max_batch_size=None,
        max_num_tokens=None,
    )
    assert built.code == 0, built.out + built.err
    fetched = builder.run(
        [
            "prefetch",
            "--key",
            KEY_CKPT,
            "--cache-dir",
            str(builder.cache),
            "--variant",
            "cosyvoice3",
            "--model-uri",
            "pvc://models/cosyvoice3",
            "--pvc-root",
            str(builder.pvc_root),
        ]
    )
    assert fetched.code == 0, fetched.out + fetched.err
    checkpoint = builder.cache / KEY_CKPT
    argv = pod.argv(
        engine_dir=builder.cache / KEY_PLANS,
        key=KEY_PLANS,
        llm_runtime="vllm",
        checkpoint_dir=checkpoint,
        checkpoint_key=KEY_CKPT,
        llm_dtype="float16",
        llm_kv_cache_dtype="fp8",
        llm_max_batch_size=32,
        llm_max_num_tokens=8192,
        dry_run=True,
    )
    result = pod.run(argv, FAKE_TRTLLM_VERSION="")
    assert result.code == 0, result.out + result.err
    lines = result.out.splitlines()
    base = pod.llm_base_port
    for index, gpus in enumerate(("0,1", "2,3")):
        assert (
            f"[llm] would start vllm serve llm{index} (GPUs {gpus}, port {base + index}): "
            f"CUDA_VISIBLE_DEVICES={gpus} vllm serve {checkpoint / 'model' / 'llm'} "
            f"--host 127.0.0.1 --port {base + index} --served-model-name cosyvoice-llm "
            "--tensor-parallel-size 2 --dtype float16 --max-num-seqs 32 "
            "--max-num-batched-tokens 8192 --gpu-memory-utilization 0.4 "
            f"--kv-cache-dtype fp8; then wait for http://127.0.0.1:{base + index}/health" in lines
        ), result.out
    # The model view reads the checkpoint's model directory.
    assert "[gate] ok: the engine was built for this GPU architecture and TensorRT" in lines


def test_serve_refuses_vllm_without_its_checkpoint(pod: Pod) -> None:
    result = pod.run(pod.argv(llm_runtime="vllm", dry_run=True))
    assert result.code == 2
    assert "--llm-runtime vllm needs --checkpoint-dir and --checkpoint-key" in result.err
