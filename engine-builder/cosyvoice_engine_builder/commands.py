"""The exact command lines of the build, as pure functions of the request.

Kept apart from execution so a dry run, the step digests and the tests all see the same
argv the Job will run.

Choices that differ from upstream's single bfloat16 recipe, and why:

- ``--dtype`` is the activation/unquantized-weight dtype: ``float16`` for float16, else
  ``bfloat16`` (the checkpoint's own dtype, upstream's choice), including the weight-only
  and fp8 modes.
- int8/int4 weight-only go through the Qwen ``convert_checkpoint.py`` with
  ``--use_weight_only --weight_only_precision int8|int4``.
- fp8 cannot be produced by ``convert_checkpoint.py``; it goes through TensorRT-LLM's
  ModelOpt path ``quantize.py --qformat fp8 --kv_cache_dtype fp8``, which calibrates.
  Its default calibration set is downloaded from the Hugging Face Hub, so an offline
  cluster must point ``TRTLLM_CALIB_DATASET`` at a local copy.
- ``--gemm_plugin`` is the dtype for bfloat16/float16/weight-only (as upstream) and is
  omitted for fp8: with the plugin off TensorRT picks its native FP8 GEMM kernels, while
  ``auto`` would resolve to the bfloat16 plugin and lose the FP8 GEMMs.
- int8-smoothquant goes through the Qwen ``convert_checkpoint.py`` with ``--smoothquant
  ALPHA`` and, as asked, ``--per_token`` and ``--per_channel`` (TensorRT-LLM's Qwen example);
  it calibrates on ``--calib_dataset``.
- An int8 KV cache is ``convert_checkpoint.py --int8_kv_cache`` (calibrated the same way),
  beside any of its precisions.
- An fp8 KV cache under a non-fp8 precision goes through ``quantize.py`` like fp8, with the
  ModelOpt format that keeps the weights as asked (``full_prec``, ``int8_wo``, ``int4_wo``)
  and ``--kv_cache_dtype fp8``. int8-smoothquant with an fp8 KV cache is refused (ModelOpt's
  SmoothQuant would ignore the alpha and scaling options the key records).
- Calibration data: ``TRTLLM_CALIB_DATASET`` (a local copy; the engine builder's README says
  how to keep one in the engine cache) is passed as ``--calib_dataset`` to whichever script
  calibrates; without it the scripts download their default set from the Hugging Face Hub.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cosyvoice_engine_builder.request import KvCacheType, Precision, SmoothQuant, Variant


@dataclass(frozen=True)
class ToolPaths:
    """Where each tool lives; every one can be overridden from the environment."""

    python: str
    convert_script: str
    quantize_script: str
    trtllm_build: str
    trtexec: str
    calib_dataset: str | None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ToolPaths:
        return cls(
            python=environ.get("TRTLLM_PYTHON") or "python3",
            convert_script=environ.get("TRTLLM_QWEN_CONVERT")
            or "/opt/tensorrt_llm/examples/qwen/convert_checkpoint.py",
            quantize_script=environ.get("TRTLLM_QUANTIZE")
            or "/opt/tensorrt_llm/examples/quantization/quantize.py",
            trtllm_build=environ.get("TRTLLM_BUILD") or "trtllm-build",
            trtexec=environ.get("TRTEXEC") or "trtexec",
            calib_dataset=environ.get("TRTLLM_CALIB_DATASET") or None,
        )


def checkpoint_dtype(precision: Precision) -> str:
    return "float16" if precision is Precision.FLOAT16 else "bfloat16"


# quantize.py's --qformat that keeps each precision's weights while it quantizes the KV cache.
_MODELOPT_FORMAT = {
    Precision.BFLOAT16: "full_prec",
    Precision.FLOAT16: "full_prec",
    Precision.INT8_WEIGHT_ONLY: "int8_wo",
    Precision.INT4_WEIGHT_ONLY: "int4_wo",
    Precision.FP8: "fp8",
}


def uses_quantize_script(precision: Precision, kv_cache_type: KvCacheType) -> bool:
    """ModelOpt's quantize.py (fp8 anything) rather than the Qwen convert_checkpoint.py."""
    return precision is Precision.FP8 or kv_cache_type is KvCacheType.FP8


def convert_argv(
    tools: ToolPaths,
    precision: Precision,
    llm_dir: Path,
    output_dir: Path,
    tp_size: int,
    kv_cache_type: KvCacheType = KvCacheType.AUTO,
    smooth_quant: SmoothQuant | None = None,
) -> tuple[str, ...]:
    dtype = checkpoint_dtype(precision)
    if uses_quantize_script(precision, kv_cache_type):
        if precision is Precision.INT8_SMOOTHQUANT:
            raise ValueError("int8-smoothquant with an fp8 KV cache is not built (see above)")
        argv = [
            tools.python,
            tools.quantize_script,
            "--model_dir",
            str(llm_dir),
            "--output_dir",
            str(output_dir),
            "--dtype",
            dtype,
            "--qformat",
            _MODELOPT_FORMAT[precision],
            "--kv_cache_dtype",
            "fp8",
            "--tp_size",
            str(tp_size),
        ]
        if tools.calib_dataset:
            argv += ["--calib_dataset", tools.calib_dataset]
        return tuple(argv)
    argv = [
        tools.python,
        tools.convert_script,
        "--model_dir",
        str(llm_dir),
        "--output_dir",
        str(output_dir),
        "--dtype",
        dtype,
        "--tp_size",
        str(tp_size),
    ]
    if precision is Precision.INT8_WEIGHT_ONLY:
        argv += ["--use_weight_only", "--weight_only_precision", "int8"]
    elif precision is Precision.INT4_WEIGHT_ONLY:
        argv += ["--use_weight_only", "--weight_only_precision", "int4"]
    elif precision is Precision.INT8_SMOOTHQUANT:
        sq = smooth_quant or SmoothQuant()
        argv += ["--smoothquant", f"{sq.alpha:g}"]
        if sq.per_token:
            argv.append("--per_token")
        if sq.per_channel:
            argv.append("--per_channel")
    if kv_cache_type is KvCacheType.INT8:
        argv.append("--int8_kv_cache")
    calibrates = precision is Precision.INT8_SMOOTHQUANT or kv_cache_type is KvCacheType.INT8
    if calibrates and tools.calib_dataset:
        argv += ["--calib_dataset", tools.calib_dataset]
    return tuple(argv)


