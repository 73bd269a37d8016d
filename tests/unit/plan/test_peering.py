"""peering: which replica is active, read the way kopf reads its peering objects."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from cosyvoice_operator.plan import peering

NOW = dt.datetime(2026, 12, 3, 12, 0, 0, tzinfo=dt.UTC)


def entry(priority: int, seen_ago: float = 5, lifetime: int = 60) -> dict[str, Any]:
    seen = NOW - dt.timedelta(seconds=seen_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


def reason(statuses: list[dict[str, Any] | None], own: int = 500) -> str | None:
    return peering.standby_reason(statuses, own, NOW)


def test_alone_is_active() -> None:
    assert reason([{"me": entry(500)}]) is None


def test_a_live_peer_of_higher_priority_outranks() -> None:
    why = reason([{"me": entry(500), "other": entry(900)}])
    assert why == "peer other has priority 900 (this operator: 500)"


def test_lower_priority_peers_stand_by_for_us() -> None:
    assert reason([{"me": entry(500), "other": entry(100)}]) is None


def test_a_dead_peer_does_not_count() -> None:
    # lastseen + lifetime in the past: the active replica died; the standby takes over.
    assert reason([{"me": entry(500), "dead": entry(900, seen_ago=61, lifetime=60)}]) is None


def test_same_priority_pauses_as_kopf_does() -> None:
    why = reason([{"me": entry(500), "twin": entry(500)}])
    assert why is not None and "share priority 500" in why


def test_not_listed_yet_or_object_missing_stands_by() -> None:
    # kopf keeps its handlers paused until its peering object exists and lists it.
    assert (
        reason([{"other": entry(100)}]) == "this operator is not listed in its peering object yet"
    )
    assert reason([None]) is not None and "missing" in str(reason([None]))
    assert reason([{"me": entry(500)}, None]) is not None
    assert reason([]) is not None


def test_our_own_entry_in_several_namespaces_is_no_collision() -> None:
    assert reason([{"me": entry(500)}, {"me": entry(500)}]) is None


def test_outranked_in_any_namespace() -> None:
    why = reason([{"me": entry(500)}, {"me": entry(500), "other": entry(700)}])
    assert why is not None and "peer other has priority 700" in why


def test_malformed_entries_are_ignored_and_no_lastseen_means_now_as_in_kopf() -> None:
    status = {
        "me": entry(500),
        "junk": "not a mapping",
        "bad-priority": {"priority": "high", "lastseen": NOW.isoformat()},
    }
    assert reason([status]) is None
    assert reason([{**status, "fresh": {"priority": 900}}]) is not None


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
