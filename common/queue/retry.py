"""The retry policy: one backoff (exponential, capped, optionally jittered) for everything that
tries again (a failed task, a MongoDB write, a webhook or mail), and when a failed task may go
again (if ever)."""
from __future__ import annotations

import random
from datetime import datetime, timedelta

from common.errors import DownloadError


def backoff(
    attempt: int, base: float, cap: float, jitter: bool = True, rand: random.Random | None = None
) -> float:
    """Seconds to wait before try ``attempt`` + 1 (``attempt`` >= 1 failed so far): ``base``
    doubled each time up to ``cap``; with ``jitter`` a uniform draw from its upper half."""
    delay = min(cap, base * 2 ** max(0, attempt - 1))
    return (rand or random).uniform(delay / 2, delay) if jitter else delay


def next_retry_at(
    error: DownloadError,
    download_times: int,
    max_retry_times: int,
    now: datetime,
    base: float,
    cap: float,
    rand: random.Random | None = None,
) -> datetime | None:
    """``base`` and ``cap``: the settings RETRY_BACKOFF_BASE and RETRY_BACKOFF_MAX.
    None when the failure is final (not retryable, or ``download_times`` — attempts made,
    this one included — reached ``max_retry_times``); else ``now`` plus an exponential,
    jittered delay that is never shorter than the server's Retry-After (capped at ``cap``)."""
    if not error.retryable or download_times >= max_retry_times:
        return None
    delay = backoff(download_times, base, cap, rand=rand)
    if error.retry_after:
        delay = max(delay, min(float(error.retry_after), cap))
    return now + timedelta(seconds=delay)
