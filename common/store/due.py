"""The dispatcher's selection of due tasks in ``crawler_task`` (a room of ``tasks.py``, whose
docstring states the fresh cursor and the indexes these reads use): fresh tasks above a job's
cursor (``due_fresh``, ``fresh_cursor``, ``advance_cursor``), tasks due again (``due_again``),
revisits (``due_revisits``, ``make_due``) and the mark of those sent (``mark_sent``).

Invariant (as in ``tasks.py``): every change of tasks' status here is followed at once by its
move in ``common.store.counts``, with the number the change's own result reports.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bson import ObjectId

from common.store import counts
from common.store.clock import store_now
from common.store.connection import collection
from common.store.models import DISPATCH, FAIL, LIVE, SUCCESS, Job
from common.store.paging import by_id, in_chunks
from common.store.records import Job as JobRecord
from common.store.records import Prev
from common.store.tasks import INTAKE_STALE, _tasks

EPOCH = datetime(1970, 1, 1)
WINDOW_MIN = 64


@dataclass
class Picked:
    """One due task: its id, the worker host it must go to ("": any) and (fresh tasks) seq."""

    id: ObjectId
    worker_host: str
    seq: int = 0
    uri: str = ""
    attempts: int = 0
    status: str = LIVE  # what it was when picked (a task that goes again: FAIL, LIVE or SUCCESS)
    prev: Prev | None = None  # a stored page visited again: its latest version (``prev_of``)
    due: datetime | None = None  # a revisit: when it came due
    sitemap: str | None = None  # a sitemap task's kind (``NewTask.sitemap``) ...
    depth: int = 0              # ... and its depth, carried in its entry's lease


PREV_FIELDS = ("data_lease", "etag", "last_modified", "digest", "versions", "revisit_every")


def prev_of(doc: Mapping[str, Any]) -> Prev | None:
    """What a visit of a task with a stored version needs of it (validators, digest, version
    count, interval), copied into its entry's lease; None for a task never stored."""
    return Prev.from_doc(doc) if doc.get("data_lease") else None


def fresh_limit(job: JobRecord, now: datetime) -> int:
    """The highest seq whose task is surely inserted: below every live intake reservation."""
    top = job.seq_next
    for r in job.intake:
        if r.get("at") and now - r["at"] < INTAKE_STALE:
            top = min(top, r["seq"] - 1)
    return top


def due_fresh(job: JobRecord, need: int, now: datetime) -> tuple[list[Picked], int]:
    """Up to ``need`` fresh LIVE tasks above the cursor, in seq order, and the seq up to which
    the job was read (the cursor's new place if all of them go out)."""
    lo, top = job.seq_sent, fresh_limit(job, now)
    picked: list[Picked] = []
    window = max(need, WINDOW_MIN)
    while lo < top and len(picked) < need:
        hi = min(lo + window, top)
        flt = {"job": job.id, "status": LIVE, "retry_at": None, "seq": {"$gt": lo, "$lte": hi}}
        docs = sorted(_tasks().find(flt, {"_id": 1, "host_name": 1, "seq": 1, "uri": 1, "sitemap": 1,
                                          "depth": 1}), key=lambda d: d["seq"])
        picked.extend(Picked(d["_id"], d.get("host_name") or "", d["seq"], d["uri"],
                             sitemap=d.get("sitemap"), depth=d.get("depth") or 0)
                      for d in docs[: need - len(picked)])
        if len(picked) >= need:
            return picked, picked[-1].seq
        lo = hi
        window *= 2  # gaps (duplicates, cancelled tasks): widen
    return picked, max(lo, job.seq_sent)


def fresh_cursor(picked: list[Picked], read_to: int, sent: int) -> int:
    """Where the cursor may move once the first ``sent`` picked tasks went out: just below the
    first one that did not, or to the end of what was read when all went."""
    return picked[sent].seq - 1 if sent < len(picked) else read_to


def advance_cursor(job_id: ObjectId, was: int, to: int) -> bool:
    """Move the job's cursor from ``was`` to ``to``; False if another dispatcher moved it first."""
    return collection(Job).update_one({"_id": job_id, "seq_sent": was},
                                      {"$set": {"seq_sent": to}}).matched_count == 1


