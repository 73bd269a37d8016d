"""triton.render_repository: the model repository of a service, checked against Triton's schema.

Every rendered ``config.pbtxt`` is parsed with Triton's own ``ModelConfig`` message
(``tritonclient.grpc.model_config_pb2``) by protobuf's text format, which rejects any field
Triton does not know. The golden files show any change of what the operator would write as a
readable diff; regenerate them with ``UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit``
(each test that rewrites a file fails; rerun without it: ``tests/unit/golden.py``).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_engine_builder import layout as builder_layout
from cosyvoice_operator.api import spec
from cosyvoice_operator.render import triton
from cosyvoice_operator.render.model_parameters import TRTLLM_UNGUARDED_PARAMETERS
from tests.unit import golden
from tests.unit.objects import service

GOLDEN = Path(__file__).parent / "golden" / "triton"
ENGINE_DIR = "/engines/0123456789abcdef0123456789abcdef01234567"
VARIANTS = ("cosyvoice2", "cosyvoice3")
URIS = {
    "cosyvoice2": "hf://FunAudioLLM/CosyVoice2-0.5B",
    "cosyvoice3": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
}
# Models that run on a GPU (every one but the orchestrator and, in CosyVoice2, the LLM,
# which the TensorRT-LLM backend places itself).
GPU_MODELS = {
    "cosyvoice2": ("token2wav", "audio_tokenizer", "speaker_embedding"),
    "cosyvoice3": ("token2wav", "vocoder", "audio_tokenizer", "speaker_embedding"),
}
GOLDEN_CASES: dict[str, dict[str, Any]] = {
    "1gpu": {},
    "4gpu-tp2-x2": {
        "serving": {"gpusPerReplica": 4, "instancesPerGpu": 2},
        "engine": {"tensorParallelSize": 2},
    },
    "offline": {"serving": {"streaming": False}},
    "speaker": {
        "speakers": {"default": {"audioUri": "pvc://voices/narrator.wav", "transcript": "Hi."}}
    },
}


def svc_of(variant: str, **sections: Any) -> spec.ServiceSpec:
    model = {"variant": variant, "uri": URIS[variant]}
    return service(model=model, **sections)


def parse(text: str) -> Any:
    """Triton's own schema: an unknown field or a wrong type raises ParseError."""
    return text_format.Parse(text, mc.ModelConfig())


def rendered(svc: spec.ServiceSpec) -> dict[str, Any]:
    return {name: parse(text) for name, text in triton.render_repository(svc, ENGINE_DIR).items()}


def params(config: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


# ---- golden files ------------------------------------------------------------------------


@pytest.mark.parametrize(("variant", "case"), list(itertools.product(VARIANTS, GOLDEN_CASES)))
def test_golden(variant: str, case: str) -> None:
    repository = triton.render_repository(svc_of(variant, **GOLDEN_CASES[case]), ENGINE_DIR)
    folder = GOLDEN / f"{variant}-{case}"
    golden.sync_folder(folder, repository, ".pbtxt")
    assert folder.is_dir(), f"{folder} missing: run with UPDATE_GOLDEN=1 to create it"
    assert sorted(p.stem for p in folder.glob("*.pbtxt")) == sorted(repository)
    for name, text in repository.items():
        assert text == (folder / f"{name}.pbtxt").read_text(), (
            f"{variant}-{case}/{name}.pbtxt differs from the golden file (UPDATE_GOLDEN=1)"
        )


# ---- Triton's schema ---------------------------------------------------------------------

SHAPES = [
    (gpus, tp, per_gpu)
    for gpus, tp, per_gpu in itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 3))
    if gpus % tp == 0
]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("streaming", [True, False])
@pytest.mark.parametrize(("gpus", "tp", "per_gpu"), SHAPES)
def test_every_config_parses_with_tritons_schema(
    variant: str, streaming: bool, gpus: int, tp: int, per_gpu: int
) -> None:
    svc = svc_of(
        variant,
        serving={"gpusPerReplica": gpus, "instancesPerGpu": per_gpu, "streaming": streaming},
        engine={"tensorParallelSize": tp},
    )
    for name, text in triton.render_repository(svc, ENGINE_DIR).items():
        config = parse(text)
        assert config.name == name
        # Round trip: nothing was dropped or misread on the way.
        assert parse(text_format.MessageToString(config)) == config


