"""Our CosyVoice3 ``token2wav`` (flow) and ``vocoder`` (causal HiFT) code, with the two networks
replaced by the narrowest stand-ins (``cv3_fakes``): upstream's ``CausalMaskedDiffWithDiT``
and ``CausalHiFTGenerator`` are on no PyPI package (README, "The PyPI packages against the
pinned commit"), so what runs here is our code around them, in-process under Debian's torch
(``cosyvoice3_check.py``): the yaml entries built, the flow's call, the excitation tables the
same in every vocoder instance, a stream's audio whichever instances serve its chunks, and
both ``model.py`` files (inputs, outputs, errors, the device Triton assigns); and both models
in the CosyVoice3 twin's tritonserver behind our orchestrator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from twins import CosyVoice3Twin, debian_python, require_library, stream

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    require_library()
    work = tmp_path_factory.mktemp("cosyvoice3_audio")
    out = debian_python(str(HERE / "cosyvoice3_check.py"), str(work))
    parsed: dict[str, Any] = json.loads(out.splitlines()[-1])
    return parsed


def test_each_model_builds_only_its_network(result: dict[str, Any]) -> None:
    """The yaml's LLM names a module that does not exist: the whole file cannot be built, the
    flow's and the vocoder's entries alone can."""
    assert result["whole_yaml_refused"] == (
        "ImportError: There is no such class as cosyvoice.llm.llm_missing_here.CosyVoice3LM"
    )
    assert result["flow"]["attributes"] == ["device", "flow", "torch"]
    assert result["vocoder"]["checkpoint_loaded"]


def test_the_flow_is_called_as_upstreams_library_calls_it(result: dict[str, Any]) -> None:
    flow = result["flow"]
    assert flow["offline_call"] == {"streaming": False, "finalize": True}
    call = flow["chunk_call"]
    assert (call["streaming"], call["finalize"]) == (True, False)
    assert call["lengths"] == [23, 20, 40]
    assert call["feat"] == [[1, 40, 80], "torch.float32"]  # float16 in, float32 to the flow
    assert call["embedding"] == [[1, 192], "torch.float32"]
    assert call["prompt_token_dtype"] == "torch.int32"
    assert call["device"] == "cpu"
    # 90 tokens -> 180 mel frames; the chunk from token 10 of 23 (3 of look-ahead) -> 20
    assert flow["offline_shape"] == [80, 180]
    assert flow["chunk_shape"] == [80, 20]
    assert flow["chunk_equals_offline_frames"]


def test_every_vocoder_instance_draws_the_same_excitation(result: dict[str, Any]) -> None:
    vocoder = result["vocoder"]
    assert vocoder["unseeded_tables_differ"]  # the hazard: built alone, each draws its own
    assert vocoder["same_tables"]  # ours: whatever the process's generator had done before
    assert vocoder["process_generator_untouched"]


def test_a_stream_is_the_same_whichever_instances_serve_its_chunks(
    result: dict[str, Any],
) -> None:
    """90 tokens, first hop 15, exponential: chunks of 15 and 25, the rest finalized; chunk i
    on instance i % 2 of both models, as our orchestrator streams: identical to one instance
    and to the offline synthesis. With the other vocoder's tables drawn on its own, not."""
    stream = result["stream"]
    assert stream["chunks"] == 3
    assert stream["samples"] == stream["offline_samples"] == 90 * 2 * 480
    assert stream["stream_mel_equals_offline_mel"]
    assert stream["alternating_vs_single"] == 0.0
    assert stream["alternating_vs_offline"] == 0.0
    assert stream["own_tables_vs_single"] > 0.01
    assert stream["peak"] > 0


def test_the_model_files_serve_and_take_the_device_triton_assigns(result: dict[str, Any]) -> None:
    models = result["models"]
    assert models["variant"] == "cosyvoice3"
    assert models["mel_shape"] == [1, 80, 20]
    assert models["mel_equals_engine"]
    assert models["refused_without_prompt"]
    assert models["speech_shape"] == [1, 20 * 480]
    assert models["bad_mel_refused"]
    assert models["gpu_devices"] == ["cuda:3", "flow cuda:3", "cuda:3", "hift cuda:3"]
    assert models["gpu_without_cuda_refused"] == [True, True]


def test_in_tritonserver_our_two_models_serve_streams_on_their_devices(
    cosyvoice3_twin: CosyVoice3Twin,
) -> None:
    """The CosyVoice3 twin runs our ``token2wav`` and ``vocoder`` (on the fake networks) behind
    our orchestrator: two concurrent streams complete with the chunk schedule the orchestrator
    reads (each chunk's audio: its tokens' mel frames, 480 samples each, less the vocoder's 4
    look-ahead frames until the last), and every instance of both recorded the device Triton
    gave it (the twin's one transform makes the rendered KIND_GPU groups KIND_CPU)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from cosyvoice_serving_models.chunking import Chunking

    config = text_format.Parse(
        (cosyvoice3_twin.repo / "cosyvoice3" / "config.pbtxt").read_text(), mc.ModelConfig()
    )
    hop = (
        config.parameters["token_hop_len"].string_value
        if "token_hop_len" in config.parameters
        else "15"
    )
    targets = ["The first of two streams.", "And the second one, a little longer than that."]
    for chunks in stream(cosyvoice3_twin.server, targets, "cosyvoice3").values():
        sizes = [len(c) for c in chunks]
        tokens = sum(sizes) // 960
        assert sum(sizes) == tokens * 960, sizes
        schedule = Chunking(first=int(hop)).schedule(tokens)
        assert len(sizes) == len(schedule), (sizes, schedule)
        assert sizes[0] == (2 * int(hop) - 4) * 480, sizes
    entries = [
        json.loads(p.read_text()) for p in sorted(cosyvoice3_twin.device_records.glob("*.json"))
    ]
    for model in ("token2wav", "vocoder"):
        text = (cosyvoice3_twin.repo / model / "config.pbtxt").read_text()
        count = sum(g.count for g in text_format.Parse(text, mc.ModelConfig()).instance_group)
        instances = [e for e in entries if e["instance"].startswith(model)]
        assert len(instances) == count, (model, entries)  # as the twin's config has them
        assert len({e["pid"] for e in instances}) == count
        for entry in instances:
            assert entry["kind"] == "CPU" and entry["device"] == "cpu", entry
