"""The tasks: ``crawler_task`` (one URL of one job each) and, of each job's document, the fields
that number its tasks (``seq_next``, ``intake``, ``seq_sent``). Every write of them is here.

Indexes (``models.CrawlerTask``), each serving the queries named:
  (job, status, retry_at, seq)   fresh tasks above the cursor; tasks due again by status and time
  (job, status, _id)             a job's tasks of one status in ``_id`` order: cancel, requeue,
                                 retention (a task changed before T was made before T), pages
  (job, _id)                     a job's tasks in ``_id`` order (pages)

Keys (``crawler_task_key``, ``models.CrawlerTaskKey``; ``_id`` only): a URL is a task of its job
once. Its ``_id`` is the job's id and the URL (``key_of``), ``task`` the task it belongs to:
intake inserts the keys first, then the tasks of the keys it won (``insert_numbered``); a task
by URL is read through its key (``_by_uri``); removals remove the task, then its key
(``forget``). Settles never touch a key: on the embedded store every update of a document
rewrites every index entry of it, and a unique (job, uri) on the tasks was the dearest of them.
A key whose task does not exist (its intake died between the inserts, a removal stopped between
them) is taken over by the next intake of its URL once INTAKE_STALE old.

The fresh cursor: intake numbers a job's tasks ``seq`` = 1, 2, ... from ``seq_next``, listing
each chunk's numbers in ``intake`` while its insert runs; ``seq_sent`` says every fresh task
with a lower-or-equal seq has gone out. Fresh tasks are read in bounded seq windows above the
cursor, never past a number handed out but not yet inserted, so no task can appear behind it;
only the dispatcher moves it, by compare-and-set (``advance_cursor``).

Tasks that go again (retryable FAIL whose ``retry_at`` passed; LIVE with ``retry_at`` set:
recovered, requeued, handed back; SUCCESS with ``retry_at`` set: a revisit, ``common/revisit.py``)
are found by status and due time, by the (job, status, retry_at, seq) index, and marked DISPATCH
when sent.

Invariant: every change of tasks' status here is followed at once by its move in
``common.store.counts``, with the number the change's own result reports; only ``settle``
leaves the move to its caller (the writer, which knows each entry's statuses). The dispatcher's
reads of due tasks and its marks of those sent are in ``due.py``.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from bson import ObjectId
from pymongo import UpdateOne
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError, PyMongoError

from common.errors import ValidationError
from common.store import counts
from common.store.clock import store_now, utcnow
from common.store.connection import collection
from common.store.leases import UNSET_LEASE
from common.store.models import CANCEL, DISPATCH, LIVE, SUCCESS, CrawlerTask, CrawlerTaskKey, Job
from common.store.paging import in_chunks
from common.store.records import Task

DUPLICATE_KEY = 11000
INTAKE_STALE = timedelta(minutes=10)  # a reservation older than this belongs to a dead intake


def _tasks() -> Collection[dict[str, Any]]:
    return collection(CrawlerTask)


# --- intake ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NewTask:
    """A task intake adds (LIVE, never sent): its URL, its worker host ("" for any) and, for a URL found
    on a page, its ``depth`` and the ``parent`` task it was found on; ``sitemap`` for a sitemap
    ("xml", ``depth``: the indexes that led to it) or a robots.txt read for its ("robots")."""

    uri: str
    worker_host: str = ""
    depth: int = 0
    parent: ObjectId | None = None
    sitemap: str = ""


def depths(ids: list[ObjectId]) -> dict[ObjectId, int]:
    """{task id: its depth} of ``ids`` (0 for a seed: it has none), by ``_id``."""
    return {d["_id"]: d.get("depth") or 0 for d in _tasks().find({"_id": {"$in": ids}}, {"depth": 1})}


# --- keys: a URL is a task of its job once ----------------------------------------------------

def key_of(job_id: ObjectId, uri: str) -> str:
    """The ``_id`` of the key of ``uri`` in the job: its id's 24 hex digits, then the URL (fixed
    width, so exact: no two pairs share a key)."""
    return str(job_id) + uri


def _keys() -> Collection[dict[str, Any]]:
    return collection(CrawlerTaskKey)


def _by_uri(job_id: ObjectId, uris: list[str], flt: Mapping[str, Any] | None = None,
           projection: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The job's tasks whose URL is among ``uris`` (and that match ``flt``): their keys by ``_id``,
    then the tasks they name by ``_id``. A key whose task is gone (an intake that died between
    its two inserts, a removal cut short) names nothing."""
    found: list[dict[str, Any]] = []
    for part in in_chunks([key_of(job_id, u) for u in dict.fromkeys(uris)]):
        named = [k["task"] for k in _keys().find({"_id": {"$in": part}}, {"task": 1})]
        if named:
            found += _tasks().find({"_id": {"$in": named}, "job": job_id, **(flt or {})},
                                   {"uri": 1, **(projection or {})} if projection is not None else None)
    return found


