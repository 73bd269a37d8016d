"""What a service serves, and from which engine (pure).

Given the engine states of one pass and the workloads the caches hold, decide per GPU
architecture which engine its Deployment serves, how many replicas it gets, what to apply
and what to report.

Engine changes without downtime: when an architecture's engine key changes (a precision
change, say) and the new engine is not Ready yet, that architecture's Deployment is left as
it is, serving the old engine (only its replica count follows the spec); once the new engine
is Ready the Deployment is rendered for it and rolls (maxUnavailable 0). A new build that
fails leaves the old fleet serving, and `Progressing` says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cosyvoice_operator.api import gpus
from cosyvoice_operator.api.effects import ApplyObject, DeleteObject, PatchObject
from cosyvoice_operator.api.engine_identity import EnginePlan
from cosyvoice_operator.api.labels import (
    ARCH_LABEL,
    CHECKPOINT_ANNOTATION,
    COMPONENT_LABEL,
    ROUTER_COMPONENT,
    SERVED_KEY_ANNOTATION,
    SERVING_COMPONENT,
)
from cosyvoice_operator.api.spec import GATEWAY_API, ROUTER, ServiceSpec
from cosyvoice_operator.autoscaling.evaluation import desired_replicas
from cosyvoice_operator.plan.engine_state import EngineState
from cosyvoice_operator.render import front, workloads
from cosyvoice_operator.render.workloads import ArchServing, ServingSettings


class ServingWorld(Protocol):
    def gpu_nodes(self) -> Sequence[gpus.GPUNode]: ...

    def deployments(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]: ...

    def owned(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def serving_pods(self, namespace: str, service: str) -> Sequence[Mapping[str, Any]]: ...


@dataclass(frozen=True)
class ServingPlan:
    effects: tuple[ApplyObject | PatchObject | DeleteObject, ...] = ()
    status: Mapping[str, Any] = field(default_factory=dict)
    conditions: tuple[Mapping[str, Any], ...] = ()
    # Engine keys the Deployments serve now (kept from cleanup while they do).
    served_keys: frozenset[str] = frozenset()
    ready: bool = False


def is_router(obj: Mapping[str, Any]) -> bool:
    """A router object or pod (it carries the service's label too: render/front.py)."""
    found = (obj.get("metadata") or {}).get("labels") or {}
    return found.get(COMPONENT_LABEL) == ROUTER_COMPONENT


def _arch_of(deployment: Mapping[str, Any]) -> str:
    return str(((deployment.get("metadata") or {}).get("labels") or {}).get(ARCH_LABEL, ""))


def served_key(deployment: Mapping[str, Any]) -> str:
    return str(
        ((deployment.get("metadata") or {}).get("annotations") or {}).get(SERVED_KEY_ANNOTATION, "")
    )


def served_checkpoint(deployment: Mapping[str, Any]) -> str:
    """The vLLM checkpoint a Deployment names ("" for every Deployment rendered since vLLM was
    refused, issue 19 item 9). One rendered before may still be there, frozen or retired: its
    checkpoint is kept by the cleanup for as long as it is."""
    notes = (deployment.get("metadata") or {}).get("annotations") or {}
    return str(notes.get(CHECKPOINT_ANNOTATION, ""))


def _count(deployment: Mapping[str, Any], field_name: str) -> int:
    return int((deployment.get("status") or {}).get(field_name) or 0)


def unschedulable(pods: Sequence[Mapping[str, Any]]) -> str:
    """The scheduler's message for a serving pod it cannot place, if any."""
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if (
                cond.get("type") == "PodScheduled"
                and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"
            ):
                name = (pod.get("metadata") or {}).get("name")
                return f"pod {name} cannot be scheduled: {cond.get('message') or 'Unschedulable'}"
    return ""


Effect = ApplyObject | PatchObject | DeleteObject


def _names(effects: Sequence[Effect]) -> set[str]:
    return {e.name for e in effects}


@dataclass(frozen=True)
class _Engines:
    """Which engine each architecture serves in this pass."""

    # arch -> (key, products): rendered for its Ready engine
    fresh: dict[str, tuple[str, tuple[str, ...]]]
    # arch -> Deployment left on its old engine while the new one is not Ready
    frozen: dict[str, Mapping[str, Any]]
    # why each frozen architecture waits
    waiting: list[str]
    # key -> the sha256 of its manifest as recorded ("" unknown)
    digests: Mapping[str, str] = field(default_factory=dict)

    @property
    def served(self) -> list[str]:
        return sorted(set(self.fresh) | set(self.frozen))


def plan_serving(
    body: Mapping[str, Any],
    svc: ServiceSpec,
    plan: EnginePlan,
    states: Mapping[str, EngineState],
    world: ServingWorld,
    settings: ServingSettings,
    refused: Mapping[str, str] | None = None,
    blocked: str = "",
    router_blocked: str = "",
) -> ServingPlan:
    """`refused` names objects the API server refused to take in this pass (name -> its
    message): they are reported, and tried again with backoff. `blocked` says why nothing
    new may be rendered (the serving image is not allowed): the Deployments there are keep
    their engine and image, only their replica count follows, and Progressing says why.
    `router_blocked` says why the router's Deployment may not be rendered (its image is not
    allowed): the one there is left as it is, and Progressing says why."""
    refused = refused or {}
    meta = body.get("metadata") or {}
    name, namespace = str(meta.get("name")), str(meta.get("namespace"))
    existing = {_arch_of(d): d for d in world.deployments(namespace, name) if not is_router(d)}
    desired_total = desired_replicas(svc, body.get("status") or {})
    engines = _choose_engines(plan, states, existing)
    if blocked:
        frozen = {a: d for a, d in existing.items() if a in engines.fresh or a in engines.frozen}
        engines = _Engines({}, frozen, [blocked], engines.digests)
    served = engines.served
    capacity = _capacity_by_arch(svc, plan, world)
    shares = workloads.split_replicas(desired_total, [(a, capacity.get(a, 0)) for a in served])
    effects, keys = _workload_effects(body, svc, engines, shares, world, settings)
    retired, kept = _retired_deployments(svc, plan, existing, world, namespace)
    effects += retired
    keys |= kept
    if served:
        effects += _front_effects(
            body, svc, namespace, world, settings, bool(blocked or router_blocked)
        )
    status = _serving_status(svc, name, namespace, existing, engines, shares, desired_total)
    ready = int(status["readyReplicas"])
    updated = _rolled_out(existing, engines.fresh)
    stuck = unschedulable(world.serving_pods(namespace, name))
    rejected = [f"{n}: {m}" for n, m in sorted(refused.items()) if n in _names(effects)]
    progressing = _progressing(
        status, desired_total, rejected, stuck, engines.waiting, effects, updated
    )
    if served and svc.routing.mode == GATEWAY_API and not settings.gateway_api:
        progressing = {
            "type": "Progressing",
            "status": "False",
            "reason": "GatewayAPIDisabled",
            "message": "spec.routing.mode GatewayAPI: this operator does not write Gateway API "
            "objects (chart value gatewayAPI.enabled, COSYVOICE_GATEWAY_API); "
            f"{workloads.service_name(name)} selects the Triton pods, as in mode Service",
        }
    if blocked or router_blocked:
        progressing = {
            "type": "Progressing",
            "status": "False",
            "reason": "ImageNotAllowed",
            "message": "; ".join(m for m in (blocked, router_blocked) if m),
        }
    conditions = (_available(bool(served), ready, desired_total, stuck), progressing)
    all_ready = bool(served) and ready >= desired_total and not engines.frozen and not effects
    return ServingPlan(
        effects=tuple(effects),
        status=status,
        conditions=conditions,
        served_keys=frozenset(keys),
        ready=all_ready and updated,
    )


def _capacity_by_arch(svc: ServiceSpec, plan: EnginePlan, world: ServingWorld) -> dict[str, int]:
    """GPUs the service may use per architecture: the weights of the replica split."""
    capacity: dict[str, int] = {}
    s = svc.serving
    for node in gpus.eligible_nodes(
        world.gpu_nodes(), s.node_selector, s.tolerations, s.affinity, s.gpus_per_replica
    ):
        for target in plan.targets:
            if node.product in target.products:
                arch = target.identity.gpu_arch
                capacity[arch] = capacity.get(arch, 0) + node.gpus
    return capacity


def _choose_engines(
    plan: EnginePlan, states: Mapping[str, EngineState], existing: Mapping[str, Mapping[str, Any]]
) -> _Engines:
    """Each architecture with a Ready engine serves it; one whose new engine is not Ready yet
    keeps its Deployment on the old one (see the module docstring)."""
    fresh: dict[str, tuple[str, tuple[str, ...]]] = {}
    frozen: dict[str, Mapping[str, Any]] = {}
    waiting: list[str] = []
    digests: dict[str, str] = {}
    for target in plan.targets:
        arch = target.identity.gpu_arch
        st = states[target.key]
        if st.state == "Ready":
            fresh[arch] = (target.key, target.products)
            digests[target.key] = st.manifest_sha256
        elif arch in existing:
            frozen[arch] = existing[arch]
            old = served_key(existing[arch])
            waiting.append(
                f"{arch} serves engine {old[:12]} until engine {target.key[:12]} is built "
                f"({st.state}: {st.message})"
            )
    return _Engines(fresh, frozen, waiting, digests)


def _workload_effects(
    body: Mapping[str, Any],
    svc: ServiceSpec,
    engines: _Engines,
    shares: Mapping[str, int],
    world: ServingWorld,
    settings: ServingSettings,
) -> tuple[list[Effect], set[str]]:
    """The repository ConfigMap and Deployment of each fresh architecture, applied when they
    changed; the replica count of each frozen one; and the engine keys they serve."""
    namespace = str((body.get("metadata") or {}).get("namespace"))
    effects: list[Effect] = []
    keys: set[str] = set()
    for arch in sorted(engines.fresh):
        key, products = engines.fresh[arch]
        keys.add(key)
        target = ArchServing(arch, key, products, shares[arch], engines.digests.get(key, ""))
        for obj in workloads.render_architecture(body, svc, target, namespace, settings):
            seen = world.owned(obj["kind"], namespace, obj["metadata"]["name"])
            drifted = (
                obj["kind"] == "Deployment"
                and seen is not None
                and ((seen.get("spec") or {}).get("replicas") != obj["spec"]["replicas"])
            )  # scaled by a merge patch while frozen, or by hand: the hash alone would miss it
            if drifted or workloads.applied_hash(seen) != workloads.applied_hash(obj):
                effects.append(ApplyObject(obj))
    for arch, stale in sorted(engines.frozen.items()):
        keys.update(k for k in (served_key(stale), served_checkpoint(stale)) if k)
        if int((stale.get("spec") or {}).get("replicas") or 0) != shares[arch]:
            effects.append(
                PatchObject(
                    "Deployment",
                    namespace,
                    str(stale["metadata"]["name"]),
                    {"spec": {"replicas": shares[arch]}},
                )
            )
    return effects, keys


def _retired_deployments(
    svc: ServiceSpec,
    plan: EnginePlan,
    existing: Mapping[str, Mapping[str, Any]],
    world: ServingWorld,
    namespace: str,
) -> tuple[list[Effect], set[str]]:
    """The Deployments of architectures the service no longer runs on, deleted; and the keys
    of those left as they are while their architecture still has GPU nodes."""
    planned_archs = {t.identity.gpu_arch for t in plan.targets}
    retired = {a: d for a, d in existing.items() if a not in planned_archs}
    present = _present_archs(svc, world) if retired else set()  # every node: only if needed
    effects: list[Effect] = []
    keys: set[str] = set()
    for arch, gone in sorted(retired.items()):
        if not svc.engine.gpu_products and arch in present:
            # left as it is, its engine (and an old vLLM checkpoint) kept by the cleanup
            keys.update(k for k in (served_key(gone), served_checkpoint(gone)) if k)
            continue
        dmeta = gone.get("metadata") or {}
        effects.append(
            DeleteObject(
                "Deployment",
                namespace,
                str(dmeta.get("name")),
                str(dmeta.get("uid") or ""),
                f"the service no longer runs on {arch}",
            )
        )
    return effects, keys


def _present_archs(svc: ServiceSpec, world: ServingWorld) -> set[str]:
    """Architectures that still have GPU nodes the service may use, Ready or not: a drained,
    NotReady or cordoned node must not take its architecture's fleet down; only the spec,
    or the last node of the architecture leaving the cluster, does."""
    present: set[str] = set()
    for node in world.gpu_nodes():
        whatever_its_state = dataclasses.replace(
            node, ready=True, gpus=max(node.gpus, svc.serving.gpus_per_replica)
        )
        if not gpus.eligible(
            whatever_its_state,
            svc.serving.node_selector,
            svc.serving.tolerations,
            svc.serving.affinity,
            svc.serving.gpus_per_replica,
        ):
            continue  # the spec keeps the service off this node
        with contextlib.suppress(gpus.UnknownGPUProduct):
            present.add(gpus.architecture(node.product))
    return present


def _front_effects(
    body: Mapping[str, Any],
    svc: ServiceSpec,
    namespace: str,
    world: ServingWorld,
    settings: ServingSettings,
    router_blocked: bool = False,
) -> list[Effect]:
    """What stands in front of the Triton pods for the routing mode (render/front.py),
    applied when it changed; the router's own objects deleted in the other modes. While an
    image is blocked the router Deployment is left as it is."""
    name = str((body.get("metadata") or {}).get("name"))
    effects: list[Effect] = []
    objects = front.front_objects(body, svc, namespace, settings, router_allowed=not router_blocked)
    for obj in objects:
        seen = world.owned(obj["kind"], namespace, obj["metadata"]["name"])
        if workloads.applied_hash(seen) != workloads.applied_hash(obj):
            effects.append(ApplyObject(obj))
    if svc.routing.mode != ROUTER:
        for kind, names in front.router_object_names(name).items():
            for gone in names:
                seen = world.owned(kind, namespace, gone)
                if seen is not None:
                    uid = str((seen.get("metadata") or {}).get("uid") or "")
                    why = f"spec.routing.mode is {svc.routing.mode}: no router"
                    effects.append(DeleteObject(kind, namespace, gone, uid, why))
    return effects


def _serving_status(
    svc: ServiceSpec,
    name: str,
    namespace: str,
    existing: Mapping[str, Mapping[str, Any]],
    engines: _Engines,
    shares: Mapping[str, int],
    desired_total: int,
) -> dict[str, Any]:
    """replicas, readyReplicas, selector, the READY column, one entry per architecture served,
    and the endpoints once anything is served."""
    served = engines.served
    replicas = sum(_count(d, "replicas") for a, d in existing.items() if a in served)
    ready = sum(_count(d, "readyReplicas") for a, d in existing.items() if a in served)
    entries = [
        {
            "gpuArch": arch,
            "deployment": workloads.deployment_name(name, arch),
            "engineKey": (
                engines.fresh[arch][0]
                if arch in engines.fresh
                else served_key(engines.frozen[arch])
            ),
            "desiredReplicas": shares[arch],
            "readyReplicas": _count(existing[arch], "readyReplicas") if arch in existing else 0,
        }
        for arch in served
    ]
    status: dict[str, Any] = {
        "replicas": replicas,
        "readyReplicas": ready,
        "selector": _selector(svc, name),
        "readySummary": f"{ready}/{desired_total}",
        "serving": entries,
    }
    if served:
        status["endpoints"] = front.endpoints(svc, name, namespace)
    return status


def _selector(svc: ServiceSpec, name: str) -> str:
    """The scale subresource's selector: the Triton pods (not the router's, mode Router)."""
    if svc.routing.mode == ROUTER:
        return f"{workloads.selector(name)},{COMPONENT_LABEL}={SERVING_COMPONENT}"
    return workloads.selector(name)


def _rolled_out(
    existing: Mapping[str, Mapping[str, Any]], fresh: Mapping[str, tuple[str, tuple[str, ...]]]
) -> bool:
    """Whether every fresh architecture's Deployment has rolled out its current spec."""
    return all(
        _count(d, "updatedReplicas") >= int((d.get("spec") or {}).get("replicas") or 0)
        and int((d.get("status") or {}).get("observedGeneration") or 0)
        >= int((d.get("metadata") or {}).get("generation") or 0)
        for a, d in existing.items()
        if a in fresh
    )


def _available(served: bool, ready: int, desired_total: int, stuck: str) -> dict[str, str]:
    if not served:
        return {
            "type": "Available",
            "status": "False",
            "reason": "EnginesNotReady",
            "message": "serving starts once an engine is built for the service's GPUs",
        }
    if ready >= max(1, desired_total) or (desired_total == 0 and ready == 0):
        return {
            "type": "Available",
            "status": "True",
            "reason": "ReplicasReady",
            "message": f"{ready}/{desired_total} Triton replicas ready",
        }
    return {
        "type": "Available",
        "status": "False",
        "reason": "ReplicasNotReady",
        "message": f"{ready}/{desired_total} Triton replicas ready"
        + (f"; {stuck}" if stuck else ""),
    }


def _progressing(
    status: Mapping[str, Any],
    desired_total: int,
    rejected: Sequence[str],
    stuck: str,
    waiting: Sequence[str],
    effects: Sequence[Effect],
    updated: bool,
) -> dict[str, str]:
    """Progressing: a refused apply first, then unschedulable pods, then a new engine being
    waited for, then a rollout in progress, else Complete."""
    entries = status["serving"]
    served, ready = bool(entries), int(status["readyReplicas"])
    if rejected:
        return {
            "type": "Progressing",
            "status": "False",
            "reason": "ApplyFailed",
            "message": "the API server refused " + "; ".join(rejected),
        }
    if stuck:
        return {
            "type": "Progressing",
            "status": "False",
            "reason": "Unschedulable",
            "message": stuck,
        }
    if waiting:
        failed = any("Failed" in w for w in waiting)
        return {
            "type": "Progressing",
            "status": "False" if failed else "True",
            "reason": "NewEngineFailed" if failed else "WaitingForEngine",
            "message": "; ".join(waiting),
        }
    if served and (effects or not updated or ready < desired_total):
        return {
            "type": "Progressing",
            "status": "True",
            "reason": "RollingOut",
            "message": f"{ready}/{desired_total} replicas ready on "
            + ", ".join(f"{e['gpuArch']} ({e['desiredReplicas']})" for e in entries),
        }
    return {
        "type": "Progressing",
        "status": "False" if not served else "True",
        "reason": "Complete" if served else "EnginesNotReady",
        "message": "every replica serves its architecture's current engine"
        if served
        else "nothing to deploy yet",
    }
