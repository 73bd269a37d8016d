"""End-to-end builds against stand-in tools: command order, manifest, digests, reuse."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from tests.engine_builder.conftest import KEY, TRT_VERSION, TRTLLM_VERSION, Builder

FLOW_PLAN_CV2 = f"flow.decoder.estimator.fp16.sm_90.trt{TRT_VERSION}.plan"
FLOW_PLAN_CV3 = f"flow.decoder.estimator.autocast_fp16.sm_90.trt{TRT_VERSION}.plan"
CAMPPLUS_PLAN = f"campplus.fp32.sm_90.trt{TRT_VERSION}.plan"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_build_runs_the_upstream_pipeline_in_order(builder: Builder) -> None:
    result = builder.build()
    assert result.code == 0, result.out
    work = builder.cache / ".work" / KEY
    model = builder.pvc_root / "models" / "cosyvoice2"
    calls = builder.calls()
    assert [c["tool"] for c in calls] == ["convert", "trtllm-build", "trtexec", "trtexec"]
    assert calls[0]["argv"] == [
        "--model_dir",
        str(model / "llm"),
        "--output_dir",
        str(work / "trt_weights"),
        "--dtype",
        "bfloat16",
        "--tp_size",
        "1",
    ]
    assert calls[1]["argv"] == [
        "--checkpoint_dir",
        str(work / "trt_weights"),
        "--output_dir",
        str(work / "trt_engines"),
        "--max_batch_size",
        "16",
        "--max_num_tokens",
        "32768",
        "--gemm_plugin",
        "bfloat16",
    ]
    assert calls[2]["argv"][:2] == [
        f"--onnx={model / 'flow.decoder.estimator.fp32.onnx'}",
        f"--saveEngine={work / 'plans' / FLOW_PLAN_CV2}",
    ]
    assert calls[3]["argv"][:2] == [
        f"--onnx={model / 'campplus.onnx'}",
        f"--saveEngine={work / 'plans' / CAMPPLUS_PLAN}",
    ]
    # Progress lines for kubectl logs, one family per step, with elapsed seconds.
    for i, name in enumerate(["fetch", "convert", "build", "plan-flow", "plan-campplus"], start=1):
        assert f"[step {i}/6] {name}: starting (" in result.out
        assert f"[step {i}/6] {name}: done (" in result.out
    assert f"[step 6/6] publish: published {builder.engine_dir} (" in result.out


def test_manifest_describes_the_engine_and_its_digests(builder: Builder) -> None:
    assert builder.build(revision="v1.2").code == 0
    manifest = builder.manifest()
    assert manifest["schemaVersion"] == 1
    assert manifest["key"] == KEY
    assert manifest["variant"] == "cosyvoice2"
    assert manifest["model"] == {
        "uri": "pvc://models/cosyvoice2",
        "revision": "v1.2",
        "companions": [],
    }
    assert manifest["precision"] == "bfloat16"
    assert manifest["tensorParallelSize"] == 1
    assert manifest["maxBatchSize"] == 16
    assert manifest["maxNumTokens"] == 32768
    assert manifest["gpuArch"] == "sm_90"
    assert manifest["versions"]["tensorrt"] == TRT_VERSION
    assert manifest["versions"]["tensorrtLlm"] == TRTLLM_VERSION
    assert manifest["versions"]["builder"]
    assert manifest["createdAt"].endswith("+00:00")
    assert manifest["layout"] == {
        "llmEngineDir": "llm",
        "modelDir": "model",
        "tokenizerDir": "model/llm",
        "flowEstimatorPlan": f"plans/{FLOW_PLAN_CV2}",
        "speakerEmbeddingPlan": f"plans/{CAMPPLUS_PLAN}",
    }
    paths = [f["path"] for f in manifest["files"]]
    assert paths == sorted(paths)
    assert {
        "llm/config.json",
        "llm/rank0.engine",
        f"plans/{FLOW_PLAN_CV2}",
        f"plans/{CAMPPLUS_PLAN}",
        "model/llm/config.json",
        "model/flow.pt",
        "model/campplus.onnx",
    } <= set(paths)
    # Hub bookkeeping is not model content.
    assert not any("/.cache/" in p or p.startswith("model/.") for p in paths)
    # Every file on disk is listed, and every digest and size is right.
    on_disk = {
        p.relative_to(builder.engine_dir).as_posix()
        for p in builder.engine_dir.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }
    assert on_disk == set(paths)
    for entry in manifest["files"]:
        path = builder.engine_dir / entry["path"]
        assert entry["sha256"] == _sha256(path)
        assert entry["size"] == path.stat().st_size


def test_success_is_atomic_and_cleans_up(builder: Builder) -> None:
    result = builder.build()
    assert result.code == 0
    assert not (builder.cache / f"{KEY}.partial").exists()
    assert not (builder.cache / ".work" / KEY).exists()
    # The pvc:// model is read in place and never touched.
    assert (builder.pvc_root / "models" / "cosyvoice2" / "llm" / "config.json").is_file()
    assert result.termination is not None
    assert result.termination["result"] == "ok"
    assert result.termination["key"] == KEY
    assert result.termination["engineDir"] == str(builder.engine_dir)
    assert isinstance(result.termination["seconds"], float | int)
    assert result.termination["alreadyBuilt"] is False
    assert "\n" not in (result.termination_raw or "").strip()


def test_a_crash_at_the_final_rename_leaves_no_engine_and_the_rerun_completes(
    builder: Builder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cosyvoice_engine_builder.manifest import write_manifest as real_write_manifest

    real_replace = os.replace
    seen_at_manifest: list[set[str]] = []

    def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
        # Every file the manifest lists is already in place, whole, when it is written.
        seen_at_manifest.append(
            {
                f["path"]
                for f in manifest["files"]
                if (directory / f["path"]).stat().st_size == f["size"]
            }
        )
        real_write_manifest(directory, manifest)

    def crash_on_publish(src: Any, dst: Any) -> None:
        if Path(dst) == builder.engine_dir:
            raise OSError("simulated power loss before the rename")
        real_replace(src, dst)

    monkeypatch.setattr("cosyvoice_engine_builder.publish.write_manifest", write_manifest)
    monkeypatch.setattr(os, "replace", crash_on_publish)
    crashed = builder.build()
    assert crashed.code == 1
    assert crashed.termination is not None and crashed.termination["step"] == "publish"
    assert not builder.engine_dir.exists()  # never a half-published engine
    assert (builder.cache / f"{KEY}.partial" / "manifest.json").is_file()
    (listed,) = seen_at_manifest
    assert {"llm/rank0.engine", "llm/config.json", "model/llm/config.json"} <= listed

    monkeypatch.setattr(os, "replace", real_replace)
    builder.reset_calls()
    resumed = builder.build()
    assert resumed.code == 0, resumed.out
    assert builder.calls() == []  # every step was done: only the publish is redone
    assert "discarding the leftover" in resumed.out
    assert not (builder.cache / f"{KEY}.partial").exists()
    assert builder.run(["verify", "--cache-dir", str(builder.cache), "--key", KEY]).code == 0


def test_a_verified_engine_is_not_built_again(builder: Builder) -> None:
    assert builder.build().code == 0
    builder.reset_calls()
    again = builder.build()
    assert again.code == 0
    assert "already built" in again.out
    assert builder.calls() == []
    assert again.termination is not None and again.termination["alreadyBuilt"] is True


@pytest.mark.parametrize("tp", [2, 4])
def test_tensor_parallel_builds_every_rank(builder: Builder, tp: int) -> None:
    assert builder.build(tensor_parallel_size=tp).code == 0
    calls = builder.calls()
    assert calls[0]["argv"][-2:] == ["--tp_size", str(tp)]
    paths = {f["path"] for f in builder.manifest()["files"]}
    assert {f"llm/rank{i}.engine" for i in range(tp)} <= paths
    assert builder.manifest()["tensorParallelSize"] == tp


def test_fp8_goes_through_quantize_and_builds_without_gemm_plugin(builder: Builder) -> None:
    assert builder.build(precision="fp8").code == 0
    calls = builder.calls()
    assert [c["tool"] for c in calls] == ["quantize", "trtllm-build", "trtexec", "trtexec"]
    assert calls[0]["argv"][6:8] == ["--qformat", "fp8"]
    assert calls[0]["argv"][8:10] == ["--kv_cache_dtype", "fp8"]
    assert "--gemm_plugin" not in calls[1]["argv"]


@pytest.mark.parametrize(
    ("precision", "dtype", "extra"),
    [
        ("float16", "float16", []),
        ("int8-weight-only", "bfloat16", ["--use_weight_only", "--weight_only_precision", "int8"]),
        ("int4-weight-only", "bfloat16", ["--use_weight_only", "--weight_only_precision", "int4"]),
    ],
)
def test_precisions_reach_the_converter_and_builder(
    builder: Builder, precision: str, dtype: str, extra: list[str]
) -> None:
    assert builder.build(precision=precision).code == 0
    convert, build = builder.calls()[:2]
    assert convert["tool"] == "convert"
    assert convert["argv"][4:6] == ["--dtype", dtype]
    assert convert["argv"][8:] == extra
    assert build["argv"][-2:] == ["--gemm_plugin", dtype]
    assert builder.manifest()["precision"] == precision


def test_cosyvoice3_prebuilds_the_autocast_estimator(builder: Builder) -> None:
    result = builder.build(variant="cosyvoice3", model_uri="pvc://models/cosyvoice3")
    assert result.code == 0, result.out
    flow = builder.calls()[2]
    model = builder.pvc_root / "models" / "cosyvoice3"
    assert flow["argv"][0] == f"--onnx={model / 'flow.decoder.estimator.autocast_fp16.onnx'}"
    assert "--stronglyTyped" in flow["argv"]
    assert builder.manifest()["layout"]["flowEstimatorPlan"] == f"plans/{FLOW_PLAN_CV3}"


def test_llm_checkpoint_at_the_model_root_is_accepted(builder: Builder) -> None:
    from tests.engine_builder.conftest import make_model

    make_model(builder.pvc_root / "models" / "flat", llm_subdir=False)
    assert builder.build(model_uri="pvc://models/flat").code == 0
    assert builder.calls()[0]["argv"][1] == str(builder.pvc_root / "models" / "flat")
    assert builder.manifest()["layout"]["tokenizerDir"] == "model"


def test_gpu_of_the_wrong_architecture_fails_permanently(builder: Builder) -> None:
    smi = {"NVIDIA_SMI": str(builder.tmp / "bin" / "nvidia-smi"), "FAKE_COMPUTE_CAP": "8.9"}
    result = builder.build(env_extra=smi)
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "preflight"
    assert "sm_89" in result.termination["message"]
    assert builder.tools_called() == ["nvidia-smi"]
    assert not builder.engine_dir.exists()

    ok = builder.build(env_extra={**smi, "FAKE_COMPUTE_CAP": "9.0"})
    assert ok.code == 0
    assert "sm_90 matches sm_90" in ok.out


def test_versions_are_probed_from_the_image_when_not_given(builder: Builder) -> None:
    site = builder.tmp / "site"
    (site / "tensorrt").mkdir(parents=True)
    (site / "tensorrt" / "__init__.py").write_text("__version__ = '10.99.0.1'\n")
    dist = site / "tensorrt_llm-0.21.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: 0.21.0\n")
    env = {k: v for k, v in builder.env.items() if k not in ("TENSORRT_VERSION", "TRTLLM_VERSION")}
    env["PYTHONPATH"] = str(site)
    result = builder.run(builder.args(), env=env)
    assert result.code == 0, result.out
    manifest = builder.manifest()
    assert manifest["versions"]["tensorrt"] == "10.99.0.1"
    assert manifest["versions"]["tensorrtLlm"] == "0.21.0"
    assert (
        manifest["layout"]["speakerEmbeddingPlan"] == "plans/campplus.fp32.sm_90.trt10.99.0.1.plan"
    )


def test_missing_tensorrt_is_a_clear_preflight_failure(builder: Builder) -> None:
    env = {k: v for k, v in builder.env.items() if k != "TENSORRT_VERSION"}
    env["PYTHONPATH"] = str(builder.tmp / "empty")
    result = builder.run(builder.args(), env=env)
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "preflight"
    assert "TensorRT version" in result.termination["message"]


@pytest.mark.parametrize(
    ("env_var", "precision"),
    [
        ("TRTLLM_BUILD", "bfloat16"),
        ("TRTEXEC", "bfloat16"),
        ("TRTLLM_QWEN_CONVERT", "bfloat16"),
        ("TRTLLM_QUANTIZE", "fp8"),
    ],
)
def test_a_missing_tool_fails_before_any_work_naming_its_env_var(
    builder: Builder, env_var: str, precision: str
) -> None:
    missing = str(builder.tmp / "nope" / "tool")
    result = builder.build(precision=precision, env_extra={env_var: missing})
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "preflight"
    assert env_var in result.termination["message"]
    assert missing in result.termination["message"]
    assert builder.calls() == []
    assert not (builder.cache / ".work").exists()
