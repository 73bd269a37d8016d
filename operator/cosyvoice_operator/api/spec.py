"""The CosyVoiceService spec as typed, defaulted, validated values.

The API server already applies the CRD's defaults and rejects what its schema and CEL rules
forbid; this module repeats the defaults so that the pure core can be handed any partial spec
(tests, older stored objects), and re-checks the invariants the core relies on so that a bad
object never turns into bad Kubernetes objects. Errors name the field, as the CRD's do.
"""

from __future__ import annotations

import difflib
import itertools
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

VARIANTS = ("cosyvoice2", "cosyvoice3")
PRECISIONS = (
    "bfloat16",
    "float16",
    "int8-weight-only",
    "int4-weight-only",
    "int8-smoothquant",
    "fp8",
)
MODES = ("Active", "DryRun")
LLM_RUNTIMES = ("tensorrt-llm", "vllm")
# The runtimes a service may ask for today. vllm is a name the API keeps so that the refusal
# can say why (the CRD's CEL rule says the same): there is no vLLM serving image, and the
# orchestrator has no OpenAI-client path to a vLLM server (issue 19, item 9).
SERVED_LLM_RUNTIMES = ("tensorrt-llm",)
VLLM_REFUSAL = (
    "vllm is not served yet: there is no vLLM serving image and the orchestrator cannot call "
    "a vLLM server; it will be accepted once both exist (issue 19, item 9). Use tensorrt-llm"
)
# The LLM's KV cache: "auto" keeps the engine's own (the activation dtype; fp8 for fp8).
KV_CACHE_TYPES = ("auto", "int8", "fp8")
TIMEOUT_ACTIONS = ("Reject", "Delay")
# Upstream's orchestrator: dynamic_chunk_strategy (exponential, equal, time_based).
HOP_GROWTHS = ("exponential", "equal", "time-based")
# Upstream's token_hop_len: 15 speech tokens (0.6 s at 25 Hz) in the first chunk.
UPSTREAM_FIRST_CHUNK_TOKENS = 15
_URI = re.compile(r"^(hf|s3|pvc)://([^/\s]+)/(\S+)$")
# What no path, revision or image may hold although the CRD's patterns may have let it in
# (objects stored before the CRD tightened them): control characters (NUL, ESC and the other
# C0/C1 ones, DEL, Unicode line separators), command substitution, '.'/'..' segments.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_DOT_SEGMENT = re.compile(r"(^|/)\.\.?(/|$)")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+=-]{0,255}$")
# An image reference: registry/path[:tag][@digest], no spaces, quotes or shell syntax.
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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
    llm_runtime: str = "tensorrt-llm"

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
class SmoothQuant:
    """TensorRT-LLM's SmoothQuant (INT8 weights and activations) options."""

    alpha: float = 0.5
    per_token: bool = True
    per_channel: bool = True


@dataclass(frozen=True)
class EngineSpec:
    precision: str = "bfloat16"
    tensor_parallel_size: int = 1
    max_batch_size: int = 16
    max_num_tokens: int = 32768
    builder_image: str = ""
    cache_claim_name: str = "cosyvoice-engines"
    gpu_products: tuple[str, ...] = ()
    kv_cache_type: str = "auto"
    # Set only with precision int8-smoothquant.
    smooth_quant: SmoothQuant | None = None


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_sizes: tuple[int, ...] = (4, 8, 16)
    max_queue_delay_microseconds: int = 500
    priority_levels: int = 2


@dataclass(frozen=True)
class QueuePolicy:
    """One Triton ModelQueuePolicy (0 = unbounded queue, no timeout)."""

    max_queue_size: int = 0
    default_timeout_microseconds: int = 0
    timeout_action: str = "Reject"
    allow_timeout_override: bool = False


@dataclass(frozen=True)
class PriorityQueuePolicy:
    priority_level: int
    policy: QueuePolicy


@dataclass(frozen=True)
class QueuePolicySpec:
    """The orchestrator's queue: a default policy and optional per-priority ones."""

    default: QueuePolicy = field(default_factory=QueuePolicy)
    priority_policies: tuple[PriorityQueuePolicy, ...] = ()


