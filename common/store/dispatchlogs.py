"""What a dispatcher run records: ``crawler_dispatch_log`` (one document per queue entry it
wrote or failed to write) and ``crawler_dispatch_alert_log`` (tasks it had to leave for a later
run: a queue full, the run's total cap reached). Both in the log database, inserted only.

No index for the dispatcher: inserts only (each index would cost every insert); retention
removes them by a TTL index on ``add_datetime`` (``common.store.retention.ensure_ttl``).
"""
from __future__ import annotations

from datetime import datetime

from common.config import settings
from common.store.models import FAIL, SUCCESS, CrawlerDispatchAlertLog, CrawlerDispatchLog


def entry_log(job_id, queue: str, lease: str, count: int, now: datetime, why: str | None = None) -> dict:
    """The record of one entry: SUCCESS when pushed, else FAIL with ``why``."""
    log = {"job": job_id, "queue": queue, "lease": lease, "count": count, "hostname": settings.HOSTNAME,
           "add_datetime": now}
    return {**log, "status": SUCCESS} if why is None else {**log, "status": FAIL, "reason": why}


def record(logs: list[dict]) -> None:
    """Insert entries' records (``entry_log``)."""
    if logs:
        CrawlerDispatchLog._get_collection().insert_many(logs, ordered=False)


def alert(alerts: list[tuple], now: datetime) -> None:
    """Insert alerts, each (job id, type, reason)."""
    CrawlerDispatchAlertLog._get_collection().insert_many([
        {"job": job_id, "type": kind, "reason": reason, "content_bytes": len(reason.encode()),
         "hostname": settings.HOSTNAME, "add_datetime": now}
        for job_id, kind, reason in alerts
    ])
