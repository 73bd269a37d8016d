"""`--dry-run` prints the plan with the exact command lines, and touches nothing."""

from __future__ import annotations

from tests.engine_builder.conftest import KEY, TRT_VERSION, Builder


def test_dry_run_prints_every_step_and_writes_nothing(builder: Builder) -> None:
    result = builder.build(dry_run=True, precision="int4-weight-only", tensor_parallel_size=2)
    assert result.code == 0
    assert builder.calls() == []
    assert not builder.cache.exists()
    assert result.termination is None
    model = builder.pvc_root / "models" / "cosyvoice2"
    work = builder.cache / ".work" / KEY
    lines = result.out.splitlines()
    steps = [line for line in lines if line.startswith("[step ")]
    assert [s.split(":")[0] for s in steps] == [
        "[step 1/6] fetch",
        "[step 2/6] convert",
        "[step 3/6] build",
        "[step 4/6] plan-flow",
        "[step 5/6] plan-campplus",
        "[step 6/6] publish",
    ]
    env = builder.env
    assert steps[1] == (
        f"[step 2/6] convert: {env['TRTLLM_PYTHON']} {env['TRTLLM_QWEN_CONVERT']} "
        f"--model_dir {model / 'llm'} --output_dir {work / 'trt_weights'} --dtype bfloat16 "
        "--tp_size 2 --use_weight_only --weight_only_precision int4"
    )
    assert steps[2] == (
        f"[step 3/6] build: {env['TRTLLM_BUILD']} --checkpoint_dir {work / 'trt_weights'} "
        f"--output_dir {work / 'trt_engines'} --max_batch_size 16 --max_num_tokens 32768 "
        "--gemm_plugin bfloat16"
    )
    assert f"flow.decoder.estimator.fp16.sm_90.trt{TRT_VERSION}.plan" in steps[3]
    assert f"campplus.fp32.sm_90.trt{TRT_VERSION}.plan" in steps[4]
    assert f"TensorRT {TRT_VERSION}" in result.out


def test_dry_run_after_a_crash_shows_what_would_be_skipped(builder: Builder) -> None:
    assert builder.build(env_extra={"FAKE_FAIL": "trtllm-build"}).code == 1
    builder.reset_calls()
    result = builder.build(dry_run=True)
    assert result.code == 0
    assert builder.calls() == []
    skipped = [line.split(":")[0] for line in result.out.splitlines() if "would skip" in line]
    assert skipped == ["[step 1/6] fetch", "[step 2/6] convert"]


def test_dry_run_for_an_hf_model_not_yet_fetched(builder: Builder) -> None:
    result = builder.build(dry_run=True, model_uri="hf://yuekai/cosyvoice2_llm", revision="r1")
    assert result.code == 0
    assert "snapshot_download(repo_id='yuekai/cosyvoice2_llm', revision='r1'" in result.out
    assert "does not exist yet" in result.out


def test_dry_run_reports_an_existing_engine(builder: Builder) -> None:
    assert builder.build().code == 0
    result = builder.build(dry_run=True)
    assert "already built" in result.out


def test_dry_run_warns_about_a_missing_tool(builder: Builder) -> None:
    result = builder.build(dry_run=True, env_extra={"TRTEXEC": "/nowhere/trtexec"})
    assert result.code == 0
    assert "warning: /nowhere/trtexec not found or not executable (set TRTEXEC" in result.out