@dataclass(frozen=True)
class StreamChunking:
    first_chunk_tokens: int = UPSTREAM_FIRST_CHUNK_TOKENS
    hop_growth: str = "exponential"


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
    # None: no queue policy rendered (Triton's default, an unbounded queue).
    queue_policy: QueuePolicySpec | None = None
    stream_chunking: StreamChunking = field(default_factory=StreamChunking)


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
class SloSpec:
    """Sizing for the first-audio SLO (issue 22); ``first_audio_milliseconds`` 0 is off (the
    queue-latency target alone sizes the fleet)."""

    first_audio_milliseconds: int = 0
    attainment_percent: float = 99.0  # of requests whose first audio is within the SLO
    first_chunk_milliseconds: int = 1107  # first chunk with every slot busy (upstream L20)
    cold_start_seconds: int = 180  # creation to Ready of a pod: the forecast's horizon
    forecast_std_devs: float = 1.0  # headroom: the forecast plus this many std deviations
    variability: float = 1.0  # (ca² + cs²) / 2: 1 is Poisson arrivals, exponential service
    slots_per_pod: int = 0  # streams a pod serves at once (0: as measured); set, it is used

    @property
    def enabled(self) -> bool:
        return self.first_audio_milliseconds > 0


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
    slo: SloSpec = SloSpec()


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


def _image(raw: Mapping[str, Any], key: str, path: str) -> str:
    value = _str(raw, key)
    if value and not _IMAGE.match(value):
        raise SpecError(
            f"{path}.{key}",
            f"must be an image reference (registry/repository[:tag][@digest]), got {value!r}",
        )
    return value


# ---- shapes of the core Kubernetes types the spec embeds (affinity, tolerations) -----------
# A shape is ("str", max length) | ("int", lo, hi) | ("enum", values) | ("list", shape, max
# items) | ("map", value shape, max keys) | ("obj", {field: shape}, required fields). The
# bounds are the CRD's (crds/): the operator checks what a stored object really holds, since
# an object admitted before the CRD had them, or a schema bypassed, must not crash a pass.

Shape = tuple[Any, ...]


def _shape_list(item: Shape, max_items: int) -> Shape:
    return ("list", item, max_items)


_LABEL_VALUE: Shape = ("str", 63)
_LABEL_KEY: Shape = ("str", 317)


def _requirement(operators: tuple[str, ...]) -> Shape:
    return (
        "obj",
        {
            "key": _LABEL_KEY,
            "operator": ("enum", operators),
            "values": _shape_list(_LABEL_VALUE, 64),
        },
        ("key", "operator"),
    )


