"""Retention: how long what a cluster writes is kept.

At 2 million pages a day a cluster writes 2 million data documents and 2 million download logs
a day; without limits nothing but expired export files would ever go. Two mechanisms:

  * MongoDB TTL indexes on ``add_datetime`` where one cluster-wide age fits and the collection is
    small: dispatch logs, alert logs, registration error logs, notification delivery logs
    (EVENT_LOG_RETENTION_DAYS). ``ensure_ttl`` keeps the index in step with the setting.
  * The defender's share where a job may say otherwise or where an index would cost every
    page's write: a job's data and its final tasks (DATA_RETENTION_DAYS or the job's
    ``data_retention_days``), its download logs (LOG_RETENTION_DAYS or ``log_retention_days``),
    delivered or finally failed notifications (NOTIFICATION_RETENTION_DAYS). Ages are read from
    ``_id`` (an ObjectId made when the document was written), which every collection indexes,
    so no page pays for an extra index; removal goes in batches under a time budget.

A GridFS body goes with its data document. A final task removed takes its data with it (a data
document counts only while its task names it).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from bson import ObjectId

from common.store import counts
from common.config import settings
from common.store.data import gridfs_of
from common.store.models import (CANCEL, DEAD, FAIL, SUCCESS, TASK_STATUSES, CrawlerDispatchAlertLog,
                           CrawlerDispatchLog, CrawlerDownloadData, CrawlerDownloadLog, CrawlerDownloadSetting,
                           CrawlerRegistrationErrorLog, CrawlerTask, Job, Notification, NotificationLog, id_at,
                           utcnow)
from common.store.paging import Span, by_id, in_chunks

logger = logging.getLogger(__name__)
TTL_LOGS = (CrawlerDispatchLog, CrawlerDispatchAlertLog, CrawlerRegistrationErrorLog, NotificationLog)
TTL_INDEX = "retention_add_datetime"
BATCH = 2000
FINAL = ({"status": SUCCESS}, {"status": DEAD}, {"status": CANCEL}, {"status": FAIL, "retry_at": None})


@dataclass
class RetentionReport:
    data: int = 0
    tasks: int = 0
    download_logs: int = 0
    notifications: int = 0
    finished: bool = True  # False: the time budget ran out; the next run goes on


def ensure_ttl() -> None:
    """A TTL index of EVENT_LOG_RETENTION_DAYS on each event log's ``add_datetime`` (none when 0)."""
    days = settings.EVENT_LOG_RETENTION_DAYS
    want = int(days * 86400) if days else None
    for model in TTL_LOGS:
        coll = model._get_collection()
        current = [ix for ix in coll.list_indexes() if list(ix["key"].items()) == [("add_datetime", 1)]]
        for ix in current:
            if ix.get("expireAfterSeconds") != want:
                coll.drop_index(ix["name"])
        if want and not any(ix.get("expireAfterSeconds") == want for ix in current):
            coll.create_index("add_datetime", expireAfterSeconds=want, name=TTL_INDEX)


def _before(days: float, now: datetime) -> ObjectId:
    return id_at(now - timedelta(days=days))


def _drop_data(docs: list[dict]) -> int:
    """Remove data documents (``_id``, ``response_body_gridfs``) and their GridFS bodies."""
    coll = CrawlerDownloadData._get_collection()
    fs = gridfs_of(coll.database)
    for doc in docs:
        if doc.get("response_body_gridfs"):
            fs.delete(doc["response_body_gridfs"])
    return sum(coll.delete_many({"_id": {"$in": ids}}).deleted_count
               for ids in in_chunks([d["_id"] for d in docs]))


def _remove_old(coll, job_id, before: ObjectId, span, end: float, drop=None) -> int:
    """Remove the job's documents of ``coll`` made before ``before``, oldest first, in batches
    read window by window (``common.store.paging``); ``drop`` removes a batch (default: delete)."""
    removed, after = 0, None
    while time.monotonic() < end:
        docs = by_id(coll, {"job": job_id}, BATCH, span=span, after=after, before=before,
                     projection={"_id": 1, "response_body_gridfs": 1})
        if not docs:
            break
        after = docs[-1]["_id"]
        removed += drop(docs) if drop else sum(coll.delete_many({"_id": {"$in": ids}}).deleted_count
                                               for ids in in_chunks([d["_id"] for d in docs]))
    return removed