def task_by_uri(job_id: ObjectId, uri: str) -> Task | None:
    """The job's task whose URL is ``uri`` (through its key), or None."""
    return Task.maybe(next(iter(_by_uri(job_id, [uri])), None))


def due_by_lastmod(job_id: ObjectId, lastmods: dict[str, datetime]) -> int:
    """Make due now the job's stored pages among ``lastmods`` (URL: its sitemap ``lastmod``,
    naive UTC) whose last visit (its settle) is older than their lastmod and whose revisit is
    later; due by the store's clock when written (after the floor of any dispatcher run begun
    before, as ``make_due``). Returns how many came due."""
    made, now = 0, store_now()
    later = {"status": SUCCESS, "retry_at": {"$gt": now}}
    stored = _by_uri(job_id, list(lastmods), later, {"last_update_datetime": 1})
    ids = [d["_id"] for d in stored
           if d.get("last_update_datetime") and d["last_update_datetime"] < lastmods[d["uri"]]]
    for part in in_chunks(ids):
        made += _tasks().update_many({"_id": {"$in": part}, **later},
                                     {"$set": {"retry_at": now}}).modified_count
    return made


def known_uris(job_id: ObjectId, uris: list[str]) -> set[str]:
    """The URLs among ``uris`` the job already has a task for."""
    return {d["uri"] for d in _by_uri(job_id, uris, projection={})}


def _drop(job_id: ObjectId, ids: list[ObjectId]) -> int:
    """Remove the tasks ``ids`` of the job that exist (a URL's second task, whose key names
    another), moving the counts by their statuses. Returns how many."""
    moves: list[tuple[ObjectId | None, str | None, str | None, int]] = []
    for d in _tasks().find({"_id": {"$in": ids}}, {"status": 1}) if ids else ():
        moves.append((job_id, d["status"], None,
                      _tasks().delete_one({"_id": d["_id"], "status": d["status"]}).deleted_count))
    counts.move(moves)
    return sum(n for *_, n in moves)


def _stale_keys(job_id: ObjectId, keys: dict[str, ObjectId], now: datetime) -> dict[str, ObjectId]:
    """Of ``keys`` (key: the task this intake would add), those refused as duplicates whose key
    names a task that does not exist and was made more than INTAKE_STALE ago (its intake died
    between its inserts, or a removal stopped between task and key), taken over by
    compare-and-set: {key: the task it named}."""
    held = {k["_id"]: k["task"] for k in _keys().find({"_id": {"$in": list(keys)}}, {"task": 1})}
    old = {k: t for k, t in held.items() if now - t.generation_time.replace(tzinfo=None) > INTAKE_STALE}
    if not old:
        return {}
    alive = {d["_id"] for d in _tasks().find({"_id": {"$in": list(old.values())}}, {"_id": 1})}
    return {k: t for k, t in old.items() if t not in alive
            and _keys().update_one({"_id": k, "task": t}, {"$set": {"task": keys[k]}}).modified_count}


