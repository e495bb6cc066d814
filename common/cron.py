"""Generator schedules: a 5-field cron expression (minute hour day-of-month month day-of-week, UTC,
read by ``croniter``) or ``@every N[s|m|h]`` (every N seconds, minutes or hours; at least 1 s),
for runs more often than once a minute. ``next_after`` is the one place a next time is computed."""
from __future__ import annotations

import re
from datetime import datetime, timedelta

from common.errors import ValidationError

EVERY_RE = re.compile(r"^@every\s+(\d{1,7})\s*(s|m|h)?$")
UNITS = {"s": 1, "m": 60, "h": 3600}
MAX_LENGTH = 200


def _every(schedule: str) -> float | None:
    found = EVERY_RE.match(schedule.strip())
    if found is None:
        return None
    return int(found[1]) * UNITS[found[2] or "s"]


def check_schedule(schedule) -> str:
    """``schedule`` stripped if it is a valid schedule, else ValidationError saying why."""
    if not isinstance(schedule, str) or not schedule.strip() or len(schedule) > MAX_LENGTH:
        raise ValidationError("generator.schedule must be a cron expression such as \"*/10 * * * *\" "
                              "or \"@every 30s\"")
    schedule = " ".join(schedule.split())
    if schedule.startswith("@every"):
        seconds = _every(schedule)
        if not seconds:
            raise ValidationError(f"generator.schedule {schedule!r}: write @every N with N >= 1 and an "
                                  "optional unit s, m or h")
        return schedule
    from croniter import croniter

    if len(schedule.split()) != 5 or not croniter.is_valid(schedule):
        raise ValidationError(f"generator.schedule {schedule!r} is not a 5-field cron expression "
                              "(minute hour day month weekday) nor @every N[s|m|h]")
    return schedule


def next_after(schedule: str, now: datetime) -> datetime:
    """The first time of ``schedule`` strictly after ``now`` (naive UTC, whole seconds for cron)."""
    seconds = _every(schedule)
    if seconds is not None:
        return now + timedelta(seconds=seconds)
    from croniter import croniter

    return croniter(schedule, now.replace(microsecond=0)).get_next(datetime)