_NODE_TERM: Shape = (
    "obj",
    {
        "matchExpressions": _shape_list(
            _requirement(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")), 32
        ),
        "matchFields": _shape_list(
            _requirement(("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")), 32
        ),
    },
    (),
)
_LABEL_SELECTOR: Shape = (
    "obj",
    {
        "matchLabels": ("map", _LABEL_VALUE, 64),
        "matchExpressions": _shape_list(
            _requirement(("In", "NotIn", "Exists", "DoesNotExist")), 32
        ),
    },
    (),
)
_POD_TERM: Shape = (
    "obj",
    {
        "labelSelector": _LABEL_SELECTOR,
        "namespaceSelector": _LABEL_SELECTOR,
        "namespaces": _shape_list(("str", 63), 64),
        "topologyKey": _LABEL_KEY,
        "matchLabelKeys": _shape_list(_LABEL_KEY, 32),
        "mismatchLabelKeys": _shape_list(_LABEL_KEY, 32),
    },
    ("topologyKey",),
)
_WEIGHT: Shape = ("int", 1, 100)
_POD_AFFINITY: Shape = (
    "obj",
    {
        "requiredDuringSchedulingIgnoredDuringExecution": _shape_list(_POD_TERM, 16),
        "preferredDuringSchedulingIgnoredDuringExecution": _shape_list(
            (
                "obj",
                {"weight": _WEIGHT, "podAffinityTerm": _POD_TERM},
                ("weight", "podAffinityTerm"),
            ),
            16,
        ),
    },
    (),
)
AFFINITY: Shape = (
    "obj",
    {
        "nodeAffinity": (
            "obj",
            {
                "requiredDuringSchedulingIgnoredDuringExecution": (
                    "obj",
                    {"nodeSelectorTerms": _shape_list(_NODE_TERM, 16)},
                    ("nodeSelectorTerms",),
                ),
                "preferredDuringSchedulingIgnoredDuringExecution": _shape_list(
                    (
                        "obj",
                        {"weight": _WEIGHT, "preference": _NODE_TERM},
                        ("weight", "preference"),
                    ),
                    16,
                ),
            },
            (),
        ),
        "podAffinity": _POD_AFFINITY,
        "podAntiAffinity": _POD_AFFINITY,
    },
    (),
)
TOLERATION: Shape = (
    "obj",
    {
        "key": _LABEL_KEY,
        "operator": ("enum", ("", "Equal", "Exists")),
        "value": _LABEL_VALUE,
        "effect": ("enum", ("", "NoSchedule", "PreferNoSchedule", "NoExecute")),
        "tolerationSeconds": ("int", -(2**63), 2**63 - 1),
    },
    (),
)


def check_shape(value: Any, shape: Shape, path: str) -> None:
    """Raise SpecError at the first place ``value`` does not have ``shape``."""
    kind = shape[0]
    if kind == "str":
        if not isinstance(value, str):
            raise SpecError(path, f"must be a string, got {value!r:.80}")
        if len(value) > shape[1] or _CONTROL.search(value):
            raise SpecError(path, f"must be at most {shape[1]} printable characters")
    elif kind == "int":
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not shape[1] <= value <= shape[2]
        ):
            raise SpecError(path, f"must be an integer between {shape[1]} and {shape[2]}")
    elif kind == "enum":
        if value not in shape[1]:
            choices = ", ".join(repr(c) for c in shape[1])
            raise SpecError(path, f"must be one of {choices}, got {value!r:.80}")
    elif kind == "list":
        if not isinstance(value, list | tuple):
            raise SpecError(path, f"must be a list, got {value!r:.80}")
        if len(value) > shape[2]:
            raise SpecError(path, f"must have at most {shape[2]} items, has {len(value)}")
        for i, item in enumerate(value):
            check_shape(item, shape[1], f"{path}[{i}]")
    elif kind == "map":
        if not isinstance(value, Mapping):
            raise SpecError(path, f"must be an object, got {value!r:.80}")
        if len(value) > shape[2]:
            raise SpecError(path, f"must have at most {shape[2]} keys, has {len(value)}")
        for k, v in value.items():
            check_shape(k, _LABEL_KEY, f"{path} key")
            check_shape(v, shape[1], f"{path}.{k}")
    else:  # obj
        if not isinstance(value, Mapping):
            raise SpecError(path, f"must be an object, got {value!r:.80}")
        fields, required = shape[1], shape[2]
        for name in required:
            if name not in value:
                raise SpecError(f"{path}.{name}", "is required")
        for name, item in value.items():
            if name not in fields:
                raise SpecError(f"{path}.{name}", f"is not a field of {path} (unknown field)")
            check_shape(item, fields[name], f"{path}.{name}")


def _resources(s: Mapping[str, Any]) -> dict[str, Any]:
    raw = s.get("resources") or {}
    path = "spec.serving.resources"
    quantity: Shape = ("str", 64)
    if not isinstance(raw, Mapping):
        raise SpecError(path, "must be an object")
    for part, values in raw.items():
        if part not in ("requests", "limits"):
            raise SpecError(f"{path}.{part}", "is not a field (requests or limits)")
        if not isinstance(values, Mapping) or len(values) > 32:
            raise SpecError(f"{path}.{part}", "must be an object of at most 32 resources")
        for name, amount in values.items():
            check_shape(name, _LABEL_KEY, f"{path}.{part} key")
            if isinstance(amount, bool) or not isinstance(amount, int | float | str):
                raise SpecError(f"{path}.{part}.{name}", "must be a quantity")
            if isinstance(amount, str):
                check_shape(amount, quantity, f"{path}.{part}.{name}")
    return dict(raw)


