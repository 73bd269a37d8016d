"""The CosyVoiceService spec as typed, defaulted, validated values.

The API server already applies the CRD's defaults and rejects what its schema and CEL rules
forbid; this module repeats the defaults so that the pure core can be handed any partial spec
(tests, older stored objects), and re-checks the invariants the core relies on so that a bad
object never turns into bad Kubernetes objects. Errors name the field, as the CRD's do.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

VARIANTS = ("cosyvoice2", "cosyvoice3")
PRECISIONS = ("bfloat16", "float16", "int8-weight-only", "int4-weight-only", "fp8")
MODES = ("Active", "DryRun")
_URI = re.compile(r"^(hf|s3|pvc)://([^/\s]+)/(\S+)$")


class SpecError(ValueError):
    """An invalid spec; ``field`` is the full path of the offending field."""

    def __init__(self, field_path: str, message: str) -> None:
        self.field = field_path
        super().__init__(f"{field_path}: {message}")


@dataclass(frozen=True)
class ModelSpec:
    variant: str
    uri: str
    revision: str = ""
    credentials_secret: str = ""

    @property
    def scheme(self) -> str:
        m = _URI.match(self.uri)
        assert m  # checked on parse
        return m.group(1)

    @property
    def pvc_claim(self) -> str | None:
        """The claim of a pvc:// model, which the build Job must mount."""
        m = _URI.match(self.uri)
        return m.group(2) if m and m.group(1) == "pvc" else None


@dataclass(frozen=True)
class EngineSpec:
    precision: str = "bfloat16"
    tensor_parallel_size: int = 1
    max_batch_size: int = 16
    max_num_tokens: int = 32768
    builder_image: str = ""
    cache_claim_name: str = "cosyvoice-engines"
    gpu_products: tuple[str, ...] = ()


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_sizes: tuple[int, ...] = (4, 8, 16)
    max_queue_delay_microseconds: int = 500
    priority_levels: int = 2


@dataclass(frozen=True)
class ServingSpec:
    image: str = ""
    gpus_per_replica: int = 1
    instances_per_gpu: int = 1
    streaming: bool = True
    dynamic_batching: DynamicBatching = field(default_factory=DynamicBatching)
    resources: Mapping[str, Any] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScaleRule:
    stabilization_window_seconds: int
    max_step_replicas: int


