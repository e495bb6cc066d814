"""What the cluster counts over time, in Redis (so every web process reports the same numbers and
they survive a web restart):

  * ``downcluster:metrics:pages`` — a hash of counters ``<job>|<outcome>|<reason class>`` →
    pages, incremented by the worker's writer when it stores outcomes (``stored`` or ``failed``);
  * ``downcluster:metrics:minute:<unix minute>`` — pages ``stored`` and ``failed`` in that minute
    (kept 26 hours: the console's 24-hour chart);
  * ``downcluster:metrics:depth:<unix minute>`` — each queue's depth when last looked at in that
    minute (by a dispatcher run, ``stats``, the console or a scrape; kept 26 hours).

Counting never raises into its caller: a page stored is never undone because Redis blinked.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Iterable

from redis import Redis

from common.errors import DownloadError
from common.store.connection import as_text

PAGES = "downcluster:metrics:pages"
MINUTE = "downcluster:metrics:minute:"
DEPTH = "downcluster:metrics:depth:"
KEEP = 26 * 3600
logger = logging.getLogger(__name__)


def reason_class(error: DownloadError | None) -> str:
    """A failure's class for a metric label (a small fixed set, ``DownloadError.label``: read
    from the failure's type, never its text); "" for success."""
    return "" if error is None else error.label


def minute(at: float | None = None) -> int:
    return int((time.time() if at is None else at) // 60)


def count_pages(redis: Redis, outcomes: Iterable[tuple[str, str, str]]) -> None:
    """Add (job, "stored" | "failed", reason class) outcomes to the counters. Never raises."""
    tally = Counter(outcomes)
    if not tally:
        return
    try:
        key = f"{MINUTE}{minute()}"
        pipe = redis.pipeline(transaction=False)
        for (job, outcome, klass), n in tally.items():
            pipe.hincrby(PAGES, f"{job}|{outcome}|{klass}", n)
            pipe.hincrby(key, outcome, n)
        pipe.expire(key, KEEP)
        pipe.execute()
    except Exception as exc:
        logger.debug("page counters not updated: %s", type(exc).__name__)


def sample_depths(redis: Redis, depths: dict[str, int]) -> None:
    """Remember each queue's depth in this minute (for the console's chart). Never raises."""
    if not depths:
        return
    try:
        key = f"{DEPTH}{minute()}"
        pipe = redis.pipeline(transaction=False)
        pipe.hset(key, mapping=depths)  # type: ignore[arg-type]  # redis-py's Mapping key type is invariant
        pipe.expire(key, KEEP)
        pipe.execute()
    except Exception as exc:
        logger.debug("queue depth not sampled: %s", type(exc).__name__)


def page_counters(redis: Redis) -> list[tuple[str, str, str, int]]:
    out = []
    for field, n in redis.hgetall(PAGES).items():
        job, outcome, klass = as_text(field).split("|", 2)
        out.append((job, outcome, klass, int(n)))
    return sorted(out)


def pages_in(redis: Redis, minutes: int) -> tuple[int, int]:
    """(stored, failed) pages of the last ``minutes`` minutes: one round trip, whatever the store holds."""
    now = minute()
    pipe = redis.pipeline(transaction=False)
    for m in range(now - minutes + 1, now + 1):
        pipe.hmget(f"{MINUTE}{m}", "stored", "failed")
    rows = pipe.execute()
    return sum(int(s or 0) for s, _ in rows), sum(int(f or 0) for _, f in rows)


def series(redis: Redis, hours: int = 24) -> dict:
    """Per minute of the last ``hours``: pages stored and failed, and queue depths sampled."""
    now = minute()
    minutes = list(range(now - hours * 60 + 1, now + 1))
    pipe = redis.pipeline(transaction=False)
    for m in minutes:
        pipe.hgetall(f"{MINUTE}{m}")
        pipe.hgetall(f"{DEPTH}{m}")
    got = pipe.execute()
    pages, depths = [], []
    for i, m in enumerate(minutes):
        counts, depth = got[2 * i], got[2 * i + 1]
        if counts:
            pages.append(
                {
                    "minute": m * 60,
                    "stored": int(counts.get(b"stored", 0)),
                    "failed": int(counts.get(b"failed", 0)),
                }
            )
        if depth:
            depths.append({"minute": m * 60, **{k.decode(): int(v) for k, v in depth.items()}})
    return {"from": minutes[0] * 60, "to": minutes[-1] * 60 + 59, "pages": pages, "depths": depths}
