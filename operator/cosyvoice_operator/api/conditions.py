"""Status conditions in the standard Kubernetes shape (pure)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any


def timestamp(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> dt.datetime | None:
    """An API timestamp (RFC 3339, ``Z`` or an offset; naive means UTC), or None."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def merge(
    previous: Iterable[Mapping[str, Any]],
    updates: Iterable[Mapping[str, Any]],
    generation: int,
    now: dt.datetime,
) -> list[dict[str, Any]]:
    """Conditions after `updates` ({type, status, reason, message}) are applied.

    lastTransitionTime moves only when a condition's status changes, as clients expect;
    conditions not updated are kept as they were.
    """
    by_type = {c["type"]: dict(c) for c in previous if "type" in c}
    for update in updates:
        old = by_type.get(update["type"])
        changed = (
            old is None
            or old.get("status") != update["status"]
            or not old.get("lastTransitionTime")
        )
        by_type[update["type"]] = {
            "type": update["type"],
            "status": update["status"],
            "reason": update["reason"],
            "message": update.get("message", "")[:32768],
            "lastTransitionTime": (
                timestamp(now) if changed or old is None else old["lastTransitionTime"]
            ),
            "observedGeneration": generation,
        }
    return sorted(by_type.values(), key=lambda c: c["type"])
