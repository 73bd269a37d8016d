"""render/model_parameters.py: the one declaration of the parameters each model's
``config.pbtxt`` carries, and the keys the TensorRT-LLM backend cannot do without
(issue 19, items 3 and 8; serving audit B1)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.render import model_parameters as mp
from cosyvoice_operator.render import triton
from tests.unit.objects import service

REPO = Path(__file__).resolve().parents[3]
ENGINE_DIR = "/engines/0123456789abcdef0123456789abcdef01234567"
URIS = {
    "cosyvoice2": "hf://FunAudioLLM/CosyVoice2-0.5B",
    "cosyvoice3": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
}

# Specs unlike the golden files' and the examples': every GPU count, tensor parallelism,
# batch size, streaming or not, chunking and queue policy the CRD allows in some mix.
SECTIONS: list[dict[str, Any]] = [
    {
        "serving": {
            "gpusPerReplica": gpus,
            "instancesPerGpu": instances,
            "streaming": streaming,
            "dynamicBatching": {"preferredBatchSizes": [1, 2]},
            "streamChunking": {"firstChunkTokens": first, "hopGrowth": growth},
        },
        "engine": {"tensorParallelSize": tp, "maxBatchSize": batch},
    }
    for (gpus, tp), instances, streaming, batch, (first, growth) in itertools.product(
        [(1, 1), (2, 1), (2, 2), (4, 2), (8, 4), (8, 1)],
        [1, 3],
        [True, False],
        [2, 64],
        [(15, "exponential"), (25, "equal"), (10, "time-based")],
    )
]


def parsed(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def rendered(variant: str, sections: dict[str, Any]) -> dict[str, mc.ModelConfig]:
    svc = service(model={"variant": variant, "uri": URIS[variant]}, **sections)
    return {name: parsed(text) for name, text in triton.render_repository(svc, ENGINE_DIR).items()}


@pytest.mark.parametrize("sections", SECTIONS)
def test_every_key_the_trtllm_backend_reads_unguarded_is_rendered(sections: dict[str, Any]) -> None:
    config = rendered("cosyvoice2", sections)["tensorrt_llm"]
    assert config.backend == "tensorrtllm"
    for key in mp.TRTLLM_UNGUARDED_PARAMETERS:
        assert key in config.parameters, f"tensorrt_llm lacks {key}: the backend would throw"
    assert config.parameters["gpt_model_type"].string_value == "inflight_fused_batching"
    # Empty, not the template's "${...}": the backend skips guided decoding for both, and
    # an empty value is what a reader of the file expects to mean "off".
    for key in ("tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend"):
        assert config.parameters[key].string_value == ""


@pytest.mark.parametrize("variant", ["cosyvoice2", "cosyvoice3"])
@pytest.mark.parametrize("sections", SECTIONS)
def test_every_rendered_parameter_is_declared_and_every_always_key_rendered(
    variant: str, sections: dict[str, Any]
) -> None:
    configs = rendered(variant, sections)
    declared = mp.MODEL_PARAMETERS[variant]
    assert set(configs) == set(declared)
    for name, config in configs.items():
        keys = set(config.parameters)
        assert keys <= declared[name].keys, (name, keys - declared[name].keys)
        assert set(declared[name].always) <= keys, (name, set(declared[name].always) - keys)


def test_the_sometimes_keys_appear_when_the_spec_asks() -> None:
    hop = {"serving": {"streamChunking": {"firstChunkTokens": 25}}}
    assert "token_hop_len" in rendered("cosyvoice2", hop)["cosyvoice2"].parameters
    assert "token_hop_len" not in rendered("cosyvoice2", {})["cosyvoice2"].parameters
    cv3 = rendered("cosyvoice3", {})["cosyvoice3"].parameters
    assert {"llm_api_base", "llm_api_bases"} <= set(cv3)


def test_a_configuration_off_the_declaration_is_refused() -> None:
    declared = mp.MODEL_PARAMETERS["cosyvoice2"]["token2wav"]
    with pytest.raises(AssertionError, match="not declared"):
        declared.check("token2wav", declared.keys | {"llm_runtime"})
    with pytest.raises(AssertionError, match="were not rendered"):
        declared.check("token2wav", declared.keys - {"model_dir"})
    declared.check("token2wav", declared.keys)


def test_what_the_model_code_must_read() -> None:
    """The model code's half of the contract: every declared key but those Triton's own
    backends read (FORCE_CPU_ONLY_INPUT_TENSORS; the whole tensorrt_llm model)."""
    assert mp.read_by_model_code("cosyvoice2", "tensorrt_llm") == frozenset()
    for variant, models in mp.MODEL_PARAMETERS.items():
        for name, declared in models.items():
            if declared.reader != mp.MODEL_CODE:
                continue
            keys = mp.read_by_model_code(variant, name)
            assert "FORCE_CPU_ONLY_INPUT_TENSORS" not in keys
            assert "model_dir" in keys
    assert mp.read_by_model_code("cosyvoice3", "cosyvoice3") >= {
        "llm_api_base",
        "llm_api_bases",
        "token_hop_len",
        "dynamic_chunk_strategy",
    }


def test_the_docs_list_the_unguarded_keys_and_their_source() -> None:
    doc = (REPO / "docs" / "concepts" / "triton-repository.md").read_text()
    for key in mp.TRTLLM_UNGUARDED_PARAMETERS:
        assert f"`{key}`" in doc
    assert "model_instance_state.cc" in doc
