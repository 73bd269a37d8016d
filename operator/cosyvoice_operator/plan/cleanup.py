"""Engine cleanup in one namespace: superseded builds stopped, unused engines removed (pure).

Two rules, each conservative on purpose:
- A build Job is *superseded* when no service of its namespace, with its cache claim, still
  asks for an engine of the same inputs on any architecture. The architecture is left out
  on purpose: GPU nodes that go NotReady for a minute change which architectures a service
  wants, and a four-hour build must not be killed for that. A superseded Job is deleted once
  it has been superseded for a grace period (the controller remembers since when).
- An engine (its record) that no service references is marked with the time it became
  unreferenced; once that is older than the retention period it is marked as being removed,
  a cleanup Job removes its directory from the cache claim, and only when that Job has
  succeeded is the record deleted. A service that wants the engine again while it is being
  removed waits for the removal and then builds it again (service.py): the removal is
  never raced. An engine a service references is never touched, and its mark is cleared.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cosyvoice_operator.api import conditions, engine_identity
from cosyvoice_operator.api.effects import CreateObject, DeleteObject, PatchObject
from cosyvoice_operator.api.engine_identity import EngineIdentity
from cosyvoice_operator.api.labels import (
    ARCH_LABEL,
    BUILD_COMPONENT,
    CLAIM_ANNOTATION,
    CLAIM_LABEL,
    CLAIM_UID_ANNOTATION,
    CLEANUP_COMPONENT,
    COMPONENT_LABEL,
    IDENTITY_ANNOTATION,
    KEY_LABEL,
    REMOVING_ANNOTATION,
    UNREFERENCED_ANNOTATION,
)
from cosyvoice_operator.api.spec import SpecError, parse
from cosyvoice_operator.plan.service import Policy, World
from cosyvoice_operator.render import build_job
from cosyvoice_operator.render.build_job import CacheClaim


@dataclass(frozen=True)
class CleanupSettings:
    retention_seconds: float = 7 * 24 * 3600
    superseded_grace_seconds: float = 30.0


@dataclass(frozen=True)
class CleanupPlan:
    effects: tuple[CreateObject | DeleteObject | PatchObject, ...] = ()
    # Jobs found superseded now (uid -> since when), for the controller to remember.
    superseded: Mapping[str, dt.datetime] = field(default_factory=dict)
    requeue_after: float | None = None


def loose_key(identity: EngineIdentity) -> str:
    """The key of an engine's inputs on any architecture."""
    return replace(identity, gpu_arch="").key