def _insert_keys(job_id: ObjectId, keys: dict[str, ObjectId],
                 now: datetime) -> tuple[set[str], dict[str, ObjectId]]:
    """Insert the ``keys`` (key: its new task); returns the keys won and, of those, the ones taken
    over from a task that never came ({key: that task})."""
    try:
        _keys().insert_many([{"_id": k, "task": t} for k, t in keys.items()], ordered=False)
        return set(keys), {}
    except BulkWriteError as exc:
        errors = exc.details["writeErrors"]
        lost = {e["op"]["_id"] for e in errors}
        if any(e["code"] != DUPLICATE_KEY for e in errors):
            _forget_quietly([(t, k) for k, t in keys.items() if k not in lost])
            raise
    taken = _stale_keys(job_id, {k: keys[k] for k in lost}, now)
    return set(keys) - lost | set(taken), taken


def _forget(named: list[tuple[ObjectId, str]]) -> None:
    """Remove the keys ``named`` ((task, key)), each only while it names that task."""
    for part in in_chunks(named):
        _keys().delete_many({"_id": {"$in": [k for _, k in part]}, "task": {"$in": [t for t, _ in part]}})


def _forget_quietly(named: list[tuple[ObjectId, str]]) -> None:
    """``_forget`` before an error is raised: best effort (a key left behind heals)."""
    try:
        _forget(named)
    except PyMongoError:
        pass


def forget(job_id: ObjectId, removed: list[tuple[ObjectId, str]]) -> None:
    """The tasks ``removed`` ((id, URL)) were removed: remove their keys (after the tasks: a key
    left by a removal cut short is taken over by the next intake of its URL)."""
    _forget([(t, key_of(job_id, u)) for t, u in removed])


def insert_numbered(job_id: ObjectId, new: list[NewTask], first: int, now: datetime) -> tuple[int, int]:
    """Insert the tasks ``new``, LIVE and never sent, numbered ``first``, ``first + 1``, ... (a
    reservation of this intake): first their keys, then the tasks of the keys won; a URL the job
    has (its key inserted by another intake) is a duplicate. Returns (added, duplicates).

    Crash consistency: no task is inserted without its key. A key left without its task (its
    intake died between the inserts) is taken over by the next intake of its URL once its task's
    id is INTAKE_STALE old (``_stale_keys``); an intake that took so long that its keys may have
    been taken over (INTAKE_STALE / 2, as ``commit``) checks them after its insert and removes its
    tasks whose key names another, and one that took a key over removes the task it named if
    that task came late. Judged by the intake machines' clocks (the task ids' time), as the
    reservations are: safe while they differ by less than INTAKE_STALE / 2."""
    started = time.monotonic()
    ids = [ObjectId() for _ in new]
    keys = {key_of(job_id, t.uri): i for t, i in zip(new, ids)}
    won, taken = _insert_keys(job_id, keys, now)
    docs = _keyed_docs(job_id, new, ids, keys, won, first, now)
    dupes = len(new) - len(docs)
    if not docs:
        return 0, dupes
    try:
        added = len(_tasks().insert_many(docs, ordered=False).inserted_ids)
    except BulkWriteError as exc:  # e.g. a store not migrated yet: its unique (job, uri) refused some
        errors = exc.details["writeErrors"]
        added = exc.details["nInserted"]
        counts.move([(job_id, None, LIVE, added)], {job_id: min(ids)})
        _forget_quietly([(docs[e["index"]]["_id"], key_of(job_id, docs[e["index"]]["uri"])) for e in errors])
        if any(e["code"] != DUPLICATE_KEY for e in errors):
            raise
        return added, dupes + len(errors)
    # any other error (the store away): the keys stay, as if this intake had died (they heal)
    counts.move([(job_id, None, LIVE, added)], {job_id: min(ids)})
    if taken:  # a stalled intake's task that came after its key was taken over: the second task
        _drop(job_id, list(taken.values()))
    if time.monotonic() - started > INTAKE_STALE.total_seconds() / 2:
        lost = _drop_taken_over(job_id, docs)
        added, dupes = added - lost, dupes + lost
    return added, dupes


