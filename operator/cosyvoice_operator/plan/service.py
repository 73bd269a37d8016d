"""One service's engines: from its spec and the observed world to its status and the
effects that move the world towards it (pure).

A pass of the controller observes (caches fed by watches; see :class:`World`), calls
:func:`plan_service`, then carries out the :class:`Step` it returns: the creates first,
then the status patch, and the Events only once that patch is accepted. Events are derived
from the difference between the old and new status, so a pass repeated on the same world
(a conflict, a second operator) posts nothing twice.

Rules this module keeps:
- finished builds are recorded whatever else is wrong (a blocker only stops new Jobs);
- a blocker (no cache claim, no model claim, an image outside the allowlist) makes no Job;
- a record being removed by the cleanup is not an engine: it is waited for, then rebuilt.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cosyvoice_operator.api import conditions, engine_identity, gpus
from cosyvoice_operator.api.effects import (
    ApplyObject,
    CreateObject,
    DeleteObject,
    PatchObject,
    PatchStatus,
    PostEvent,
)
from cosyvoice_operator.api.labels import REMOVING_ANNOTATION
from cosyvoice_operator.api.spec import ROUTER, ServiceSpec, SpecError, parse
from cosyvoice_operator.plan import engine_state, engine_status, fleet_events, serving
from cosyvoice_operator.plan.engine_state import EngineState
from cosyvoice_operator.render import build_job, front, triton, workloads
from cosyvoice_operator.render.build_job import BuildSettings, CacheClaim
from cosyvoice_operator.render.workloads import ServingSettings

# The status fields a service pass writes; one absent from a new status is removed.
OWNED_STATUS = (
    "observedGeneration",
    "phase",
    "engines",
    "engineSummary",
    "conditions",
    "readyReplicas",
    "readySummary",
    "replicas",
    "selector",
    "serving",
    "endpoints",
)
# EngineReady reasons that deserve a Warning Event when they start to hold.
WARNING_REASONS = frozenset(
    {
        "InvalidSpec",
        "LimitExceeded",
        "CacheClaimMissing",
        "ModelClaimMissing",
        "ImageNotAllowed",
        "JobCreateFailed",
        "CredentialsSecretMissing",
        "CredentialsSecretInvalid",
        "UnknownGPUProduct",
        "PrecisionUnsupported",
        "KVCacheUnsupported",
        "NoEligibleGPUNodes",
    }
)


class World(Protocol):
    """What the controller's caches answer (read-only, no I/O)."""

    def gpu_nodes(self) -> Sequence[gpus.GPUNode]: ...

    def claim_uid(self, namespace: str, name: str) -> str | None: ...

    def record(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def jobs(self, namespace: str, key: str, tag: str) -> Sequence[Mapping[str, Any]]: ...

    def pods(self, namespace: str, job: str) -> Sequence[Mapping[str, Any]]: ...

    def deployments(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]: ...

    def owned(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def serving_pods(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]: ...


@dataclass(frozen=True)
class Limits:
    """What one service may ask of the cluster, whatever the CRD allows (operator settings
    COSYVOICE_MAX_*): a service over one gets LimitExceeded and no new objects, and what
    serves keeps serving."""

    # Replicas: spec.replicas, and spec.autoscaling.maxReplicas when autoscaling is on.
    max_replicas: int = 100
    # GPUs the service may hold at its most replicas (replicas x gpusPerReplica).
    max_gpus_per_service: int = 128
    # Triton model instances one pod runs: the orchestrator's (Python processes) and the
    # GPU models' (instancesPerGpu x gpusPerReplica each).
    max_instances_per_pod: int = 1024
    # The spec as JSON: what every cached copy and rendered Deployment carries.
    max_spec_bytes: int = 65536


@dataclass(frozen=True)
class Policy:
    """Operator settings the planners need."""

    build: BuildSettings = field(default_factory=BuildSettings)
    serving: ServingSettings = field(default_factory=ServingSettings)
    # Image prefixes services may name (empty: any image).
    allowed_image_prefixes: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)


def limit_problem(
    raw: Mapping[str, Any], svc: ServiceSpec, limits: Limits
) -> tuple[str, str] | None:
    """(field, why) of the first of the operator's limits the service is over, or None."""
    size = len(json.dumps(raw, separators=(",", ":"), default=str))
    if size > limits.max_spec_bytes:
        return "spec", (
            f"{size} bytes of JSON, over the operator's limit of {limits.max_spec_bytes} "
            "(COSYVOICE_MAX_SPEC_BYTES)"
        )
    a = svc.autoscaling
    autoscaled = a.enabled and a.max_replicas >= svc.replicas
    most = a.max_replicas if autoscaled else svc.replicas
    where = "spec.autoscaling.maxReplicas" if autoscaled else "spec.replicas"
    if most > limits.max_replicas:
        return where, (
            f"{most} replicas, over the operator's limit of {limits.max_replicas} per service "
            "(COSYVOICE_MAX_REPLICAS)"
        )
    gpus = most * svc.serving.gpus_per_replica
    if gpus > limits.max_gpus_per_service:
        return where, (
            f"{most} replicas of {svc.serving.gpus_per_replica} GPUs (spec.serving."
            f"gpusPerReplica) are {gpus} GPUs, over the operator's limit of "
            f"{limits.max_gpus_per_service} per service (COSYVOICE_MAX_GPUS_PER_SERVICE)"
        )
    instances = instances_per_pod(svc)
    if instances > limits.max_instances_per_pod:
        return "spec.serving", (
            f"{instances} Triton model instances per pod (the orchestrator's "
            f"{triton.orchestrator_instances(svc)}, from spec.engine.maxBatchSize and "
            "gpusPerReplica, and instancesPerGpu x gpusPerReplica of each GPU model), over "
            f"the operator's limit of {limits.max_instances_per_pod} "
            "(COSYVOICE_MAX_INSTANCES_PER_POD)"
        )
    return None


def instances_per_pod(svc: ServiceSpec) -> int:
    """The Triton model instances of one pod: the orchestrator's (Python processes) and, per
    other model of the variant's repository, instancesPerGpu on each of the pod's GPUs."""
    others = len(triton.MODEL_NAMES[svc.model.variant]) - 1
    per_gpu = svc.serving.instances_per_gpu * svc.serving.gpus_per_replica
    return triton.orchestrator_instances(svc) + others * per_gpu


# Status fields and conditions the autoscaler writes; removed when it is turned off.
AUTOSCALER_CONDITIONS = frozenset({"ScalingActive", "MetricsAvailable", "ScalingConflict"})


@dataclass(frozen=True)
class EngineRef:
    """An engine as the caches index it: namespace, cache-claim tag, key."""

    namespace: str
    tag: str
    key: str


@dataclass(frozen=True)
class Step:
    creates: tuple[CreateObject, ...] = ()
    # The serving workloads: applied, scaled or deleted after the creates.
    workloads: tuple[ApplyObject | PatchObject | DeleteObject, ...] = ()
    status: PatchStatus | None = None
    events: tuple[PostEvent, ...] = ()
    # When the pass must run again although nothing it watches changes (a retry time).
    requeue_after: float | None = None
    # The engines this service wants: the controller routes Job, pod and record events by it.
    wants: frozenset[EngineRef] = frozenset()
    # Engine keys its Deployments serve now (the cleanup keeps them).
    served_keys: frozenset[str] = frozenset()


def image_problem(image: str, field_path: str, prefixes: Sequence[str]) -> str | None:
    """Why `image` may not be used, or None (an empty image means the operator's default)."""
    if not image or not prefixes or any(image.startswith(p) for p in prefixes):
        return None
    return (
        f"{field_path} {image!r} is not under an allowed image prefix "
        f"({', '.join(prefixes)}); use an image from one of them, or ask the platform team "
        "to allow yours (chart value imagePolicy.allowedPrefixes)"
    )


def blockers_of(
    svc: ServiceSpec, namespace: str, world: World, policy: Policy
) -> tuple[list[engine_status.Blocker], CacheClaim | None]:
    """What keeps new build Jobs from being made, and the cache claim when it exists."""
    found: list[engine_status.Blocker] = []
    for image, where in (
        (svc.engine.builder_image, "spec.engine.builderImage"),
        (svc.serving.image, "spec.serving.image"),
    ):
        why = image_problem(image, where, policy.allowed_image_prefixes)
        if why:
            found.append(engine_status.Blocker("ImageNotAllowed", why))
    claim = svc.engine.cache_claim_name
    uid = world.claim_uid(namespace, claim)
    if uid is None:
        found.append(
            engine_status.Blocker(
                "CacheClaimMissing",
                f"PersistentVolumeClaim {namespace}/{claim} (spec.engine.cacheClaimName) does not "
                "exist: create a ReadWriteMany claim of that name for the engine cache",
            )
        )
    model_claim = svc.model.pvc_claim
    if model_claim and world.claim_uid(namespace, model_claim) is None:
        found.append(
            engine_status.Blocker(
                "ModelClaimMissing",
                f"PersistentVolumeClaim {namespace}/{model_claim} (from spec.model.uri) "
                "does not exist",
            )
        )
    return found, (CacheClaim(claim, uid) if uid is not None else None)


def _engine(
    target: engine_identity.EngineTarget,
    svc: ServiceSpec,
    namespace: str,
    world: World,
    policy: Policy,
    cache: CacheClaim,
    blocked: bool,
    refused: Mapping[str, str],
    now: dt.datetime,
) -> tuple[EngineState, list[CreateObject]]:
    """The state of one engine, and what to create for it."""
    ident = target.identity
    record = world.record(namespace, build_job.record_name(ident, cache))
    if record is not None and ((record.get("metadata") or {}).get("annotations") or {}).get(
        REMOVING_ANNOTATION
    ):
        return (
            EngineState(
                "Pending",
                f"engine {ident.key} is being removed by the cleanup (no service used it for "
                "the retention period); it is built again once that is done",
            ),
            [],
        )
    jobs = world.jobs(namespace, ident.key, cache.tag) if record is None else []
    latest = engine_state.latest_job(jobs)
    pods = world.pods(namespace, str(latest["metadata"]["name"])) if latest is not None else []
    st = engine_state.assess(ident, record, jobs, pods, now, policy.build)
    creates: list[CreateObject] = []
    if st.action == "create":
        if blocked:
            # Only a build still to be made waits for the blocker; the status says which.
            return EngineState("Pending", "blocked", attempts=st.next_attempt - 1), []
        job = build_job.render_job(target, svc, namespace, st.next_attempt, policy.build, cache)
        name = str(job["metadata"]["name"])
        if name in refused:
            message = (
                f"the API server refused build Job {name}: {refused[name]}; retried with backoff"
            )
            return (
                EngineState(
                    "Pending", message, attempts=st.next_attempt - 1, reason="JobCreateFailed"
                ),
                [],
            )
        creates.append(CreateObject(job))
        st = EngineState(
            "Building",
            f"{name} started (attempt {st.next_attempt})",
            job=name,
            attempts=st.next_attempt,
        )
    elif st.action in ("record", "record-failure"):
        failed = st.action == "record-failure"
        creates.append(
            CreateObject(
                build_job.render_record(
                    ident,
                    namespace,
                    st.job,
                    st.message if failed else st.result,
                    now,
                    cache,
                    state="Failed" if failed else "Ready",
                    manifest_sha256="" if failed else st.manifest_sha256,
                )
            )
        )
    if st.state in ("Pending", "Building") and st.job:
        problem = engine_state.credentials_problem(pods)
        if problem is not None:
            reason, message = problem
            st = EngineState("Pending", message, job=st.job, attempts=st.attempts, reason=reason)
    return st, creates


def _changes(previous: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Only what changed; an owned field the new status lacks is removed (null)."""
    changes = {key: value for key, value in new.items() if previous.get(key) != value}
    for key in OWNED_STATUS:
        if key not in new and previous.get(key) is not None:
            changes[key] = None
    return changes


def _engine_ready(st: Mapping[str, Any]) -> Mapping[str, Any]:
    for cond in st.get("conditions") or []:
        if cond.get("type") == "EngineReady":
            return dict(cond)
    return {}


def transitions(previous: Mapping[str, Any], new: Mapping[str, Any]) -> list[PostEvent]:
    """The Events a status change deserves, only those a user needs (each once, when it
    starts): a build that failed, a retry of it and the engine it then makes, and a problem
    that begins. A first build that just works posts none: the status says it, and its
    writes are kept to the build Job, the record and two status writes."""
    events: list[PostEvent] = []
    before = {e.get("key"): e for e in previous.get("engines") or [] if e.get("key")}
    seen: set[str] = set()
    for entry in new.get("engines") or []:
        key = entry.get("key")
        if not key or key in seen:
            continue
        seen.add(key)
        old = before.get(key) or {}
        state, job = entry.get("state"), entry.get("job")
        where = f"engine {key} ({entry.get('gpuArch')})"
        retried = int(entry.get("attempts") or 0) > 1
        if (
            state == "Building"
            and retried
            and (old.get("state") != "Building" or old.get("job") != job)
        ):
            events.append(
                PostEvent(
                    "Normal",
                    "EngineBuildStarted",
                    f"{where}: build Job {job}, attempt {entry.get('attempts')}",
                )
            )
        elif state == "Ready" and retried and old.get("state") != "Ready":
            events.append(PostEvent("Normal", "EngineReady", f"{where}: {entry.get('message')}"))
        elif state == "Failed" and (
            old.get("state") != "Failed" or old.get("attempts") != entry.get("attempts")
        ):
            events.append(
                PostEvent("Warning", "EngineBuildFailed", f"{where}: {entry.get('message')}")
            )
    cond, old_cond = _engine_ready(new), _engine_ready(previous)
    reason = cond.get("reason")
    if reason in WARNING_REASONS and (
        old_cond.get("reason") != reason or old_cond.get("status") != cond.get("status")
    ):
        events.append(PostEvent("Warning", str(reason), str(cond.get("message", ""))))
    return events


def _recorded(states: Mapping[str, EngineState]) -> dict[str, EngineState]:
    """The engine states serving goes by: an engine built but not recorded yet (this pass
    records it) is not served yet, so the pass that turns EngineReady writes nothing for
    serving; the next one, on the record, does."""
    return {
        key: dataclasses.replace(st, state="Building") if st.action == "record" else st
        for key, st in states.items()
    }


def plan_service(
    body: Mapping[str, Any],
    world: World,
    now: dt.datetime,
    policy: Policy,
    refused: Mapping[str, str] | None = None,
) -> Step:
    """The whole decision for one service. `refused` names the Jobs the API server refused
    in this pass (Job name -> its message): they are reported instead of created again."""
    refused = refused or {}
    meta = body.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    generation = int(meta.get("generation") or 0)
    version = str(meta.get("resourceVersion") or "")
    previous = dict(body.get("status") or {})
    reason = "InvalidSpec"
    try:
        svc = parse(body.get("spec") or {})
        over = limit_problem(body.get("spec") or {}, svc, policy.limits)
        if over:
            reason = "LimitExceeded"
            raise SpecError(*over)
    except SpecError as exc:
        new = engine_status.engine_status(None, {}, [], str(exc), previous, generation, now, reason)
        # What serves keeps serving: the serving fields stay as they were.
        for key in (
            "replicas",
            "readyReplicas",
            "readySummary",
            "selector",
            "serving",
            "endpoints",
        ):
            if key in previous:
                new.setdefault(key, previous[key])
        return _step(previous, new, version, [], None, frozenset())
    nodes = [] if svc.engine.gpu_products else list(world.gpu_nodes())
    plan = engine_identity.plan(
        svc, nodes, policy.build.default_builder_image, policy.build.companion_pins
    )
    blockers, cache = blockers_of(svc, namespace, world, policy)
    states: dict[str, EngineState] = {}
    creates: list[CreateObject] = []
    wants: set[EngineRef] = set()
    for target in plan.targets:
        if cache is None:
            states[target.key] = EngineState("Pending", "blocked")
            continue
        wants.add(EngineRef(namespace, cache.tag, target.key))
        st, made = _engine(
            target, svc, namespace, world, policy, cache, bool(blockers), refused, now
        )
        states[target.key] = st
        creates.extend(made)
    new = engine_status.engine_status(plan, states, blockers, None, previous, generation, now)
    image = workloads.serving_image(svc, policy.serving)
    blocked = image_problem(image, "the serving image", policy.allowed_image_prefixes) or ""
    router_blocked = ""
    if svc.routing.mode == ROUTER:
        router_image = front.router_image(svc, policy.serving)
        where = "spec.routing.router.image" if svc.routing.router.image else "the router image"
        router_blocked = image_problem(router_image, where, policy.allowed_image_prefixes) or ""
    served = serving.plan_serving(
        body, svc, plan, _recorded(states), world, policy.serving, refused, blocked, router_blocked
    )
    new.update(served.status)
    new["conditions"] = conditions.merge(new["conditions"], served.conditions, generation, now)
    if not svc.autoscaling.enabled:
        _forget_autoscaler(previous, new)
    engines_ready = any(
        c["type"] == "EngineReady" and c["status"] == "True" for c in new["conditions"]
    )
    if engines_ready and new["phase"] == "Deploying" and served.ready:
        new["phase"] = "Ready"
    due = [t for s in states.values() for t in (s.next_retry, s.look_again) if t is not None]
    requeue = max(0.0, (min(due) - now).total_seconds()) + 0.5 if due else None
    resized = fleet_events.resize_event(previous, new, svc)
    return _step(
        previous,
        new,
        version,
        creates,
        requeue,
        frozenset(wants),
        served.effects,
        served.served_keys,
        (resized,) if resized else (),
    )


def _forget_autoscaler(previous: Mapping[str, Any], new: dict[str, Any]) -> None:
    """With autoscaling off, what the autoscaler left (status.autoscaling and its conditions)
    goes: it describes a loop that no longer runs."""
    if previous.get("autoscaling") is not None:
        new["autoscaling"] = None
    new["conditions"] = [
        c for c in new.get("conditions") or [] if c.get("type") not in AUTOSCALER_CONDITIONS
    ]


def _step(
    previous: Mapping[str, Any],
    new: Mapping[str, Any],
    version: str,
    creates: list[CreateObject],
    requeue: float | None,
    wants: frozenset[EngineRef],
    workloads: tuple[ApplyObject | PatchObject | DeleteObject, ...] = (),
    served_keys: frozenset[str] = frozenset(),
    more_events: tuple[PostEvent, ...] = (),
) -> Step:
    changes = _changes(previous, new)
    return Step(
        creates=tuple(creates),
        workloads=workloads,
        served_keys=served_keys,
        status=PatchStatus(changes, version) if changes else None,
        events=(*transitions(previous, new), *more_events) if changes else (),
        requeue_after=requeue,
        wants=wants,
    )
