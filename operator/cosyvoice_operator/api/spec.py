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

from cosyvoice_operator.api import pod_profiles
from cosyvoice_operator.api.fields import (
    AFFINITY,
    CONTROL,
    LABEL_KEY,
    LABEL_VALUE,
    TOLERATION,
    Shape,
    boolean,
    check_shape,
    enum,
    image,
    integer,
    number,
    obj,
    shape_list,
    string,
)

# The spec's errors and schedule type are part of this module's API (re-exported).
from cosyvoice_operator.api.fields import SpecError as SpecError
from cosyvoice_operator.api.schedule_fields import Schedule as Schedule
from cosyvoice_operator.api.schedule_fields import parse_schedules

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
# spec.routing.mode: how clients reach the Triton pods (docs/concepts/routing.md).
ROUTER = "Router"  # the operator's HAProxy: one fleet queue, least-loaded per stream
SERVICE = "Service"  # a ClusterIP Service straight to the pods (kube-proxy: per connection)
GATEWAY_API = "GatewayAPI"  # a GRPCRoute and Envoy Gateway's BackendTrafficPolicy
ROUTING_MODES = (ROUTER, SERVICE, GATEWAY_API)
_URI = re.compile(r"^(hf|s3|pvc)://([^/\s]+)/(\S+)$")
_DOT_SEGMENT = re.compile(r"(^|/)\.\.?(/|$)")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/+=-]{0,255}$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


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
    instances_per_gpu: int = 4  # the H200 sweep (bench/results/gpu-sweep.json, issue 20)
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
class SloSpec:
    """Sizing for the first-audio SLO (issue 22); ``first_audio_milliseconds`` 0 is off (the
    queue-latency target alone sizes the fleet)."""

    first_audio_milliseconds: int = 0
    attainment_percent: float = 99.0  # of requests whose first audio is within the SLO
    # first chunk with every slot busy; set 0, the pod profile of the service's GPU products
    # (api/pod_profiles.py: measured there, else upstream's L20 figure, 1107 ms)
    first_chunk_milliseconds: int = 1107
    first_chunk_source: str = f"L20 pod profile: {pod_profiles.UPSTREAM_L20.source}"
    cold_start_seconds: int = 180  # creation to Ready of a pod: the forecast's horizon
    forecast_std_devs: float = 1.0  # headroom: the forecast plus this many std deviations
    variability: float = 1.0  # (ca² + cs²) / 2: 1 is Poisson arrivals, exponential service
    slots_per_pod: int = 0  # streams a pod serves at once (0: as measured); set, it is used
    seasonal_period_hours: int = 0  # the seasonal profile's period (24: a day); 0 is off
    seasonal_bucket_minutes: int = 15  # the profile's resolution
    seasonal_floor_percent: float = 100.0  # of what the last period needed over a cold start
    # a scale-down removes at least this percent of the count in force, else it holds
    scale_down_hysteresis_percent: float = 10.0

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
class DefaultSpeaker:
    """The voice of requests without reference audio: a recording on a claim and what it says.
    The engine builder turns it into the speaker's prompt features (issue 19, item 5)."""

    audio_uri: str  # pvc://CLAIM/PATH of a WAV file
    transcript: str

    @property
    def pvc_claim(self) -> str:
        m = _URI.match(self.audio_uri)
        assert m  # checked on parse
        return m.group(2)


@dataclass(frozen=True)
class SpeakersSpec:
    default: DefaultSpeaker | None = None


@dataclass(frozen=True)
class RouterSpec:
    """The router of mode Router: HAProxy pods in front of the Triton pods."""

    replicas: int = 2  # each gets floor(slots / replicas) streams of every Triton pod
    queue_timeout_seconds: int = 0  # 0: derived from the first-audio SLO
    image: str = ""  # "": the operator's configured default
    resources: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GatewaySpec:
    """Mode GatewayAPI: the Gateways the rendered GRPCRoute attaches to."""

    parent_refs: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class RoutingSpec:
    mode: str = ROUTER
    router: RouterSpec = RouterSpec()
    gateway: GatewaySpec = GatewaySpec()


