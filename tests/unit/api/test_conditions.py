"""conditions.merge: standard Kubernetes condition semantics."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from cosyvoice_operator.api import conditions
from tests.unit.objects import T0

LATER = T0 + dt.timedelta(minutes=10)


def _cond(kind: str, status: str, reason: str = "R", message: str = "m") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def _by_type(conds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in conds}


def test_new_condition_gets_now_and_generation() -> None:
    (c,) = conditions.merge([], [_cond("EngineReady", "False", "Building", "building")], 4, T0)
    assert c == {
        "type": "EngineReady",
        "status": "False",
        "reason": "Building",
        "message": "building",
        "lastTransitionTime": "2025-03-01T12:00:00Z",
        "observedGeneration": 4,
    }


def test_transition_time_kept_when_status_unchanged_even_if_reason_changes() -> None:
    first = conditions.merge([], [_cond("EngineReady", "False", "Building", "a")], 1, T0)
    second = conditions.merge(first, [_cond("EngineReady", "False", "BuildFailed", "b")], 2, LATER)
    (c,) = second
    assert c["lastTransitionTime"] == "2025-03-01T12:00:00Z"
    assert (c["reason"], c["message"], c["observedGeneration"]) == ("BuildFailed", "b", 2)


def test_transition_time_moves_when_status_changes() -> None:
    first = conditions.merge([], [_cond("EngineReady", "False")], 1, T0)
    (c,) = conditions.merge(first, [_cond("EngineReady", "True", "EnginesBuilt")], 1, LATER)
    assert c["status"] == "True"
    assert c["lastTransitionTime"] == "2025-03-01T12:10:00Z"


def test_untouched_conditions_are_kept_as_they_were() -> None:
    other = {
        "type": "ScalingActive",
        "status": "True",
        "reason": "Owned",
        "message": "x",
        "lastTransitionTime": "2024-01-01T00:00:00Z",
        "observedGeneration": 1,
    }
    merged = conditions.merge([other], [_cond("EngineReady", "True")], 9, T0)
    assert _by_type(merged)["ScalingActive"] == other
    assert _by_type(merged)["EngineReady"]["observedGeneration"] == 9


def test_merge_does_not_mutate_its_inputs() -> None:
    previous = [{**_cond("A", "False"), "lastTransitionTime": "2024-01-01T00:00:00Z"}]
    snapshot = [dict(c) for c in previous]
    conditions.merge(previous, [_cond("A", "True")], 2, T0)
    assert previous == snapshot


def test_result_is_sorted_by_type_one_per_type() -> None:
    merged = conditions.merge(
        [{**_cond("Progressing", "True"), "lastTransitionTime": "2024-01-01T00:00:00Z"}],
        [_cond("EngineReady", "False"), _cond("Available", "False"), _cond("EngineReady", "True")],
        1,
        T0,
    )
    assert [c["type"] for c in merged] == ["Available", "EngineReady", "Progressing"]
    assert _by_type(merged)["EngineReady"]["status"] == "True"  # the last update wins


def test_missing_message_is_empty_and_long_message_is_capped() -> None:
    (c,) = conditions.merge([], [{"type": "A", "status": "True", "reason": "R"}], 1, T0)
    assert c["message"] == ""
    (long,) = conditions.merge([], [_cond("A", "True", message="x" * 40000)], 1, T0)
    assert len(long["message"]) == 32768


def test_previous_entries_without_type_are_dropped() -> None:
    merged = conditions.merge([{"status": "True"}], [_cond("A", "True")], 1, T0)
    assert [c["type"] for c in merged] == ["A"]


@pytest.mark.parametrize(
    ("when", "text"),
    [
        (dt.datetime(2025, 3, 1, 12, 0, 0, 999999, tzinfo=dt.UTC), "2025-03-01T12:00:00Z"),
        (
            dt.datetime(2025, 3, 1, 20, 0, 0, tzinfo=dt.timezone(dt.timedelta(hours=8))),
            "2025-03-01T12:00:00Z",
        ),
    ],
)
def test_timestamp_is_utc_rfc3339_seconds(when: dt.datetime, text: str) -> None:
    assert conditions.timestamp(when) == text


def test_previous_condition_without_transition_time_does_not_crash() -> None:
    previous = [_cond("EngineReady", "False")]
    (c,) = conditions.merge(previous, [_cond("EngineReady", "False", "Building")], 1, T0)
    assert c["lastTransitionTime"]
