"""The article's levers as service options (issue 14), end to end through the pure core:
the spec (defaults, refusals naming the field, vLLM refused until it can serve: issue 19,
item 9) and what Triton is given (queue policy, stream chunking)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from cosyvoice_operator.api import spec
from cosyvoice_operator.cli.main import main
from cosyvoice_operator.plan.service import WARNING_REASONS, Policy
from cosyvoice_operator.render import triton, workloads
from cosyvoice_operator.render.workloads import ServingSettings
from tests.unit.objects import raw_spec, service

ENGINE_DIR = "/engines/" + "e" * 40
CHECKPOINT_DIR = "/engines/" + "c" * 40
L20 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L20"}}
POLICY = Policy()


def parse_config(text: str) -> Any:
    return text_format.Parse(text, mc.ModelConfig())


def params(config: Any) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


# ---- the spec --------------------------------------------------------------------------------


def test_defaults_are_upstreams_and_change_nothing() -> None:
    svc = service()
    assert svc.model.llm_runtime == "tensorrt-llm"
    assert svc.engine.kv_cache_type == "auto"
    assert svc.engine.smooth_quant is None
    assert svc.serving.queue_policy is None
    assert svc.serving.stream_chunking == spec.StreamChunking(15, "exponential")


def test_the_full_set_of_levers_parses() -> None:
    svc = service(
        engine={"precision": "int8-smoothquant", "kvCacheType": "int8"},
        serving={
            "dynamicBatching": {"priorityLevels": 3},
            "queuePolicy": {
                "maxQueueSize": 16,
                "defaultTimeoutMicroseconds": 250000,
                "timeoutAction": "Delay",
                "priorityPolicies": [
                    {"priorityLevel": 2, "maxQueueSize": 4},
                    {"priorityLevel": 1, "allowTimeoutOverride": True},
                ],
            },
            "streamChunking": {"firstChunkTokens": 5, "hopGrowth": "time-based"},
        },
    )
    assert svc.engine.smooth_quant == spec.SmoothQuant(0.5, True, True)
    queue = svc.serving.queue_policy
    assert queue is not None
    assert queue.default == spec.QueuePolicy(16, 250000, "Delay", False)
    # Sorted by level, each with Triton's "no bound, no timeout" where not given.
    assert [p.priority_level for p in queue.priority_policies] == [1, 2]
    assert queue.priority_policies[0].policy == spec.QueuePolicy(0, 0, "Reject", True)
    assert queue.priority_policies[1].policy.max_queue_size == 4
    assert svc.serving.stream_chunking == spec.StreamChunking(5, "time-based")


@pytest.mark.parametrize(
    ("sections", "field", "words"),
    [
        (
            {"model": {"llmRuntime": "vllm"}},
            "spec.model.llmRuntime",
            "vllm is not served yet: there is no vLLM serving image",
        ),
        (
            {"engine": {"precision": "fp8", "kvCacheType": "int8"}},
            "spec.engine.kvCacheType",
            "cannot go with spec.engine.precision fp8",
        ),
        (
            {"engine": {"precision": "int8-smoothquant", "kvCacheType": "fp8"}},
            "spec.engine.kvCacheType",
            "cannot go with spec.engine.precision int8-smoothquant",
        ),
        (
            {"engine": {"smoothQuant": {"alpha": 0.3}}},
            "spec.engine.smoothQuant",
            "only read with spec.engine.precision int8-smoothquant",
        ),
        (
            {"engine": {"precision": "int8-smoothquant", "smoothQuant": {"alpha": 2}}},
            "spec.engine.smoothQuant.alpha",
            "between 0 and 1",
        ),
        (
            {"model": {"llmRuntime": "sglang"}},
            "spec.model.llmRuntime",
            "must be one of tensorrt-llm, vllm",
        ),
        (
            {"serving": {"queuePolicy": {"priorityPolicies": [{"priorityLevel": 3}]}}},
            "spec.serving.queuePolicy.priorityPolicies[0].priorityLevel",
            "must be <= spec.serving.dynamicBatching.priorityLevels (2)",
        ),
        (
            {
                "serving": {
                    "queuePolicy": {
                        "priorityPolicies": [{"priorityLevel": 1}, {"priorityLevel": 1}]
                    }
                }
            },
            "spec.serving.queuePolicy.priorityPolicies[1].priorityLevel",
            "has a policy already",
        ),
        (
            {"serving": {"queuePolicy": {"timeoutAction": "Drop"}}},
            "spec.serving.queuePolicy.timeoutAction",
            "must be one of Reject, Delay",
        ),
        (
            {"serving": {"streamChunking": {"firstChunkTokens": 0}}},
            "spec.serving.streamChunking.firstChunkTokens",
            "between 1 and 750",
        ),
    ],
)
def test_refusals_name_the_field(sections: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(spec.SpecError) as err:
        spec.parse(raw_spec(**sections))
    assert err.value.field == field
    assert words in str(err.value)


# ---- Triton: queue policy and stream chunking ------------------------------------------------


def test_without_the_new_fields_the_repository_is_as_before() -> None:
    """No queue policy, no token_hop_len: the golden repositories stay byte for byte."""
    for variant, uri in (
        ("cosyvoice2", "hf://FunAudioLLM/CosyVoice2-0.5B"),
        ("cosyvoice3", "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"),
    ):
        golden = Path(__file__).parent / "golden" / "triton" / f"{variant}-1gpu"
        svc = service(
            model={"variant": variant, "uri": uri},
            serving={"streamChunking": {"firstChunkTokens": 15, "hopGrowth": "exponential"}},
        )
        repository = triton.render_repository(
            svc, "/engines/0123456789abcdef0123456789abcdef01234567"
        )
        for name, text in repository.items():
            assert text == (golden / f"{name}.pbtxt").read_text(), f"{variant}/{name}"


@pytest.mark.parametrize("variant", ["cosyvoice2", "cosyvoice3"])
def test_queue_policy_is_on_the_orchestrators_queue_only(variant: str) -> None:
    svc = service(
        model={"variant": variant},
        serving={
            "queuePolicy": {
                "maxQueueSize": 8,
                "defaultTimeoutMicroseconds": 200000,
                "priorityPolicies": [
                    {"priorityLevel": 1, "defaultTimeoutMicroseconds": 0},
                    {"priorityLevel": 2, "maxQueueSize": 2, "timeoutAction": "Delay"},
                ],
            }
        },
    )
    repository = {
        name: parse_config(text) for name, text in triton.render_repository(svc, ENGINE_DIR).items()
    }
    batching = repository[variant].dynamic_batching
    default = batching.default_queue_policy
    assert default.max_queue_size == 8
    assert default.default_timeout_microseconds == 200000
    assert default.timeout_action == mc.ModelQueuePolicy.REJECT
    assert not default.allow_timeout_override
    # Per-priority policies give the orchestrator the levels, new requests at the lowest.
    assert (batching.priority_levels, batching.default_priority_level) == (2, 2)
    assert set(batching.priority_queue_policy) == {1, 2}
    assert batching.priority_queue_policy[1].default_timeout_microseconds == 0
    assert batching.priority_queue_policy[2].max_queue_size == 2
    assert batching.priority_queue_policy[2].timeout_action == mc.ModelQueuePolicy.DELAY
    # A stream's later chunks must never be dropped: no policy on the inner models.
    for name, config in repository.items():
        if name != variant:
            assert not config.dynamic_batching.HasField("default_queue_policy"), name
            assert not config.dynamic_batching.priority_queue_policy, name


def test_a_default_policy_alone_keeps_the_orchestrator_single_level() -> None:
    svc = service(serving={"queuePolicy": {"maxQueueSize": 4}})
    batching = parse_config(
        triton.render_repository(svc, ENGINE_DIR)["cosyvoice3"]
    ).dynamic_batching
    assert batching.default_queue_policy.max_queue_size == 4
    assert batching.priority_levels == 0


@pytest.mark.parametrize(
    ("chunking", "expected"),
    [
        ({}, {"dynamic_chunk_strategy": "exponential"}),
        (
            {"firstChunkTokens": 5},
            {"dynamic_chunk_strategy": "exponential", "token_hop_len": "5"},
        ),
        ({"hopGrowth": "equal"}, {"dynamic_chunk_strategy": "equal"}),
        (
            {"firstChunkTokens": 25, "hopGrowth": "time-based"},
            {"dynamic_chunk_strategy": "time_based", "token_hop_len": "25"},
        ),
    ],
)
def test_stream_chunking_reaches_the_orchestrator(
    chunking: dict[str, Any], expected: dict[str, str]
) -> None:
    svc = service(serving={"streamChunking": chunking})
    got = params(parse_config(triton.render_repository(svc, ENGINE_DIR)["cosyvoice3"]))
    assert {k: got[k] for k in got if k in ("dynamic_chunk_strategy", "token_hop_len")} == expected


def test_a_tensorrt_llm_pod_gets_no_vllm_arguments() -> None:
    args = workloads.serve_args(service(), "k" * 40, ServingSettings())
    assert "--llm-runtime" not in args and "--checkpoint-dir" not in args


def test_the_kv_cache_refusal_is_a_warning_reason() -> None:
    assert "KVCacheUnsupported" in WARNING_REASONS


# ---- `render` shows each option's effect -----------------------------------------------------


def _render(tmp_path: Path, capsys: pytest.CaptureFixture[str], **sections: Any) -> list[Any]:
    doc = {
        "apiVersion": "tts.cosyvoice.dev/v1alpha1",
        "kind": "CosyVoiceService",
        "metadata": {"name": "tts"},
        "spec": raw_spec(**copy.deepcopy(sections)),
    }
    path = tmp_path / "svc.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["render", "-f", str(path), "--gpu-product", "NVIDIA-L20"]) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


def test_render_shows_the_queue_policy_and_chunking_in_the_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = _render(
        tmp_path,
        capsys,
        serving={
            "queuePolicy": {"maxQueueSize": 4, "defaultTimeoutMicroseconds": 100000},
            "streamChunking": {"firstChunkTokens": 5},
        },
        engine={"kvCacheType": "fp8"},
    )
    [repo] = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-repo")
    ]
    config = parse_config(repo["data"]["cosyvoice3.pbtxt"])
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 4
    assert params(config)["token_hop_len"] == "5"
    [build] = [d for d in docs if d["kind"] == "Job"]
    args = build["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--kv-cache-type") + 1] == "fp8"
