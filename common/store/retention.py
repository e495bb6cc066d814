"""Removal by age: what ``master/ops/retention.py`` and ``master/ops/archive.py`` remove, and
the TTL indexes of the event logs. Owns no collection of its own; it removes from
``crawler_download_data`` (and its GridFS bodies), ``crawler_download_log``, ``crawler_task``
(final tasks, and their keys), ``notification`` and reads the jobs' retention settings.

Indexes used, all (equality fields..., ``_id``): an ObjectId begins with the second it was made,
so ``_id`` ranges are ages and no page pays for an index on a time field; reads go window by
window (``common.store.paging``). The event logs (dispatch, alert, registration error and
notification delivery logs) get a TTL index on ``add_datetime`` instead (``ensure_ttl``).

Invariants: a GridFS body is removed before its document (a body is never left without its
document unless this is cut short, and then the next pass finds the document again); a final
task removed takes its data with it, the data first (a data document counts only while its task
names it), and its key after it (``crawler_task_key``: one left by a pass cut short is taken over
by the next intake of its URL); every task removed moves its job's counts.
"""
from __future__ import annotations

import time
from datetime import datetime
from typing import Callable, Iterator

from bson import ObjectId
from pymongo.collection import Collection

from common.store import counts, known
from common.store import tasks as store_tasks
from common.store.clock import id_at
from common.store.data import body_of, gridfs_of
from common.store.fence import named as named_by_tasks
from common.store.fence import visible
from common.store.log_models import (
    CrawlerDispatchAlertLog,
    CrawlerDispatchLog,
    CrawlerDownloadLog,
    CrawlerGeneratorLog,
    CrawlerRegistrationErrorLog,
    NotificationLog,
)
from common.store.logrecords import DownloadLog
from common.store.models import (
    CANCEL,
    DEAD,
    FAIL,
    SUCCESS,
    TASK_STATUSES,
    CrawlerDownloadData,
    CrawlerDownloadSetting,
    CrawlerOldVersion,
    CrawlerTask,
    Job,
    Notification,
)
from common.store.pages import TASK_FIELDS
from common.store.paging import Doc, Span, by_id, in_chunks
from common.store.records import DataDoc, Task

TTL_LOGS = (CrawlerDispatchLog, CrawlerDispatchAlertLog, CrawlerRegistrationErrorLog, NotificationLog,
            CrawlerGeneratorLog)
TTL_INDEX = "retention_add_datetime"
BATCH = 2000
FINAL: tuple[dict[str, str | None], ...] = (
    {"status": SUCCESS}, {"status": DEAD}, {"status": CANCEL}, {"status": FAIL, "retry_at": None})


def ensure_ttl(days: float) -> None:
    """A TTL index of ``days`` on each event log's ``add_datetime`` (none when 0)."""
    want = int(days * 86400) if days else None
    for model in TTL_LOGS:
        coll = model._get_collection()
        current = [ix for ix in coll.list_indexes() if list(ix["key"].items()) == [("add_datetime", 1)]]
        for ix in current:
            if ix.get("expireAfterSeconds") != want:
                coll.drop_index(ix["name"])
        if want and not any(ix.get("expireAfterSeconds") == want for ix in current):
            coll.create_index("add_datetime", expireAfterSeconds=want, name=TTL_INDEX)


def overrides() -> dict[ObjectId, tuple[int | None, int | None]]:
    """{job id: (data days, log days)} for every job, None where the job sets no value of its own."""
    own = {d["job"]: d for d in CrawlerDownloadSetting._get_collection().find(
        {"$or": [{"data_retention_days": {"$ne": None}}, {"log_retention_days": {"$ne": None}}]},
        {"job": 1, "data_retention_days": 1, "log_retention_days": 1})}
    return {job["_id"]: (own.get(job["_id"], {}).get("data_retention_days"),
                         own.get(job["_id"], {}).get("log_retention_days"))
            for job in Job._get_collection().find({}, {"_id": 1})}


def revisited() -> set[ObjectId]:
    """The jobs with revisits (their pages' latest versions outlive the data retention)."""
    found = CrawlerDownloadSetting._get_collection().find({"revisit": {"$gt": 0}}, {"job": 1})
    return {d["job"] for d in found}


def drop_data(docs: list[Doc]) -> int:
    """Remove data documents (``_id``, ``response_body_gridfs``) and their GridFS bodies."""
    coll = CrawlerDownloadData._get_collection()
    fs = gridfs_of(coll.database)
    for doc in docs:
        if doc.get("response_body_gridfs"):
            fs.delete(doc["response_body_gridfs"])
    return sum(coll.delete_many({"_id": {"$in": ids}}).deleted_count
               for ids in in_chunks([d["_id"] for d in docs]))


def _remove_old(coll: Collection[Doc], job_id: ObjectId, before: ObjectId, span: Span, end: float,
                drop: Callable[[list[Doc]], int] | None = None) -> int:
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