@dataclass(frozen=True)
class ServiceSpec:
    model: ModelSpec
    engine: EngineSpec
    serving: ServingSpec
    replicas: int
    autoscaling: AutoscalingSpec
    speakers: SpeakersSpec = SpeakersSpec()
    routing: RoutingSpec = RoutingSpec()


def _resources(s: Mapping[str, Any], path: str = "spec.serving.resources") -> dict[str, Any]:
    raw = s.get("resources") or {}
    quantity: Shape = ("str", 64)
    if not isinstance(raw, Mapping):
        raise SpecError(path, "must be an object")
    for part, values in raw.items():
        if part not in ("requests", "limits"):
            raise SpecError(f"{path}.{part}", "is not a field (requests or limits)")
        if not isinstance(values, Mapping) or len(values) > 32:
            raise SpecError(f"{path}.{part}", "must be an object of at most 32 resources")
        for name, amount in values.items():
            check_shape(name, LABEL_KEY, f"{path}.{part} key")
            if isinstance(amount, bool) or not isinstance(amount, int | float | str):
                raise SpecError(f"{path}.{part}.{name}", "must be a quantity")
            if isinstance(amount, str):
                check_shape(amount, quantity, f"{path}.{part}.{name}")
    return dict(raw)


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
    sq = obj(e, "smoothQuant", "spec.engine")
    alpha = sq.get("alpha", 0.5)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 <= alpha <= 1:
        raise SpecError("spec.engine.smoothQuant.alpha", f"must be between 0 and 1, got {alpha!r}")
    path = "spec.engine.smoothQuant"
    return SmoothQuant(
        alpha=float(alpha),
        per_token=boolean(sq, "perToken", path, True),
        per_channel=boolean(sq, "perChannel", path, True),
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
        max_queue_size=integer(raw, "maxQueueSize", path, 0, 0, 1 << 20),
        default_timeout_microseconds=integer(
            raw, "defaultTimeoutMicroseconds", path, 0, 0, 3600 * 10**6
        ),
        timeout_action=enum(raw, "timeoutAction", path, TIMEOUT_ACTIONS, "Reject"),
        allow_timeout_override=boolean(raw, "allowTimeoutOverride", path, False),
    )


def _queue_policy(s: Mapping[str, Any], db: Mapping[str, Any]) -> QueuePolicySpec | None:
    if s.get("queuePolicy") is None:
        return None
    path = "spec.serving.queuePolicy"
    raw = obj(s, "queuePolicy", "spec.serving")
    levels = integer(db, "priorityLevels", "spec.serving.dynamicBatching", 2, 0, 100)
    found: list[PriorityQueuePolicy] = []
    for i, entry in enumerate(raw.get("priorityPolicies") or []):
        where = f"{path}.priorityPolicies[{i}]"
        if not isinstance(entry, Mapping):
            raise SpecError(where, "must be an object")
        level = integer(entry, "priorityLevel", where, 0, 1, 100)
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
    raw = obj(s, "streamChunking", "spec.serving")
    path = "spec.serving.streamChunking"
    return StreamChunking(
        first_chunk_tokens=integer(
            raw, "firstChunkTokens", path, UPSTREAM_FIRST_CHUNK_TOKENS, 1, 750
        ),
        hop_growth=enum(raw, "hopGrowth", path, HOP_GROWTHS, "exponential"),
    )


def parse(spec: Mapping[str, Any]) -> ServiceSpec:
    """A raw ``.spec`` (as the API server stores it) into a validated ServiceSpec."""
    model = _model(obj(spec, "model", "spec"))
    engine = _engine(obj(spec, "engine", "spec"))
    _check_engine_combinations(model, engine)
    serving = _serving(obj(spec, "serving", "spec"), engine)
    autoscaling = _autoscaling(obj(spec, "autoscaling", "spec"), engine.gpu_products)
    return ServiceSpec(
        model=model,
        engine=engine,
        serving=serving,
        replicas=integer(spec, "replicas", "spec", 1, 0, 10**4),
        autoscaling=autoscaling,
        speakers=_speakers(obj(spec, "speakers", "spec")),
        routing=_routing(obj(spec, "routing", "spec")),
    )


