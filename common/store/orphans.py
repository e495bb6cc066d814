"""The fence: why a worker whose lease was given back changes nothing a reader sees, and the
orphans it leaves (tombstones, the writer's prompt cleanup, the defender's sweep).

A task names its data: on
SUCCESS its ``data_lease`` is the lease whose attempt stored it, and an entry stores at most one
outcome per task, so (task, data_lease) names exactly one ``crawler_download_data`` document.
Data is inserted before the settle (a settle must never name data that is not stored), so an
insert is not itself guarded: a stale worker's insert, or one retried or delivered late over a
connection that a partition held, may land after its lease was given back. Such a document is
an orphan that no task names. Readers read data only through ``common.store.fence.visible``
(the data export, the export center, the API and console), so an orphan is never read,
whatever the interleaving (the check is made document by document only for leases still open or
tombstoned, ``tombstone``); the writer removes its own refused data at once, and
``sweep_orphans`` (the defender's share) removes whatever is left once its lease is gone and
DATA_SWEEP_GRACE has passed, longer than an in-flight write can live.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from bson import ObjectId

from common.config import settings
from common.store.clock import utcnow
from common.store.data import gridfs_of
from common.store.fence import named
from common.store.models import CrawlerDownloadData, CrawlerLease, CrawlerTask, LostLease
from common.store.paging import Doc

logger = logging.getLogger(__name__)


def _drop_data(docs: list[Doc]) -> int:
    """Delete data documents (GridFS bodies first: a body is never left without its document
    unless this is cut short, and then the sweep finds the document again)."""
    if not docs:
        return 0
    coll = CrawlerDownloadData._get_collection()
    fs = None
    for d in docs:
        if d.get("response_body_gridfs"):
            fs = fs or gridfs_of(coll.database)
            fs.delete(d["response_body_gridfs"])
    return int(coll.delete_many({"_id": {"$in": [d["_id"] for d in docs]}}).deleted_count)


def tombstone(lease: str, job_id: ObjectId | None, reason: str, ids: list[ObjectId],
              now: datetime | None = None) -> None:
    """Mark ``lease`` as one whose data may hold orphans (given back, or a settle refused):
    readers then check its documents one by one, and the sweep looks for orphans among the data
    it stored for ``ids``. Written before the lease ends."""
    LostLease._get_collection().update_one(
        {"_id": lease}, {"$setOnInsert": {"job": job_id, "reason": reason[:200], "at": now or utcnow()},
                         "$addToSet": {"ids": {"$each": list(ids)}}, "$unset": {"swept": ""}}, upsert=True)


def settled_of(lease: str, ids: list[ObjectId]) -> set[ObjectId]:
    """The tasks among ``ids`` that name data of ``lease`` (a success settled under it)."""
    if not ids:
        return set()
    return {
        d["_id"]
        for d in CrawlerTask._get_collection().find({"_id": {"$in": ids}, "data_lease": lease}, {"_id": 1})
    }


def drop_unsettled(lease: str, ids: list[ObjectId]) -> int:
    """Delete data that ``lease`` stored for tasks among ``ids`` that do not name it (prompt
    cleanup by the writer and the defender; readers never see such data either way)."""
    if not ids:
        return 0
    settled = settled_of(lease, ids)
    orphans = [i for i in ids if i not in settled]
    if not orphans:
        return 0
    docs = list(CrawlerDownloadData._get_collection().find(
        {"task": {"$in": orphans}, "lease": lease}, {"response_body_gridfs": 1}))
    return _drop_data(docs)


def drop_orphans_of_versions() -> int:
    """Data of one page version stored more than once (a store written before one document per
    version was kept, ``models.CrawlerDownloadData``): the documents no task names go (read whole
    once: ``migrate``'s)."""
    twice = CrawlerDownloadData._get_collection().aggregate([
        {"$group": {"_id": {"task": "$task", "version": "$version"}, "n": {"$sum": 1},
                    "docs": {"$push": {"_id": "$_id", "task": "$task", "lease": "$lease",
                                       "response_body_gridfs": "$response_body_gridfs"}}}},
        {"$match": {"n": {"$gt": 1}}}], allowDiskUse=True)
    docs = [d for group in twice for d in group["docs"]]
    keep = named(docs)
    return _drop_data([d for d in docs if d["_id"] not in keep])


def sweep_orphans(now: datetime | None = None, grace: float | None = None, budget: float = 30.0,
                  batch: int = 500) -> int:
    """Remove data documents that no task names. Only a tombstoned lease can have such data (a
    lease ends with its settles all matched, else it is tombstoned first: ``tombstone``), so the
    sweep reads tombstones, not the data: each once, when it is older than ``grace``
    (DATA_SWEEP_GRACE, longer than a write in flight can live) and its lease is gone, finding its
    documents by (task, lease) for the tasks it lists. Its cost follows the tombstones (a few a
    day), not the size of the store. Not removed: data of a worker frozen past the grace that
    then inserts and dies before its own cleanup (no reader shows it), and of tombstones an
    earlier version wrote without their tasks."""
    now = now or utcnow()
    grace = settings.DATA_SWEEP_GRACE if grace is None else grace
    tombs, data = LostLease._get_collection(), CrawlerDownloadData._get_collection()
    due = list(
        tombs.find({"swept": None, "at": {"$lte": now - timedelta(seconds=grace)}}).sort("at", 1).limit(batch)
    )
    open_ = {
        x["_id"]
        for x in CrawlerLease._get_collection().find({"_id": {"$in": [t["_id"] for t in due]}}, {"_id": 1})
    }
    end, removed = time.monotonic() + budget, 0
    for tomb in due:
        if time.monotonic() > end:
            break
        if tomb["_id"] in open_:  # an attempt under it may still settle: look again next time
            continue
        docs = list(data.find({"task": {"$in": tomb.get("ids") or []}, "lease": tomb["_id"]},
                              {"task": 1, "lease": 1, "response_body_gridfs": 1})) if tomb.get("ids") else []
        keep = named(docs)
        removed += _drop_data([d for d in docs if d["_id"] not in keep])
        tombs.update_one({"_id": tomb["_id"]}, {"$set": {"swept": now}})
    if removed:
        logger.warning(
            "defender: removed %s data documents that no task names (orphans of lost attempts)", removed
        )
    return removed
