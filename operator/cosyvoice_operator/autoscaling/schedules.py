"""Schedule floors of the autoscaler (pure): the highest minReplicas of the
`spec.autoscaling.schedules` windows active at a moment (rule 1 of `policy`)."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cosyvoice_operator.api.spec import Schedule, SpecError

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")  # datetime.weekday() order
_HHMM = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")


def schedule_floor(schedules: Sequence[Schedule], now: dt.datetime) -> tuple[int, str]:
    """The highest minReplicas of the schedules active at `now` (0 when none is), and the
    names of the active ones, comma-separated in spec order.

    A window is read on the wall clock of its time zone (as cron does): start inclusive, end
    exclusive, on the days it starts; one whose end is not after its start runs past
    midnight and belongs to the day it starts (22:00-06:00 on Fri is active Fri 22:00 to Sat
    06:00; an end of 00:00 is midnight). Across a DST change a window keeps its wall-clock
    times, so it lasts an hour more or less that night, and a start inside the skipped hour
    is reached at the first wall-clock minute after it. Raises `SpecError` (naming the field)
    for what the CRD would have refused, or an unknown time zone.
    """
    require_aware(now, "now")
    floor = 0
    names: list[str] = []
    for index, schedule in enumerate(schedules):
        if _active(schedule, now, index):
            names.append(schedule.name)
            floor = max(floor, schedule.min_replicas)
    return floor, ", ".join(names)


def _active(schedule: Schedule, now: dt.datetime, index: int) -> bool:
    path = f"spec.autoscaling.schedules[{index}]"
    start = _minute_of_day(schedule.start, f"{path}.start")
    end = _minute_of_day(schedule.end, f"{path}.end")
    if start == end:
        raise SpecError(f"{path}.end", f"must differ from start ({schedule.start})")
    for day in schedule.days_of_week:
        if day not in DAYS:
            raise SpecError(f"{path}.daysOfWeek", f"must be among {', '.join(DAYS)}, got {day!r}")
    local = now.astimezone(_zone(schedule.timezone, f"{path}.timezone"))
    minute = local.hour * 60 + local.minute
    today = DAYS[local.weekday()]
    yesterday = DAYS[(local.weekday() - 1) % 7]
    days = schedule.days_of_week
    if start < end:
        return today in days and start <= minute < end
    return (today in days and minute >= start) or (yesterday in days and minute < end)


def _minute_of_day(value: str, path: str) -> int:
    m = _HHMM.match(value)
    if not m:
        raise SpecError(path, f"must be HH:MM on a 24-hour clock, got {value!r}")
    return int(m.group(1)) * 60 + int(m.group(2))


def _zone(name: str, path: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise SpecError(path, f"unknown IANA time zone {name!r}") from None


def require_aware(value: dt.datetime, name: str) -> None:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got {value!r}")