def convert_script(
    tools: ToolPaths, precision: Precision, kv_cache_type: KvCacheType = KvCacheType.AUTO
) -> str:
    return (
        tools.quantize_script
        if uses_quantize_script(precision, kv_cache_type)
        else tools.convert_script
    )


def build_argv(
    tools: ToolPaths,
    precision: Precision,
    checkpoint_dir: Path,
    output_dir: Path,
    max_batch_size: int,
    max_num_tokens: int,
) -> tuple[str, ...]:
    argv = [
        tools.trtllm_build,
        "--checkpoint_dir",
        str(checkpoint_dir),
        "--output_dir",
        str(output_dir),
        "--max_batch_size",
        str(max_batch_size),
        "--max_num_tokens",
        str(max_num_tokens),
    ]
    if precision is not Precision.FP8:
        argv += ["--gemm_plugin", checkpoint_dtype(precision)]
    return tuple(argv)


@dataclass(frozen=True)
class ShapeProfile:
    """One dynamic input's min/opt/max shape, as upstream's get_trt_kwargs declares it."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class PlanSpec:
    """How one lazily-built upstream TensorRT plan is prebuilt with trtexec."""

    role: str
    onnx_name: str
    plan_stem: str
    profiles: tuple[ShapeProfile, ...]
    flags: tuple[str, ...]

    def plan_name(self, gpu_arch: str, tensorrt_version: str) -> str:
        # Upstream's names ("mygpu", "l20") say nothing about what the plan runs on, so
        # a cache shared across GPU types or image upgrades loads incompatible plans.
        return f"{self.plan_stem}.{gpu_arch}.trt{tensorrt_version}.plan"


def _mel_profile(name: str, channels: int) -> ShapeProfile:
    # Batch 2 is classifier-free guidance (conditional + unconditional), not a batch size.
    return ShapeProfile(name, (2, channels, 4), (2, channels, 500), (2, channels, 3000))


_FLOW_PROFILES = (
    _mel_profile("x", 80),
    _mel_profile("mask", 1),
    _mel_profile("mu", 80),
    _mel_profile("cond", 80),
)
# The estimator's six inputs in export order (x, mask, mu, t, spks, cond) and its one
# output; cosyvoice2 upstream sets all of them to fp16, which trtexec expresses as I/O
# formats, so the serving code can keep feeding half-precision tensors.
_FLOW_FP16_IO = (
    "--inputIOFormats=" + ",".join(["fp16:chw"] * 6),
    "--outputIOFormats=fp16:chw",
)
# Upstream's builder sets a 4 GiB workspace; trtexec's default unit is MiB.
_WORKSPACE = "--memPoolSize=workspace:4096M"

FLOW_ESTIMATOR_PLANS: dict[Variant, PlanSpec] = {
    Variant.COSYVOICE2: PlanSpec(
        role="flowEstimator",
        onnx_name="flow.decoder.estimator.fp32.onnx",
        plan_stem="flow.decoder.estimator.fp16",
        profiles=_FLOW_PROFILES,
        flags=("--fp16", *_FLOW_FP16_IO, _WORKSPACE),
    ),
    # cosyvoice3 ships an autocast (mixed-precision) export and upstream builds it as a
    # strongly typed network: precisions come from the ONNX, no --fp16.
    Variant.COSYVOICE3: PlanSpec(
        role="flowEstimator",
        onnx_name="flow.decoder.estimator.autocast_fp16.onnx",
        plan_stem="flow.decoder.estimator.autocast_fp16",
        profiles=_FLOW_PROFILES,
        flags=("--stronglyTyped", _WORKSPACE),
    ),
}

# Upstream loads campplus with fp16=False: fp32 precision and fp32 I/O, both variants.
SPEAKER_EMBEDDING_PLAN = PlanSpec(
    role="speakerEmbedding",
    onnx_name="campplus.onnx",
    plan_stem="campplus.fp32",
    profiles=(ShapeProfile("input", (1, 4, 80), (1, 500, 80), (1, 3000, 80)),),
    flags=(_WORKSPACE,),
)


def _shapes(profiles: tuple[ShapeProfile, ...], which: str) -> str:
    return ",".join(f"{p.name}:{'x'.join(str(d) for d in getattr(p, which))}" for p in profiles)


def trtexec_argv(
    tools: ToolPaths, spec: PlanSpec, onnx_path: Path, plan_path: Path
) -> tuple[str, ...]:
    return (
        tools.trtexec,
        f"--onnx={onnx_path}",
        f"--saveEngine={plan_path}",
        *spec.flags,
        f"--minShapes={_shapes(spec.profiles, 'min')}",
        f"--optShapes={_shapes(spec.profiles, 'opt')}",
        f"--maxShapes={_shapes(spec.profiles, 'max')}",
        # The build is the product; trtexec's benchmark run afterwards is not.
        "--skipInference",
    )
