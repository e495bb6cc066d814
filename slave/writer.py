"""Writing an entry's results: data documents (and GridFS files), download logs, then task
statuses, each in bulk: on the happy path one insert of data, one of logs and one update.

Order matters: a task is settled (SUCCESS/FAIL) only after its data is stored, and only if it
still belongs to this entry (``common.models.held_by``). Data of a task the entry could not settle
(recovered meanwhile, cancelled) is removed again, GridFS files included, so a task never keeps
data of an unsettled attempt. A result MongoDB cannot store fails that task alone. MongoDB
hiccups are retried with backoff; if it stays away the entry raises and the defender recovers it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable, TypeVar

from bson import BSON, Binary, ObjectId
from bson.errors import InvalidDocument
from pymongo import UpdateMany, UpdateOne
from pymongo.errors import BulkWriteError, ConnectionFailure, DocumentTooLarge, OperationFailure

from common.config import settings
from common.errors import DownloadError
from common.data import drop_unsettled, gridfs_of
from common.models import (
    FAIL,
    LIVE,
    SUCCESS,
    UNSET_LEASE,
    held_by,
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
MAX_BSON = 16 * 1024 * 1024


@dataclass
class Outcome:
    task: dict
    download: Download | None
    error: DownloadError | None
    spend_us: int
    request_size: int = 0
    deferred: float | None = None        # handed back (busy or closed host): due again in this many s, no attempt
    coalesce_key: str | None = None      # this download leads identical requests: publish it once stored
    coalesced_from: object = None        # the task whose stored download this one copied
    data_id: object = None               # set by store_many: the data document written


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


def _data_doc(ctx, lease: str, outcome: Outcome, now: datetime) -> dict:
    d = outcome.download
    doc = {
        "_id": ObjectId(),  # made here: an insert retried after a lost reply is a duplicate, ignored
        "job": ctx.job_id, "downloader": ctx.download_id, "task": outcome.task["_id"], "lease": lease,
        "url": outcome.task["uri"], "status_code": d.status_code,
        "requests_headers": d.request_headers, "response_headers": d.headers,
        "requests_body": Binary(d.request_body or b""), "encoding": d.encoding,
        "hostname": settings.HOSTNAME, "remote_ip": d.remote_ip, "add_datetime": now,
    }
    if len(d.body) + len(d.request_body or b"") >= settings.GRIDFS_THRESHOLD:
        doc["response_body_gridfs"] = ObjectId()  # the file is written after this document
        doc["response_body"] = None
    else:
        doc["response_body"] = Binary(d.body)
    return doc


def _log_doc(ctx, lease: str, outcome: Outcome, now: datetime) -> dict:
    return {
        "_id": ObjectId(), "job": ctx.job_id, "task": outcome.task["_id"], "lease": lease,
        "status": SUCCESS if outcome.error is None else FAIL,
        "requests_size": outcome.request_size,
        "response_size": len(outcome.download.body) if outcome.download else 0,
        "failed_reason": redact(outcome.error.reason)[:10240] if outcome.error else None,
        "downloads_hostname": settings.HOSTNAME, "spend_time": outcome.spend_us, "add_datetime": now,
        **({"coalesced_from": outcome.coalesced_from} if outcome.coalesced_from is not None else {}),
    }


def _unstorable(outcome: Outcome, doc: dict) -> str | None:
    """Why one data document cannot be stored (None if it can)."""
    try:
        size = len(BSON.encode(doc))
    except (InvalidDocument, TypeError, ValueError, OverflowError) as exc:
        return f"response not storable: {type(exc).__name__}: {exc}"
    if size > MAX_BSON:
        return f"response not storable: document of {size} bytes exceeds MongoDB's 16 MiB limit"
    return None


def _insert_data(data_coll, outcomes: list[Outcome], docs: list[dict]) -> None:
    """Insert the data documents; one that MongoDB cannot take turns its outcome into a final
    failure instead of failing the others."""
    try:
        with_retries(lambda: _insert_ignoring_duplicates(data_coll, docs), "data insert")
        return
    except (InvalidDocument, DocumentTooLarge, BulkWriteError) as exc:
        if isinstance(exc, BulkWriteError) and all(e["code"] == DUPLICATE_KEY for e in exc.details["writeErrors"]):
            return
        logger.warning("a data document was refused (%s); storing the others", type(exc).__name__)
    keep_o, keep_d = [], []
    for o, d in zip(outcomes, docs):
        why = _unstorable(o, d)
        if why:
            o.download, o.error = None, DownloadError(why, retryable=False)
        else:
            keep_o.append(o)
            keep_d.append(d)
    outcomes[:] = keep_o
    docs[:] = keep_d
    with_retries(lambda: _insert_ignoring_duplicates(data_coll, docs), "data insert")


@dataclass
class Part:
    """Outcomes of one entry in one write."""

    ctx: object
    lease: str
    kind: str
    outcomes: list[Outcome]


def store(ctx, lease: str, kind: str, outcomes: list[Outcome], now: datetime) -> dict[str, int]:
    """Store outcomes of one entry (see ``store_many``)."""
    return store_many([Part(ctx, lease, kind, outcomes)], now)


def store_many(parts: list[Part], now: datetime) -> dict[str, int]:
    """Store outcomes of one or more entries, in bulk: one insert of data (then GridFS files of
    large bodies), one insert of logs, one bulk of task updates (an UpdateMany of the successes
    of each entry, an UpdateOne per failure). Returns counts of settled successes and failures."""
    data_coll = CrawlerDownloadData._get_collection()
    tasks = CrawlerTask._get_collection()
    ok = [(p, o) for p in parts for o in p.outcomes if o.error is None and o.deferred is None]
    data_docs = [_data_doc(p.ctx, p.lease, o, now) for p, o in ok]
    for (_, o), d in zip(ok, data_docs):
        o.data_id = d["_id"]
    if data_docs:
        outs = [o for _, o in ok]
        _insert_data(data_coll, outs, data_docs)
        kept = {id(o) for o in outs}
        ok = [(p, o) for p, o in ok if id(o) in kept]
        big = [(o, d) for o, d in zip(outs, data_docs) if d.get("response_body_gridfs")]
        if big:
            fs = gridfs_of(data_coll.database)
            for o, d in big:
                with_retries(lambda: _put_once(fs, o.download.body, d["response_body_gridfs"],
                                               f"{o.task['_id']}-{d['lease']}"), "GridFS put")
    bad = [(p, o) for p in parts for o in p.outcomes if o.error is not None and o.deferred is None]
    later = [(p, o) for p in parts for o in p.outcomes if o.deferred is not None]
    logs = [_log_doc(p.ctx, p.lease, o, now) for p, o in (*ok, *bad)]
    if logs:
        with_retries(lambda: _insert_ignoring_duplicates(CrawlerDownloadLog._get_collection(), logs), "log insert")

    ops: list = []
    ok_by_part: dict[int, tuple[Part, list]] = {}
    for p, o in ok:
        ok_by_part.setdefault(id(p), (p, []))[1].append(o.task["_id"])
    for p, ids in ok_by_part.values():
        ops.append(UpdateMany(
            {"_id": {"$in": ids}, **held_by(p.lease, p.kind)},
            {"$set": {"status": SUCCESS, "data_lease": p.lease, "failed_reason": None, "retry_at": None,
                      "last_update_datetime": now},
             "$inc": {"download_times": 1}, "$unset": UNSET_LEASE}))
    for p, o in bad:
        times = o.task.get("download_times", 0) + 1
        retry_at = next_retry_at(o.error, times, p.ctx.max_retry_times, now,
                                 settings.RETRY_BACKOFF_BASE, settings.RETRY_BACKOFF_MAX)
        ops.append(UpdateOne(
            {"_id": o.task["_id"], **held_by(p.lease, p.kind)},
            {"$set": {"status": FAIL, "retry_at": retry_at, "failed_reason": redact(o.error.reason)[:10240],
                      "last_update_datetime": now},
             "$inc": {"download_times": 1}, "$unset": UNSET_LEASE}))
    for p, o in later:  # handed back before any request: no attempt counted
        ops.append(UpdateOne(
            {"_id": o.task["_id"], **held_by(p.lease, p.kind)},
            {"$set": {"status": LIVE, "retry_at": now + timedelta(seconds=o.deferred), "last_update_datetime": now,
                      "failed_reason": redact(o.error.reason if o.error else "handed back")[:10240]},
             "$unset": UNSET_LEASE}))
    if not ops:
        return {"success": 0, "fail": 0}
    modified = with_retries(lambda: tasks.bulk_write(ops, ordered=False), "task settle").modified_count
    settled_ok = len(ok)
    if modified < len(ok) + len(bad):  # some were recovered or cancelled meanwhile
        for p, ids in ok_by_part.values():
            dropped = with_retries(lambda: drop_unsettled(p.lease, ids), "orphan cleanup")
            if dropped:  # one data document per unsettled success
                settled_ok -= dropped
                logger.info("dropped data of %s tasks no longer held by %s", dropped, p.lease)
    return {"success": settled_ok, "fail": max(0, modified - settled_ok - len(later))}


def _put_once(fs, body: bytes, file_id, filename: str) -> None:
    """Write a GridFS file under the id its data document names (a retry finds it there)."""
    if fs.exists(file_id):
        return
    fs.put(body, _id=file_id, filename=filename)
