"""Argument validation: keys and architectures become paths and names on a shared volume."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosyvoice_engine_builder.request import BuildRequest, InvalidRequest
from tests.engine_builder.conftest import KEY, Builder
from tests.precision_cases import PRECISION_ARCH_CASES


def _request(**overrides: object) -> BuildRequest:
    values: dict[str, object] = {
        "key": KEY,
        "cache_dir": Path("/engines"),
        "variant": "cosyvoice2",
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


def test_paths_derived_from_the_key() -> None:
    r = _request()
    assert r.engine_dir == Path(f"/engines/{KEY}")
    assert r.partial_dir == Path(f"/engines/{KEY}.partial")
    assert r.work_dir == Path(f"/engines/.work/{KEY}")
    assert r.lock_path == Path(f"/engines/.locks/{KEY}.lock")
    assert _request(work_dir=Path("/scratch")).work_dir == Path("/scratch")


@pytest.mark.parametrize("key", ["", "../x", "a/b", "a.partial", ".work", "-x", "k" * 129])
def test_unsafe_keys_are_rejected(key: str) -> None:
    with pytest.raises(InvalidRequest, match="--key"):
        _request(key=key)


@pytest.mark.parametrize("arch", ["90", "sm90", "sm_9", "SM_90", "sm_90/../x"])
def test_bad_gpu_arch_is_rejected(arch: str) -> None:
    with pytest.raises(InvalidRequest, match="--gpu-arch"):
        _request(gpu_arch=arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120"])
def test_real_gpu_archs_are_accepted(arch: str) -> None:
    assert _request(gpu_arch=arch).gpu_arch == arch


@pytest.mark.parametrize("field", ["tensor_parallel_size", "max_batch_size", "max_num_tokens"])
def test_limits_must_be_positive(field: str) -> None:
    with pytest.raises(InvalidRequest):
        _request(**{field: 0})


def test_cli_rejects_bad_input_with_exit_code_2(builder: Builder) -> None:
    for overrides in ({"key": "../etc"}, {"model_uri": "ftp://x/y"}, {"tensor_parallel_size": 0}):
        result = builder.build(**overrides)
        assert result.code == 2, overrides
        assert result.termination is not None and result.termination["step"] == "arguments"
    assert builder.calls() == []


@pytest.mark.parametrize(("precision", "arch", "ok"), PRECISION_ARCH_CASES)
def test_precision_must_run_on_the_architecture(precision: str, arch: str, ok: bool) -> None:
    if ok:
        assert _request(precision=precision, gpu_arch=arch).gpu_arch == arch
    else:
        with pytest.raises(InvalidRequest, match=f"--precision {precision} needs sm_"):
            _request(precision=precision, gpu_arch=arch)


def test_fp8_on_ampere_fails_before_any_work(builder: Builder) -> None:
    result = builder.build(precision="fp8", gpu_arch="sm_80")
    assert result.code == 2
    assert result.termination is not None
    assert "needs sm_89 or newer" in result.termination["message"]
    assert builder.calls() == []


@pytest.mark.parametrize("precision", ["int8-weight-only", "int4-weight-only"])
def test_weight_only_on_turing_fails_before_any_work(builder: Builder, precision: str) -> None:
    # A Tesla T4 (sm_75): the weight-only modes run with bfloat16 activations.
    result = builder.build(precision=precision, gpu_arch="sm_75")
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "arguments"
    assert f"--precision {precision} needs sm_80 or newer" in result.termination["message"]
    assert builder.calls() == []
    assert not (builder.cache / ".work").exists()
