"""The retry policy, one pure function: when may a failed task go again (if ever)."""
from __future__ import annotations

import random
from datetime import datetime, timedelta

from common.errors import DownloadError


def next_retry_at(
    error: DownloadError,
    download_times: int,
    max_retry_times: int,
    now: datetime,
    base: float = 2.0,
    cap: float = 600.0,
    rand: random.Random | None = None,
) -> datetime | None:
    """None when the failure is final (not retryable, or ``download_times`` — attempts made,
    this one included — reached ``max_retry_times``); else ``now`` plus an exponential,
    jittered delay that is never shorter than the server's Retry-After (capped at ``cap``)."""
    if not error.retryable or download_times >= max_retry_times:
        return None
    delay = min(cap, base * 2 ** max(0, download_times - 1))
    delay = (rand or random).uniform(delay / 2, delay)
    if error.retry_after:
        delay = max(delay, min(float(error.retry_after), cap))
    return now + timedelta(seconds=delay)
