"""Engine identity (the content key) and the engine plan of a service."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import pytest

from cosyvoice_operator.api import engine_identity, gpus, spec
from cosyvoice_operator.api.engine_identity import EngineIdentity
from tests.precision_cases import KV_CACHE_ARCH_CASES, PRECISION_ARCH_CASES
from tests.unit.objects import identity, node, raw_spec, service

DEFAULT_IMAGE = "ghcr.io/cosyvoice-operator/engine-builder:0.1.0-trtllm0.20.0"

# A fixed identity and its key. If this test fails, the key derivation changed: every engine
# already built would get a new key and be rebuilt. Bump engine_identity.KEY_SCHEMA deliberately and
# update the value here in the same change.
GOLDEN_IDENTITY = EngineIdentity(
    model_uri="hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
    revision="0123abcd",
    variant="cosyvoice3",
    precision="bfloat16",
    tensor_parallel_size=1,
    max_batch_size=16,
    max_num_tokens=32768,
    builder_image=DEFAULT_IMAGE,
    gpu_arch="sm_89",
)
GOLDEN_KEY = "deefb7bb4469955f5771a9fd77d07daac5e2558a"


def _unknown(p: engine_identity.EnginePlan) -> tuple[str, ...]:
    return tuple(r.product for r in p.rejected if r.reason == "UnknownGPUProduct")


def test_key_of_a_fixed_identity_is_pinned() -> None:
    assert engine_identity.KEY_SCHEMA == "cosyvoice-engine/v1"
    assert GOLDEN_IDENTITY.key == GOLDEN_KEY
    assert GOLDEN_IDENTITY.short_name == "sm89-deefb7bb4469955f5771"


def test_key_is_a_label_safe_hex_digest() -> None:
    key = identity().key
    assert re.fullmatch(r"[0-9a-f]{40}", key)
    assert len(key) == engine_identity.KEY_LENGTH <= 63


def test_key_is_stable_across_instances() -> None:
    assert identity().key == identity().key
    # and across parses of the same spec
    a = engine_identity.identity(service(), "sm_90", DEFAULT_IMAGE)
    b = engine_identity.identity(service(), "sm_90", DEFAULT_IMAGE)
    assert a == b and a.key == b.key


@pytest.mark.parametrize(
    ("arch", "short"), [("sm_80", "sm80-"), ("sm_90", "sm90-"), ("sm_100", "sm100-")]
)
def test_short_name_is_arch_and_key_prefix(arch: str, short: str) -> None:
    ident = identity(gpu_arch=arch)
    assert ident.short_name == f"{short}{ident.key[:20]}"


def test_identity_from_spec_carries_every_engine_field() -> None:
    s = service(
        model={"variant": "cosyvoice2", "uri": "s3://models/cv2/", "revision": "v1"},
        engine={
            "precision": "fp8",
            "tensorParallelSize": 2,
            "maxBatchSize": 32,
            "maxNumTokens": 4096,
            "builderImage": "reg/builder:2",
        },
        serving={"gpusPerReplica": 2},
    )
    assert engine_identity.identity(s, "sm_90", DEFAULT_IMAGE) == EngineIdentity(
        model_uri="s3://models/cv2/",
        revision="v1",
        variant="cosyvoice2",
        precision="fp8",
        tensor_parallel_size=2,
        max_batch_size=32,
        max_num_tokens=4096,
        builder_image="reg/builder:2",
        gpu_arch="sm_90",
    )


def _key(raw: dict[str, Any], arch: str = "sm_89", default_image: str = DEFAULT_IMAGE) -> str:
    return engine_identity.identity(spec.parse(raw), arch, default_image).key


BASE_KEY_SPEC = raw_spec()

CHANGES_KEY: list[tuple[str, dict[str, Any]]] = [
    ("model-uri", raw_spec(model={"uri": "hf://FunAudioLLM/CosyVoice2-0.5B"})),
    ("model-uri-scheme", raw_spec(model={"uri": "s3://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"})),
    ("revision", raw_spec(model={"revision": "0123abcd"})),
    ("variant", raw_spec(model={"variant": "cosyvoice2"})),
    ("precision", raw_spec(engine={"precision": "float16"})),
    (
        "tensor-parallel-size",
        raw_spec(engine={"tensorParallelSize": 2}, serving={"gpusPerReplica": 2}),
    ),
    ("max-batch-size", raw_spec(engine={"maxBatchSize": 32})),
    ("max-num-tokens", raw_spec(engine={"maxNumTokens": 16384})),
    ("builder-image", raw_spec(engine={"builderImage": "registry.local/builder:custom"})),
    ("kv-cache-int8", raw_spec(engine={"kvCacheType": "int8"})),
    ("kv-cache-fp8", raw_spec(engine={"kvCacheType": "fp8"})),
    ("smoothquant", raw_spec(engine={"precision": "int8-smoothquant"})),
]


@pytest.mark.parametrize("raw", [c[1] for c in CHANGES_KEY], ids=[c[0] for c in CHANGES_KEY])
def test_every_engine_input_changes_the_key(raw: dict[str, Any]) -> None:
    assert _key(raw) != _key(BASE_KEY_SPEC)


def test_gpu_arch_changes_the_key() -> None:
    assert _key(BASE_KEY_SPEC, "sm_89") != _key(BASE_KEY_SPEC, "sm_90")


def test_default_builder_image_is_part_of_the_key() -> None:
    assert _key(BASE_KEY_SPEC, default_image="img:a") != _key(BASE_KEY_SPEC, default_image="img:b")


def test_explicit_builder_image_wins_over_the_default() -> None:
    custom = raw_spec(engine={"builderImage": "img:custom"})
    assert _key(custom, default_image="img:a") == _key(custom, default_image="img:b")
    # an explicit image equal to the default is the same engine as the default
    assert _key(raw_spec(engine={"builderImage": "img:a"}), default_image="img:zzz") == _key(
        BASE_KEY_SPEC, default_image="img:a"
    )


def test_every_identity_field_enters_the_key() -> None:
    """Guards against a field being added to EngineIdentity and left out of the digest."""
    base = identity()
    changed = {
        "model_uri": "hf://other/model",
        "revision": "r2",
        "variant": "cosyvoice2",
        "precision": "fp8",
        "tensor_parallel_size": 4,
        "max_batch_size": 64,
        "max_num_tokens": 1024,
        "builder_image": "img:other",
        "gpu_arch": "sm_100",
        "kv_cache_type": "int8",
        "smooth_quant": "alpha=0.5,per_token,per_channel",
        "companion_revisions": "hf://yuekai/x=" + "a" * 40,
        "speaker_audio_uri": "pvc://voices/narrator.wav",
        "speaker_transcript": "Hello.",
    }
    assert set(changed) == set(EngineIdentity.__dataclass_fields__)
    keys = {identity(**{name: value}).key for name, value in changed.items()}
    assert base.key not in keys
    assert len(keys) == len(changed)


KEEPS_KEY: list[tuple[str, dict[str, Any]]] = [
    ("serving-image", raw_spec(serving={"image": "nvcr.io/triton:custom"})),
    ("gpus-per-replica", raw_spec(serving={"gpusPerReplica": 4})),
    ("instances-per-gpu", raw_spec(serving={"instancesPerGpu": 3})),
    ("streaming", raw_spec(serving={"streaming": False})),
    (
        "preferred-batch-sizes",
        raw_spec(serving={"dynamicBatching": {"preferredBatchSizes": [2, 16]}}),
    ),
    (
        "max-queue-delay",
        raw_spec(serving={"dynamicBatching": {"maxQueueDelayMicroseconds": 9000}}),
    ),
    ("priority-levels", raw_spec(serving={"dynamicBatching": {"priorityLevels": 0}})),
    ("resources", raw_spec(serving={"resources": {"requests": {"cpu": "8"}}})),
    ("node-selector", raw_spec(serving={"nodeSelector": {"pool": "tts"}})),
    ("tolerations", raw_spec(serving={"tolerations": [{"operator": "Exists"}]})),
    (
        "affinity",
        raw_spec(
            serving={
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}
                            ]
                        }
                    }
                }
            }
        ),
    ),
    ("replicas", raw_spec(replicas=7)),
    ("credentials-secret", raw_spec(model={"credentialsSecret": "hf-token"})),
    ("cache-claim", raw_spec(engine={"cacheClaimName": "other-cache"})),
    ("gpu-products", raw_spec(engine={"gpuProducts": ["NVIDIA-L20"]})),
    ("autoscaling-enabled", raw_spec(autoscaling={"enabled": True})),
    ("autoscaling-mode", raw_spec(autoscaling={"mode": "DryRun"})),
    ("autoscaling-min", raw_spec(autoscaling={"minReplicas": 0})),
    ("autoscaling-max", raw_spec(autoscaling={"maxReplicas": 40})),
    ("autoscaling-target", raw_spec(autoscaling={"targetQueueLatencyMilliseconds": 7.5})),
    ("autoscaling-interval", raw_spec(autoscaling={"evaluationIntervalSeconds": 60})),
    (
        "autoscaling-scale-up",
        raw_spec(autoscaling={"scaleUp": {"stabilizationWindowSeconds": 30, "maxStepReplicas": 2}}),
    ),
    (
        "autoscaling-scale-down",
        raw_spec(
            autoscaling={"scaleDown": {"stabilizationWindowSeconds": 600, "maxStepReplicas": 3}}
        ),
    ),
    ("autoscaling-prometheus", raw_spec(autoscaling={"prometheusUrl": "http://prom:9090"})),
    (
        "queue-policy",
        raw_spec(
            serving={
                "queuePolicy": {
                    "maxQueueSize": 8,
                    "defaultTimeoutMicroseconds": 500000,
                    "priorityPolicies": [{"priorityLevel": 1, "maxQueueSize": 2}],
                }
            }
        ),
    ),
    (
        "stream-chunking",
        raw_spec(serving={"streamChunking": {"firstChunkTokens": 5, "hopGrowth": "equal"}}),
    ),
    ("kv-cache-auto-explicit", raw_spec(engine={"kvCacheType": "auto"})),
    ("llm-runtime-default-explicit", raw_spec(model={"llmRuntime": "tensorrt-llm"})),
    (
        "autoscaling-schedules",
        raw_spec(
            autoscaling={
                "schedules": [
                    {
                        "name": "day",
                        "start": "08:00",
                        "end": "20:00",
                        "minReplicas": 2,
                        "daysOfWeek": ["Mon"],
                        "timezone": "Asia/Shanghai",
                    }
                ]
            }
        ),
    ),
]


@pytest.mark.parametrize("raw", [c[1] for c in KEEPS_KEY], ids=[c[0] for c in KEEPS_KEY])
def test_serving_replicas_and_autoscaling_never_change_the_key(raw: dict[str, Any]) -> None:
    assert _key(raw) == _key(BASE_KEY_SPEC)


# ---- engine_identity.plan ------------------------------------------------------------------------


def _nodes(*raws: dict[str, Any]) -> list[gpus.GPUNode]:
    out = []
    for raw in raws:
        n = gpus.GPUNode.from_node(raw)
        assert n is not None
        out.append(n)
    return out


def _targets(p: engine_identity.EnginePlan) -> dict[str, set[str]]:
    return {t.identity.gpu_arch: set(t.products) for t in p.targets}


def test_plan_from_nodes_l20_and_l40s_share_one_sm89_engine() -> None:
    p = engine_identity.plan(
        service(),
        _nodes(node("a", "NVIDIA-L20"), node("b", "NVIDIA-L40S"), node("c", "NVIDIA-L20")),
        DEFAULT_IMAGE,
    )
    assert p.source == "nodes"
    assert _targets(p) == {"sm_89": {"NVIDIA-L20", "NVIDIA-L40S"}}
    (target,) = p.targets
    assert len(target.products) == 2  # each product once
    assert (
        target.key
        == target.identity.key
        == engine_identity.identity(service(), "sm_89", DEFAULT_IMAGE).key
    )
    assert _unknown(p) == ()
    assert p.product_count == 2


def test_plan_l20_and_h100_are_two_engines() -> None:
    p = engine_identity.plan(
        service(),
        _nodes(node("h", "NVIDIA-H100-80GB-HBM3"), node("l", "NVIDIA-L20")),
        DEFAULT_IMAGE,
    )
    assert _targets(p) == {"sm_89": {"NVIDIA-L20"}, "sm_90": {"NVIDIA-H100-80GB-HBM3"}}
    assert [t.identity.gpu_arch for t in p.targets] == ["sm_89", "sm_90"]  # ordered by arch
    assert p.targets[0].key != p.targets[1].key
    # the two identities differ only in the architecture
    a, b = (t.identity for t in p.targets)
    assert dataclasses.replace(a, gpu_arch=b.gpu_arch) == b


def test_plan_reports_unknown_products_and_never_guesses() -> None:
    p = engine_identity.plan(
        service(),
        _nodes(node("t", "Tesla-T4"), node("l", "NVIDIA-L20"), node("x", "NVIDIA-X9")),
        DEFAULT_IMAGE,
    )
    assert _targets(p) == {"sm_89": {"NVIDIA-L20"}}
    assert set(_unknown(p)) == {"Tesla-T4", "NVIDIA-X9"}
    assert p.product_count == 3
    assert all(
        product not in t.products for t in p.targets for product in ("Tesla-T4", "NVIDIA-X9")
    )


def test_plan_only_unknown_products_has_no_target() -> None:
    p = engine_identity.plan(service(engine={"gpuProducts": ["Tesla-T4"]}), [], DEFAULT_IMAGE)
    assert p.targets == ()
    assert _unknown(p) == ("Tesla-T4",)


@pytest.mark.parametrize(
    ("products", "source_hint"),
    [
        (["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"], "spec.engine.gpuProducts"),
        ([], "nodeSelector or affinity"),
    ],
)
def test_plan_rejects_products_the_precision_cannot_run_on(
    products: list[str], source_hint: str
) -> None:
    s = service(engine={"precision": "fp8", "gpuProducts": products})
    nodes = _nodes(node("a", "NVIDIA-A100-SXM4-80GB"), node("h", "NVIDIA-H100-80GB-HBM3"))
    p = engine_identity.plan(s, nodes, DEFAULT_IMAGE)
    assert _targets(p) == {"sm_90": {"NVIDIA-H100-80GB-HBM3"}}  # no build for sm_80
    (rejected,) = p.rejected
    assert (rejected.product, rejected.arch, rejected.reason) == (
        "NVIDIA-A100-SXM4-80GB",
        "sm_80",
        "PrecisionUnsupported",
    )
    assert "fp8 needs sm_89 or newer" in rejected.message
    assert source_hint in rejected.message
    assert _unknown(p) == ()


@pytest.mark.parametrize(("precision", "arch", "ok"), PRECISION_ARCH_CASES)
def test_precision_support_by_architecture(precision: str, arch: str, ok: bool) -> None:
    assert (gpus.precision_unsupported(precision, arch) is None) is ok


@pytest.mark.parametrize("precision", ["int8-weight-only", "int4-weight-only"])
def test_weight_only_precisions_are_refused_on_turing(precision: str) -> None:
    # sm_75 (Tesla T4): the builder runs the weight-only modes with bfloat16 activations.
    assert gpus.precision_unsupported(precision, "sm_75") == f"{precision} needs sm_80 or newer"
    assert gpus.precision_unsupported(precision, "sm_80") is None


def test_plan_gpu_products_from_spec_win_over_nodes() -> None:
    s = service(engine={"gpuProducts": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-L4"]})
    p = engine_identity.plan(s, _nodes(node("l", "NVIDIA-L20")), DEFAULT_IMAGE)
    assert p.source == "spec"
    assert _targets(p) == {
        "sm_89": {"NVIDIA-L4"},
        "sm_90": {"NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"},
    }


def test_plan_spec_products_need_no_nodes_at_all() -> None:
    p = engine_identity.plan(service(engine={"gpuProducts": ["NVIDIA-B200"]}), [], DEFAULT_IMAGE)
    assert _targets(p) == {"sm_100": {"NVIDIA-B200"}}


def test_plan_without_eligible_nodes_is_empty() -> None:
    p = engine_identity.plan(service(), [], DEFAULT_IMAGE)
    assert p == engine_identity.EnginePlan((), (), "nodes")
    assert p.product_count == 0


@pytest.mark.parametrize(
    ("serving", "nodes", "expected"),
    [
        (
            {"nodeSelector": {"pool": "tts"}},
            [node("a", "NVIDIA-L20", labels={"pool": "tts"}), node("b", "NVIDIA-H100-NVL")],
            {"NVIDIA-L20"},
        ),
        (
            {},
            [node("a", "NVIDIA-L20", ready="False"), node("b", "NVIDIA-H20")],
            {"NVIDIA-H20"},
        ),
        (
            {},
            [node("a", "NVIDIA-L20", unschedulable=True), node("b", "NVIDIA-H20")],
            {"NVIDIA-H20"},
        ),
        (
            {"gpusPerReplica": 4},
            [node("a", "NVIDIA-L20", gpus=2), node("b", "NVIDIA-A100-SXM4-80GB", gpus=8)],
            {"NVIDIA-A100-SXM4-80GB"},
        ),
        (
            {},
            [
                node(
                    "a",
                    "NVIDIA-L20",
                    taints=[{"key": "team", "value": "x", "effect": "NoSchedule"}],
                ),
                node("b", "NVIDIA-A10G"),
            ],
            {"NVIDIA-A10G"},
        ),
        (
            {"tolerations": [{"key": "team", "operator": "Exists"}]},
            [
                node(
                    "a",
                    "NVIDIA-L20",
                    taints=[{"key": "team", "value": "x", "effect": "NoSchedule"}],
                ),
                node("b", "NVIDIA-A10G"),
            ],
            {"NVIDIA-L20", "NVIDIA-A10G"},
        ),
    ],
    ids=["node-selector", "not-ready", "cordoned", "too-few-gpus", "taint", "toleration"],
)
def test_plan_from_nodes_uses_only_eligible_nodes(
    serving: dict[str, Any], nodes: Sequence[dict[str, Any]], expected: set[str]
) -> None:
    s = service(serving=serving)
    p = engine_identity.plan(s, _nodes(*nodes), DEFAULT_IMAGE)
    assert {prod for t in p.targets for prod in t.products} == expected
    assert engine_identity.eligible_products(s, _nodes(*nodes)) == sorted(expected)


def test_plan_uses_the_default_builder_image_only_when_the_spec_has_none() -> None:
    nodes = _nodes(node("l", "NVIDIA-L20"))
    default = engine_identity.plan(service(), nodes, "img:default")
    assert default.targets[0].identity.builder_image == "img:default"
    other_default = engine_identity.plan(service(), nodes, "img:newer")
    assert default.targets[0].key != other_default.targets[0].key

    explicit = engine_identity.plan(
        service(engine={"builderImage": "img:mine"}), nodes, "img:default"
    )
    assert explicit.targets[0].identity.builder_image == "img:mine"


def test_two_services_asking_for_the_same_engine_share_its_key() -> None:
    nodes = _nodes(node("l", "NVIDIA-L20"))
    a = engine_identity.plan(
        service(serving={"instancesPerGpu": 2}, replicas=5), nodes, DEFAULT_IMAGE
    )
    b = engine_identity.plan(
        service(serving={"streaming": False}, autoscaling={"enabled": True}), nodes, DEFAULT_IMAGE
    )
    assert [t.key for t in a.targets] == [t.key for t in b.targets]


def test_the_operator_and_the_builder_agree_on_precision_support() -> None:
    # Both refuse a precision an architecture cannot run (the operator before making a Job,
    # the builder before any download); the builder is a program of its own, so each keeps
    # the table, and this keeps them the same.
    from cosyvoice_engine_builder import request

    builder = {p.value: sm for p, sm in request.PRECISION_MIN_SM.items()}
    assert builder == gpus.PRECISION_MIN_SM


# ---- the levers of issue 14: KV cache, SmoothQuant ------------------------------------------


def test_an_existing_spec_keeps_its_key_and_identity_record() -> None:
    """The new identity fields stay out of the key and the recorded identity at their
    defaults: engines built before they existed are found again, not rebuilt."""
    s = service(model={"revision": "0123abcd"})
    ident = engine_identity.identity(s, "sm_89", DEFAULT_IMAGE)
    assert ident == GOLDEN_IDENTITY
    assert ident.key == GOLDEN_KEY
    assert engine_identity.identity_to_dict(ident) == {
        "modelUri": "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
        "revision": "0123abcd",
        "variant": "cosyvoice3",
        "precision": "bfloat16",
        "tensorParallelSize": 1,
        "maxBatchSize": 16,
        "maxNumTokens": 32768,
        "builderImage": DEFAULT_IMAGE,
        "gpuArch": "sm_89",
    }


@pytest.mark.parametrize(
    "ident",
    [
        GOLDEN_IDENTITY,
        dataclasses.replace(GOLDEN_IDENTITY, kv_cache_type="fp8"),
        dataclasses.replace(
            GOLDEN_IDENTITY, precision="int8-smoothquant", smooth_quant="alpha=0.8,per_token"
        ),
    ],
)
def test_identity_dict_round_trips(ident: EngineIdentity) -> None:
    assert engine_identity.identity_from_dict(engine_identity.identity_to_dict(ident)) == ident


def test_fp8_engines_keep_their_key_with_kv_cache_fp8_spelled_out() -> None:
    # An fp8 engine's KV cache is fp8 already: saying so is the same engine.
    fp8 = raw_spec(engine={"precision": "fp8"})
    assert _key(fp8) == _key(raw_spec(engine={"precision": "fp8", "kvCacheType": "fp8"}))


def test_smoothquant_options_enter_the_key() -> None:
    base = raw_spec(engine={"precision": "int8-smoothquant"})
    explicit = raw_spec(
        engine={
            "precision": "int8-smoothquant",
            "smoothQuant": {"alpha": 0.5, "perToken": True, "perChannel": True},
        }
    )
    assert _key(base) == _key(explicit)  # the defaults spelled out
    for change in ({"alpha": 0.8}, {"perToken": False}, {"perChannel": False}):
        other = raw_spec(engine={"precision": "int8-smoothquant", "smoothQuant": change})
        assert _key(other) != _key(base), change
    ident = engine_identity.identity(spec.parse(base), "sm_90", DEFAULT_IMAGE)
    assert ident.smooth_quant == "alpha=0.5,per_token,per_channel"


@pytest.mark.parametrize(("kv", "arch", "ok"), KV_CACHE_ARCH_CASES)
def test_kv_cache_support_by_architecture(kv: str, arch: str, ok: bool) -> None:
    assert (gpus.kv_cache_unsupported(kv, arch) is None) is ok


def test_plan_refuses_fp8_kv_cache_where_the_architecture_cannot_run_it() -> None:
    s = service(
        engine={"kvCacheType": "fp8", "gpuProducts": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-L20"]}
    )
    p = engine_identity.plan(s, [], DEFAULT_IMAGE)
    assert _targets(p) == {"sm_89": {"NVIDIA-L20"}}
    (rejected,) = p.rejected
    assert (rejected.product, rejected.arch, rejected.reason) == (
        "NVIDIA-A100-SXM4-80GB",
        "sm_80",
        "KVCacheUnsupported",
    )
    assert "spec.engine.kvCacheType fp8 needs sm_89 or newer" in rejected.message
    assert "spec.engine.gpuProducts" in rejected.message


def test_plan_builds_smoothquant_from_ampere_on() -> None:
    p = engine_identity.plan(
        service(
            engine={
                "precision": "int8-smoothquant",
                "kvCacheType": "int8",
                "gpuProducts": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"],
            }
        ),
        [],
        DEFAULT_IMAGE,
    )
    assert _targets(p) == {"sm_80": {"NVIDIA-A100-SXM4-80GB"}, "sm_89": {"NVIDIA-L4"}}
    assert p.rejected == ()
    assert {t.identity.kv_cache_type for t in p.targets} == {"int8"}


def test_the_operator_and_the_builder_agree_on_kv_cache_support() -> None:
    from cosyvoice_engine_builder import request

    builder = {k.value: sm for k, sm in request.KV_CACHE_MIN_SM.items()}
    assert builder == gpus.KV_CACHE_MIN_SM
