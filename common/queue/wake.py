"""The dispatcher's wake-up: new tasks to send now, without waiting for the next run.

Intake that adds tasks while the cluster runs (the worker's writer, adding the links found on
stored pages and the entries of sitemaps) calls ``wake`` after the tasks are stored; the
dispatcher's loop (``master.dispatch.runs``) rests between runs in ``rest``, which returns as
soon as a wake-up is there, and ``downcluster scheduler`` (cron) starts a run at once when it
finds one. Either way the run that follows is an ordinary dispatcher run under the lock: the
caps, priorities, per-site limits, leases and the fence hold as for any task.

The key is a list of at most one element (LPUSH then LTRIM), so many wake-ups while a run goes
make one run after it, and one that comes during a run is never lost: it is there when the run
ends. It is a hint, never the source of truth: a wake-up lost (Redis away, flushed) only leaves
the tasks to the next scheduled run, as before; ``wake`` never raises.
"""
from __future__ import annotations

import logging
import time

from redis import Redis
from redis.exceptions import RedisError

WAKE_KEY = "downcluster:dispatch:wake"
WAKE_GAP = 0.5    # seconds a loop rests after a run at least: a stream of wake-ups is a run a gap
WAIT_SLICE = 1.0  # the longest single blocking wait (a stopping loop notices within this)

logger = logging.getLogger(__name__)


def wake(redis: Redis) -> None:
    """Ask for a dispatcher run now (best effort: a failure is logged, never raised)."""
    try:
        pipe = redis.pipeline(transaction=False)
        pipe.lpush(WAKE_KEY, 1)
        pipe.ltrim(WAKE_KEY, 0, 0)
        pipe.execute()
    except RedisError as exc:
        logger.warning("dispatcher not woken (the next run sends the new tasks): %s", type(exc).__name__)


def woken(redis: Redis) -> bool:
    """Take a wake-up if one is there (no wait)."""
    return redis.lpop(WAKE_KEY) is not None


def rest(redis: Redis, seconds: float, stopping) -> bool:
    """Rest ``seconds`` between dispatcher runs, or less: return True as soon as a wake-up is
    there (after WAKE_GAP at least), False at the end of ``seconds`` or when ``stopping`` (an
    Event) is set. Redis errors are raised, as the run's own."""
    end = time.monotonic() + seconds
    if stopping.wait(min(seconds, WAKE_GAP)):
        return False
    while not stopping.is_set():
        left = end - time.monotonic()
        if left < 0.01:  # (a BLPOP timeout of 0 would wait for ever)
            return False
        if redis.blpop([WAKE_KEY], timeout=min(left, WAIT_SLICE)) is not None:
            return True
    return False
