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
document counts only while its task names it). The removals themselves are
``common.store.retention``; this module says what is due.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from bson import ObjectId

from common.config import settings
from common.store import counts
from common.store import retention as store
from common.store.clock import id_at, utcnow

logger = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    data: int = 0
    tasks: int = 0
    download_logs: int = 0
    notifications: int = 0
    center_tasks: int = 0
    finished: bool = True  # False: the time budget ran out; the next run goes on


def ensure_ttl() -> None:
    """A TTL index of EVENT_LOG_RETENTION_DAYS on each event log's ``add_datetime`` (none when 0)."""
    store.ensure_ttl(settings.EVENT_LOG_RETENTION_DAYS)


def _before(days: float, now: datetime) -> ObjectId:
    return id_at(now - timedelta(days=days))


def job_days() -> dict:
    """{job id: (data days, log days)} with each job's overrides applied."""
    return {job: (settings.DATA_RETENTION_DAYS if data is None else data,
                  settings.LOG_RETENTION_DAYS if logs is None else logs)
            for job, (data, logs) in store.overrides().items()}


def enforce(now: datetime | None = None, budget: float = 30.0) -> RetentionReport:
    """One pass of the defender's share (and the TTL indexes' settings); master/maintenance.py says when."""
    end = time.monotonic() + budget
    now = now or utcnow()
    ensure_ttl()
    report = RetentionReport()
    revisited = store.revisited()
    for job_id, (data_days, log_days) in job_days().items():
        span = counts.span(job_id)
        if data_days:
            before = now - timedelta(days=data_days)
            if job_id in revisited:  # earlier versions go; a page's latest stays while its task does
                report.data += store.remove_old_versions(job_id, id_at(before), span, end)
            else:
                report.data += store.remove_old_data(job_id, id_at(before), span, end)
            data, tasks, complete = store.remove_final(job_id, before, span, end, job_id in revisited)
            report.data, report.tasks = report.data + data, report.tasks + tasks
            if complete:
                counts.raise_floor(job_id, store.oldest_left(job_id, before, span))
        if log_days:
            report.download_logs += store.remove_old_logs(job_id, _before(log_days, now), span, end)
    if settings.NOTIFICATION_RETENTION_DAYS:
        cutoff = _before(settings.NOTIFICATION_RETENTION_DAYS, now)
        report.notifications = store.remove_notifications(cutoff, end)
    if settings.CENTER_TASK_RETENTION_DAYS:
        report.center_tasks = age_center_tasks(now - timedelta(days=settings.CENTER_TASK_RETENTION_DAYS), end)
    report.finished = time.monotonic() < end
    if report.center_tasks:
        logger.info("retention: archived and removed %s download tasks", report.center_tasks)
    if report.data or report.tasks or report.download_logs or report.notifications:
        logger.info(
            "retention: removed %s data documents, %s final tasks, %s download logs, %s notifications",
            report.data,
            report.tasks,
            report.download_logs,
            report.notifications,
        )
    return report


def age_center_tasks(cutoff: datetime, end: float) -> int:
    """Download tasks of the center that ended before ``cutoff``: each written to the day's archive
    (CENTER_ARCHIVE_DIR, when set) before its document and any file are removed, in batches until
    ``end``; how many went. A task is removed only once its line is written and flushed."""
    from common.store import center
    from common.store.data import drop_export_file

    removed = 0
    while time.monotonic() < end:
        batch = center.ended_before(cutoff, 100)
        if not batch:
            break
        if settings.CENTER_ARCHIVE_DIR:
            _archive(batch)
        for task in batch:
            drop_export_file(task.file_id)
        removed += center.remove_many([t.id for t in batch])
    return removed


def _archive(batch: list) -> None:
    import json
    import os
    from pathlib import Path

    folder = Path(settings.CENTER_ARCHIVE_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"center-{utcnow():%Y-%m-%d}.jsonl"
    with open(path, "a", encoding="utf-8") as out:
        for task in batch:
            out.write(json.dumps(task.to_doc(), default=str, ensure_ascii=False) + "\n")
        out.flush()
        os.fsync(out.fileno())
