"""Writing a batch's results: data documents, download logs, then task statuses.

Order matters: a task is settled (SUCCESS/FAIL) only after its data is stored, and only if
it still holds this batch's lease. Data of a task this batch could not settle (recovered
meanwhile, cancelled) is removed again, so a task never keeps data of an unsettled attempt.
MongoDB hiccups are retried with backoff; if it stays away the batch raises and the
defender recovers its tasks.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Callable, TypeVar

import gridfs
from bson import Binary
from pymongo import UpdateOne
from pymongo.errors import BulkWriteError, ConnectionFailure, OperationFailure

from common.config import settings
from common.errors import DownloadError
from common.models import (
    DISPATCH,
    FAIL,
    SUCCESS,
    CrawlerDownloadData,
    CrawlerDownloadLog,
    CrawlerTask,
)
from common.secrets import redact
from slave.engines.base import Download
from slave.retry import next_retry_at

logger = logging.getLogger(__name__)
T = TypeVar("T")
DUPLICATE_KEY = 11000
UNSET_LEASE = {"lease": "", "queue": "", "dispatched_at": ""}


@dataclass
class Outcome:
    task: dict
    download: Download | None
    error: DownloadError | None
    spend_us: int
    request_size: int = 0


def with_retries(fn: Callable[[], T], what: str, deadline: float = 120.0) -> T:
    """Call ``fn`` until it stops failing on a lost connection, for up to ``deadline`` seconds."""
    delay, end = 0.2, time.monotonic() + deadline
    while True:
        try:
            return fn()
        except (ConnectionFailure, OperationFailure) as exc:
            if isinstance(exc, OperationFailure) and not exc.has_error_label("RetryableWriteError") \
                    and exc.code not in (91, 189, 11600, 11602, 10107, 13435, 13436):
                raise
            if time.monotonic() + delay > end:
                raise
            logger.warning("MongoDB unavailable during %s (%s); retrying in %.1fs", what, type(exc).__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def _insert_ignoring_duplicates(coll, docs: list[dict]) -> None:
    if not docs:
        return
    try:
        coll.insert_many(docs, ordered=False)
    except BulkWriteError as exc:
        if any(e["code"] != DUPLICATE_KEY for e in exc.details["writeErrors"]):
            raise


def _data_doc(ctx, lease: str, outcome: Outcome, fs: gridfs.GridFS, now: datetime) -> dict:
    d = outcome.download
    doc = {
        "job": ctx.job_id, "downloader": ctx.download_id, "task": outcome.task["_id"], "lease": lease,
        "url": outcome.task["uri"], "status_code": d.status_code,
        "requests_headers": d.request_headers, "response_headers": d.headers,
        "requests_body": Binary(d.request_body or b""), "encoding": d.encoding,
        "hostname": settings.HOSTNAME, "remote_ip": d.remote_ip, "add_datetime": now,
    }
    if len(d.body) >= settings.GRIDFS_THRESHOLD:
        doc["response_body_gridfs"] = fs.put(d.body, filename=f"{outcome.task['_id']}-{lease}")
        doc["response_body"] = None
    else:
        doc["response_body"] = Binary(d.body)
    return doc


def _log_doc(ctx, lease: str, outcome: Outcome, now: datetime) -> dict:
    return {
        "job": ctx.job_id, "task": outcome.task["_id"], "lease": lease,
        "status": SUCCESS if outcome.error is None else FAIL,
        "requests_size": outcome.request_size,
        "response_size": len(outcome.download.body) if outcome.download else 0,
        "failed_reason": redact(outcome.error.reason)[:10240] if outcome.error else None,
        "downloads_hostname": settings.HOSTNAME, "spend_time": outcome.spend_us, "add_datetime": now,
    }


def store(ctx, lease: str, outcomes: list[Outcome], now: datetime) -> dict[str, int]:
    """Store one batch's outcomes; return counts of settled successes and failures."""
    data_coll = CrawlerDownloadData._get_collection()
    tasks = CrawlerTask._get_collection()
    ok = [o for o in outcomes if o.error is None]
    bad = [o for o in outcomes if o.error is not None]
    fs = gridfs.GridFS(data_coll.database, collection="crawler_download_data_fs")
    data_docs = [_data_doc(ctx, lease, o, fs, now) for o in ok]
    with_retries(lambda: _insert_ignoring_duplicates(data_coll, data_docs), "data insert")
    logs = [_log_doc(ctx, lease, o, now) for o in outcomes]
    with_retries(lambda: _insert_ignoring_duplicates(CrawlerDownloadLog._get_collection(), logs), "log insert")

    settled_ok = 0
    if ok:
        ok_ids = [o.task["_id"] for o in ok]
        result = with_retries(lambda: tasks.update_many(
            {"_id": {"$in": ok_ids}, "lease": lease, "status": DISPATCH},
            {"$set": {"status": SUCCESS, "data_lease": lease, "failed_reason": None, "retry_at": None,
                      "last_update_datetime": now},
             "$inc": {"download_times": 1}, "$unset": UNSET_LEASE},
        ), "task success")
        settled_ok = result.modified_count
        if settled_ok < len(ok_ids):
            _drop_unsettled(data_coll, tasks, ok_ids, lease)
    settled_bad = 0
    if bad:
        ops = []
        for o in bad:
            times = o.task.get("download_times", 0) + 1
            retry_at = next_retry_at(o.error, times, ctx.max_retry_times, now,
                                     settings.RETRY_BACKOFF_BASE, settings.RETRY_BACKOFF_MAX)
            ops.append(UpdateOne(
                {"_id": o.task["_id"], "lease": lease, "status": DISPATCH},
                {"$set": {"status": FAIL, "retry_at": retry_at, "failed_reason": redact(o.error.reason)[:10240],
                          "last_update_datetime": now},
                 "$inc": {"download_times": 1}, "$unset": UNSET_LEASE},
            ))
        settled_bad = with_retries(lambda: tasks.bulk_write(ops, ordered=False), "task failure").modified_count
    return {"success": settled_ok, "fail": settled_bad}


def _drop_unsettled(data_coll, tasks, ok_ids: list, lease: str) -> None:
    """Remove data this lease stored for tasks it did not settle (recovered or cancelled)."""
    settled = {d["_id"] for d in tasks.find({"_id": {"$in": ok_ids}, "data_lease": lease}, {"_id": 1})}
    orphans = [i for i in ok_ids if i not in settled]
    if orphans:
        with_retries(lambda: data_coll.delete_many({"task": {"$in": orphans}, "lease": lease}), "orphan cleanup")
        logger.info("dropped data of %s tasks no longer leased to %s", len(orphans), lease)
