"""Which of several operator replicas is the active one (pure).

kopf's peering pauses an operator's handlers while a live peer of higher priority exists,
and pauses *every* operator when live peers share a priority. Replicas of one Deployment
all get the same arguments, so `cosyvoice-operator run --peering` picks a random priority
per process: the replica with the highest is active, the others stand by and take over
when its peering entry expires.

The operator's own resync loop is not a kopf handler, so kopf does not pause it: it reads
the same peering objects and stands by by the same rule.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cosyvoice_operator.api.conditions import parse_time

PRIORITY_RANGE = (1, 1_000_000)


def random_priority(rng: random.Random | None = None) -> int:
    return (rng or random.SystemRandom()).randint(*PRIORITY_RANGE)


@dataclass(frozen=True)
class Peer:
    identity: str
    priority: int
    alive: bool


def peers(status: Mapping[str, Any], now: dt.datetime) -> list[Peer]:
    """The peers a peering object's status lists (kopf: {identity: {priority, lifetime,
    lastseen}}), each alive until its lastseen plus its lifetime."""
    found: list[Peer] = []
    for identity, info in status.items():
        if not isinstance(info, Mapping):
            continue
        try:
            priority = int(info.get("priority", 0))
            lifetime = dt.timedelta(seconds=int(info.get("lifetime", 60)))
        except (TypeError, ValueError):
            continue
        raw_seen = info.get("lastseen")
        # kopf takes an entry without lastseen as seen just now; so does this.
        lastseen = parse_time(raw_seen) if raw_seen is not None else now
        alive = lastseen is not None and lastseen + lifetime > now
        found.append(Peer(str(identity), priority, alive))
    return found


def standby_reason(
    statuses: Sequence[Mapping[str, Any] | None], own_priority: int, now: dt.datetime
) -> str | None:
    """Why this operator must stand by, or None when it is the active one.

    `statuses` holds the status of each peering object the operator takes part in (one
    cluster-wide, or one per served namespace), None for one that does not exist. kopf keeps
    its handlers paused while an object is missing or does not list the operator yet, while
    a live peer has a higher priority, and while another live peer shares its priority; the
    operator's own entry is the live one with its own priority.
    """
    if not statuses:
        return "no peering object to take part in"
    for status in statuses:
        if status is None:
            return "a peering object is missing (kopf waits for it)"
        live = [p for p in peers(status, now) if p.alive]
        higher = [p for p in live if p.priority > own_priority]
        if higher:
            top = max(higher, key=lambda p: p.priority)
            return (
                f"peer {top.identity} has priority {top.priority} (this operator: {own_priority})"
            )
        same = [p for p in live if p.priority == own_priority]
        if not same:
            return "this operator is not listed in its peering object yet"
        if len(same) > 1:
            return f"{len(same)} live peers share priority {own_priority}; kopf pauses them all"
    return None