# A Gateway API ParentReference (gateway.networking.k8s.io/v1): the bounds of its CRD.
_PARENT_REF: Shape = (
    "obj",
    {
        "group": ("str", 253),
        "kind": ("str", 63),
        "namespace": ("str", 63),
        "name": ("str", 253),
        "sectionName": ("str", 253),
        "port": ("int", 1, 65535),
    },
    ("name",),
)
MAX_ROUTER_REPLICAS = 16


def _routing(r: Mapping[str, Any]) -> RoutingSpec:
    path = "spec.routing"
    mode = enum(r, "mode", path, ROUTING_MODES, ROUTER)
    raw_router = obj(r, "router", path)
    where = f"{path}.router"
    router = RouterSpec(
        replicas=integer(raw_router, "replicas", where, 2, 1, MAX_ROUTER_REPLICAS),
        queue_timeout_seconds=integer(raw_router, "queueTimeoutSeconds", where, 0, 0, 3600),
        image=image(raw_router, "image", where),
        resources=_resources(raw_router, f"{where}.resources"),
    )
    raw_gateway = obj(r, "gateway", path)
    refs = raw_gateway.get("parentRefs") or []
    check_shape(refs, shape_list(_PARENT_REF, 32), f"{path}.gateway.parentRefs")
    if mode == GATEWAY_API and not refs:
        raise SpecError(
            f"{path}.gateway.parentRefs",
            "needs at least one Gateway with spec.routing.mode GatewayAPI (the GRPCRoute "
            "attaches to it)",
        )
    return RoutingSpec(mode, router, GatewaySpec(tuple(dict(ref) for ref in refs)))


MAX_TRANSCRIPT = 2000
_SPEAKER_URI = re.compile(r"^pvc://([a-z0-9]([-a-z0-9.]*[a-z0-9])?)/(\S+)$")


def _speakers(s: Mapping[str, Any]) -> SpeakersSpec:
    if s.get("default") is None:
        return SpeakersSpec()
    d = obj(s, "default", "spec.speakers")
    path = "spec.speakers.default"
    uri = string(d, "audioUri")
    if not _SPEAKER_URI.match(uri) or len(uri) > 1024:
        raise SpecError(
            f"{path}.audioUri",
            f"must be pvc://CLAIM/PATH, a WAV file on a PersistentVolumeClaim, got {uri!r:.80}",
        )
    if CONTROL.search(uri) or "$(" in uri or _DOT_SEGMENT.search(uri.split("://", 1)[1]):
        raise SpecError(
            f"{path}.audioUri",
            "must not have '.' or '..' path segments, '$(' or control characters",
        )
    transcript = string(d, "transcript")
    if not transcript.strip() or len(transcript) > MAX_TRANSCRIPT or CONTROL.search(transcript):
        raise SpecError(
            f"{path}.transcript",
            f"must be what the audio says: 1-{MAX_TRANSCRIPT} characters, no control characters",
        )
    return SpeakersSpec(DefaultSpeaker(uri, transcript))


def _model(m: Mapping[str, Any]) -> ModelSpec:
    variant = enum(m, "variant", "spec.model", VARIANTS, None)
    uri = string(m, "uri")
    if not _URI.match(uri):
        raise SpecError(
            "spec.model.uri",
            f"must be hf://ORG/NAME, s3://BUCKET/PATH or pvc://CLAIM/PATH, got {uri!r}",
        )
    if CONTROL.search(uri) or "$(" in uri or _DOT_SEGMENT.search(uri.split("://", 1)[1]):
        raise SpecError(
            "spec.model.uri", "must not have '.' or '..' path segments, '$(' or control characters"
        )
    revision = string(m, "revision")
    if revision and (not _REVISION.match(revision) or ".." in revision):
        raise SpecError(
            "spec.model.revision",
            "must be a branch, tag, commit or version id: letters, digits and . _ - / + =, "
            f"starting with a letter or digit, without '..' (got {revision!r:.80})",
        )
    secret = string(m, "credentialsSecret")
    if secret and (len(secret) > 253 or not _DNS_SUBDOMAIN.match(secret)):
        raise SpecError(
            "spec.model.credentialsSecret", f"must be a Secret name, got {secret!r:.80}"
        )
    runtime = enum(m, "llmRuntime", "spec.model", LLM_RUNTIMES, "tensorrt-llm")
    if runtime not in SERVED_LLM_RUNTIMES:
        raise SpecError("spec.model.llmRuntime", VLLM_REFUSAL)
    return ModelSpec(variant, uri, revision, secret, runtime)


