"""The log alias's records of downloads and dispatches: ``crawler_download_log`` (one per
download attempt), ``crawler_dispatch_alert_log`` (``queue_full`` and ``queue_stall`` alerts)
(``notification_log``, the delivery attempts, is written by ``common.store.notifications``).

Indexes: ``crawler_download_log`` by ``task`` (a task's attempts) and ``(job, _id)`` (a job's, by
time: the ``_id`` is made when the log is written, so it orders and ranges by time without an
index on ``add_datetime``). The alert log has no index of its own: it is small, kept for
LOG_RETENTION_DAYS by a TTL index on ``add_datetime``.
Invariant: logs are appended, never changed; only retention removes them.
"""
from __future__ import annotations

from datetime import datetime

from common.store.models import CrawlerDispatchAlertLog, CrawlerDownloadLog

DOWNLOAD_FIELDS = {"status": 1, "failed_reason": 1, "spend_time": 1, "response_size": 1,
                   "downloads_hostname": 1, "coalesced_from": 1, "add_datetime": 1}


def of_task(task_id, limit: int = 100) -> list[dict]:
    """The task's download logs, newest first."""
    return list(CrawlerDownloadLog._get_collection().find({"task": task_id}, DOWNLOAD_FIELDS)
                .sort("_id", -1).limit(limit))


def add_alerts(job_ids: list, kind: str, reason: str, hostname: str, at: datetime) -> None:
    """One ``kind`` alert with ``reason`` for each of ``job_ids`` (None: a cluster-wide alert)."""
    CrawlerDispatchAlertLog._get_collection().insert_many([
        {"job": job, "type": kind, "reason": reason, "content_bytes": len(reason.encode()),
         "hostname": hostname, "add_datetime": at} for job in job_ids])


def alerts_since(job_id, since: datetime) -> tuple[int, list[str]]:
    """(how many ``queue_full`` alerts, the reasons of up to five ``queue_stall`` alerts) of the
    job written after ``since``."""
    coll = CrawlerDispatchAlertLog._get_collection()
    full = coll.count_documents({"job": job_id, "type": "queue_full", "add_datetime": {"$gt": since}})
    stalls = coll.find({"job": job_id, "type": "queue_stall", "add_datetime": {"$gt": since}},
                       {"reason": 1}).limit(5)
    return full, [s["reason"] for s in stalls]