def _bool(raw: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(f"{path}.{key}", f"must be true or false, got {value!r}")
    return value


def _smooth_quant(e: Mapping[str, Any]) -> SmoothQuant | None:
    precision = e.get("precision", "bfloat16")
    raw = e.get("smoothQuant")
    if raw is None:
        return SmoothQuant() if precision == "int8-smoothquant" else None
    if precision != "int8-smoothquant":
        raise SpecError(
            "spec.engine.smoothQuant",
            f"is only read with spec.engine.precision int8-smoothquant, not {precision!r}",
        )
    sq = _obj(e, "smoothQuant", "spec.engine")
    alpha = sq.get("alpha", 0.5)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
        raise SpecError("spec.engine.smoothQuant.alpha", f"must be between 0 and 1, got {alpha!r}")
    path = "spec.engine.smoothQuant"
    return SmoothQuant(
        alpha=float(alpha),
        per_token=_bool(sq, "perToken", path, True),
        per_channel=_bool(sq, "perChannel", path, True),
    )


def _check_engine_combinations(model: ModelSpec, engine: EngineSpec) -> None:
    """The pairs no GPU can run, whatever its architecture (the CRD's CEL rules say the same)."""
    if engine.precision == "int8-smoothquant" and engine.kv_cache_type == "fp8":
        raise SpecError(
            "spec.engine.kvCacheType",
            "fp8 cannot go with spec.engine.precision int8-smoothquant (TensorRT-LLM's FP8 KV "
            "cache path would not apply spec.engine.smoothQuant); use auto or int8",
        )
    if engine.precision == "fp8" and engine.kv_cache_type == "int8":
        raise SpecError(
            "spec.engine.kvCacheType",
            "int8 cannot go with spec.engine.precision fp8 (an fp8 engine keeps its KV cache "
            "in fp8); use auto or fp8",
        )


def _policy(raw: Mapping[str, Any], path: str) -> QueuePolicy:
    return QueuePolicy(
        max_queue_size=_int(raw, "maxQueueSize", path, 0, 0, 1 << 20),
        default_timeout_microseconds=_int(
            raw, "defaultTimeoutMicroseconds", path, 0, 0, 3600 * 10**6
        ),
        timeout_action=_enum(raw, "timeoutAction", path, TIMEOUT_ACTIONS, "Reject"),
        allow_timeout_override=_bool(raw, "allowTimeoutOverride", path, False),
    )


def _queue_policy(s: Mapping[str, Any], db: Mapping[str, Any]) -> QueuePolicySpec | None:
    if s.get("queuePolicy") is None:
        return None
    path = "spec.serving.queuePolicy"
    raw = _obj(s, "queuePolicy", "spec.serving")
    levels = _int(db, "priorityLevels", "spec.serving.dynamicBatching", 2, 0, 100)
    found: list[PriorityQueuePolicy] = []
    for i, entry in enumerate(raw.get("priorityPolicies") or []):
        where = f"{path}.priorityPolicies[{i}]"
        if not isinstance(entry, Mapping):
            raise SpecError(where, "must be an object")
        level = _int(entry, "priorityLevel", where, 0, 1, 100)
        if level > levels:
            raise SpecError(
                f"{where}.priorityLevel",
                f"must be <= spec.serving.dynamicBatching.priorityLevels ({levels}), got {level}",
            )
        if any(p.priority_level == level for p in found):
            raise SpecError(f"{where}.priorityLevel", f"level {level} has a policy already")
        found.append(PriorityQueuePolicy(level, _policy(entry, where)))
    return QueuePolicySpec(_policy(raw, path), tuple(sorted(found, key=lambda p: p.priority_level)))


def _stream_chunking(s: Mapping[str, Any]) -> StreamChunking:
    raw = _obj(s, "streamChunking", "spec.serving")
    path = "spec.serving.streamChunking"
    return StreamChunking(
        first_chunk_tokens=_int(raw, "firstChunkTokens", path, UPSTREAM_FIRST_CHUNK_TOKENS, 1, 750),
        hop_growth=_enum(raw, "hopGrowth", path, HOP_GROWTHS, "exponential"),
    )


def parse(spec: Mapping[str, Any]) -> ServiceSpec:
    """A raw ``.spec`` (as the API server stores it) into a validated ServiceSpec."""
    model = _model(_obj(spec, "model", "spec"))
    engine = _engine(_obj(spec, "engine", "spec"))
    _check_engine_combinations(model, engine)
    serving = _serving(_obj(spec, "serving", "spec"), engine)
    autoscaling = _autoscaling(_obj(spec, "autoscaling", "spec"))
    return ServiceSpec(
        model=model,
        engine=engine,
        serving=serving,
        replicas=_int(spec, "replicas", "spec", 1, 0, 10**4),
        autoscaling=autoscaling,
    )


def _model(m: Mapping[str, Any]) -> ModelSpec:
    variant = _enum(m, "variant", "spec.model", VARIANTS, None)
    uri = _str(m, "uri")
    if not _URI.match(uri):
        raise SpecError(
            "spec.model.uri",
            f"must be hf://ORG/NAME, s3://BUCKET/PATH or pvc://CLAIM/PATH, got {uri!r}",
        )
    if _CONTROL.search(uri) or "$(" in uri or _DOT_SEGMENT.search(uri.split("://", 1)[1]):
        raise SpecError(
            "spec.model.uri", "must not have '.' or '..' path segments, '$(' or control characters"
        )
    revision = _str(m, "revision")
    if revision and (not _REVISION.match(revision) or ".." in revision):
        raise SpecError(
            "spec.model.revision",
            "must be a branch, tag, commit or version id: letters, digits and . _ - / + =, "
            f"starting with a letter or digit, without '..' (got {revision!r:.80})",
        )
    secret = _str(m, "credentialsSecret")
    if secret and (len(secret) > 253 or not _DNS_SUBDOMAIN.match(secret)):
        raise SpecError(
            "spec.model.credentialsSecret", f"must be a Secret name, got {secret!r:.80}"
        )
    runtime = _enum(m, "llmRuntime", "spec.model", LLM_RUNTIMES, "tensorrt-llm")
    if runtime not in SERVED_LLM_RUNTIMES:
        raise SpecError("spec.model.llmRuntime", VLLM_REFUSAL)
    return ModelSpec(variant, uri, revision, secret, runtime)


def _engine(e: Mapping[str, Any]) -> EngineSpec:
    tp = _int(e, "tensorParallelSize", "spec.engine", 1, 1, 8)
    if tp not in (1, 2, 4, 8):
        raise SpecError("spec.engine.tensorParallelSize", f"must be 1, 2, 4 or 8, got {tp}")
    products = e.get("gpuProducts") or []
    check_shape(products, _shape_list(_LABEL_VALUE, 16), "spec.engine.gpuProducts")
    claim = _str(e, "cacheClaimName", "cosyvoice-engines") or "cosyvoice-engines"
    if len(claim) > 253 or not _DNS_SUBDOMAIN.match(claim):
        raise SpecError("spec.engine.cacheClaimName", f"must be a claim name, got {claim!r:.80}")
    return EngineSpec(
        precision=_enum(e, "precision", "spec.engine", PRECISIONS, "bfloat16"),
        tensor_parallel_size=tp,
        max_batch_size=_int(e, "maxBatchSize", "spec.engine", 16, 1, 256),
        max_num_tokens=_int(e, "maxNumTokens", "spec.engine", 32768, 1, 1 << 20),
        builder_image=_image(e, "builderImage", "spec.engine"),
        cache_claim_name=claim,
        gpu_products=tuple(dict.fromkeys(str(p) for p in products)),
        kv_cache_type=_enum(e, "kvCacheType", "spec.engine", KV_CACHE_TYPES, "auto"),
        smooth_quant=_smooth_quant(e),
    )


def _serving(s: Mapping[str, Any], engine: EngineSpec) -> ServingSpec:
    tp = engine.tensor_parallel_size
    gpus = _int(s, "gpusPerReplica", "spec.serving", 1, 1, 8)
    if gpus % tp:
        raise SpecError(
            "spec.serving.gpusPerReplica",
            f"must be a positive multiple of spec.engine.tensorParallelSize ({tp}), got {gpus}",
        )
    db = _obj(s, "dynamicBatching", "spec.serving")
    sizes = _preferred_batch_sizes(db, engine.max_batch_size)
    node_selector = s.get("nodeSelector") or {}
    check_shape(node_selector, ("map", _LABEL_VALUE, 64), "spec.serving.nodeSelector")
    tolerations = s.get("tolerations") or []
    check_shape(tolerations, _shape_list(TOLERATION, 32), "spec.serving.tolerations")
    affinity = s.get("affinity") or {}
    check_shape(affinity, AFFINITY, "spec.serving.affinity")
    return ServingSpec(
        image=_image(s, "image", "spec.serving"),
        gpus_per_replica=gpus,
        instances_per_gpu=_int(s, "instancesPerGpu", "spec.serving", 1, 1, 8),
        streaming=_bool(s, "streaming", "spec.serving", True),
        dynamic_batching=DynamicBatching(
            preferred_batch_sizes=sizes,
            max_queue_delay_microseconds=_int(
                db, "maxQueueDelayMicroseconds", "spec.serving.dynamicBatching", 500, 0, 10**6
            ),
            priority_levels=_int(db, "priorityLevels", "spec.serving.dynamicBatching", 2, 0, 100),
        ),
        resources=_resources(s),
        node_selector={str(k): str(v) for k, v in node_selector.items()},
        tolerations=tuple(tolerations),
        affinity=dict(affinity),
        queue_policy=_queue_policy(s, db),
        stream_chunking=_stream_chunking(s),
    )


def _preferred_batch_sizes(db: Mapping[str, Any], max_batch_size: int) -> tuple[int, ...]:
    path = "spec.serving.dynamicBatching.preferredBatchSizes"
    raw_sizes = db.get("preferredBatchSizes", (4, 8, 16))
    if not isinstance(raw_sizes, list | tuple) or any(
        isinstance(x, bool) or not isinstance(x, int) for x in raw_sizes
    ):
        raise SpecError(path, f"must be a list of integers, got {raw_sizes!r}")
    sizes = tuple(raw_sizes)
    if any(b > max_batch_size or b < 1 for b in sizes):
        raise SpecError(
            path, f"every entry must be between 1 and spec.engine.maxBatchSize ({max_batch_size})"
        )
    if any(a >= b for a, b in itertools.pairwise(sizes)):
        raise SpecError(path, "must be strictly increasing")
    return sizes


def _autoscaling(a: Mapping[str, Any]) -> AutoscalingSpec:
    up = _obj(a, "scaleUp", "spec.autoscaling")
    down = _obj(a, "scaleDown", "spec.autoscaling")
    min_r = _int(a, "minReplicas", "spec.autoscaling", 1, 0, 10**4)
    max_r = _int(a, "maxReplicas", "spec.autoscaling", 4, 1, 10**4)
    if min_r > max_r:
        raise SpecError(
            "spec.autoscaling.minReplicas", f"must be <= spec.autoscaling.maxReplicas ({max_r})"
        )
    schedules = _schedules(a, max_r)
    target = a.get("targetQueueLatencyMilliseconds", 50)
    if isinstance(target, bool) or not isinstance(target, int | float) or target <= 0:
        raise SpecError("spec.autoscaling.targetQueueLatencyMilliseconds", "must be a number > 0")
    return AutoscalingSpec(
        enabled=_bool(a, "enabled", "spec.autoscaling", False),
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
        schedules=schedules,
        slo=_slo(_obj(a, "slo", "spec.autoscaling")),
    )


def _number(
    raw: Mapping[str, Any], key: str, path: str, default: float, lo: float, hi: float
) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(f"{path}.{key}", f"must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(f"{path}.{key}", f"must be between {lo:g} and {hi:g}, got {value}")
    return float(value)


def _slo(s: Mapping[str, Any]) -> SloSpec:
    path = "spec.autoscaling.slo"
    slo = SloSpec(
        first_audio_milliseconds=_int(s, "firstAudioMilliseconds", path, 0, 0, 600_000),
        attainment_percent=_number(s, "attainmentPercent", path, 99.0, 50.0, 99.99),
        first_chunk_milliseconds=_int(s, "firstChunkMilliseconds", path, 1107, 0, 600_000),
        cold_start_seconds=_int(s, "coldStartSeconds", path, 180, 0, 3600),
        forecast_std_devs=_number(s, "forecastStdDevs", path, 1.0, 0.0, 10.0),
        variability=_number(s, "variability", path, 1.0, 0.05, 10.0),
        slots_per_pod=_int(s, "slotsPerPod", path, 0, 0, 10_000),
    )
    if slo.enabled and slo.first_chunk_milliseconds >= slo.first_audio_milliseconds:
        raise SpecError(
            f"{path}.firstChunkMilliseconds",
            f"must be below {path}.firstAudioMilliseconds ({slo.first_audio_milliseconds}): "
            "no wait at all would leave the SLO reachable",
        )
    return slo


def _schedules(a: Mapping[str, Any], max_replicas: int) -> tuple[Schedule, ...]:
    """The schedule floors, every field checked here: a window the autoscaler could not read
    (an unknown time zone such as ``Asia/Shanghi``, a time that is not HH:MM) is an
    InvalidSpec on the service, not an error at each evaluation with autoscaling off."""
    raws = a.get("schedules") or []
    if not isinstance(raws, list):
        raise SpecError("spec.autoscaling.schedules", "must be a list")
    if len(raws) > 32:
        raise SpecError("spec.autoscaling.schedules", f"has at most 32 windows, got {len(raws)}")
    schedules: list[Schedule] = []
    for i, raw in enumerate(raws):
        path = f"spec.autoscaling.schedules[{i}]"
        if not isinstance(raw, Mapping):
            raise SpecError(path, "must be an object")
        name = _str(raw, "name")
        if not _SCHEDULE_NAME.match(name):
            raise SpecError(
                f"{path}.name", f"must be a lower-case DNS label (a-z, 0-9, '-'), got {name!r}"
            )
        if any(s.name == name for s in schedules):
            raise SpecError(f"{path}.name", f"{name!r} is the name of another window")
        start = _hhmm(raw, "start", path)
        end = _hhmm(raw, "end", path)
        if start == end:
            raise SpecError(
                f"{path}.end", f"must differ from start ({start}; an end before start runs past "
                "midnight)",
            )  # fmt: skip
        schedules.append(
            Schedule(
                name=name,
                start=start,
                end=end,
                min_replicas=_int(raw, "minReplicas", path, 0, 0, max_replicas),
                days_of_week=_days(raw, path),
                timezone=_timezone(raw, path),
            )
        )
    return tuple(schedules)


_SCHEDULE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HHMM = re.compile(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _hhmm(raw: Mapping[str, Any], key: str, path: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not _HHMM.match(value):
        raise SpecError(
            f"{path}.{key}", f"must be HH:MM on a 24-hour clock (00:00..23:59), got {value!r}"
        )
    return value


def _days(raw: Mapping[str, Any], path: str) -> tuple[str, ...]:
    days = raw.get("daysOfWeek")
    if days is None:
        return Schedule.days_of_week
    if not isinstance(days, list) or not days:
        raise SpecError(f"{path}.daysOfWeek", f"must be a non-empty list of {', '.join(DAYS)}")
    for day in days:
        if day not in DAYS:
            raise SpecError(f"{path}.daysOfWeek", f"must be among {', '.join(DAYS)}, got {day!r}")
    if len(set(days)) != len(days):
        raise SpecError(f"{path}.daysOfWeek", "names a day twice")
    return tuple(days)


def _timezone(raw: Mapping[str, Any], path: str) -> str:
    """An IANA time zone this operator can read (zoneinfo, with the tzdata package)."""
    name = raw.get("timezone")
    if name is None or name == "":
        return "UTC"
    if not isinstance(name, str):
        raise SpecError(f"{path}.timezone", f"must be an IANA time zone name, got {name!r}")
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        known = sorted(
            z for z in zoneinfo.available_timezones() if z.lower() == name.lower()
        ) or difflib.get_close_matches(name, zoneinfo.available_timezones(), n=1)
        hint = f" (did you mean {known[0]}?)" if known else ""
        raise SpecError(
            f"{path}.timezone", f"unknown IANA time zone {name!r}{hint}, e.g. Asia/Shanghai, UTC"
        ) from None
    return name