def _engine(e: Mapping[str, Any]) -> EngineSpec:
    tp = integer(e, "tensorParallelSize", "spec.engine", 1, 1, 8)
    if tp not in (1, 2, 4, 8):
        raise SpecError("spec.engine.tensorParallelSize", f"must be 1, 2, 4 or 8, got {tp}")
    products = e.get("gpuProducts") or []
    check_shape(products, shape_list(LABEL_VALUE, 16), "spec.engine.gpuProducts")
    claim = string(e, "cacheClaimName", "cosyvoice-engines") or "cosyvoice-engines"
    if len(claim) > 253 or not _DNS_SUBDOMAIN.match(claim):
        raise SpecError("spec.engine.cacheClaimName", f"must be a claim name, got {claim!r:.80}")
    return EngineSpec(
        precision=enum(e, "precision", "spec.engine", PRECISIONS, "bfloat16"),
        tensor_parallel_size=tp,
        max_batch_size=integer(e, "maxBatchSize", "spec.engine", 16, 1, 256),
        max_num_tokens=integer(e, "maxNumTokens", "spec.engine", 32768, 1, 1 << 20),
        builder_image=image(e, "builderImage", "spec.engine"),
        cache_claim_name=claim,
        gpu_products=tuple(dict.fromkeys(str(p) for p in products)),
        kv_cache_type=enum(e, "kvCacheType", "spec.engine", KV_CACHE_TYPES, "auto"),
        smooth_quant=_smooth_quant(e),
    )


