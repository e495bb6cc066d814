"""Export documents (``export``): an asynchronous export of a job's data, PENDING -> RUNNING ->
SUCCESS | FAIL | CANCEL, and EXPIRED once its file (GridFS bucket ``export_fs``) is removed.

Indexes: ``(digest, created_at)`` finds an identical export underway or fresh (de-duplication);
``(state, retry_at)`` the PENDING exports due and the RUNNING ones to judge; ``(job_name,
-created_at)`` and ``(requested_by, -created_at)`` the listings, newest first.
Invariant: every change of state is a compare-and-set on the state it leaves (and, for a
RUNNING export, on the worker that holds it), so a cancelled or recovered attempt can never
settle; times a worker writes and the defender judges are by the store's clock. An attempt is
claimed work (``common.store.claims``, as ``EXPORT``): held while RUNNING by its worker, taken
back after HEARTBEAT_TTL without a beat or past its ``deadline_at``, FAIL at MAX_RECOVERIES.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Iterator

from bson import ObjectId
from gridfs import GridFSBucket
from gridfs.errors import NoFile
from gridfs.grid_file import GridOut
from pymongo.collection import Collection

from common.config import settings
from common.store import claims
from common.store.connection import collection
from common.store.data import EXPORT_BUCKET
from common.store.models import CANCELLED, EXPIRED, EXPORT_RUNNING, FAIL, PENDING, SUCCESS, Export
from common.store.records import ExportRecord


def _coll() -> Collection[dict[str, Any]]:
    return collection(Export)


EXPORT = claims.Claimed("export", _coll, owner="worker", ttl=lambda: float(settings.HEARTBEAT_TTL),
                        max_recoveries=lambda: int(settings.MAX_RECOVERIES),
                        held={"state": EXPORT_RUNNING}, alert="export_fail")


# --- requests (the master) ---------------------------------------------------------------

def earlier(key: str, now: datetime, window: timedelta, owner: ObjectId | None = None) -> ExportRecord | None:
    """The newest export of ``owner`` (a token's id; None: the command line) with digest ``key``
    underway, or finished with SUCCESS within ``window``."""
    found = _coll().find({"digest": key, "owner": owner,
                          "$or": [{"state": {"$in": [PENDING, EXPORT_RUNNING]}},
                                  {"state": SUCCESS, "created_at": {"$gte": now - window}}]})
    return next((ExportRecord.from_doc(d) for d in found.sort("created_at", -1).limit(1)), None)


def add(export: ExportRecord) -> ExportRecord:
    """Insert a new (PENDING) export; as stored."""
    _coll().insert_one(export.to_doc())
    return export


def remove(export_id: ObjectId) -> None:
    """Delete an export's document (its file is dropped by the caller)."""
    _coll().delete_one({"_id": export_id})


def join(export_id: ObjectId, callbacks: list[str], mails: list[str]) -> None:
    """Add the callbacks and mails of a request that joined the export."""
    _coll().update_one({"_id": export_id}, {"$addToSet": {"callback_urls": {"$each": callbacks},
                                                          "mails": {"$each": mails}}})


def mark_queued(export_id: ObjectId, now: datetime) -> None:
    """Note when a PENDING export's queue entry was pushed."""
    _coll().update_one({"_id": export_id, "state": PENDING}, {"$set": {"queued_at": now}})


def get(export_id: ObjectId) -> ExportRecord | None:
    return ExportRecord.maybe(_coll().find_one({"_id": export_id}))


@dataclass(frozen=True)
class Viewer:
    """Whose exports a listing shows: those of the projects ``held`` (``default``: the id of the
    project of exports stored before projects) that the token ``owner`` (named ``name``, made at
    ``since``) requested, or whose job it was ``granted``. An export stored before exports had an
    ``owner`` counts as the token's by ``name`` if it is not older than the token (an earlier
    token of that name, revoked since, owned those); ``migrate`` fills ``owner`` in."""

    owner: ObjectId
    name: str
    since: datetime | None
    granted: list[str]
    held: list[int]
    default: int

    def query(self) -> dict[str, Any]:
        legacy: dict[str, Any] = {"owner": None, "requested_by": self.name}
        if self.since is not None:
            legacy["created_at"] = {"$gte": self.since}
        in_projects: dict[str, Any] = {"project": {"$in": list(self.held)}}
        if self.default in self.held:  # exports stored before projects: the default project's
            in_projects = {"$or": [in_projects, {"project": None}]}
        mine = {"$or": [{"owner": self.owner}, legacy, {"job_name": {"$in": list(self.granted)}}]}
        return {"$and": [in_projects, mine]}


def listing(job_name: str | None, limit: int, viewer: Viewer | None = None) -> list[ExportRecord]:
    """Up to ``limit`` exports (of job ``job_name``), newest first; with ``viewer`` only those it sees."""
    query: dict[str, Any] = {"job_name": job_name} if job_name else {}
    if viewer is not None:
        query = {**query, **viewer.query()}
    return [ExportRecord.from_doc(d) for d in _coll().find(query).sort("created_at", -1).limit(limit)]


def retry(export_id: ObjectId, now: datetime) -> bool:
    """FAIL -> PENDING, due now, with its attempts and recoveries counted afresh; whether it was FAIL."""
    return bool(_coll().update_one(
        {"_id": export_id, "state": FAIL},
        {"$set": {"state": PENDING, "retry_at": now, "attempts": 0, "recoveries": 0, "error": None,
                  "worker": None},
         "$unset": {"finished_at": 1, "queued_at": 1, "deadline_at": 1}}).modified_count)


def fill_owners(owners: dict[str, tuple[ObjectId, datetime | None]]) -> int:
    """The upgrade to owned exports: each export without an ``owner`` whose ``requested_by``
    names a live token (``owners``: name -> (id, created)) and is not older than that token gets
    its id; the others (the command line's, a revoked token's) keep none. How many changed."""
    changed = 0
    for name, (token_id, created) in owners.items():
        query: dict[str, Any] = {"owner": None, "requested_by": name}
        if created is not None:
            query["created_at"] = {"$gte": created}
        changed += _coll().update_many(query, {"$set": {"owner": token_id}}).modified_count
    return changed


def cancel(export_id: ObjectId, now: datetime) -> bool:
    """PENDING or RUNNING -> CANCEL; whether it was either."""
    return bool(_coll().update_one({"_id": export_id, "state": {"$in": [PENDING, EXPORT_RUNNING]}},
                                   {"$set": {"state": CANCELLED, "finished_at": now, "error": "cancelled"}})
                .modified_count)


def by_state() -> dict[str, int]:
    """How many exports there are in each state (states without any left out)."""
    rows = _coll().aggregate([{"$group": {"_id": "$state", "n": {"$sum": 1}}}])
    return {row["_id"]: row["n"] for row in rows}


def open_file(file_id: ObjectId | None) -> GridOut:
    """A reader of an export's file (``gridfs.errors.NoFile`` if it is gone, or it has none)."""
    if file_id is None:
        raise NoFile("the export has no file")
    return GridFSBucket(_coll().database, bucket_name=EXPORT_BUCKET).open_download_stream(file_id)


def event_doc(export_id: ObjectId, fields: tuple[str, ...]) -> ExportRecord | None:
    """The export with only ``fields`` read."""
    return ExportRecord.maybe(_coll().find_one({"_id": export_id}, {k: 1 for k in fields}))


# --- tending (every dispatcher run) ------------------------------------------------------

def recover_dead(now: datetime) -> Iterator[tuple[ExportRecord, bool]]:
    """Give RUNNING exports whose worker stopped beating back to PENDING (FAIL when given up,
    ``claims.gives_up``); yields (the export with its ``file_id``, final) for each."""
    for doc in claims.expired(EXPORT, now, {"file_id": 1, "job": 1}):
        final = claims.recover(EXPORT, doc, "its worker died", _again(now, "its worker died"),
                               _given_up(now, f"its worker died {EXPORT.max_recoveries()} times"),
                               job=doc.get("job"))
        if final is not None:
            yield ExportRecord.from_doc(doc), final


def stop_overrun(now: datetime, default_limit: int) -> Iterator[tuple[ExportRecord, bool]]:
    """Stop RUNNING exports past their deadline: PENDING again, a recovery as a dead worker's
    (FAIL when given up); yields (the export with its ``file_id``, final) for each."""
    over = {**EXPORT.held, "deadline_at": {"$lt": now}}
    for doc in _coll().find(over, {"file_id": 1, "job": 1, "max_exec_time": 1, claims.COUNTER: 1}):
        error = f"ran over its time limit of {doc.get('max_exec_time') or default_limit} s (max_exec_time)"
        final = claims.recover(EXPORT, doc, error, _again(now, error), _given_up(now, error),
                               guard={"_id": doc["_id"], **over}, job=doc.get("job"))
        if final is not None:
            yield ExportRecord.from_doc(doc), final


def _again(now: datetime, error: str) -> dict[str, Any]:
    return {"$set": {"state": PENDING, "retry_at": now, "error": error}, "$unset": {"queued_at": 1}}


def _given_up(now: datetime, error: str) -> dict[str, Any]:
    return {"$set": {"state": FAIL, "retry_at": now, "error": error, "finished_at": now},
            "$unset": {"queued_at": 1}}


def due(now: datetime) -> Iterator[ExportRecord]:
    """The PENDING exports due by ``now`` (only their ``id`` and ``queued_at`` read)."""
    found = _coll().find({"state": PENDING, "retry_at": {"$lte": now}}, {"_id": 1, "queued_at": 1})
    return map(ExportRecord.from_doc, found)


def expire(now: datetime, ttl: timedelta | None = None) -> Iterator[ExportRecord]:
    """SUCCESS exports past ``expires_at`` -> EXPIRED, and (with ``ttl``) download tasks of the
    general center that ended without a file (FAIL, CANCEL) longer than ``ttl`` ago: a download
    task expires after 7 days whatever became of it. Yields each (with its ``file_id``)."""
    coll = _coll()
    for doc in coll.find({"state": SUCCESS, "expires_at": {"$lt": now}}, {"file_id": 1}):
        expired = coll.update_one({"_id": doc["_id"], "state": SUCCESS}, {"$set": {"state": EXPIRED}})
        if expired.modified_count:
            yield ExportRecord.from_doc(doc)
    if ttl is None:
        return
    ended = {"state": {"$in": [FAIL, CANCELLED]}, "center": {"$exists": True, "$ne": {}},
             "finished_at": {"$lt": now - ttl}}
    for doc in coll.find(ended, {"file_id": 1, "state": 1}):
        expired = coll.update_one({"_id": doc["_id"], "state": doc["state"]}, {"$set": {"state": EXPIRED}})
        if expired.modified_count:
            yield ExportRecord.from_doc(doc)


# --- an attempt (the exporter) -----------------------------------------------------------

def claim(export_id: ObjectId, worker_id: str, now: datetime, default_limit: int,
          file_id: ObjectId) -> ExportRecord | None:
    """PENDING -> RUNNING for ``worker_id`` (counting the attempt); the export after, or None if
    it was not PENDING."""
    limit = (_coll().find_one({"_id": export_id}, {"max_exec_time": 1}) or {}).get("max_exec_time")
    limit = limit or default_limit
    return ExportRecord.maybe(claims.claim(
        EXPORT, {"_id": export_id, "state": PENDING}, worker_id,
        {"$set": {"started_at": now, "deadline_at": now + timedelta(seconds=limit), "file_id": file_id,
                  "rows_done": 0, "error": None},
         "$inc": {"attempts": 1}, "$unset": {"queued_at": 1}}))


def progress(export_id: ObjectId, worker_id: str, rows: int) -> bool:
    """Record rows done; whether the export is still RUNNING by ``worker_id``."""
    return bool(_coll().update_one({"_id": export_id, **claims.holding(EXPORT, worker_id)},
                                   {"$set": {"rows_done": rows}}).matched_count)


def set_total(export_id: ObjectId, worker_id: str, total: int) -> None:
    _coll().update_one({"_id": export_id, **claims.holding(EXPORT, worker_id)},
                       {"$set": {"rows_total": total}})


def settle(export_id: ObjectId, worker_id: str, rows: int, size: int, done: datetime, ttl: timedelta) -> bool:
    """RUNNING by ``worker_id`` -> SUCCESS; whether it still was."""
    return bool(_coll().update_one(
        {"_id": export_id, **claims.holding(EXPORT, worker_id)},
        {"$set": {"state": SUCCESS, "rows_done": rows, "rows_total": rows, "bytes": size, "finished_at": done,
                  "expires_at": done + ttl, "beat_at": done}}).modified_count)


def fail(export_id: ObjectId, worker_id: str, reason: str, now: datetime, final: bool,
         retry_at: datetime) -> bool:
    """RUNNING by ``worker_id`` -> FAIL (``final``) or PENDING again from ``retry_at``; whether it
    still was."""
    update = {"state": FAIL, "finished_at": now} if final else {"state": PENDING, "retry_at": retry_at}
    return bool(_coll().update_one({"_id": export_id, **claims.holding(EXPORT, worker_id)},
                                   {"$set": {**update, "error": reason, "worker": None}}).modified_count)
