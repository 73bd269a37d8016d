"""A model missing what the build needs fails early, naming the missing file."""

from __future__ import annotations

import pytest

from tests.engine_builder.conftest import Builder, make_model


def _model(builder: Builder, name: str, variant: str, omit: list[str]) -> str:
    make_model(builder.pvc_root / "models" / name, variant, omit=omit)
    return f"pvc://models/{name}"


def test_missing_llm_config_names_the_expected_file(builder: Builder) -> None:
    uri = _model(builder, "noconfig", "cosyvoice2", ["llm/config.json"])
    result = builder.build(model_uri=uri)
    assert result.code == 2
    assert result.termination is not None
    assert result.termination["step"] == "fetch"
    expected = builder.pvc_root / "models" / "noconfig" / "llm" / "config.json"
    assert str(expected) in result.termination["message"]
    assert builder.calls() == []


@pytest.mark.parametrize(
    ("variant", "missing"),
    [
        ("cosyvoice2", "flow.decoder.estimator.fp32.onnx"),
        ("cosyvoice3", "flow.decoder.estimator.autocast_fp16.onnx"),
        ("cosyvoice2", "campplus.onnx"),
        ("cosyvoice3", "campplus.onnx"),
    ],
)
def test_missing_onnx_names_the_file(builder: Builder, variant: str, missing: str) -> None:
    uri = _model(builder, f"no-{variant}", variant, [missing])
    result = builder.build(model_uri=uri, variant=variant)
    assert result.code == 2
    assert result.termination is not None
    assert missing in result.termination["message"]
    assert variant in result.termination["message"]
    # Fails before spending time on the LLM engine.
    assert builder.calls() == []


def test_cosyvoice3_build_on_a_cosyvoice2_model_names_the_cv3_export(builder: Builder) -> None:
    result = builder.build(variant="cosyvoice3")  # the default model is a cosyvoice2 one
    assert result.code == 2
    assert result.termination is not None
    assert "flow.decoder.estimator.autocast_fp16.onnx" in result.termination["message"]


def test_invalid_llm_config_json(builder: Builder) -> None:
    uri = _model(builder, "badjson", "cosyvoice2", [])
    (builder.pvc_root / "models" / "badjson" / "llm" / "config.json").write_text("{oops")
    result = builder.build(model_uri=uri)
    assert result.code == 2
    assert result.termination is not None
    assert "config.json is not valid JSON" in result.termination["message"]