def _serving(s: Mapping[str, Any], engine: EngineSpec) -> ServingSpec:
    tp = engine.tensor_parallel_size
    gpus = integer(s, "gpusPerReplica", "spec.serving", 1, 1, 8)
    if gpus % tp:
        raise SpecError(
            "spec.serving.gpusPerReplica",
            f"must be a positive multiple of spec.engine.tensorParallelSize ({tp}), got {gpus}",
        )
    db = obj(s, "dynamicBatching", "spec.serving")
    sizes = _preferred_batch_sizes(db, engine.max_batch_size)
    node_selector = s.get("nodeSelector") or {}
    check_shape(node_selector, ("map", LABEL_VALUE, 64), "spec.serving.nodeSelector")
    tolerations = s.get("tolerations") or []
    check_shape(tolerations, shape_list(TOLERATION, 32), "spec.serving.tolerations")
    affinity = s.get("affinity") or {}
    check_shape(affinity, AFFINITY, "spec.serving.affinity")
    return ServingSpec(
        image=image(s, "image", "spec.serving"),
        gpus_per_replica=gpus,
        instances_per_gpu=integer(s, "instancesPerGpu", "spec.serving", 4, 1, 8),
        streaming=boolean(s, "streaming", "spec.serving", True),
        dynamic_batching=DynamicBatching(
            preferred_batch_sizes=sizes,
            max_queue_delay_microseconds=integer(
                db, "maxQueueDelayMicroseconds", "spec.serving.dynamicBatching", 500, 0, 10**6
            ),
            priority_levels=integer(
                db, "priorityLevels", "spec.serving.dynamicBatching", 2, 0, 100
            ),
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


def _autoscaling(a: Mapping[str, Any], products: tuple[str, ...] = ()) -> AutoscalingSpec:
    up = obj(a, "scaleUp", "spec.autoscaling")
    down = obj(a, "scaleDown", "spec.autoscaling")
    min_r = integer(a, "minReplicas", "spec.autoscaling", 1, 0, 10**4)
    max_r = integer(a, "maxReplicas", "spec.autoscaling", 4, 1, 10**4)
    if min_r > max_r:
        raise SpecError(
            "spec.autoscaling.minReplicas", f"must be <= spec.autoscaling.maxReplicas ({max_r})"
        )
    schedules = parse_schedules(a, max_r)
    target = a.get("targetQueueLatencyMilliseconds", 50)
    if isinstance(target, bool) or not isinstance(target, int | float) or target <= 0:
        raise SpecError("spec.autoscaling.targetQueueLatencyMilliseconds", "must be a number > 0")
    return AutoscalingSpec(
        enabled=boolean(a, "enabled", "spec.autoscaling", False),
        mode=enum(a, "mode", "spec.autoscaling", MODES, "Active"),
        min_replicas=min_r,
        max_replicas=max_r,
        target_queue_latency_milliseconds=float(target),
        evaluation_interval_seconds=integer(
            a, "evaluationIntervalSeconds", "spec.autoscaling", 15, 1, 3600
        ),
        scale_up=ScaleRule(
            integer(up, "stabilizationWindowSeconds", "spec.autoscaling.scaleUp", 0, 0, 3600),
            integer(up, "maxStepReplicas", "spec.autoscaling.scaleUp", 4, 1, 10**4),
        ),
        scale_down=ScaleRule(
            integer(down, "stabilizationWindowSeconds", "spec.autoscaling.scaleDown", 300, 0, 3600),
            integer(down, "maxStepReplicas", "spec.autoscaling.scaleDown", 1, 1, 10**4),
        ),
        prometheus_url=string(a, "prometheusUrl"),
        schedules=schedules,
        slo=_slo(obj(a, "slo", "spec.autoscaling"), products),
    )


def _slo(s: Mapping[str, Any], products: tuple[str, ...] = ()) -> SloSpec:
    path = "spec.autoscaling.slo"
    first_chunk = integer(s, "firstChunkMilliseconds", path, 0, 0, 600_000)
    source = "spec.autoscaling.slo.firstChunkMilliseconds"
    if first_chunk == 0:  # unset: the pod profile of the GPUs the service runs on
        found = pod_profiles.for_products(products)
        first_chunk, source = found.first_chunk_busy_ms, f"{found.gpu} pod profile: {found.source}"
    slo = SloSpec(
        first_audio_milliseconds=integer(s, "firstAudioMilliseconds", path, 0, 0, 600_000),
        attainment_percent=number(s, "attainmentPercent", path, 99.0, 50.0, 99.99),
        first_chunk_milliseconds=first_chunk,
        first_chunk_source=source,
        cold_start_seconds=integer(s, "coldStartSeconds", path, 180, 0, 3600),
        forecast_std_devs=number(s, "forecastStdDevs", path, 1.0, 0.0, 10.0),
        variability=number(s, "variability", path, 1.0, 0.05, 10.0),
        slots_per_pod=integer(s, "slotsPerPod", path, 0, 0, 10_000),
        seasonal_period_hours=integer(s, "seasonalPeriodHours", path, 0, 0, 168),
        seasonal_bucket_minutes=integer(s, "seasonalBucketMinutes", path, 15, 1, 120),
        seasonal_floor_percent=number(s, "seasonalFloorPercent", path, 100.0, 0.0, 200.0),
        scale_down_hysteresis_percent=number(
            s, "scaleDownHysteresisPercent", path, 10.0, 0.0, 50.0
        ),
    )
    if slo.enabled and slo.first_chunk_milliseconds >= slo.first_audio_milliseconds:
        raise SpecError(
            f"{path}.firstChunkMilliseconds",
            f"must be below {path}.firstAudioMilliseconds ({slo.first_audio_milliseconds}): "
            "no wait at all would leave the SLO reachable"
            + (
                ""
                if source.startswith(path)
                else f" (unset, it is {slo.first_chunk_milliseconds} ms from the {source}; "
                "raise the SLO or set it from your own measurement)"
            ),
        )
    return slo
