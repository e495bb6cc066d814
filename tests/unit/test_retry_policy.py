"""When a failed task is tried again: backoff with jitter, Retry-After, the cap and the limit."""
from __future__ import annotations

import random
from datetime import datetime

from common.errors import DownloadError
from common.queue.retry import next_retry_at

NOW = datetime(2026, 1, 1, 12, 0, 0)


def test_retry_backoff_jitter_retry_after_and_limits():
    rnd = random.Random(1)
    err = DownloadError("HTTP 503")
    delays = [(next_retry_at(err, n, 10, NOW, 2.0, 600.0, rnd) - NOW).total_seconds() for n in range(1, 6)]
    for n, d in enumerate(delays, 1):
        full = 2.0 * 2 ** (n - 1)
        assert full / 2 <= d <= full
    assert next_retry_at(err, 5, 5, NOW, 2.0, 600.0) is None  # retries exhausted
    assert next_retry_at(DownloadError("HTTP 404", retryable=False), 1, 5, NOW, 2.0, 600.0) is None
    later = next_retry_at(DownloadError("HTTP 429", retry_after=120), 1, 5, NOW, 2.0, 600.0)
    assert (later - NOW).total_seconds() >= 120
    capped = next_retry_at(DownloadError("HTTP 503", retry_after=10 ** 6), 1, 5, NOW, 2.0, 600.0)
    assert (capped - NOW).total_seconds() == 600