def remove_old_data(job_id: ObjectId, before: ObjectId, span: Span, end: float) -> int:
    """The job's data documents made before ``before`` (and their bodies), until ``end``."""
    return _remove_old(CrawlerDownloadData._get_collection(), job_id, before, span, end, drop=drop_data)


def remove_old_versions(job_id: ObjectId, before: ObjectId, span: Span, end: float) -> int:
    """A job with revisits: the earlier versions of its pages superseded before ``before`` (listed
    in ``crawler_old_version`` when superseded), oldest first, until ``end``; their tasks forget
    them (``history``). A page's latest version stays while its task does, however old (an
    unchanged page is answered 304 and stores nothing newer), and the job's latest versions are
    never read. Returns the data documents removed."""
    coll, removed = CrawlerOldVersion._get_collection(), 0
    while time.monotonic() < end:
        listed = by_id(coll, {"job": job_id}, BATCH, span=span, before=before)
        if not listed:
            break
        removed += _drop_versions(listed)
        for ids in in_chunks([d["_id"] for d in listed]):
            coll.delete_many({"_id": {"$in": ids}})
    return removed


def _drop_versions(listed: list[Doc]) -> int:
    """``drop_data`` of the listed versions (task, lease) that are not their task's latest."""
    tasks, data = CrawlerTask._get_collection(), CrawlerDownloadData._get_collection()
    wanted = {(d["task"], d["lease"]) for d in listed}
    latest, docs = set(), []
    for part in in_chunks(list({task for task, _ in wanted})):
        named = tasks.find({"_id": {"$in": part}}, {"data_lease": 1})
        latest |= {(t["_id"], t.get("data_lease")) for t in named}
        found = data.find({"task": {"$in": part}}, {"task": 1, "lease": 1, "response_body_gridfs": 1})
        docs += [d for d in found if (key := (d["task"], d["lease"])) in wanted and key not in latest]
    removed = drop_data(docs)
    for task, lease in wanted - latest:
        tasks.update_one({"_id": task}, {"$pull": {"history": lease}})
    return removed


def remove_old_logs(job_id: ObjectId, before: ObjectId, span: Span, end: float) -> int:
    """The job's download logs made before ``before``, until ``end`` (monotonic time)."""
    return _remove_old(CrawlerDownloadLog._get_collection(), job_id, before, span, end)


def final_tasks(job_id: ObjectId, before: datetime, span: Span,
                revisits: bool = False) -> Iterator[tuple[str, list[Task]]]:
    """The job's final tasks last changed before ``before``, in batches (their status, the tasks):
    per final status, read window by window by (job, status, _id) — changed before it, so made
    before it — and checked here (another predicate in the query would make the embedded store
    read every task of the job). With ``revisits`` a SUCCESS task due for a visit (``retry_at``
    set) is not final. A batch may be empty (none of a window's tasks qualified)."""
    tasks, cutoff = CrawlerTask._get_collection(), id_at(before)
    for final in FINAL:
        after = None
        while docs := by_id(tasks, {"job": job_id, "status": final["status"]}, BATCH, span=span, after=after,
                            before=cutoff, projection=TASK_FIELDS):
            after = docs[-1]["_id"]
            yield str(final["status"]), [Task.from_doc(d) for d in docs if _final(d, final, before, revisits)]


def _final(doc: Doc, final: dict[str, str | None], before: datetime, revisits: bool) -> bool:
    return ((doc.get("last_update_datetime") or before) < before
            and all(doc.get(k) == v for k, v in final.items() if k != "status")
            and not (revisits and final["status"] == SUCCESS and doc.get("retry_at")))


def remove_tasks(job_id: ObjectId, status: str, before: datetime, ids: list[ObjectId]) -> tuple[int, int]:
    """Remove the tasks ``ids`` that are still final (``status``) and last changed before
    ``before``, with their data: the data first (a data document counts only while its task
    names it), then the tasks, their counts, then their keys. Returns (data, tasks) removed."""
    tasks, data, removed = CrawlerTask._get_collection(), 0, 0
    final = next(f for f in FINAL if f["status"] == status)
    unchanged = {**final, "last_update_datetime": {"$lt": before}}
    for part in in_chunks(ids):
        uris = {d["_id"]: d["uri"] for d in tasks.find({"_id": {"$in": part}, **unchanged}, {"uri": 1})}
        data += drop_data(list(CrawlerDownloadData._get_collection().find(
            {"task": {"$in": list(uris)}}, {"_id": 1, "response_body_gridfs": 1})))
        known.forget(job_id)  # before and after: no removed URL stays in intake's filter
        gone = tasks.delete_many({"_id": {"$in": list(uris)}, **unchanged}).deleted_count
        known.forget(job_id)
        counts.move([(job_id, status, None, gone)])
        left = {d["_id"] for d in tasks.find({"_id": {"$in": list(uris)}}, {"_id": 1})} \
            if gone < len(uris) else set()
        store_tasks.forget(job_id, [(i, u) for i, u in uris.items() if i not in left])  # then keys
        removed += gone
    return data, removed


