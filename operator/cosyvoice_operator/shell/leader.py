"""Acting or standing by: which replica of the operator works, from kopf's peering objects.

Several replicas may run; each announces itself in a (Cluster)KopfPeering object (kopf does
that) and reads the others there. :func:`peering.standby_reason` decides from what the cache
holds; this module only follows it: it re-decides on every peering event and every few
seconds (peers lapse with time, not with events), and tells the loop when it becomes active
so that everything is looked at again. The workers wait while it stands by.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from cosyvoice_operator.plan import peering
from cosyvoice_operator.shell import metrics
from cosyvoice_operator.shell.informer import Cache, Obj

log = logging.getLogger(__name__)

# How often lapsed peers are looked for (no I/O: the cache is read).
CHECK_SECONDS = 2.0


class Leader:
    """Whether this replica acts. Without peering (a single replica) it always does."""

    def __init__(
        self,
        peerings: Cache | None,
        namespaces: tuple[str, ...],
        peering_as: tuple[str, int] | None,
        clock: Callable[[], dt.datetime],
        on_active: Callable[[], None],
    ) -> None:
        self.peerings = peerings
        self.namespaces = namespaces
        self.peering_as = peering_as  # (peering name, own priority)
        self.clock = clock
        self.on_active = on_active
        self.active = asyncio.Event()
        self.standby_reason: str | None = None

    def start(self) -> asyncio.Task[None] | None:
        """Decide once; the task that keeps deciding as peers lapse (None without peering)."""
        if self.peerings is None:
            self._activate()
            return None
        self.check()
        return asyncio.create_task(self._clock(), name="peering clock")

    def on_peering(self, old: Obj | None, new: Obj | None) -> None:
        """A peering object changed: decide again."""
        self.check()

    def check(self) -> None:
        if self.peerings is None or self.peering_as is None:
            return
        name, priority = self.peering_as
        found = [self.peerings.get(ns, name) for ns in self.namespaces or ("",)]
        statuses: list[dict[str, Any] | None] = [
            dict(o.get("status") or {}) if o else None for o in found
        ]
        why = peering.standby_reason(statuses, priority, self.clock())
        if why != self.standby_reason:
            log.info("standing by: %s" if why else "active: %s", why or f"priority {priority}")
        self.standby_reason = why
        if why is None:
            self._activate()
        else:
            metrics.ACTIVE.set(0)
            self.active.clear()

    def _activate(self) -> None:
        metrics.ACTIVE.set(1)
        if not self.active.is_set():
            self.active.set()
            self.on_active()

    async def _clock(self) -> None:
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            self.check()