@dataclass(frozen=True)
class Schedule:
    name: str
    start: str
    end: str
    min_replicas: int
    days_of_week: tuple[str, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    timezone: str = "UTC"


@dataclass(frozen=True)
class AutoscalingSpec:
    enabled: bool = False
    mode: str = "Active"
    min_replicas: int = 1
    max_replicas: int = 4
    target_queue_latency_milliseconds: float = 50.0
    evaluation_interval_seconds: int = 15
    scale_up: ScaleRule = ScaleRule(0, 4)
    scale_down: ScaleRule = ScaleRule(300, 1)
    prometheus_url: str = ""
    schedules: tuple[Schedule, ...] = ()


@dataclass(frozen=True)
class ServiceSpec:
    model: ModelSpec
    engine: EngineSpec
    serving: ServingSpec
    replicas: int
    autoscaling: AutoscalingSpec


def _obj(raw: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{path}.{key}", "must be an object")
    return value


def _int(raw: Mapping[str, Any], key: str, path: str, default: int, lo: int, hi: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{path}.{key}", f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(f"{path}.{key}", f"must be between {lo} and {hi}, got {value}")
    return value


def _enum(
    raw: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...], default: str | None
) -> str:
    value = raw.get(key, default)
    if value is None:
        raise SpecError(f"{path}.{key}", f"is required (one of {', '.join(choices)})")
    if value not in choices:
        raise SpecError(f"{path}.{key}", f"must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _str(raw: Mapping[str, Any], key: str, default: str = "") -> str:
    value = raw.get(key, default)
    return "" if value is None else str(value)


def parse(spec: Mapping[str, Any]) -> ServiceSpec:
    """A raw ``.spec`` (as the API server stores it) into a validated ServiceSpec."""
    m = _obj(spec, "model", "spec")
    variant = _enum(m, "variant", "spec.model", VARIANTS, None)
    uri = _str(m, "uri")
    if not _URI.match(uri):
        raise SpecError(
            "spec.model.uri",
            f"must be hf://ORG/NAME, s3://BUCKET/PATH or pvc://CLAIM/PATH, got {uri!r}",
        )
    model = ModelSpec(variant, uri, _str(m, "revision"), _str(m, "credentialsSecret"))

    e = _obj(spec, "engine", "spec")
    tp = _int(e, "tensorParallelSize", "spec.engine", 1, 1, 8)
    if tp not in (1, 2, 4, 8):
        raise SpecError("spec.engine.tensorParallelSize", f"must be 1, 2, 4 or 8, got {tp}")
    products = e.get("gpuProducts") or []
    engine = EngineSpec(
        precision=_enum(e, "precision", "spec.engine", PRECISIONS, "bfloat16"),
        tensor_parallel_size=tp,
        max_batch_size=_int(e, "maxBatchSize", "spec.engine", 16, 1, 256),
        max_num_tokens=_int(e, "maxNumTokens", "spec.engine", 32768, 1, 1 << 24),
        builder_image=_str(e, "builderImage"),
        cache_claim_name=_str(e, "cacheClaimName", "cosyvoice-engines") or "cosyvoice-engines",
        gpu_products=tuple(dict.fromkeys(str(p) for p in products)),
    )

    s = _obj(spec, "serving", "spec")
    gpus = _int(s, "gpusPerReplica", "spec.serving", 1, 1, 64)
    if gpus % tp:
        raise SpecError(
            "spec.serving.gpusPerReplica",
            f"must be a positive multiple of spec.engine.tensorParallelSize ({tp}), got {gpus}",
        )
    db = _obj(s, "dynamicBatching", "spec.serving")
    raw_sizes = db.get("preferredBatchSizes", (4, 8, 16))
    if not isinstance(raw_sizes, list | tuple) or any(
        isinstance(x, bool) or not isinstance(x, int) for x in raw_sizes
    ):
        raise SpecError(
            "spec.serving.dynamicBatching.preferredBatchSizes",
            f"must be a list of integers, got {raw_sizes!r}",
        )
    sizes = tuple(raw_sizes)
    if any(b > engine.max_batch_size or b < 1 for b in sizes):
        raise SpecError(
            "spec.serving.dynamicBatching.preferredBatchSizes",
            f"every entry must be between 1 and spec.engine.maxBatchSize ({engine.max_batch_size})",
        )
    if any(a >= b for a, b in itertools.pairwise(sizes)):
        raise SpecError(
            "spec.serving.dynamicBatching.preferredBatchSizes", "must be strictly increasing"
        )
    serving = ServingSpec(
        image=_str(s, "image"),
        gpus_per_replica=gpus,
        instances_per_gpu=_int(s, "instancesPerGpu", "spec.serving", 1, 1, 8),
        streaming=bool(s.get("streaming", True)),
        dynamic_batching=DynamicBatching(
            preferred_batch_sizes=sizes,
            max_queue_delay_microseconds=_int(
                db, "maxQueueDelayMicroseconds", "spec.serving.dynamicBatching", 500, 0, 10**9
            ),
            priority_levels=_int(db, "priorityLevels", "spec.serving.dynamicBatching", 2, 0, 100),
        ),
        resources=dict(s.get("resources") or {}),
        node_selector={str(k): str(v) for k, v in (s.get("nodeSelector") or {}).items()},
        tolerations=tuple(s.get("tolerations") or ()),
        affinity=dict(s.get("affinity") or {}),
    )

    a = _obj(spec, "autoscaling", "spec")
    up = _obj(a, "scaleUp", "spec.autoscaling")
    down = _obj(a, "scaleDown", "spec.autoscaling")
    min_r = _int(a, "minReplicas", "spec.autoscaling", 1, 0, 10**4)
    max_r = _int(a, "maxReplicas", "spec.autoscaling", 4, 1, 10**4)
    if min_r > max_r:
        raise SpecError(
            "spec.autoscaling.minReplicas", f"must be <= spec.autoscaling.maxReplicas ({max_r})"
        )
    schedules = []
    for i, raw in enumerate(a.get("schedules") or []):
        path = f"spec.autoscaling.schedules[{i}]"
        sched = Schedule(
            name=_str(raw, "name"),
            start=_str(raw, "start"),
            end=_str(raw, "end"),
            min_replicas=_int(raw, "minReplicas", path, 0, 0, max_r),
            days_of_week=tuple(raw.get("daysOfWeek") or Schedule.days_of_week),
            timezone=_str(raw, "timezone", "UTC") or "UTC",
        )
        schedules.append(sched)
    target = a.get("targetQueueLatencyMilliseconds", 50)
    if isinstance(target, bool) or not isinstance(target, int | float) or target <= 0:
        raise SpecError("spec.autoscaling.targetQueueLatencyMilliseconds", "must be a number > 0")
    autoscaling = AutoscalingSpec(
        enabled=bool(a.get("enabled", False)),
        mode=_enum(a, "mode", "spec.autoscaling", MODES, "Active"),
        min_replicas=min_r,
        max_replicas=max_r,
        target_queue_latency_milliseconds=float(target),
        evaluation_interval_seconds=_int(
            a, "evaluationIntervalSeconds", "spec.autoscaling", 15, 1, 3600
        ),
        scale_up=ScaleRule(
            _int(up, "stabilizationWindowSeconds", "spec.autoscaling.scaleUp", 0, 0, 3600),
            _int(up, "maxStepReplicas", "spec.autoscaling.scaleUp", 4, 1, 10**4),
        ),
        scale_down=ScaleRule(
            _int(down, "stabilizationWindowSeconds", "spec.autoscaling.scaleDown", 300, 0, 3600),
            _int(down, "maxStepReplicas", "spec.autoscaling.scaleDown", 1, 1, 10**4),
        ),
        prometheus_url=_str(a, "prometheusUrl"),
        schedules=tuple(schedules),
    )
    return ServiceSpec(
        model=model,
        engine=engine,
        serving=serving,
        replicas=_int(spec, "replicas", "spec", 1, 0, 10**4),
        autoscaling=autoscaling,
    )
