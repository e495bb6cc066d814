"""The log alias's records of downloads and dispatches: ``crawler_download_log`` (one per
download attempt), ``crawler_dispatch_log`` (one per queue entry a dispatcher run wrote or
failed to write), ``crawler_dispatch_alert_log`` (``queue_full``, ``queue_stall``, ``generator_fail`` and
``unreadable_entry`` alerts)
(``notification_log``, the delivery attempts, is written by ``common.store.notifications``).

Indexes: ``crawler_download_log`` by ``task`` (a task's attempts) and ``(job, _id)`` (a job's, by
time: the ``_id`` is made when the log is written, so it orders and ranges by time without an
index on ``add_datetime``). The dispatch and alert logs have no index of their own (every index
would cost each insert): it is small, kept for
LOG_RETENTION_DAYS by a TTL index on ``add_datetime``.
Invariant: logs are appended, never changed; only retention removes them.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Iterator

from bson import ObjectId

from common.config import settings
from common.store.connection import collection
from common.store.log_models import CrawlerDispatchAlertLog, CrawlerDispatchLog, CrawlerDownloadLog
from common.store.logrecords import DispatchLog, DownloadLog
from common.store.models import FAIL, SUCCESS

DOWNLOAD_FIELDS = {"status": 1, "failed_reason": 1, "spend_time": 1, "response_size": 1,
                   "downloads_hostname": 1, "coalesced_from": 1, "add_datetime": 1}


def of_task(task_id: ObjectId, limit: int = 100) -> list[DownloadLog]:
    """The task's download logs, newest first (their status, reason, time, size, host and the
    download they reused)."""
    found = collection(CrawlerDownloadLog).find({"task": task_id}, DOWNLOAD_FIELDS)
    return [DownloadLog.from_doc(d) for d in found.sort("_id", -1).limit(limit)]


def not_modified(job_id: ObjectId, since: datetime | None = None,
                 until: datetime | None = None) -> Iterator[DownloadLog]:
    """The job's download logs of revisits that stored nothing (``not_modified`` set), oldest
    first, within [since, until) when given: read by the ``(job, _id)`` index, a window of time."""
    query: dict[str, Any] = {"job": job_id, "not_modified": {"$exists": True}}
    window = {**({"$gte": ObjectId.from_datetime(since)} if since else {}),
              **({"$lt": ObjectId.from_datetime(until)} if until else {})}
    if window:
        query["_id"] = window
    shown = {"task": 1, "not_modified": 1, "fetched_at": 1, "add_datetime": 1}
    found = collection(CrawlerDownloadLog).find(query, shown)
    yield from map(DownloadLog.from_doc, found.sort("_id", 1).batch_size(500))


def add_alerts(alerts: list[tuple[ObjectId | None, str, str]], at: datetime) -> None:
    """Insert alerts, each (job id or None for a cluster-wide one, type, reason), written by this host."""
    if alerts:
        collection(CrawlerDispatchAlertLog).insert_many([
            {"job": job_id, "type": alert, "reason": reason, "content_bytes": len(reason.encode()),
             "hostname": settings.HOSTNAME, "add_datetime": at}
            for job_id, alert, reason in alerts])


def add_alert_once(job_id: ObjectId | None, alert: str, reason: str, at: datetime) -> bool:
    """Insert the alert unless one of the same type and reason is kept already (the log's
    retention forgets it); whether it was inserted. Callers serialize (the dispatcher lock)."""
    if collection(CrawlerDispatchAlertLog).find_one({"type": alert, "reason": reason}, {"_id": 1}):
        return False
    add_alerts([(job_id, alert, reason)], at)
    return True


def entry_log(job_id: ObjectId, queue: str, lease: str, count: int, now: datetime,
              why: str | None = None) -> DispatchLog:
    """The record of one queue entry: SUCCESS when pushed, else FAIL with ``why``."""
    return DispatchLog(id=ObjectId(), job=job_id, queue=queue, lease=lease, count=count,
                       hostname=settings.HOSTNAME, add_datetime=now, status=SUCCESS if why is None else FAIL,
                       reason=why)


def add_entry_logs(records: list[DispatchLog]) -> None:
    """Insert queue entries' records (``entry_log``)."""
    if records:
        collection(CrawlerDispatchLog).insert_many([r.to_doc() for r in records], ordered=False)


def alerts_since(job_id: ObjectId, since: datetime) -> tuple[int, list[str]]:
    """(how many ``queue_full`` alerts, the reasons of up to five ``queue_stall`` alerts) of the
    job written after ``since``."""
    coll = collection(CrawlerDispatchAlertLog)
    full = coll.count_documents({"job": job_id, "type": "queue_full", "add_datetime": {"$gt": since}})
    stalls = coll.find({"job": job_id, "type": "queue_stall", "add_datetime": {"$gt": since}},
                       {"reason": 1}).limit(5)
    return full, [str(s["reason"]) for s in stalls]


def generator_failures_since(job_id: ObjectId, since: datetime) -> list[str]:
    """The reasons of up to five ``generator_fail`` alerts of the job written after ``since``."""
    coll = collection(CrawlerDispatchAlertLog)
    match = {"job": job_id, "type": "generator_fail", "add_datetime": {"$gt": since}}
    return [str(a["reason"]) for a in coll.find(match, {"reason": 1}).limit(5)]
