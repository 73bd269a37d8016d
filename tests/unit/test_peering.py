"""peering: which replica is active, read the way kopf reads its peering objects."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from cosyvoice_operator import peering

NOW = dt.datetime(2026, 12, 3, 12, 0, 0, tzinfo=dt.UTC)


def entry(priority: int, seen_ago: float = 5, lifetime: int = 60) -> dict[str, Any]:
    seen = NOW - dt.timedelta(seconds=seen_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def test_alone_is_active() -> None:
    assert peering.outranked_by([{"me": entry(500)}], 500, NOW) is None


def test_a_live_peer_of_higher_priority_outranks() -> None:
    found = peering.outranked_by([{"me": entry(500), "other": entry(900)}], 500, NOW)
    assert found == peering.Peer("other", 900, True)


def test_lower_priority_peers_stand_by_for_us() -> None:
    assert peering.outranked_by([{"me": entry(500), "other": entry(100)}], 500, NOW) is None


def test_a_dead_peer_does_not_count() -> None:
    # lastseen + lifetime in the past: the active replica died; the standby takes over.
    status = {"me": entry(500), "dead": entry(900, seen_ago=61, lifetime=60)}
    assert peering.outranked_by([status], 500, NOW) is None


def test_same_priority_pauses_as_kopf_does() -> None:
    found = peering.outranked_by([{"me": entry(500), "twin": entry(500)}], 500, NOW)
    assert found is not None and found.priority == 500


def test_our_own_entry_in_several_namespaces_is_no_collision() -> None:
    statuses = [{"me": entry(500)}, {"me": entry(500)}]
    assert peering.outranked_by(statuses, 500, NOW) is None


def test_outranked_in_any_namespace() -> None:
    statuses = [{"me": entry(500)}, {"me": entry(500), "other": entry(700)}]
    found = peering.outranked_by(statuses, 500, NOW)
    assert found is not None and found.identity == "other"


def test_malformed_entries_are_ignored() -> None:
    status = {
        "me": entry(500),
        "junk": "not a mapping",
        "bad-priority": {"priority": "high", "lastseen": NOW.isoformat()},
        "no-lastseen": {"priority": 900},
    }
    assert peering.outranked_by([status], 500, NOW) is None


def test_kopf_timestamps_with_z_and_without_zone() -> None:
    z = {"priority": 900, "lifetime": 60, "lastseen": "2026-12-03T11:59:30Z"}
    naive = {"priority": 900, "lifetime": 60, "lastseen": "2026-12-03T11:59:30"}
    assert peering.peers({"a": z, "b": naive}, NOW) == [
        peering.Peer("a", 900, True),
        peering.Peer("b", 900, True),
    ]


def test_random_priorities_are_in_range_and_differ() -> None:
    rng = random.Random(7)
    values = {peering.random_priority(rng) for _ in range(50)}
    assert len(values) == 50
    assert all(peering.PRIORITY_RANGE[0] <= v <= peering.PRIORITY_RANGE[1] for v in values)
