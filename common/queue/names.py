"""Priorities, the four rq queues, host queues and the worker's queue order (names only: how an
entry is an rq job is ``common/queue/rqbridge.py``)."""
from __future__ import annotations

from common.config import settings

QUEUE_NAMES = ("down_super", "down_high", "down_mid", "down_low")
PRIORITIES = range(-1, 6)
DEFAULT_PRIORITY = PRIORITIES[-1]  # a job whose manifest names no priority: the lowest
LOCK_KEY = "downcluster:dispatch:lock"
# Export entries (rq jobs "dcx-<export id>"), taken by every worker one at a time.
EXPORT_QUEUE = "down_export"
# Generator runs (rq jobs "dcg-<run id>"), taken by every worker after its download queues.
GENERATE_QUEUE = "down_generate"
# Followed by an rq worker name: that worker's download figures (in flight, peak), for stats.
WORKER_KEY_PREFIX = "downcluster:worker:"
# A ``downcluster worker`` loads up to this many times WORKER_INFLIGHT tasks; those beyond its gate
# wait for earlier downloads to end (slave/worker/runner.py; the dispatcher's LEASE_TIMEOUT check
# counts those rounds).
WORKER_AHEAD = 2


def queue_for_priority(priority: int) -> str:
    """-1 -> down_super, 0..1 -> down_high, 2..3 -> down_mid, 4..5 -> down_low."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be in -1..5, got {priority!r}")
    if priority == -1:
        return "down_super"
    return QUEUE_NAMES[1 + priority // 2]


FOREIGN = "#foreign"  # suffix of the queues of jobs with prior = 2 (hosts with an exit abroad)


def queue_name(base: str, host: str = "", foreign: bool = False) -> str:
    """The shared queue ``base``, host ``host``'s own queue of that level, or (``foreign``) the
    level's foreign queue, read only by ``downcluster worker --foreign``."""
    if host:
        return f"{base}@{host}"
    return base + FOREIGN if foreign else base


def base_of(name: str) -> str:
    return name.split("@", 1)[0].split("#", 1)[0]


def cap(name: str) -> int:
    """Cap on entries of a queue (a host queue has the cap of its level)."""
    return int(getattr(settings, "Q_" + base_of(name).upper() + "_LEN"))


def worker_queue_names(host: str = "", foreign: bool = False) -> list[str]:
    """Strict order for a worker: at each level its host queue, then (``foreign``) the foreign
    queue, then the shared one."""
    names: list[str] = []
    for base in QUEUE_NAMES:
        if host:
            names.append(queue_name(base, host))
        if foreign:
            names.append(queue_name(base, foreign=True))
        names.append(base)
    return names