def test_the_schema_check_rejects_an_unknown_field() -> None:
    text = triton.render_repository(svc_of("cosyvoice3"), ENGINE_DIR)["token2wav"]
    parse(text)
    with pytest.raises(text_format.ParseError):
        parse(text + "instance_groups [ { count: 1 } ]\n")
    with pytest.raises(text_format.ParseError):
        parse(text.replace("max_queue_delay_microseconds", "max_queue_delay_us"))


# ---- names -------------------------------------------------------------------------------


def test_model_names_follow_upstream() -> None:
    assert triton.MODEL_NAMES == {
        "cosyvoice2": (
            "cosyvoice2",
            "tensorrt_llm",
            "token2wav",
            "audio_tokenizer",
            "speaker_embedding",
        ),
        "cosyvoice3": (
            "cosyvoice3",
            "token2wav",
            "vocoder",
            "audio_tokenizer",
            "speaker_embedding",
        ),
    }
    assert triton.orchestrator("cosyvoice2") == "cosyvoice2"
    assert triton.orchestrator("cosyvoice3") == "cosyvoice3"
    with pytest.raises(ValueError, match="unknown variant"):
        triton.orchestrator("cosyvoice1")


@pytest.mark.parametrize("variant", VARIANTS)
def test_repository_has_every_model_in_order(variant: str) -> None:
    configs = rendered(svc_of(variant))
    assert tuple(configs) == triton.MODEL_NAMES[variant]
    backends = {name: c.backend for name, c in configs.items()}
    expected = {name: "python" for name in triton.MODEL_NAMES[variant]}
    if variant == "cosyvoice2":
        expected["tensorrt_llm"] = "tensorrtllm"
    assert backends == expected


def test_interfaces_follow_upstream() -> None:
    cv2, cv3 = rendered(svc_of("cosyvoice2")), rendered(svc_of("cosyvoice3"))

    def io(config: Any) -> tuple[list[tuple[str, int, list[int], bool]], list[str]]:
        inputs = [(t.name, t.data_type, list(t.dims), t.optional) for t in config.input]
        return inputs, [t.name for t in config.output]

    assert (
        io(cv2["cosyvoice2"])
        == io(cv3["cosyvoice3"])
        == (
            [
                ("reference_wav", mc.TYPE_FP32, [-1], True),
                ("reference_wav_len", mc.TYPE_INT32, [1], True),
                ("reference_text", mc.TYPE_STRING, [1], True),
                ("target_text", mc.TYPE_STRING, [1], False),
            ],
            ["waveform"],
        )
    )
    # CosyVoice2's token2wav also carries the vocoder state between chunks (serving-models/).
    assert [t.name for t in cv2["token2wav"].output] == [
        "waveform",
        "hift_next_mel",
        "hift_next_source",
        "hift_next_speech",
    ]
    assert [(t.name, list(t.dims)) for t in cv3["token2wav"].output] == [("mel", [80, -1])]
    assert io(cv3["vocoder"]) == (
        [("mel", mc.TYPE_FP32, [80, -1], False), ("finalize", mc.TYPE_BOOL, [1], False)],
        ["tts_speech"],
    )
    assert [t.name for t in cv2["speaker_embedding"].output] == ["prompt_spk_embedding"]
    assert cv2["speaker_embedding"].output[0].data_type == mc.TYPE_FP16
    llm = cv2["tensorrt_llm"]
    required = [t.name for t in llm.input if not t.optional]
    assert required == ["input_lengths", "request_output_len"]
    # What upstream's orchestrator sends and asks for.
    sent = {
        "input_ids",
        "input_lengths",
        "request_output_len",
        "end_id",
        "pad_id",
        "streaming",
        "runtime_top_p",
        "runtime_top_k",
        "temperature",
        "repetition_penalty",
        "random_seed",
    }
    assert sent <= {t.name for t in llm.input}
    assert {"output_ids", "sequence_length"} <= {t.name for t in llm.output}


# ---- instance groups ---------------------------------------------------------------------