def _remove(coll, query: dict, end: float) -> int:
    """Remove what ``query`` matches in a small collection (notifications), in batches."""
    removed = 0
    while time.monotonic() < end:
        ids = [d["_id"] for d in coll.find(query, {"_id": 1}).limit(BATCH)]
        if not ids:
            break
        removed += coll.delete_many({"_id": {"$in": ids}}).deleted_count
    return removed


def _remove_final(job_id, before: datetime, span, end: float, report: RetentionReport) -> bool:
    """Remove the job's final tasks last changed before ``before`` (and their data): per final
    status, read window by window by (job, status, _id) — changed before it, so made before it —
    and checked here (another predicate in the query would make the embedded store read every
    task of the job). True when every one was reached."""
    tasks, cutoff = CrawlerTask._get_collection(), id_at(before)
    for final in FINAL:
        after = None
        while True:
            if time.monotonic() >= end:
                return False
            docs = by_id(tasks, {"job": job_id, "status": final["status"]}, BATCH, span=span, after=after,
                         before=cutoff, projection={"_id": 1, "retry_at": 1, "last_update_datetime": 1})
            if not docs:
                break
            after = docs[-1]["_id"]
            ids = [d["_id"] for d in docs if (d.get("last_update_datetime") or before) < before
                   and all(d.get(k) == v for k, v in final.items() if k != "status")]
            if not ids:
                continue
            for part in in_chunks(ids):
                report.data += _drop_data(list(CrawlerDownloadData._get_collection().find(
                    {"task": {"$in": part}}, {"_id": 1, "response_body_gridfs": 1})))
                gone = tasks.delete_many({"_id": {"$in": part}, **final,
                                          "last_update_datetime": {"$lt": before}}).deleted_count
                counts.move([(job_id, final["status"], None, gone)])
                report.tasks += gone
    return True


def _oldest_left(job_id, before: datetime, span: Span) -> ObjectId:
    """The lowest ``_id`` of the job's tasks made before ``before`` that retention left (tasks
    still to download, retried or changed since), else ``before`` itself: the job's new floor."""
    tasks, cutoff = CrawlerTask._get_collection(), id_at(before)
    left = [d["_id"] for status in TASK_STATUSES
            for d in by_id(tasks, {"job": job_id, "status": status}, 1, span=span, before=cutoff,
                           projection={"_id": 1})]
    return min(left, default=cutoff)


def job_days() -> dict:
    """{job id: (data days, log days)} with each job's overrides applied."""
    overrides = {d["job"]: d for d in CrawlerDownloadSetting._get_collection().find(
        {"$or": [{"data_retention_days": {"$ne": None}}, {"log_retention_days": {"$ne": None}}]},
        {"job": 1, "data_retention_days": 1, "log_retention_days": 1})}
    out = {}
    for job in Job._get_collection().find({}, {"_id": 1}):
        own = overrides.get(job["_id"], {})
        data = own.get("data_retention_days")
        logs = own.get("log_retention_days")
        out[job["_id"]] = (settings.DATA_RETENTION_DAYS if data is None else data,
                           settings.LOG_RETENTION_DAYS if logs is None else logs)
    return out


def enforce(now: datetime | None = None, budget: float = 30.0) -> RetentionReport:
    """One pass of the defender's share (and the TTL indexes' settings); master/maintenance.py says when."""
    end = time.monotonic() + budget
    now = now or utcnow()
    ensure_ttl()
    report = RetentionReport()
    logs = CrawlerDownloadLog._get_collection()
    for job_id, (data_days, log_days) in job_days().items():
        span = counts.span(job_id)
        if data_days:
            before = now - timedelta(days=data_days)
            report.data += _remove_old(CrawlerDownloadData._get_collection(), job_id, id_at(before), span,
                                       end, drop=_drop_data)
            if _remove_final(job_id, before, span, end, report):
                counts.raise_floor(job_id, _oldest_left(job_id, before, span))
        if log_days:
            report.download_logs += _remove_old(logs, job_id, _before(log_days, now), span, end)
    if settings.NOTIFICATION_RETENTION_DAYS:
        report.notifications = _remove(Notification._get_collection(), {
            "state": {"$in": [SUCCESS, FAIL]}, "_id": {"$lt": _before(settings.NOTIFICATION_RETENTION_DAYS, now)}}, end)
    report.finished = time.monotonic() < end
    if report.data or report.tasks or report.download_logs or report.notifications:
        logger.info("retention: removed %s data documents, %s final tasks, %s download logs, %s notifications",
                    report.data, report.tasks, report.download_logs, report.notifications)
    return report