def remove_final(job_id: ObjectId, before: datetime, span: Span, end: float,
                 revisits: bool = False) -> tuple[int, int, bool]:
    """Remove the job's final tasks last changed before ``before`` (``final_tasks``) and their
    data, until ``end``. Returns (data removed, tasks removed, every one was reached)."""
    data, gone_all = 0, 0
    for final, docs in final_tasks(job_id, before, span, revisits):
        if time.monotonic() >= end:
            return data, gone_all, False
        data_gone, tasks_gone = remove_tasks(job_id, final, before, [t.id for t in docs])
        data, gone_all = data + data_gone, gone_all + tasks_gone
    return data, gone_all, True


def oldest_left(job_id: ObjectId, before: datetime, span: Span) -> ObjectId:
    """The lowest ``_id`` of the job's tasks made before ``before`` that retention left (tasks
    still to download, retried or changed since), else ``before`` itself: the job's new floor."""
    tasks, cutoff = CrawlerTask._get_collection(), id_at(before)
    left = [d["_id"] for status in TASK_STATUSES
            for d in by_id(tasks, {"job": job_id, "status": status}, 1, span=span, before=cutoff,
                           projection={"_id": 1})]
    return min(left, default=cutoff)


def remove_notifications(before: ObjectId, end: float) -> int:
    """Delivered or finally failed notifications made before ``before``, in batches until ``end``."""
    coll, removed = Notification._get_collection(), 0
    query = {"state": {"$in": [SUCCESS, FAIL]}, "_id": {"$lt": before}}
    while time.monotonic() < end:
        ids = [d["_id"] for d in coll.find(query, {"_id": 1}).limit(BATCH)]
        if not ids:
            break
        removed += coll.delete_many({"_id": {"$in": ids}}).deleted_count
    return removed


# --- the archive: read, then remove --------------------------------------------------------

def old_data(job_id: ObjectId, before: ObjectId) -> Iterator[tuple[DataDoc, bytes]]:
    """(document, body) of the job's earlier versions of pages made before ``before``, in ``_id``
    order: documents their task names in its ``history`` and a later version superseded. A page's
    latest version is never read here (it goes only with its task, ``remove_final``), nor a data
    document no task names."""
    coll = CrawlerDownloadData._get_collection()
    fs = gridfs_of(coll.database)
    cursor = coll.find({"job": job_id, "_id": {"$lt": before}}, {"requests_body": 0}).sort("_id", 1)
    for doc in visible(cursor.batch_size(200)):
        if doc.get("superseded"):  # marked once a later version is named: never the latest
            yield DataDoc.from_doc(doc), body_of(doc, fs)


def old_logs(job_id: ObjectId, before: ObjectId) -> Iterator[DownloadLog]:
    """The job's download logs made before ``before``, in ``_id`` order."""
    yield from map(DownloadLog.from_doc, CrawlerDownloadLog._get_collection().find(
        {"job": job_id, "_id": {"$lt": before}}).sort("_id", 1).batch_size(1000))


def data_of_tasks(ids: list[ObjectId], but_old_before: ObjectId) -> Iterator[tuple[DataDoc, bytes]]:
    """(document, body) of every version the tasks ``ids`` name (latest and earlier), in ``_id``
    order, but the earlier versions made before ``but_old_before`` (``old_data``'s); a document
    no task names is not read."""
    coll = CrawlerDownloadData._get_collection()
    fs = gridfs_of(coll.database)
    docs = [d for d in coll.find({"task": {"$in": ids}}, {"_id": 1, "task": 1, "lease": 1, "superseded": 1})
            if not (d.get("superseded") and d["_id"] < but_old_before)]
    keep = sorted(named_by_tasks(docs))
    for part in in_chunks(keep):
        for doc in coll.find({"_id": {"$in": part}}, {"requests_body": 0}).sort("_id", 1):
            yield DataDoc.from_doc(doc), body_of(doc, fs)


def remove_data(ids: list[ObjectId]) -> None:
    """Remove the data documents ``ids`` (GridFS bodies first) but any that is its page's latest
    version; their tasks forget them (``history``)."""
    coll = CrawlerDownloadData._get_collection()
    fs = gridfs_of(coll.database)
    docs = list(coll.find({"_id": {"$in": ids}}, {"response_body_gridfs": 1, "task": 1, "lease": 1}))
    latest = named_by_tasks(docs, latest=True)
    docs = [d for d in docs if d["_id"] not in latest]
    for doc in docs:
        if doc.get("response_body_gridfs"):
            fs.delete(doc["response_body_gridfs"])
    coll.delete_many({"_id": {"$in": [d["_id"] for d in docs]}})
    tasks = CrawlerTask._get_collection()
    for doc in docs:
        tasks.update_one({"_id": doc["task"]}, {"$pull": {"history": doc["lease"]}})


def remove_logs(ids: list[ObjectId]) -> None:
    """Remove the download logs ``ids``."""
    CrawlerDownloadLog._get_collection().delete_many({"_id": {"$in": ids}})