def _keyed_docs(job_id: ObjectId, new: list[NewTask], ids: list[ObjectId], keys: dict[str, ObjectId],
                won: set[str], first: int, now: datetime) -> list[dict[str, Any]]:
    """The task documents of ``new`` whose keys this intake won (``ids[i]`` for ``new[i]``,
    numbered from ``first``): a URL twice in ``new`` is keyed by its last."""
    docs: list[dict[str, Any]] = []
    for i, t in enumerate(new):
        key = key_of(job_id, t.uri)
        if key not in won or keys[key] != ids[i]:
            continue
        doc: dict[str, Any] = {
            "_id": ids[i], "job": job_id, "uri": t.uri, "seq": first + i, "status": LIVE, "download_times": 0,
            "recoveries": 0, "host_name": t.worker_host, "add_datetime": now, "last_update_datetime": now}
        if t.parent is not None:
            doc["depth"], doc["parent"] = t.depth, t.parent
        if t.sitemap:
            doc["sitemap"], doc["depth"] = t.sitemap, t.depth
        docs.append(doc)
    return docs


def _drop_taken_over(job_id: ObjectId, docs: list[dict[str, Any]]) -> int:
    """After a slow intake (its keys may have been taken over meanwhile): remove its tasks
    ``docs`` whose key now names another task. Returns how many were removed."""
    mine = [key_of(job_id, d["uri"]) for d in docs]
    held = {k["_id"]: k["task"] for k in _keys().find({"_id": {"$in": mine}}, {"task": 1})}
    return _drop(job_id, [d["_id"] for d in docs if held.get(key_of(job_id, d["uri"])) != d["_id"]])


def reserve(job_id: ObjectId, count: int) -> int:
    """Reserve ``count`` seq numbers of a job (compare-and-set on its counter); returns the first."""
    coll = collection(Job)
    while True:
        doc = coll.find_one({"_id": job_id}, {"seq_next": 1})
        if doc is None:
            raise ValidationError("the job was removed while its tasks were being added")
        top: int = doc.get("seq_next", 0)
        first = top + 1
        change = {"$set": {"seq_next": top + count}, "$push": {"intake": {"seq": first, "at": utcnow()}}}
        if coll.update_one({"_id": job_id, "seq_next": top}, change).modified_count:
            return first


def commit(job_id: ObjectId, first: int, count: int) -> None:
    """Drop the reservation. One that grew old (a stalled intake; the dispatcher stops honouring
    reservations at INTAKE_STALE) may lie below the cursor: its tasks are sent as retries."""
    before = collection(Job).find_one_and_update(
        {"_id": job_id, "intake.seq": first}, {"$pull": {"intake": {"seq": first}}}, projection={"intake": 1})
    mine = next((r for r in (before or {}).get("intake") or () if r.get("seq") == first), None)
    if mine is not None and utcnow() - mine["at"] < INTAKE_STALE / 2:
        return
    now = utcnow()
    _tasks().update_many(
        {"job": job_id, "status": LIVE, "retry_at": None, "seq": {"$gte": first, "$lt": first + count}},
        {"$set": {"retry_at": now, "last_update_datetime": now}})


# --- settle (the worker's writer) -----------------------------------------------------------

def settle(ops: list[UpdateOne]) -> int:
    """Apply guarded settles or hand-backs (``common.store.leases.settle_success``,
    ``settle_failure``, ``hand_back``) in one bulk write; returns how many tasks changed.
    The caller moves the counts (it knows each part's statuses)."""
    return _tasks().bulk_write(ops, ordered=False).modified_count if ops else 0


def changed_to(ids: list[ObjectId], status: str, at: datetime) -> int:
    """How many of ``ids`` are in ``status`` and were changed at ``at``: a settle's read-back
    when some guarded updates were refused."""
    return _tasks().count_documents({"_id": {"$in": ids}, "status": status, "last_update_datetime": at})


# --- an administrator's changes: cancel, requeue --------------------------------------------

