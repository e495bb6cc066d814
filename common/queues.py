"""Priorities, the four rq queues, host queues and the worker's queue order."""
from __future__ import annotations

from common.config import settings

QUEUE_NAMES = ("down_super", "down_high", "down_mid", "down_low")
PRIORITIES = range(-1, 6)
LOCK_KEY = "downcluster:dispatch:lock"
HEARTBEAT_PREFIX = "downcluster:hb:"
RQ_JOB_PREFIX = "dc-"


def queue_for_priority(priority: int) -> str:
    """-1 -> down_super, 0..1 -> down_high, 2..3 -> down_mid, 4..5 -> down_low."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be in -1..5, got {priority!r}")
    if priority == -1:
        return "down_super"
    return QUEUE_NAMES[1 + priority // 2]


def queue_name(base: str, host: str = "") -> str:
    """The shared queue ``base``, or host ``host``'s own queue of that level."""
    return f"{base}@{host}" if host else base


def base_of(name: str) -> str:
    return name.split("@", 1)[0]


def cap(name: str) -> int:
    """Cap on entries of a queue (a host queue has the cap of its level)."""
    return int(getattr(settings, "Q_" + base_of(name).upper() + "_LEN"))


def worker_queue_names(host: str = "") -> list[str]:
    """Strict order for a worker: each level's host queue before the shared one."""
    names: list[str] = []
    for base in QUEUE_NAMES:
        if host:
            names.append(queue_name(base, host))
        names.append(base)
    return names


def rq_job_id(lease: str) -> str:
    return RQ_JOB_PREFIX + lease
