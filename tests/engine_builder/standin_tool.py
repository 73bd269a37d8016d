"""Stand-in for convert_checkpoint.py, quantize.py, trtllm-build, trtexec, nvidia-smi and the
speaker_prompt tool.

The tests write tiny wrappers that call :func:`main` with the tool's name. Each call is
appended to ``$CALL_LOG`` as one JSON line; outputs are created where the real tool would
put them. Behaviour switches, all through the environment:

- ``FAKE_FAIL=<tool>``: print ``FAKE_STDERR_LINES`` lines to stderr and exit 3 (or
  ``FAKE_FAIL_CODE``)
  (only calls with an argument containing ``FAKE_FAIL_ARG``, when that is set)
- ``FAKE_LEAK``: a string printed to stderr by a failing tool (a leaked secret)
- ``FAKE_NO_OUTPUT=<tool>``: exit 0 without producing anything
- ``FAKE_SLEEP=<tool>:<seconds>``: sleep first (writes its pid to ``$FAKE_PID_FILE``)
- ``FAKE_COMPUTE_CAP``: what the nvidia-smi stand-in reports

Each stand-in of a tool whose source we could read refuses a command line the real tool
refuses (:func:`command_line_problems`): an option the tool does not have, an option without
its value, a value outside its choices, a missing required option. It answers as the real one
does: argparse's ``error: ...`` and exit 2 for the TensorRT-LLM scripts and
``speaker_prompt``, trtexec's ``Unknown option: ...`` and exit 1. The flag tables below are
copied from the tools' sources (file and version with each); abbreviations, which argparse
would accept, are refused (the builder writes every flag in full).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# Mirrors cosyvoice_engine_builder.redaction.SECRET_ENV_VARS (checked by test_redaction), so
# that this stand-in, which runs as a separate script, imports nothing of the builder.
SECRET_NAMES = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
)


# How many values an option takes: 0 (a switch), 1, "?" (zero or one), "+" (one or more).
Arity = int | str

# examples/models/core/qwen/convert_checkpoint.py, parse_arguments(): NVIDIA/TensorRT-LLM
# 0df9aaf (the code index's stored version; the v0.20.0 tag the builder image clones,
# 7965842, is not stored there, and this script's options are unchanged across the stored
# versions read).
CONVERT_FLAGS: dict[str, Arity] = {
    "--model_dir": 1,
    "--tp_size": 1,
    "--pp_size": 1,
    "--cp_size": 1,
    "--dtype": 1,
    "--use_weight_only": 0,
    "--disable_weight_only_quant_plugin": 0,
    "--weight_only_precision": "?",
    "--calib_dataset": 1,
    "--smoothquant": 1,
    "-sq": 1,
    "--per_channel": 0,
    "--per_token": 0,
    "--int8_kv_cache": 0,
    "--per_group": 0,
    "--group_size": 1,
    "--load_model_on_cpu": 0,
    "--use_parallel_embedding": 0,
    "--embedding_sharding_dim": 1,
    "--output_dir": 1,
    "--workers": 1,
    "--moe_tp_size": 1,
    "--moe_ep_size": 1,
}
CONVERT_CHOICES = {
    "--dtype": ("auto", "float16", "bfloat16", "float32"),
    "--weight_only_precision": ("int8", "int4", "int4_gptq", "int8_gptq"),
    "--embedding_sharding_dim": ("0", "1"),
}

# examples/quantization/quantize.py: NVIDIA/TensorRT-LLM 059c97c (stored version; see above).
QUANTIZE_FLAGS: dict[str, Arity] = {
    "--model_dir": 1,
    "--nemo_ckpt_path": 1,
    "--decoder_type": 1,
    "--device": 1,
    "--device_map": 1,
    "--calib_dataset": 1,
    "--calib_tp_size": 1,
    "--calib_pp_size": 1,
    "--dtype": 1,
    "--qformat": 1,
    "--seed": 1,
    "--tokenizer_max_seq_length": 1,
    "--batch_size": 1,
    "--calib_size": 1,
    "--calib_max_seq_length": 1,
    "--output_dir": 1,
    "--tp_size": 1,
    "--pp_size": 1,
    "--cp_size": 1,
    "--awq_block_size": 1,
    "--kv_cache_dtype": 1,
    "--quantize_lm_head": 0,
    "--num_medusa_heads": 1,
    "--num_medusa_layers": 1,
    "--max_draft_len": 1,
    "--medusa_hidden_act": 1,
    "--medusa_model_dir": 1,
    "--quant_medusa_head": 0,
    "--autoq_format": 1,
    "--auto_quantize_bits": 1,
    "--export_format": 1,
}
QUANTIZE_CHOICES = {
    "--dtype": ("auto", "float16", "bfloat16", "float32"),
    "--qformat": (
        "nvfp4",
        "fp8",
        "int8_sq",
        "int4_awq",
        "w4a8_awq",
        "int8_wo",
        "int4_wo",
        "full_prec",
    ),
    "--kv_cache_dtype": ("int8", "fp8"),
    "--device": ("cuda", "cpu"),
    "--export_format": ("tensorrt_llm", "hf"),
}

# trtllm-build: tensorrt_llm/commands/build.py parse_arguments() (NVIDIA/TensorRT-LLM 008b2b8,
# stored version), plus one option per name of tensorrt_llm/plugin/plugin.py's
# ``cli_plugin_args`` (add_plugin_argument: ``--<name>`` taking one value; the same list in
# the dataclass and the pydantic versions of PluginConfig stored, code-index files
# 4216063708 and 196834873).
TRTLLM_BUILD_FLAGS: dict[str, Arity] = {
    "--checkpoint_dir": 1,
    "--model_config": 1,
    "--build_config": 1,
    "--model_cls_file": 1,
    "--model_cls_name": 1,
    "--output_dir": 1,
    "--max_batch_size": 1,
    "--max_input_len": 1,
    "--max_seq_len": 1,
    "--max_decoder_seq_len": 1,
    "--max_beam_width": 1,
    "--max_num_tokens": 1,
    "--opt_num_tokens": 1,
    "--max_encoder_input_len": 1,
    "--max_prompt_embedding_table_size": 1,
    "--max_multimodal_len": 1,
    "--kv_cache_type": 1,
    "--paged_kv_cache": 1,
    "--input_timing_cache": 1,
    "--output_timing_cache": 1,
    "--profiling_verbosity": 1,
    "--strip_plan": 0,
    "--weight_sparsity": 0,
    "--weight_streaming": 0,
    "--fast_build": 0,
    "--workers": 1,
    "--log_level": 1,
    "--enable_debug_output": 0,
    "--visualize_network": 1,
    "--dry_run": 0,
    "--monitor_memory": 0,
    "--logits_dtype": 1,
    "--gather_context_logits": 0,
    "--gather_generation_logits": 0,
    "--gather_all_token_logits": 0,
    "--lora_dir": "+",
    "--lora_ckpt_source": 1,
    "--lora_target_modules": "+",
    "--max_lora_rank": 1,
    "--speculative_decoding_mode": 1,
    "--max_draft_len": 1,
    "--auto_parallel": 1,
    "--gpus_per_node": 1,
    "--cluster_key": 1,
    **{
        "--" + name: 1
        for name in (
            "bert_attention_plugin",
            "gpt_attention_plugin",
            "gemm_plugin",
            "gemm_swiglu_plugin",
            "fp8_rowwise_gemm_plugin",
            "lora_plugin",
            "dora_plugin",
            "moe_plugin",
            "mamba_conv1d_plugin",
            "nccl_plugin",
            "low_latency_gemm_plugin",
            "low_latency_gemm_swiglu_plugin",
            "gemm_allreduce_plugin",
            "context_fmha",
            "bert_context_fmha_fp32_acc",
            "remove_input_padding",
            "tokens_per_block",
            "use_paged_context_fmha",
            "use_fp8_context_fmha",
            "fuse_fp4_quant",
            "multiple_profiles",
            "paged_state",
            "streamingllm",
            "norm_quant_fusion",
            "reduce_fusion",
            "user_buffer",
            "use_fused_mlp",
            "pp_reduce_scatter",
        )
    },
}
TRTLLM_BUILD_CHOICES = {
    "--profiling_verbosity": ("layer_names_only", "detailed", "none"),
    "--logits_dtype": ("float16", "float32"),
    "--lora_ckpt_source": ("hf", "nemo"),
}

# trtexec (TensorRT 10.10.0.31, the builder image's): every option name in
# samples/common/sampleOptions.cpp at NVIDIA/TensorRT v10.10.0
# (665cfbe8623652e706ce7e616a3db42dbff94f5f). trtexec takes ``--name`` or ``--name=value``
# and answers an option it does not know with ``Unknown option: ...`` and a failure (exit 1).
TRTEXEC_FLAGS = frozenset(
    [
        "--allocationStrategy",
        "--allowGPUFallback",
        "--allowWeightStreaming",
        "--asyncFileReader",
        "--avgRuns",
        "--avgTiming",
        "--best",
        "--bf16",
        "--buildDLAStandalone",
        "--builderOptimizationLevel",
        "--calib",
        "--calibProfile",
        "--device",
        "--directIO",
        "--dumpLayerInfo",
        "--dumpOptimizationProfile",
        "--dumpOutput",
        "--dumpProfile",
        "--dumpRawBindingsToFile",
        "--dumpRefit",
        "--duration",
        "--dynamicPlugins",
        "--errorOnTimingCacheMiss",
        "--excludeLeanRuntime",
        "--exportLayerInfo",
        "--exportOutput",
        "--exportProfile",
        "--exportTimes",
        "--exposeDMA",
        "--fp16",
        "--fp8",
        "--getPlanVersionOnly",
        "--hardwareCompatibilityLevel",
        "--help",
        "--idleTime",
        "--ignoreParsedPluginLibs",
        "--infStreams",
        "--inputIOFormats",
        "--int4",
        "--int8",
        "--iterations",
        "--l2LimitForTiling",
        "--layerDeviceTypes",
        "--layerOutputTypes",
        "--layerPrecisions",
        "--leanDLLPath",
        "--loadEngine",
        "--loadInputs",
        "--markDebug",
        "--maxAuxStreams",
        "--maxShapes",
        "--maxShapesCalib",
        "--maxTactics",
        "--memPoolSize",
        "--minShapes",
        "--minShapesCalib",
        "--monitorMemory",
        "--noBuilderCache",
        "--noCompilationCache",
        "--noDataTransfers",
        "--noTF32",
        "--onnx",
        "--optShapes",
        "--optShapesCalib",
        "--outputIOFormats",
        "--percentile",
        "--persistentCacheRatio",
        "--pi",
        "--pluginInstanceNorm",
        "--plugins",
        "--precisionConstraints",
        "--preview",
        "--profile",
        "--profilingVerbosity",
        "--refit",
        "--restricted",
        "--runtimePlatform",
        "--safe",
        "--saveDebugTensors",
        "--saveEngine",
        "--separateProfileRun",
        "--serialized",
        "--setPluginsToSerialize",
        "--shapes",
        "--skipInference",
        "--sleepTime",
        "--sparsity",
        "--staticPlugins",
        "--std",
        "--streams",
        "--stripAllWeights",
        "--stripWeights",
        "--stronglyTyped",
        "--tacticSources",
        "--tempdir",
        "--tempfileControls",
        "--threads",
        "--tilingOptimizationLevel",
        "--timeDeserialize",
        "--timeRefit",
        "--timingCacheFile",
        "--useCudaGraph",
        "--useDLACore",
        "--useManagedMemory",
        "--useProfile",
        "--useRuntime",
        "--useSpinWait",
        "--vc",
        "--verbose",
        "--versionCompatible",
        "--warmUp",
        "--weightStreamingBudget",
        "--weightless",
    ]
)

# The project's own tool (serving-models/cosyvoice_serving_models/speaker_prompt.py, main()'s
# parser; test_standin_tool checks this table against it): every option required.
SPEAKER_PROMPT_FLAGS: dict[str, Arity] = {
    "--model-dir": 1,
    "--variant": 1,
    "--audio": 1,
    "--transcript-file": 1,
    "--out": 1,
}

# tool -> (options, choices, required options)
ARGPARSE_TOOLS: dict[str, tuple[dict[str, Arity], dict[str, tuple[str, ...]], tuple[str, ...]]] = {
    "convert": (CONVERT_FLAGS, CONVERT_CHOICES, ("--model_dir",)),
    "quantize": (QUANTIZE_FLAGS, QUANTIZE_CHOICES, ()),
    "trtllm-build": (TRTLLM_BUILD_FLAGS, TRTLLM_BUILD_CHOICES, ()),
    "speaker-prompt": (SPEAKER_PROMPT_FLAGS, {}, tuple(SPEAKER_PROMPT_FLAGS)),
}


def _is_option(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False  # a negative number is a value, as argparse reads it


def argparse_problems(
    argv: list[str],
    flags: dict[str, Arity],
    choices: dict[str, tuple[str, ...]],
    required: tuple[str, ...] = (),
) -> list[str]:
    """What argparse would refuse in ``argv`` for a parser with these options (none of the
    tools here takes a positional argument)."""
    problems: list[str] = []
    unrecognized: list[str] = []
    seen: set[str] = set()
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not _is_option(token):
            unrecognized.append(token)
            continue
        name, eq, inline = token.partition("=")
        if name not in flags:
            unrecognized.append(token)
            continue
        seen.add(name)
        arity = flags[name]
        values: list[str] = [inline] if eq else []
        if arity == 0:
            if eq:
                problems.append(f"argument {name}: ignored explicit argument {inline!r}")
            continue
        if not eq:
            while i < len(argv) and not _is_option(argv[i]):
                values.append(argv[i])
                i += 1
                if arity in (1, "?"):
                    break
        if arity == 1 and not values:
            problems.append(f"argument {name}: expected one argument")
        if arity == "+" and not values:
            problems.append(f"argument {name}: expected at least one argument")
        allowed = choices.get(name)
        for value in values if allowed else ():
            if value not in allowed:  # type: ignore[operator]
                problems.append(f"argument {name}: invalid choice: {value!r}")
    if unrecognized:
        problems.append("unrecognized arguments: " + " ".join(unrecognized))
    missing = [name for name in required if name not in seen]
    if missing:
        problems.append("the following arguments are required: " + ", ".join(missing))
    return problems


def trtexec_problems(argv: list[str]) -> list[str]:
    """What trtexec 10.10 would refuse: options it does not have, and any argument that is not
    an option (it takes none)."""
    return [
        f"Unknown option: {token}"
        for token in argv
        if not token.startswith("--") or token.partition("=")[0] not in TRTEXEC_FLAGS
    ]


def refuse_like_the_real_tool(tool: str, argv: list[str]) -> None:
    """Exit as the real tool does when its command line is one it refuses."""
    if tool in ARGPARSE_TOOLS:
        flags, choices, required = ARGPARSE_TOOLS[tool]
        problems = argparse_problems(argv, flags, choices, required)
        if problems:
            print(f"usage: {tool} [-h] ...", file=sys.stderr)
            print(f"{tool}: error: {problems[0]}", file=sys.stderr)
            raise SystemExit(2)
    elif tool == "trtexec":
        problems = trtexec_problems(argv)
        if problems:
            for problem in problems:
                print(f"[E] {problem}", file=sys.stderr)
            raise SystemExit(1)


def _opt(argv: list[str], name: str) -> str:
    for i, arg in enumerate(argv):
        if arg == name:
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise SystemExit(f"stand-in: missing {name} in {argv}")


def main(tool: str) -> None:
    argv = sys.argv[1:]
    with open(os.environ["CALL_LOG"], "a", encoding="utf-8") as log:
        record = {
            "tool": tool,
            "argv": argv,
            "hf_token_in_env": "HF_TOKEN" in os.environ,
            "secrets_in_env": sorted(k for k in SECRET_NAMES if k in os.environ),
        }
        log.write(json.dumps(record) + "\n")
    refuse_like_the_real_tool(tool, argv)

    sleep = os.environ.get("FAKE_SLEEP", "")
    if sleep.startswith(tool + ":"):
        Path(os.environ["FAKE_PID_FILE"]).write_text(str(os.getpid()))
        time.sleep(float(sleep.split(":", 1)[1]))

    fail_arg = os.environ.get("FAKE_FAIL_ARG", "")
    if os.environ.get("FAKE_FAIL") == tool and any(fail_arg in a for a in argv):
        print(f"{tool}: starting", flush=True)
        for i in range(int(os.environ.get("FAKE_STDERR_LINES", "30"))):
            print(
                f"{tool} error line {i} " + os.environ.get("FAKE_STDERR_PAD", ""), file=sys.stderr
            )
        if os.environ.get("FAKE_LEAK"):
            print(f"auth header: Bearer {os.environ['FAKE_LEAK']}", file=sys.stderr)
        print(f"{tool}: fatal: simulated failure", file=sys.stderr)
        raise SystemExit(int(os.environ.get("FAKE_FAIL_CODE", "3")))
    if os.environ.get("FAKE_NO_OUTPUT") == tool:
        return

    if tool == "nvidia-smi":
        print(os.environ.get("FAKE_COMPUTE_CAP", "9.0"))
    elif tool in ("convert", "quantize"):
        out = Path(_opt(argv, "--output_dir"))
        out.mkdir(parents=True, exist_ok=True)
        tp = int(_opt(argv, "--tp_size"))
        (out / "config.json").write_text(json.dumps({"tp": tp, "tool": tool, "argv": argv}))
        for rank in range(tp):
            (out / f"rank{rank}.safetensors").write_bytes(f"weights {rank} {argv}".encode())
    elif tool == "trtllm-build":
        ckpt = Path(_opt(argv, "--checkpoint_dir"))
        tp = json.loads((ckpt / "config.json").read_text())["tp"]
        out = Path(_opt(argv, "--output_dir"))
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps({"built_from": str(ckpt), "argv": argv}))
        for rank in range(tp):
            (out / f"rank{rank}.engine").write_bytes(f"engine {rank} {argv}".encode() * 10)
    elif tool == "trtexec":
        onnx = Path(_opt(argv, "--onnx"))
        plan = Path(_opt(argv, "--saveEngine"))
        plan.write_bytes(b"plan for " + onnx.read_bytes())
    elif tool == "speaker-prompt":
        # --model-dir --variant --audio --transcript-file --out: a file naming its inputs.
        out = Path(_opt(argv, "--out"))
        out.parent.mkdir(parents=True, exist_ok=True)
        text = Path(_opt(argv, "--transcript-file")).read_text(encoding="utf-8")
        audio = Path(_opt(argv, "--audio")).read_bytes()
        out.write_text(json.dumps({"transcript": text, "audio_bytes": len(audio), "argv": argv}))
    elif tool == "aws":
        # aws s3 sync s3://bucket/prefix/ DEST --no-progress
        dest = Path(argv[3])
        (dest / "llm").mkdir(parents=True, exist_ok=True)
        (dest / "llm" / "config.json").write_text("{}")
        (dest / "flow.decoder.estimator.fp32.onnx").write_bytes(b"onnx")
        (dest / "campplus.onnx").write_bytes(b"onnx")
        (dest / "llm" / "tokenizer.json").write_text("{}")
        for name in ("cosyvoice2.yaml", "flow.pt", "hift.pt", "speech_tokenizer_v2.onnx"):
            (dest / name).write_bytes(b"stand-in")
    else:
        raise SystemExit(f"stand-in: unknown tool {tool}")