@pytest.mark.parametrize(("gpus", "tp", "per_gpu"), SHAPES)
def test_instance_groups(gpus: int, tp: int, per_gpu: int) -> None:
    for variant in VARIANTS:
        svc = svc_of(
            variant,
            serving={"gpusPerReplica": gpus, "instancesPerGpu": per_gpu},
            engine={"tensorParallelSize": tp},
        )
        configs = rendered(svc)
        for name in GPU_MODELS[variant]:
            (group,) = configs[name].instance_group
            assert group.kind == mc.ModelInstanceGroup.KIND_GPU, name
            assert group.count == per_gpu, name
            assert list(group.gpus) == list(range(gpus)), name
        (bls,) = configs[triton.orchestrator(variant)].instance_group
        assert bls.kind == mc.ModelInstanceGroup.KIND_CPU
        assert not bls.gpus
        slots = svc.engine.max_batch_size * (gpus // tp)  # CosyVoice2: one per LLM sequence
        upstream = {"cosyvoice2": 4, "cosyvoice3": 10}[variant] * gpus
        assert bls.count == (max(upstream, slots) if variant == "cosyvoice2" else upstream)
        assert bls.count == triton.orchestrator_instances(svc)
        if variant == "cosyvoice2":
            (llm,) = configs["tensorrt_llm"].instance_group
            assert (llm.kind, llm.count) == (mc.ModelInstanceGroup.KIND_CPU, gpus // tp)
            entries = params(configs["tensorrt_llm"])["gpu_device_ids"].split(";")
            assert len(entries) == llm.count  # the backend wants one entry per instance


@pytest.mark.parametrize(
    ("gpus", "tp", "groups", "device_ids"),
    [
        (1, 1, [[0]], "0"),
        (2, 1, [[0], [1]], "0;1"),
        (2, 2, [[0, 1]], "0,1"),
        (4, 2, [[0, 1], [2, 3]], "0,1;2,3"),
        (4, 4, [[0, 1, 2, 3]], "0,1,2,3"),
        (8, 2, [[0, 1], [2, 3], [4, 5], [6, 7]], "0,1;2,3;4,5;6,7"),
        (8, 4, [[0, 1, 2, 3], [4, 5, 6, 7]], "0,1,2,3;4,5,6,7"),
    ],
)
def test_tensor_parallel_groups(
    gpus: int, tp: int, groups: list[list[int]], device_ids: str
) -> None:
    svc = svc_of("cosyvoice2", serving={"gpusPerReplica": gpus}, engine={"tensorParallelSize": tp})
    assert triton.llm_groups(svc) == groups
    assert triton.gpu_device_ids(svc) == device_ids
    assert params(rendered(svc)["tensorrt_llm"])["gpu_device_ids"] == device_ids


def test_server_environment_selects_the_trtllm_orchestrator_mode() -> None:
    """Leader mode (no TRTLLM_ORCHESTRATOR) for one LLM group, as upstream's run.sh; the
    orchestrator mode, processes spawned, for several (issue 19, item 8). NO_PROXY always."""
    no_proxy = {"NO_PROXY": triton.NO_PROXY_HOSTS, "no_proxy": triton.NO_PROXY_HOSTS}
    assert triton.server_environment(svc_of("cosyvoice2")) == no_proxy
    two_groups = svc_of("cosyvoice2", serving={"gpusPerReplica": 2})
    assert triton.server_environment(two_groups) == {
        **no_proxy,
        "TRTLLM_ORCHESTRATOR": "1",
        "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1",
    }
    # One group of two GPUs (tensor parallel): its ranks are spawned, orchestrator mode too.
    tp2 = svc_of("cosyvoice2", serving={"gpusPerReplica": 2}, engine={"tensorParallelSize": 2})
    assert triton.server_environment(tp2)["TRTLLM_ORCHESTRATOR"] == "1"
    cv3 = svc_of("cosyvoice3", serving={"gpusPerReplica": 2})
    assert triton.server_environment(cv3) == no_proxy
    for host in ("localhost", "127.0.0.1"):
        assert host in triton.NO_PROXY_HOSTS.split(",")


# ---- the trtllm-serve side of CosyVoice3 ---------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "tp", "ports"),
    [(1, 1, [8010]), (2, 1, [8010, 8011]), (4, 2, [8010, 8011]), (8, 1, list(range(8010, 8018)))],
)
def test_llm_ports_and_urls(gpus: int, tp: int, ports: list[int]) -> None:
    sections: dict[str, Any] = {
        "serving": {"gpusPerReplica": gpus},
        "engine": {"tensorParallelSize": tp},
    }
    assert triton.LLM_BASE_PORT == 8010
    assert triton.llm_ports(svc_of("cosyvoice2", **sections)) == []
    cv3 = svc_of("cosyvoice3", **sections)
    assert triton.llm_ports(cv3) == ports
    urls = [f"http://127.0.0.1:{p}/v1/chat/completions" for p in ports]
    assert triton.llm_urls(cv3) == urls
    p = params(rendered(cv3)["cosyvoice3"])
    assert p["llm_api_base"] == urls[0]  # upstream's key: the first group
    assert p["llm_api_bases"].split(",") == urls
    # The name each trtllm-serve answers under: its engine directory's basename.
    assert p["llm_model_name"] == triton.ENGINE_LLM_DIR == "llm"
    cv2 = params(rendered(svc_of("cosyvoice2", **sections))["cosyvoice2"])
    assert "llm_api_base" not in cv2 and "llm_model_name" not in cv2


# ---- batching ----------------------------------------------------------------------------


def test_batching_follows_the_spec_capped_per_model() -> None:
    sections: dict[str, Any] = {
        "engine": {"maxBatchSize": 8},
        "serving": {
            "dynamicBatching": {
                "preferredBatchSizes": [2, 4, 8],
                "maxQueueDelayMicroseconds": 1500,
                "priorityLevels": 5,
            }
        },
    }
    for variant in VARIANTS:
        configs = rendered(svc_of(variant, **sections))
        for name, config in configs.items():
            batching = config.dynamic_batching
            assert batching.max_queue_delay_microseconds == 1500, name
            assert max(batching.preferred_batch_size) <= config.max_batch_size, name
            if name == triton.orchestrator(variant):
                assert config.max_batch_size == 1
                assert list(batching.preferred_batch_size) == [1]
            else:
                assert config.max_batch_size == 8, name  # the engine's, as the CRD says
                assert list(batching.preferred_batch_size) == [2, 4, 8], name
            # Priorities only where upstream's caller sends them: CosyVoice3's token2wav.
            if (variant, name) == ("cosyvoice3", "token2wav"):
                assert (batching.priority_levels, batching.default_priority_level) == (5, 5)
            else:
                assert batching.priority_levels == 0, name


def test_priorities_off() -> None:
    svc = svc_of("cosyvoice3", serving={"dynamicBatching": {"priorityLevels": 0}})
    batching = rendered(svc)["token2wav"].dynamic_batching
    assert (batching.priority_levels, batching.default_priority_level) == (0, 0)


def test_empty_preferred_sizes_leave_the_batcher_free() -> None:
    svc = svc_of("cosyvoice2", serving={"dynamicBatching": {"preferredBatchSizes": []}})
    for name, config in rendered(svc).items():
        assert list(config.dynamic_batching.preferred_batch_size) == [], name
        assert config.HasField("dynamic_batching"), name


def test_llm_kv_cache_holds_a_window_per_batch_slot() -> None:
    svc = svc_of("cosyvoice2", engine={"maxBatchSize": 32}, serving={"dynamicBatching": {}})
    p = params(rendered(svc)["tensorrt_llm"])
    assert p["max_attention_window_size"] == "2560"
    assert p["max_tokens_in_paged_kv_cache"] == str(32 * 2560)


# ---- streaming ---------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [True, False])
def test_decoupled_follows_streaming(streaming: bool) -> None:
    decoupled_models = {"cosyvoice2": {"cosyvoice2", "tensorrt_llm"}, "cosyvoice3": {"cosyvoice3"}}
    for variant in VARIANTS:
        svc = svc_of(variant, serving={"streaming": streaming})
        configs = rendered(svc)
        for name, config in configs.items():
            if name in decoupled_models[variant]:
                assert config.HasField("model_transaction_policy"), name
                assert config.model_transaction_policy.decoupled is streaming, name
                text = triton.render_repository(svc, ENGINE_DIR)[name]
                assert f"decoupled: {str(streaming).lower()}" in text  # written out either way
            else:
                assert not config.HasField("model_transaction_policy"), name


# ---- memory and paths --------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_python_models_take_inputs_in_host_memory(variant: str) -> None:
    for name, config in rendered(svc_of(variant, serving={"gpusPerReplica": 2})).items():
        if config.backend == "python":
            assert params(config)["FORCE_CPU_ONLY_INPUT_TENSORS"] == "yes", name
        else:  # the C++ TensorRT-LLM backend does not read the key
            assert "FORCE_CPU_ONLY_INPUT_TENSORS" not in params(config), name


@pytest.mark.parametrize("variant", VARIANTS)
def test_paths_point_inside_the_engine_directory(variant: str) -> None:
    configs = rendered(svc_of(variant))
    for name, config in configs.items():
        for key, value in params(config).items():
            if key in TRTLLM_UNGUARDED_PARAMETERS and key != "gpt_model_type":
                assert value == "", (name, key, value)  # guided decoding off
            elif key == "model_dir":
                # The view the serving entrypoint assembles over the engine's model/ files.
                assert value == triton.MODEL_VIEW, (name, value)
            elif key.endswith(("_dir", "_path", "_manifest")) and key != "executor_worker_path":
                assert value.startswith(ENGINE_DIR + "/"), (name, key, value)
    bls = params(configs[triton.orchestrator(variant)])
    assert bls["model_dir"] == triton.MODEL_VIEW
    assert bls["llm_tokenizer_dir"] == f"{ENGINE_DIR}/model/llm"
    for name in ("token2wav", "speaker_embedding"):  # the models that load TensorRT plans
        assert params(configs[name])["plans_dir"] == f"{ENGINE_DIR}/plans"
        assert params(configs[name])["engine_manifest"] == f"{ENGINE_DIR}/manifest.json"
    if variant == "cosyvoice2":
        assert params(configs["tensorrt_llm"])["gpt_model_path"] == f"{ENGINE_DIR}/llm"


def test_engine_dir_is_normalised_and_must_be_absolute() -> None:
    svc = svc_of("cosyvoice3")
    assert triton.render_repository(svc, ENGINE_DIR + "/") == triton.render_repository(
        svc, ENGINE_DIR
    )
    with pytest.raises(ValueError, match="absolute"):
        triton.render_repository(svc, "engines/key")
    with pytest.raises(ValueError, match="unprintable"):
        triton.render_repository(svc, "/engines/a\nb")


def test_engine_layout_matches_the_builders() -> None:
    assert triton.ENGINE_LLM_DIR == builder_layout.ENGINE_LLM_DIR
    assert triton.ENGINE_MODEL_DIR == builder_layout.ENGINE_MODEL_DIR
    assert triton.ENGINE_PLANS_DIR == builder_layout.ENGINE_PLANS_DIR
    assert triton.MANIFEST_NAME == builder_layout.MANIFEST_NAME
    assert triton.TOKENIZER_SUBDIR == builder_layout.LLM_SUBDIR


def test_quotes_and_backslashes_are_escaped() -> None:
    svc = svc_of("cosyvoice2")
    config = parse(triton.render_repository(svc, '/engines/we"ird\\dir')["token2wav"])
    assert params(config)["plans_dir"] == '/engines/we"ird\\dir/plans'


@pytest.mark.parametrize(
    ("max_batch", "gpus", "tp", "expected"),
    [
        (16, 1, 1, 16),  # one orchestrator instance per LLM sequence slot
        (32, 1, 1, 32),
        (16, 4, 2, 32),  # two tensor-parallel groups of 16 slots
        (2, 1, 1, 4),  # never fewer than upstream's 4 per GPU
        (2, 4, 4, 16),
    ],
)
def test_cosyvoice2_orchestrator_fills_the_llm_slots(
    max_batch: int, gpus: int, tp: int, expected: int
) -> None:
    svc = svc_of(
        "cosyvoice2",
        serving={"gpusPerReplica": gpus, "dynamicBatching": {"preferredBatchSizes": []}},
        engine={"tensorParallelSize": tp, "maxBatchSize": max_batch},
    )
    (bls,) = rendered(svc)["cosyvoice2"].instance_group
    assert bls.count == expected == triton.orchestrator_instances(svc)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_default_speaker_reaches_the_orchestrator_only_when_set(variant: str) -> None:
    """spec.speakers.default: the engine's speakers/default.npz as ``default_speaker``
    (issue 19, item 5); without it no key, and the orchestrator answers a request without
    reference audio with an error."""
    with_speaker = svc_of(
        variant,
        speakers={"default": {"audioUri": "pvc://voices/narrator.wav", "transcript": "Hi."}},
    )
    configs = rendered(with_speaker)
    assert params(configs[variant])["default_speaker"] == f"{ENGINE_DIR}/speakers/default.npz"
    others = [name for name, c in configs.items() if "default_speaker" in params(c)]
    assert others == [variant]
    assert "default_speaker" not in params(rendered(svc_of(variant))[variant])