def cancel(job_id: ObjectId, statuses: Sequence[str]) -> int:
    """The job's tasks in ``statuses`` become CANCEL, their lease fields cleared; a worker
    holding one then settles nothing for it. One status at a time, so each change's count is
    its move. Returns how many changed."""
    moves = [(job_id, status, CANCEL, _tasks().update_many(
        {"job": job_id, "status": status},
        {"$set": {"status": CANCEL, "last_update_datetime": utcnow()}, "$unset": UNSET_LEASE}).modified_count)
        for status in statuses]
    counts.move(moves)
    return sum(n for *_, n in moves)


def requeue(job_id: ObjectId, statuses: Sequence[str], now: datetime) -> int:
    """The job's tasks in ``statuses`` go back to LIVE with fresh counters, due at ``now``; one
    status at a time, as ``cancel``. Returns how many changed."""
    moves = [(job_id, status, LIVE, _tasks().update_many({"job": job_id, "status": status}, {
        "$set": {"status": LIVE, "download_times": 0, "recoveries": 0, "failed_reason": None,
                 "retry_at": now, "last_update_datetime": now}}).modified_count) for status in statuses]
    counts.move(moves)
    return sum(n for *_, n in moves)


# --- migrate: tasks written by an earlier version -------------------------------------------

def unnumbered(job_id: ObjectId, limit: int) -> list[ObjectId]:
    """Ids of up to ``limit`` of the job's tasks without a ``seq``, in ``_id`` order."""
    found = _tasks().find({"job": job_id, "seq": None}, {"_id": 1}).sort("_id", 1).limit(limit)
    return [d["_id"] for d in found]


def number(ids: list[ObjectId], first: int) -> None:
    """Give ``ids`` the seq numbers ``first``, ``first + 1``, ... (those still without one)."""
    _tasks().bulk_write([UpdateOne({"_id": i, "seq": None}, {"$set": {"seq": first + n}})
                         for n, i in enumerate(ids)], ordered=False)


def dispatched_leases(before: datetime) -> set[str]:
    """Leases named by DISPATCH tasks sent before ``before``."""
    return {d["_id"] for d in _tasks().aggregate([
        {"$match": {"status": DISPATCH, "dispatched_at": {"$lt": before}}}, {"$group": {"_id": "$lease"}}])}


def send_again(lease: str, reason: str, now: datetime) -> int:
    """The DISPATCH tasks of ``lease`` (an entry that can no longer be claimed) go again at
    once, no attempt counted. Returns how many (counts moved)."""
    held = list(_tasks().find({"status": DISPATCH, "lease": lease}, {"job": 1}).sort("_id", 1).limit(1))
    job, lowest = (held[0].get("job"), held[0]["_id"]) if held else (None, None)
    again = _tasks().update_many(
        {"status": DISPATCH, "lease": lease},
        {"$set": {"status": LIVE, "retry_at": now, "failed_reason": reason, "last_update_datetime": now},
         "$unset": UNSET_LEASE}).modified_count
    counts.move([(job, DISPATCH, LIVE, again)], floors={(job, LIVE): lowest} if lowest is not None else None)
    return again


def build_keys(job_id: ObjectId, batch: int = 5000) -> int:
    """Make the keys of the job's tasks stored before keys were kept (their URLs were unique by
    a (job, uri) index), in ``_id`` order, ``batch`` at a time; a key already there is left as it
    is. Returns how many were made."""
    made, after = 0, None
    while True:
        flt: dict[str, Any] = {"job": job_id} if after is None else {"job": job_id, "_id": {"$gt": after}}
        docs = list(_tasks().find(flt, {"uri": 1}).sort("_id", 1).limit(batch))
        if not docs:
            return made
        after = docs[-1]["_id"]
        try:
            keys = [{"_id": key_of(job_id, d["uri"]), "task": d["_id"]} for d in docs]
            made += len(_keys().insert_many(keys, ordered=False).inserted_ids)
        except BulkWriteError as exc:
            if any(e["code"] != DUPLICATE_KEY for e in exc.details["writeErrors"]):
                raise
            made += exc.details["nInserted"]


def forget_watermarks() -> None:
    """Remove the per-job ``_id`` watermark earlier versions kept instead of the cursor."""
    collection(Job).update_many({"live_from": {"$exists": True}}, {"$unset": {"live_from": ""}})
