"""Crash and rerun: completed steps are skipped, the failed one and later ones rerun."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests.engine_builder.conftest import KEY, Builder


def test_crash_in_build_then_rerun_skips_convert(builder: Builder) -> None:
    crashed = builder.build(env_extra={"FAKE_FAIL": "trtllm-build"})
    assert crashed.code == 1
    assert builder.tools_called() == ["convert", "trtllm-build"]
    assert crashed.termination is not None
    assert crashed.termination["result"] == "failed"
    assert crashed.termination["step"] == "build"
    assert crashed.termination["key"] == KEY
    assert "trtllm-build: exited with code 3" in crashed.termination["message"]
    assert "trtllm-build: fatal: simulated failure" in crashed.termination["message"]
    # A failed build publishes nothing that could be taken for an engine.
    assert not builder.engine_dir.exists()
    assert builder.build(dry_run=True).code == 0  # (does not disturb anything)

    builder.reset_calls()
    resumed = builder.build()
    assert resumed.code == 0, resumed.out
    assert builder.tools_called() == ["trtllm-build", "trtexec", "trtexec"]
    assert "[step 2/6] convert: skipped" in resumed.out
    assert "[step 1/6] fetch: skipped" in resumed.out


def test_crash_in_the_last_plan_reruns_only_that_plan(builder: Builder) -> None:
    crashed = builder.build(env_extra={"FAKE_FAIL": "trtexec", "FAKE_FAIL_ARG": "campplus"})
    assert crashed.code == 1
    assert crashed.termination is not None and crashed.termination["step"] == "plan-campplus"
    assert builder.tools_called() == ["convert", "trtllm-build", "trtexec", "trtexec"]
    builder.reset_calls()
    resumed = builder.build()
    assert resumed.code == 0
    calls = builder.calls()
    assert [c["tool"] for c in calls] == ["trtexec"]
    assert "campplus.onnx" in calls[0]["argv"][0]
    assert "[step 4/6] plan-flow: skipped" in resumed.out


def test_crash_in_the_first_plan_keeps_the_llm_engine(builder: Builder) -> None:
    crashed = builder.build(env_extra={"FAKE_FAIL": "trtexec"})
    assert crashed.code == 1
    assert crashed.termination is not None and crashed.termination["step"] == "plan-flow"
    builder.reset_calls()
    assert builder.build().code == 0
    assert builder.tools_called() == ["trtexec", "trtexec"]


def test_a_killed_tool_mid_step_reruns_that_step_from_clean_outputs(builder: Builder) -> None:
    # Simulate a pod killed after convert wrote part of its output: no marker, junk left.
    work = builder.cache / ".work" / KEY
    assert builder.build(env_extra={"FAKE_FAIL": "trtllm-build"}).code == 1
    (work / "trt_engines").mkdir(parents=True, exist_ok=True)
    (work / "trt_engines" / "rank7.engine").write_text("stale rank from a crashed attempt")
    builder.reset_calls()
    assert builder.build().code == 0
    assert builder.tools_called()[0] == "trtllm-build"
    assert "llm/rank7.engine" not in {f["path"] for f in builder.manifest()["files"]}


def test_changed_parameters_rerun_the_affected_steps_only(builder: Builder) -> None:
    work = builder.cache / ".work" / KEY
    assert builder.build(env_extra={"FAKE_FAIL": "trtexec"}).code == 1
    builder.reset_calls()
    # Same key and work dir, a different batch size: convert is still valid, build is not.
    assert builder.build(max_batch_size=64).code == 0
    calls = builder.calls()
    assert [c["tool"] for c in calls] == ["trtllm-build", "trtexec", "trtexec"]
    assert calls[0]["argv"][calls[0]["argv"].index("--max_batch_size") + 1] == "64"
    assert not work.exists()


def test_outputs_deleted_behind_a_marker_are_rebuilt(builder: Builder) -> None:
    work = builder.cache / ".work" / KEY
    assert builder.build(env_extra={"FAKE_FAIL": "trtllm-build"}).code == 1
    marker = json.loads((work / "steps" / "convert.done").read_text())
    assert marker["step"] == "convert" and len(marker["digest"]) == 64
    shutil.rmtree(work / "trt_weights")
    builder.reset_calls()
    assert builder.build().code == 0
    assert builder.tools_called()[:2] == ["convert", "trtllm-build"]


def test_a_tool_that_succeeds_without_output_fails_its_step(builder: Builder) -> None:
    result = builder.build(env_extra={"FAKE_NO_OUTPUT": "convert"})
    assert result.code == 1
    assert result.termination is not None
    assert result.termination["step"] == "convert"
    assert "did not produce" in result.termination["message"]
    assert "trt_weights/config.json" in result.termination["message"]
    assert not (builder.cache / ".work" / KEY / "steps" / "convert.done").exists()


def test_leftover_partial_directory_is_discarded_not_trusted(builder: Builder) -> None:
    partial = builder.cache / f"{KEY}.partial"
    partial.mkdir(parents=True)
    (partial / "junk.engine").write_text("from a publish that crashed")
    (partial / "manifest.json").write_text("{}")
    result = builder.build()
    assert result.code == 0
    assert not partial.exists()
    assert "junk.engine" not in {f["path"] for f in builder.manifest()["files"]}


def test_an_invalid_engine_directory_is_replaced(builder: Builder) -> None:
    builder.engine_dir.mkdir(parents=True)
    (builder.engine_dir / "rank0.engine").write_text("no manifest: never done")
    result = builder.build()
    assert result.code == 0, result.out
    assert "moving the invalid" in result.out
    assert (builder.engine_dir / "manifest.json").is_file()
    assert not (builder.engine_dir / "rank0.engine").exists()


def test_a_truncated_output_behind_a_marker_is_rebuilt_not_published(builder: Builder) -> None:
    # A node crash can leave a marker whose file lost its tail (the tools never fsync).
    work = builder.cache / ".work" / KEY
    assert builder.build(env_extra={"FAKE_FAIL": "trtexec"}).code == 1
    engine = work / "trt_engines" / "rank0.engine"
    whole = engine.read_bytes()
    engine.write_bytes(whole[: len(whole) // 2])
    builder.reset_calls()
    resumed = builder.build()
    assert resumed.code == 0, resumed.out
    assert builder.tools_called() == ["trtllm-build", "trtexec", "trtexec"]
    assert "build: outputs changed since an earlier attempt" in resumed.out
    assert (builder.engine_dir / "llm" / "rank0.engine").read_bytes() == whole


def test_same_size_corruption_behind_a_marker_is_caught_by_its_digest(builder: Builder) -> None:
    work = builder.cache / ".work" / KEY
    assert builder.build(env_extra={"FAKE_FAIL": "trtexec", "FAKE_FAIL_ARG": "campplus"}).code == 1
    plan = next((work / "plans").glob("flow.*.plan"))
    whole = plan.read_bytes()
    plan.write_bytes(bytes(len(whole)))  # same size, other bytes
    builder.reset_calls()
    assert builder.build().code == 0
    assert builder.tools_called() == ["trtexec", "trtexec"]  # the flow plan is rebuilt too
    assert (builder.engine_dir / "plans" / plan.name).read_bytes() == whole


def test_markers_record_what_each_step_produced(builder: Builder) -> None:
    work = builder.cache / ".work" / KEY
    assert builder.build(env_extra={"FAKE_FAIL": "trtexec"}).code == 1
    marker = json.loads((work / "steps" / "build.done").read_text())
    outputs = {Path(o["path"]).name: o for o in marker["outputs"]}
    engine = work / "trt_engines" / "rank0.engine"
    assert outputs["rank0.engine"]["size"] == engine.stat().st_size
    assert outputs["rank0.engine"]["sha256"] == hashlib.sha256(engine.read_bytes()).hexdigest()
    fetch = json.loads((work / "steps" / "fetch.done").read_text())
    (model,) = fetch["outputs"]
    assert model["files"]["llm/config.json"] > 0  # a directory: every file's size


def test_a_work_dir_shared_by_two_architectures_never_reuses_the_engine(
    builder: Builder,
) -> None:
    shared = builder.tmp / "shared-work"
    crashed = builder.build(work_dir=shared, gpu_arch="sm_89", env_extra={"FAKE_FAIL": "trtexec"})
    assert crashed.code == 1
    builder.reset_calls()
    assert builder.build(work_dir=shared, gpu_arch="sm_90").code == 0
    # The converted checkpoint does not depend on the GPU; the engine does.
    assert builder.tools_called() == ["trtllm-build", "trtexec", "trtexec"]


def test_a_model_that_changed_since_the_fetch_reruns_what_was_made_from_it(
    builder: Builder,
) -> None:
    # Files of a pvc:// model changed between two attempts (or an hf:// default branch moved
    # and the fetch ran again): the converted checkpoint and the engine are stale.
    assert builder.build(env_extra={"FAKE_FAIL": "trtexec"}).code == 1
    weights = builder.pvc_root / "models" / "cosyvoice2" / "llm" / "model.safetensors"
    weights.write_text("llm weights, fine-tuned further")
    builder.reset_calls()
    resumed = builder.build()
    assert resumed.code == 0, resumed.out
    assert "fetch: outputs changed since an earlier attempt" in resumed.out
    assert builder.tools_called() == ["convert", "trtllm-build", "trtexec", "trtexec"]


def test_a_dangling_link_in_the_model_does_not_break_the_build(builder: Builder) -> None:
    model = builder.pvc_root / "models" / "cosyvoice2"
    (model / "notes.txt").symlink_to(model / "gone.txt")
    assert builder.build(env_extra={"FAKE_FAIL": "trtexec"}).code == 1
    builder.reset_calls()
    assert builder.build().code == 0
    assert builder.tools_called() == ["trtexec", "trtexec"]  # the link did not look changed
