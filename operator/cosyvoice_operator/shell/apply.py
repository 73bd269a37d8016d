"""Carrying out effects: the one place where a plan becomes API requests.

Each of the six effect types (`api/effects.py`) has one rule, stated here once:

- CreateObject: create if absent; an object of that name already there counts as done;
- ApplyObject: server-side apply of the whole object under the operator's field manager;
- DeleteObject: delete that exact object (uid precondition); already gone counts as done;
- PatchObject: a JSON merge patch of an object the operator owns;
- PatchStatus: a merge patch of the service's status with its resourceVersion as
  precondition. When the service changed since the cache saw it (or our previous write has
  not come back yet), nothing is written and :class:`Conflict` is raised: the pass is
  planned again, with backoff, on the newer copy;
- PostEvent: an Event on the service (or the object it names). Events follow a status
  write, and only an accepted one (:meth:`Applier.report`): a status refused or in conflict
  posts nothing, so a pass repeated on the same world never posts an Event twice.

Redaction: every string of a status patch (condition and engine messages above all) and
every Event message passes :func:`logs.redact` here, the one place they leave the operator:
they quote builders, Prometheus and the API server, and status and Events are read by far
more people than the operator's Secrets. A status patch that redaction makes equal to what
is stored is not written (and its Events not posted).

Failures: an API server in trouble (:attr:`KubeError.transient`) fails the whole pass, which
is retried with backoff. A refusal (any other 4xx) of a world effect is gathered by
:meth:`Applier.carry_out_all` (name -> the API server's words) for the planner to report.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from cosyvoice_operator.api import labels
from cosyvoice_operator.api.effects import (
    ApplyObject,
    CreateObject,
    DeleteObject,
    PatchObject,
    PatchStatus,
    PostEvent,
)
from cosyvoice_operator.shell import metrics
from cosyvoice_operator.shell.caches import Caches
from cosyvoice_operator.shell.kube import KINDS_BY_NAME, SERVICES, Kube, KubeError
from cosyvoice_operator.shell.logs import redact

log = logging.getLogger(__name__)

WorldEffect = CreateObject | ApplyObject | DeleteObject | PatchObject
Effect = WorldEffect | PatchStatus | PostEvent


class Backoff(Exception):
    """A pass that must be tried again with the key's growing backoff (a refused write, a
    conflict), without being logged as a failure."""


class Conflict(Backoff):
    """The service changed since the cache saw it: plan again on the newer copy."""


class Applier:
    """Carries out effects for the passes of one operator (all of its requests are kube's)."""

    def __init__(self, kube: Kube, caches: Caches | None = None) -> None:
        self.kube = kube
        # What is written goes into the caches at once (Cache.wrote): the next pass plans on
        # it, instead of writing again, or conflicting, on the copy from before the write.
        self.caches = caches

    async def carry_out(
        self, namespace: str, effect: Effect, service: Mapping[str, Any] | None = None
    ) -> None:
        """One effect, in `namespace`; `service` is the service whose pass it is (needed by
        PatchStatus and PostEvent). Raises KubeError when the API server refuses, Conflict
        when a status precondition fails."""
        where = f"{namespace}/{_name(service)}" if service is not None else namespace
        if isinstance(effect, CreateObject):
            made_kind = str(effect.body["kind"])
            made = await self.kube.create_object(effect.body)
            if made is not None:
                self._wrote(made_kind, made, None)
                log.info("%s: created %s %s", where, made_kind, effect.name)
                if _is_build(effect.body):
                    metrics.record_build_started()
        elif isinstance(effect, ApplyObject):
            made_kind = str(effect.body["kind"])
            before = self._version(made_kind, namespace, effect.name)
            self._wrote(made_kind, await self.kube.apply(effect.body), before)
            log.info("%s: applied %s %s", where, made_kind, effect.name)
        elif isinstance(effect, DeleteObject):
            kind = KINDS_BY_NAME[effect.kind]
            if await self.kube.delete(kind, namespace, effect.name, effect.uid):
                log.info("%s: deleted %s %s: %s", where, effect.kind, effect.name, effect.why)
        elif isinstance(effect, PatchObject):
            kind = KINDS_BY_NAME[effect.kind]
            await self.kube.merge_patch(kind, namespace, effect.name, effect.patch)
        elif isinstance(effect, PatchStatus):
            assert service is not None, "a status is always some service's"
            patch = {
                "metadata": {"resourceVersion": effect.resource_version},
                "status": redacted(dict(effect.changes)),
            }
            written = await self.kube.merge_patch_object(
                SERVICES, namespace, _name(service), patch, "status"
            )
            if written is None:
                raise Conflict(f"{where} changed since the cache saw it")
            self._wrote("CosyVoiceService", written, effect.resource_version)
        else:
            assert service is not None or effect.regarding is not None
            regarding = effect.regarding or service or {}
            await self.kube.post_event(
                regarding, effect.type, effect.reason, redact(effect.message)
            )

    def _version(self, kind: str, namespace: str, name: str) -> str | None:
        return self.caches.version_of(kind, namespace, name) if self.caches else None

    def _wrote(self, kind: str, obj: Mapping[str, Any], previous: str | None) -> None:
        if self.caches is not None:
            self.caches.wrote(kind, obj, previous)

    async def carry_out_all(
        self,
        namespace: str,
        effects: Sequence[WorldEffect],
        service: Mapping[str, Any] | None,
        together: bool = False,
    ) -> dict[str, str]:
        """World effects, in order (`together`: all at once, for effects that do not depend
        on each other, such as one service's serving objects: one round trip instead of one
        each). Those the API server refuses (a 4xx) are skipped and returned (name -> its
        message), the others are still carried out; an API server in trouble fails the pass
        (retried with backoff)."""
        refused: dict[str, str] = {}

        async def one(effect: WorldEffect) -> None:
            try:
                await self.carry_out(namespace, effect, service)
            except KubeError as exc:
                if exc.transient:
                    raise
                refused[effect.name] = exc.api_message

        if together:
            failed = [
                e
                for e in await asyncio.gather(*map(one, effects), return_exceptions=True)
                if isinstance(e, BaseException)
            ]
            if failed:
                raise failed[0]
        else:
            for effect in effects:
                await one(effect)
        return refused

    async def report(
        self,
        service: Mapping[str, Any],
        status: PatchStatus | None,
        events: Sequence[PostEvent],
    ) -> None:
        """A pass's status write, then its Events, only once the write is accepted (events
        without a status change are not posted: they are derived from one)."""
        if status is None:
            return
        stored = service.get("status") or {}
        changes = {k: v for k, v in redacted(dict(status.changes)).items() if stored.get(k) != v}
        if not changes:
            return  # only what redaction takes out differed from what is stored
        status = PatchStatus(changes, status.resource_version)
        namespace = str(service["metadata"].get("namespace"))
        await self.carry_out(namespace, status, service)
        for event in events:
            await self.carry_out(namespace, event, service)


def redacted(value: Any) -> Any:
    """`value` with every string in it redacted (keys are the operator's own)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    return value


def _name(service: Mapping[str, Any] | None) -> str:
    return str(((service or {}).get("metadata") or {}).get("name"))


def _is_build(body: Mapping[str, Any]) -> bool:
    found = (body.get("metadata") or {}).get("labels") or {}
    return body.get("kind") == "Job" and found.get(labels.COMPONENT_LABEL) == labels.BUILD_COMPONENT
