"""The CPU twin's ``tensorrt_llm`` stand-in refuses to load what the TensorRT-LLM backend
refuses (``standins/trtllm_backend_params.py`` says from which source): the unguarded keys
absent, a batching type it does not know, guided decoding it cannot set up. The rendered
CosyVoice2 configurations (every golden case) are loaded."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.devtools.closedloop import cpu_twin
from cosyvoice_operator.render.model_parameters import TRTLLM_UNGUARDED_PARAMETERS

GOLDEN = Path(__file__).parents[1] / "render" / "golden" / "triton"


def backend_params() -> ModuleType:
    path = cpu_twin.STANDINS / "trtllm_backend_params.py"
    spec = importlib.util.spec_from_file_location("trtllm_backend_params", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parameters(path: Path) -> dict[str, str]:
    config = text_format.Parse(path.read_text(), mc.ModelConfig())
    return {key: value.string_value for key, value in config.parameters.items()}


def test_the_unguarded_keys_are_the_renderers() -> None:
    assert backend_params().UNGUARDED == TRTLLM_UNGUARDED_PARAMETERS


@pytest.mark.parametrize("case", sorted(p.name for p in GOLDEN.glob("cosyvoice2-*")))
def test_every_rendered_tensorrt_llm_config_is_taken(case: str) -> None:
    assert backend_params().config_problems(parameters(GOLDEN / case / "tensorrt_llm.pbtxt")) == []


@pytest.mark.parametrize("key", TRTLLM_UNGUARDED_PARAMETERS)
def test_an_absent_unguarded_key_is_refused(key: str) -> None:
    values = parameters(GOLDEN / "cosyvoice2-1gpu" / "tensorrt_llm.pbtxt")
    del values[key]
    assert backend_params().config_problems(values) == [f"Cannot find parameter with name: {key}"]


def test_a_batching_type_the_backend_does_not_know_is_refused() -> None:
    values = parameters(GOLDEN / "cosyvoice2-1gpu" / "tensorrt_llm.pbtxt")
    values["gpt_model_type"] = "inflight-fused-batching"
    [problem] = backend_params().config_problems(values)
    assert problem.startswith("Invalid gpt_model_type")


def test_guided_decoding_needs_xgrammar_and_its_tokenizer_info(tmp_path: Path) -> None:
    values = parameters(GOLDEN / "cosyvoice2-1gpu" / "tensorrt_llm.pbtxt")
    check = backend_params().config_problems
    # Placeholders and empty strings turn it off, as upstream's template leaves them.
    values |= {
        "guided_decoding_backend": "${guided_decoding_backend}",
        "xgrammar_tokenizer_info_path": "/absent.json",
    }
    assert check(values) == []
    values["guided_decoding_backend"] = "outlines"
    assert len(check(values)) == 2  # an absent info file and an unknown backend
    info = tmp_path / "info.json"
    info.write_text("{}")
    values |= {"guided_decoding_backend": "xgrammar", "xgrammar_tokenizer_info_path": str(info)}
    assert check(values) == []
