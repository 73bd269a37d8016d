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

Records and Jobs are selected by label, and anyone who may write ConfigMaps in the namespace
can forge one. So a record is believed only for what it cannot turn into anything else: the
cleanup Job runs the operator's own builder image (never one a record names), and a record
whose key or architecture is not one the operator makes is left alone. One service that
cannot be planned never stops the namespace's cleanup: one with an invalid spec wants
nothing (as before); one whose planning fails otherwise makes the pass conservative
(nothing marked unreferenced, no build stopped) instead of failing it.
"""

from __future__ import annotations

import datetime as dt
import json
import re
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

# What a record's labels must hold for the cleanup to act on it: a content key as the
# operator makes them, and a GPU architecture of the known shape, or none: the records of
# vLLM checkpoints fetched before llmRuntime vllm was refused (issue 19, item 9) have no
# architecture, and no service wants them any more; recognising them is what lets the
# cleanup remove them from users' caches (their cleanup Job is named ...-gc-ckpt-...).
_CONTENT_KEY = re.compile(r"^[0-9a-f]{40}$")
_GPU_ARCH = re.compile(r"^(sm_[0-9]{2,3}[a-z]?)?$")


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


@dataclass
class Wanted:
    """(claim tag, key) of every engine the services want, and (claim tag, loose key);
    ``complete`` is False when a service could not be planned (what it wants is unknown)."""

    exact: set[tuple[str, str]] = field(default_factory=set)
    loose: set[tuple[str, str]] = field(default_factory=set)
    complete: bool = True


def wanted_by(
    namespace: str, services: Iterable[Mapping[str, Any]], world: World, policy: Policy
) -> Wanted:
    found = Wanted()
    nodes = world.gpu_nodes()
    for body in services:
        try:
            _add_wanted(found, namespace, body, nodes, world, policy)
        except SpecError:
            continue  # an invalid spec wants nothing (its service says why)
        except Exception:  # one service must not stop the namespace's cleanup
            found.complete = False
    return found


def _add_wanted(
    found: Wanted,
    namespace: str,
    body: Mapping[str, Any],
    nodes: Sequence[Any],
    world: World,
    policy: Policy,
) -> None:
    exact, loose = found.exact, found.loose
    svc = parse(body.get("spec") or {})
    uid = world.claim_uid(namespace, svc.engine.cache_claim_name)
    if uid is None:
        return
    tag = CacheClaim(svc.engine.cache_claim_name, uid).tag
    build = policy.build
    plan = engine_identity.plan(
        svc,
        [] if svc.engine.gpu_products else nodes,
        build.default_builder_image,
        build.companion_pins,
    )
    for target in plan.targets:
        exact.add((tag, target.key))
    base = engine_identity.identity(svc, "", build.default_builder_image, build.companion_pins)
    loose.add((tag, base.key))


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
    want = wanted_by(namespace, services, world, policy)
    exact = want.exact
    found = _Pass(namespace, jobs, world, now, policy, settings)
    cleaners = _stop_superseded(found, want.loose, superseded_since, stop=want.complete)
    for record in records:
        tag, key = _labels(record).get(CLAIM_LABEL, ""), _labels(record).get(KEY_LABEL, "")
        if not _CONTENT_KEY.match(key) or not _GPU_ARCH.match(_labels(record).get(ARCH_LABEL, "")):
            continue  # not a record the operator wrote: nothing of it is acted on
        removing = _annotations(record).get(REMOVING_ANNOTATION)
        # An engine a Deployment still serves (the old one, while a new one is built) counts.
        if ((tag, key) in exact or key in served) and not removing:
            _keep(found, record)
        elif not removing:
            if want.complete:
                _mark_unreferenced(found, record)
        else:
            _remove(found, record, cleaners.get((tag, key)))
    requeue = min(found.waits) + 0.5 if found.waits else None
    return CleanupPlan(tuple(found.effects), found.superseded, requeue)


@dataclass
class _Pass:
    """One namespace's cleanup pass: what it reads, and what it collects."""

    namespace: str
    jobs: Sequence[Mapping[str, Any]]
    world: World
    now: dt.datetime
    policy: Policy
    settings: CleanupSettings
    effects: list[CreateObject | DeleteObject | PatchObject] = field(default_factory=list)
    # Build Jobs found superseded (uid -> since when).
    superseded: dict[str, dt.datetime] = field(default_factory=dict)
    # Seconds until something found here is due.
    waits: list[float] = field(default_factory=list)

    def annotate(self, record: Mapping[str, Any], annotations: Mapping[str, str | None]) -> None:
        name = str((record.get("metadata") or {}).get("name"))
        patch = {"metadata": {"annotations": dict(annotations)}}
        self.effects.append(PatchObject("ConfigMap", self.namespace, name, patch))