def identity_of(obj: Mapping[str, Any]) -> EngineIdentity | None:
    """The identity a build Job (annotation) or record (data) was made for."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(IDENTITY_ANNOTATION) or (
        obj.get("data") or {}
    ).get("identity")
    try:
        return engine_identity.identity_from_dict(json.loads(raw or ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def wanted(
    namespace: str, services: Iterable[Mapping[str, Any]], world: World, policy: Policy
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """(claim tag, key) of every engine the services want, and (claim tag, loose key)."""
    exact: set[tuple[str, str]] = set()
    loose: set[tuple[str, str]] = set()
    nodes = world.gpu_nodes()
    for body in services:
        try:
            svc = parse(body.get("spec") or {})
        except SpecError:
            continue
        uid = world.claim_uid(namespace, svc.engine.cache_claim_name)
        if uid is None:
            continue
        tag = CacheClaim(svc.engine.cache_claim_name, uid).tag
        plan = engine_identity.plan(
            svc, [] if svc.engine.gpu_products else nodes, policy.build.default_builder_image
        )
        # vLLM's checkpoint has no architecture: its exact key is its loose key too.
        for target in plan.builds:
            exact.add((tag, target.key))
        base = engine_identity.identity(svc, "", policy.build.default_builder_image)
        loose.add((tag, base.key))
        checkpoint = engine_identity.checkpoint_identity(svc, policy.build.default_builder_image)
        if checkpoint is not None:
            loose.add((tag, checkpoint.key))
    return exact, loose


def _finished(job: Mapping[str, Any]) -> str:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in (
            "Complete",
            "SuccessCriteriaMet",
        ):
            return "Complete"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "Failed"
    return ""


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _build_jobs_of(
    namespace: str, tag: str, key: str, jobs: Sequence[Mapping[str, Any]]
) -> list[DeleteObject]:
    found = []
    for job in jobs:
        labels = _labels(job)
        if (
            labels.get(COMPONENT_LABEL) == BUILD_COMPONENT
            and labels.get(CLAIM_LABEL) == tag
            and labels.get(KEY_LABEL) == key
        ):
            meta = job.get("metadata") or {}
            found.append(
                DeleteObject(
                    "Job",
                    namespace,
                    str(meta.get("name")),
                    str(meta.get("uid") or ""),
                    f"engine {key} is being removed",
                )
            )
    return found


def plan_cleanup(
    namespace: str,
    services: Sequence[Mapping[str, Any]],
    jobs: Sequence[Mapping[str, Any]],
    records: Sequence[Mapping[str, Any]],
    world: World,
    now: dt.datetime,
    policy: Policy,
    settings: CleanupSettings,
    superseded_since: Mapping[str, dt.datetime],
    served: frozenset[str] = frozenset(),
) -> CleanupPlan:
    """The cleanup of one namespace, given its services, its operator-made Jobs and its
    engine records (all from the caches)."""
    exact, loose = wanted(namespace, services, world, policy)
    effects: list[CreateObject | DeleteObject | PatchObject] = []
    superseded: dict[str, dt.datetime] = {}
    waits: list[float] = []

    cleanup_jobs: dict[tuple[str, str], Mapping[str, Any]] = {}
    for job in jobs:
        labels = _labels(job)
        tag, key = labels.get(CLAIM_LABEL, ""), labels.get(KEY_LABEL, "")
        if labels.get(COMPONENT_LABEL) == CLEANUP_COMPONENT:
            cleanup_jobs[(tag, key)] = job
            continue
        if _finished(job):
            continue  # its TTL removes it; a finished Job holds no GPU
        ident = identity_of(job)
        if ident is None or (tag, loose_key(ident)) in loose:
            continue
        meta = job.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        first = superseded_since.get(uid, now)
        superseded[uid] = first
        left = settings.superseded_grace_seconds - (now - first).total_seconds()
        if left > 0:
            waits.append(left)
            continue
        effects.append(
            DeleteObject(
                "Job",
                namespace,
                str(meta.get("name")),
                uid,
                f"no service in {namespace} asks for engine {key} any more "
                f"(superseded for {settings.superseded_grace_seconds:.0f}s)",
            )
        )

    for record in records:
        meta = record.get("metadata") or {}
        name, uid = str(meta.get("name")), str(meta.get("uid") or "")
        labels, notes = _labels(record), _annotations(record)
        tag, key = labels.get(CLAIM_LABEL, ""), labels.get(KEY_LABEL, "")
        removing = notes.get(REMOVING_ANNOTATION)
        # An engine a Deployment still serves (the old one, while a new one is built) counts.
        if ((tag, key) in exact or key in served) and not removing:
            if notes.get(UNREFERENCED_ANNOTATION):
                effects.append(
                    PatchObject(
                        "ConfigMap",
                        namespace,
                        name,
                        {"metadata": {"annotations": {UNREFERENCED_ANNOTATION: None}}},
                    )
                )
            continue
        if not removing:
            marked = conditions.parse_time(notes.get(UNREFERENCED_ANNOTATION))
            if marked is None:
                effects.append(
                    PatchObject(
                        "ConfigMap",
                        namespace,
                        name,
                        {
                            "metadata": {
                                "annotations": {UNREFERENCED_ANNOTATION: conditions.timestamp(now)}
                            }
                        },
                    )
                )
                waits.append(settings.retention_seconds)
                continue
            left = settings.retention_seconds - (now - marked).total_seconds()
            if left > 0:
                waits.append(left)
                continue
            # The finished build Jobs of the engine go first: a Job that says "built" must not
            # outlive the files it built, or the engine would be recorded again from it.
            effects.extend(_build_jobs_of(namespace, tag, key, jobs))
            effects.append(
                PatchObject(
                    "ConfigMap",
                    namespace,
                    name,
                    {"metadata": {"annotations": {REMOVING_ANNOTATION: conditions.timestamp(now)}}},
                )
            )
            continue
        # Being removed: the cleanup Job, then the record.
        claim = notes.get(CLAIM_ANNOTATION, "")
        claim_uid = notes.get(CLAIM_UID_ANNOTATION, "")
        if not claim or world.claim_uid(namespace, claim) != claim_uid:
            # The claim that held the engine is gone: so are its files.
            effects.append(
                DeleteObject("ConfigMap", namespace, name, uid, "its cache claim is gone")
            )
            continue
        effects.extend(_build_jobs_of(namespace, tag, key, jobs))
        cleaner = cleanup_jobs.get((tag, key))
        if cleaner is None:
            ident = identity_of(record)
            effects.append(
                CreateObject(
                    build_job.render_cleanup_job(
                        key,
                        ident.gpu_arch if ident else str(labels.get(ARCH_LABEL, "")),
                        ident.builder_image if ident else policy.build.default_builder_image,
                        namespace,
                        CacheClaim(claim, claim_uid),
                        policy.build,
                    )
                )
            )
        elif _finished(cleaner) == "Complete":
            effects.append(
                DeleteObject(
                    "ConfigMap",
                    namespace,
                    name,
                    uid,
                    f"engine {key} removed from claim {claim} by "
                    f"{(cleaner.get('metadata') or {}).get('name')}",
                )
            )
        # A failed cleanup Job keeps the record (and the mark): someone must look; the
        # Job's pods say why. It is tried again after the Job's TTL removes it.
    requeue = min(waits) + 0.5 if waits else None
    return CleanupPlan(tuple(effects), superseded, requeue)