Floor = tuple[datetime, ObjectId | None]  # a job's revisit floor: (due time, _id); None: all of that time
PICK_FIELDS = {"_id": 1, "host_name": 1, "download_times": 1, "uri": 1, "sitemap": 1, "depth": 1,
               **dict.fromkeys(PREV_FIELDS, 1)}


def _picked(d: Mapping[str, Any], status: str, due: datetime | None = None) -> Picked:
    attempts = 0 if status == SUCCESS else d.get("download_times", 0)  # a revisit counts afresh
    return Picked(d["_id"], d.get("host_name") or "", 0, d["uri"], attempts, status, prev_of(d), due,
                  d.get("sitemap"), d.get("depth") or 0)


def due_again(job_id: ObjectId, max_retry_times: int, need: int, now: datetime) -> list[Picked]:
    """Up to ``need`` tasks that go again: retryable FAIL, then LIVE recovered or requeued.
    Queries name only the fields of the task index (job, status, retry_at): another predicate
    makes some servers scan the collection, so ``download_times`` is checked here."""
    picked: list[Picked] = []
    due = {"$gte": EPOCH, "$lte": now}
    for status in (FAIL, LIVE):
        if len(picked) >= need:
            break
        if status == FAIL and max_retry_times <= 0:
            continue
        for d in _tasks().find({"job": job_id, "status": status, "retry_at": due}, PICK_FIELDS):
            if d.get("download_times", 0) < max_retry_times or status == LIVE:
                picked.append(_picked(d, status))
                if len(picked) >= need:
                    break
    return picked


REVISIT_WINDOW = timedelta(minutes=1)      # the first window of due times read
REVISIT_WINDOW_MAX = timedelta(minutes=15)  # an empty window doubles the next, up to this


def due_revisits(job: JobRecord, need: int, now: datetime) -> tuple[list[Picked], Floor | None]:
    """Up to ``need`` SUCCESS tasks whose revisit is due, in (due time, ``_id``) order, and the
    job's new revisit floor once they are sent: (due time, ``_id``) of the last one, every task
    up to which has gone out (``_id`` None: every task due up to that time).

    Revisits are sent without a write of their own (``common.store.leases._held_by``): what keeps
    the next run from sending them again is the floor (``revisit_from``, ``revisit_from_id``).
    Read in windows of due time up from the floor, each one range of the (job, status, retry_at,
    seq) index, until ``need`` are found or ``now`` is reached: a query with a sort and a limit
    would make some servers read every due task first. An empty window doubles the next, up to
    REVISIT_WINDOW_MAX (a window is never so wide that a burst of due pages behind a quiet
    stretch lands in it whole); one that held some sizes the next by what it found. The floor is
    safe: a settle or a release sets ``retry_at`` after the time it is written, later than the
    time this run began."""
    if need <= 0:
        return [], None
    lo, lo_id = job.revisit_from or EPOCH, job.revisit_from_id
    fields, job_id = {**PICK_FIELDS, "retry_at": 1}, job.id
    picked: list[dict[str, Any]] = []
    if lo_id is not None and lo <= now:  # the rest of the floor's own due time
        same = _tasks().find({"job": job_id, "status": SUCCESS, "retry_at": lo}, fields)
        picked = sorted((d for d in same if d["_id"] > lo_id), key=lambda d: d["_id"])[:need]
    width = REVISIT_WINDOW
    while len(picked) < need and lo < now:
        hi = lo + width
        due = {"$gt": lo, "$lt": hi} if hi < now else {"$gt": lo, "$lte": now}
        found = sorted(_tasks().find({"job": job_id, "status": SUCCESS, "retry_at": due}, fields),
                       key=lambda d: (d["retry_at"], d["_id"]))
        picked += found[:need - len(picked)]
        if hi >= now:
            break
        lo = hi - timedelta(microseconds=1)  # (BSON times are milliseconds)
        if found:  # as many again as are still needed, at the density just seen
            width = max(REVISIT_WINDOW, min(width * 2, width * (need - len(picked)) / len(found)))
        else:
            width = min(width * 2, REVISIT_WINDOW_MAX)
    tasks = [_picked(d, SUCCESS, d["retry_at"]) for d in picked]
    if len(picked) >= need:  # the rest of the last window is still due: the floor stays on it
        return tasks, (picked[-1]["retry_at"], picked[-1]["_id"])
    return tasks, (now, None)