def _stop_superseded(
    found: _Pass,
    loose: set[tuple[str, str]],
    superseded_since: Mapping[str, dt.datetime],
    stop: bool = True,
) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Delete the unfinished build Jobs no service asks for any more, once superseded for the
    grace period (none when ``stop`` is False: what the services want is not all known);
    return the cleanup Jobs by (claim tag, key)."""
    cleaners: dict[tuple[str, str], Mapping[str, Any]] = {}
    grace = found.settings.superseded_grace_seconds
    for job in found.jobs:
        labels = _labels(job)
        tag, key = labels.get(CLAIM_LABEL, ""), labels.get(KEY_LABEL, "")
        if labels.get(COMPONENT_LABEL) == CLEANUP_COMPONENT:
            cleaners[(tag, key)] = job
            continue
        if _finished(job) or not stop:
            continue  # its TTL removes it; a finished Job holds no GPU
        ident = identity_of(job)
        if ident is None or (tag, loose_key(ident)) in loose:
            continue
        meta = job.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        first = superseded_since.get(uid, found.now)
        found.superseded[uid] = first
        left = grace - (found.now - first).total_seconds()
        if left > 0:
            found.waits.append(left)
            continue
        found.effects.append(
            DeleteObject(
                "Job",
                found.namespace,
                str(meta.get("name")),
                uid,
                f"no service in {found.namespace} asks for engine {key} any more "
                f"(superseded for {grace:.0f}s)",
            )
        )
    return cleaners


def _keep(found: _Pass, record: Mapping[str, Any]) -> None:
    """A referenced engine: its unreferenced mark, if any, is cleared."""
    if _annotations(record).get(UNREFERENCED_ANNOTATION):
        found.annotate(record, {UNREFERENCED_ANNOTATION: None})


def _mark_unreferenced(found: _Pass, record: Mapping[str, Any]) -> None:
    """An unreferenced engine: marked with the time, then, once the mark is older than the
    retention period, its finished build Jobs deleted and the record marked as being removed."""
    marked = conditions.parse_time(_annotations(record).get(UNREFERENCED_ANNOTATION))
    retention = found.settings.retention_seconds
    if marked is None:
        found.annotate(record, {UNREFERENCED_ANNOTATION: conditions.timestamp(found.now)})
        found.waits.append(retention)
        return
    left = retention - (found.now - marked).total_seconds()
    if left > 0:
        found.waits.append(left)
        return
    # The finished build Jobs of the engine go first: a Job that says "built" must not
    # outlive the files it built, or the engine would be recorded again from it.
    labels = _labels(record)
    key = labels.get(KEY_LABEL, "")
    found.effects.extend(
        _build_jobs_of(found.namespace, labels.get(CLAIM_LABEL, ""), key, found.jobs)
    )
    found.annotate(record, {REMOVING_ANNOTATION: conditions.timestamp(found.now)})


def _remove(found: _Pass, record: Mapping[str, Any], cleaner: Mapping[str, Any] | None) -> None:
    """An engine being removed: its cleanup Job, then, once that has succeeded, the record."""
    meta = record.get("metadata") or {}
    name, uid = str(meta.get("name")), str(meta.get("uid") or "")
    labels, notes = _labels(record), _annotations(record)
    tag, key = labels.get(CLAIM_LABEL, ""), labels.get(KEY_LABEL, "")
    claim = notes.get(CLAIM_ANNOTATION, "")
    claim_uid = notes.get(CLAIM_UID_ANNOTATION, "")
    namespace = found.namespace
    if not claim or found.world.claim_uid(namespace, claim) != claim_uid:
        # The claim that held the engine is gone: so are its files.
        found.effects.append(
            DeleteObject("ConfigMap", namespace, name, uid, "its cache claim is gone")
        )
        return
    found.effects.extend(_build_jobs_of(namespace, tag, key, found.jobs))
    build = found.policy.build
    if cleaner is None:
        # The operator's own builder image, whatever the record says it was built with: a
        # record is a ConfigMap, and an image read from it would run with the whole cache
        # claim mounted read-write. `remove` is the same in every builder image.
        found.effects.append(
            CreateObject(
                build_job.render_cleanup_job(
                    key,
                    str(labels.get(ARCH_LABEL, "")),
                    build.default_builder_image,
                    namespace,
                    CacheClaim(claim, claim_uid),
                    build,
                )
            )
        )
    elif _finished(cleaner) == "Complete":
        found.effects.append(
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
