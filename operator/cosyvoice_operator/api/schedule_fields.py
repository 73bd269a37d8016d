"""Schedule floors of ``spec.autoscaling.schedules``: every field checked when the spec is read
(an unknown time zone such as ``Asia/Shanghi``, a time that is not HH:MM), so the autoscaler
never meets one it cannot read."""

from __future__ import annotations

import difflib
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cosyvoice_operator.api.fields import SpecError, integer, string


@dataclass(frozen=True)
class Schedule:
    name: str
    start: str
    end: str
    min_replicas: int
    days_of_week: tuple[str, ...] = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
    timezone: str = "UTC"


def parse_schedules(a: Mapping[str, Any], max_replicas: int) -> tuple[Schedule, ...]:
    """The schedule floors, every field checked here: a window the autoscaler could not read
    (an unknown time zone such as ``Asia/Shanghi``, a time that is not HH:MM) is an
    InvalidSpec on the service, not an error at each evaluation with autoscaling off."""
    raws = a.get("schedules") or []
    if not isinstance(raws, list):
        raise SpecError("spec.autoscaling.schedules", "must be a list")
    if len(raws) > 32:
        raise SpecError("spec.autoscaling.schedules", f"has at most 32 windows, got {len(raws)}")
    schedules: list[Schedule] = []
    for i, raw in enumerate(raws):
        path = f"spec.autoscaling.schedules[{i}]"
        if not isinstance(raw, Mapping):
            raise SpecError(path, "must be an object")
        name = string(raw, "name")
        if not _SCHEDULE_NAME.match(name):
            raise SpecError(
                f"{path}.name", f"must be a lower-case DNS label (a-z, 0-9, '-'), got {name!r}"
            )
        if any(s.name == name for s in schedules):
            raise SpecError(f"{path}.name", f"{name!r} is the name of another window")
        start = _hhmm(raw, "start", path)
        end = _hhmm(raw, "end", path)
        if start == end:
            raise SpecError(
                f"{path}.end", f"must differ from start ({start}; an end before start runs past "
                "midnight)",
            )  # fmt: skip
        schedules.append(
            Schedule(
                name=name,
                start=start,
                end=end,
                min_replicas=integer(raw, "minReplicas", path, 0, 0, max_replicas),
                days_of_week=_days(raw, path),
                timezone=_timezone(raw, path),
            )
        )
    return tuple(schedules)


_SCHEDULE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_HHMM = re.compile(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _hhmm(raw: Mapping[str, Any], key: str, path: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not _HHMM.match(value):
        raise SpecError(
            f"{path}.{key}", f"must be HH:MM on a 24-hour clock (00:00..23:59), got {value!r}"
        )
    return value


def _days(raw: Mapping[str, Any], path: str) -> tuple[str, ...]:
    days = raw.get("daysOfWeek")
    if days is None:
        return Schedule.days_of_week
    if not isinstance(days, list) or not days:
        raise SpecError(f"{path}.daysOfWeek", f"must be a non-empty list of {', '.join(DAYS)}")
    for day in days:
        if day not in DAYS:
            raise SpecError(f"{path}.daysOfWeek", f"must be among {', '.join(DAYS)}, got {day!r}")
    if len(set(days)) != len(days):
        raise SpecError(f"{path}.daysOfWeek", "names a day twice")
    return tuple(days)


def _timezone(raw: Mapping[str, Any], path: str) -> str:
    """An IANA time zone this operator can read (zoneinfo, with the tzdata package)."""
    name = raw.get("timezone")
    if name is None or name == "":
        return "UTC"
    if not isinstance(name, str):
        raise SpecError(f"{path}.timezone", f"must be an IANA time zone name, got {name!r}")
    try:
        zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        known = sorted(
            z for z in zoneinfo.available_timezones() if z.lower() == name.lower()
        ) or difflib.get_close_matches(name, zoneinfo.available_timezones(), n=1)
        hint = f" (did you mean {known[0]}?)" if known else ""
        raise SpecError(
            f"{path}.timezone", f"unknown IANA time zone {name!r}{hint}, e.g. Asia/Shanghai, UTC"
        ) from None
    return name
