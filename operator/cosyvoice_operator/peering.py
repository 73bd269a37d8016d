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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PRIORITY_RANGE = (1, 1_000_000)
GROUP, VERSION = "kopf.dev", "v1"
CLUSTER_PLURAL, NAMESPACED_PLURAL = "clusterkopfpeerings", "kopfpeerings"


def random_priority(rng: random.Random | None = None) -> int:
    return (rng or random.SystemRandom()).randint(*PRIORITY_RANGE)


@dataclass(frozen=True)
class Peer:
    identity: str
    priority: int
    alive: bool


def _parse_time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


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
        lastseen = _parse_time(info.get("lastseen"))
        alive = lastseen is not None and lastseen + lifetime > now
        found.append(Peer(str(identity), priority, alive))
    return found


def outranked_by(
    statuses: Iterable[Mapping[str, Any]], own_priority: int, now: dt.datetime
) -> Peer | None:
    """A live peer this operator must stand by for, if any, in any of the peering objects.

    Each object lists the operator itself with its own priority; a second live entry of the
    same priority in one object is a collision, which kopf resolves by pausing both, and so
    does this.
    """
    for status in statuses:
        live = [p for p in peers(status, now) if p.alive]
        higher = [p for p in live if p.priority > own_priority]
        if higher:
            return max(higher, key=lambda p: p.priority)
        same = [p for p in live if p.priority == own_priority]
        if len(same) > 1:
            return same[0]
    return None