def start_revisits(job_id: ObjectId, now: datetime) -> bool:
    """The job has revisits. The first time: its floor starts just before ``now`` (a success sets
    a due time after the time it settles, so none is due earlier) and its pages already stored
    are left to the "revisits" chore (``revisit_backlog``); whether this was the first time."""
    floor = {"revisit_from": now - timedelta(milliseconds=1), "revisit_from_id": None,
             "revisit_backlog": FROM_START}
    return bool(collection(Job).update_one({"_id": job_id, "revisit_from": None},
                                           {"$set": floor}).modified_count)


FROM_START = ObjectId("0" * 24)  # a backlog not begun


def make_due(end: float, batch: int = 2000) -> int:
    """The "revisits" chore: make the SUCCESS tasks each job had stored when its revisits were
    turned on due now, in ``_id`` order from its ``revisit_backlog``, in batches read window by
    window, until ``end`` (monotonic time): a chore bounded in time however large the backlog,
    never the registering request (why: docs/revisits.md); a job's backlog is gone once all are.
    Due by the store's clock when written: after the floor of any dispatcher run begun before.
    Returns how many came due."""
    made = 0
    for job in collection(Job).find({"revisit_backlog": {"$ne": None}}, {"revisit_backlog": 1}):
        job_id, mark = job["_id"], job["revisit_backlog"]
        after, span = (None if mark == FROM_START else mark), counts.span(job_id)
        while time.monotonic() < end:
            docs = by_id(_tasks(), {"job": job_id, "status": SUCCESS}, batch, span=span, after=after,
                         projection={"_id": 1, "retry_at": 1})
            now = store_now()
            for part in in_chunks([d["_id"] for d in docs if d.get("retry_at") is None]):
                made += _tasks().update_many({"_id": {"$in": part}, "status": SUCCESS, "retry_at": None},
                                             {"$set": {"retry_at": now}}).modified_count
            done = len(docs) < batch
            after = None if done else docs[-1]["_id"]
            collection(Job).update_one({"_id": job_id}, {"$unset": {"revisit_backlog": ""}} if done
                                       else {"$set": {"revisit_backlog": after}})
            if done:
                break
    return made


def raise_revisit_floor(job_id: ObjectId, at: datetime, last_id: ObjectId | None) -> None:
    """Every SUCCESS task of the job due up to (``at``, ``last_id``) was sent (``due_revisits``):
    later runs read from there."""
    collection(Job).update_one({"_id": job_id}, {"$set": {"revisit_from": at, "revisit_from_id": last_id}})


def mark_sent(job_id: ObjectId, entries: list[tuple[str, str, list[Picked]]], now: datetime) -> None:
    """Tasks that go again, sent in entries (lease, queue, tasks): DISPATCH, if still due
    (``due_again`` checked the rest). By ``_id`` and one status at a time, as an ``$or`` makes
    some servers scan every task; the counts move by what each update changed, in one write."""
    moves: list[tuple[ObjectId | None, str | None, str, int]] = []
    lowest = min((t.id for _, _, picked in entries for t in picked), default=None)
    for lease, queue, picked in entries:
        for status in (FAIL, LIVE, SUCCESS):
            ids = [t.id for t in picked if t.status == status]
            if not ids:
                continue
            sent: dict[str, Any] = {"status": DISPATCH, "lease": lease, "queue": queue, "dispatched_at": now,
                    "last_update_datetime": now}
            if status == SUCCESS:  # a revisit: its attempts are counted afresh
                sent["download_times"] = 0
            moved = _tasks().update_many(
                {"_id": {"$in": ids}, "status": status, "retry_at": {"$gte": EPOCH, "$lte": now}},
                {"$set": sent}).modified_count
            moves.append((job_id, status, DISPATCH, moved))
    counts.move(moves, floors={(job_id, DISPATCH): lowest} if lowest is not None else None)
