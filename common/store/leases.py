"""The lease: a queue entry's hold on its tasks, from dispatch to settle.

One ``crawler_lease`` document per queue entry (the rq job ``dc-<lease>``):

    create  (dispatcher)  QUEUED; fresh tasks stay LIVE, tasks sent again become DISPATCH
    claim   (worker)      QUEUED -> RUNNING, compare-and-set: at most one worker runs an entry
    beat    (worker)      RUNNING: ``beat_at`` refreshed every HEARTBEAT_INTERVAL
                          (claim, beat and the verdict's CAS are ``common.store.claims``, as ``LEASE``)
    settle  (worker)      each task SUCCESS (naming its data), FAIL, or handed back, under ``_held_by``
    finish  (worker)      the lease is deleted once every outcome is stored
    verdict (defender)    QUEUED and in no queue (seen so twice, ABSENCE_GRACE apart), or
                          RUNNING without a beat for HEARTBEAT_TTL, or older than LEASE_TIMEOUT
    release (defender)    LOST (compare-and-set), its tasks given back under the same guard, deleted

A lease's *attempt kind* (stored as ``kind``) says what its tasks were when sent: FRESH (LIVE,
never sent), AGAIN (sent again: DISPATCH) or REVISIT (SUCCESS, due again); it picks the guard.

Invariant: every change to a task sent in an entry is guarded by ``_held_by(lease, attempt_kind)``,
so each task ends settled by the worker or released by the defender, never both.

The fence (why a returning worker changes nothing a reader sees) is ``common.store.orphans``:
data an attempt stored that no task names is never read, and is removed.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Protocol, Sequence

from bson import ObjectId
from pymongo import UpdateMany, UpdateOne

from common.config import settings
from common.store import claims, counts
from common.store.connection import collection
from common.store.models import (
    DEAD,
    DISPATCH,
    FAIL,
    FRESH,
    LIVE,
    LOST,
    QUEUED,
    REVISIT,
    RUNNING,
    SUCCESS,
    CrawlerDownloadData,
    CrawlerLease,
    CrawlerOldVersion,
    CrawlerTask,
)

# the writer reaches these here, with the settles (re-exported)
from common.store.orphans import drop_unsettled as drop_unsettled
from common.store.orphans import settled_of as settled_of
from common.store.orphans import tombstone as tombstone
from common.store.paging import Doc
from common.store.records import Lease, LeaseTask, Prev

UNSET_LEASE = {"lease": "", "queue": "", "dispatched_at": ""}  # a task's fields while it is DISPATCH

# A lease in the one protocol of claimed work: held while RUNNING by its worker, dead after
# HEARTBEAT_TTL without a beat; its tasks count their own recoveries and end DEAD at MAX_RECOVERIES.
LEASE = claims.Claimed("download lease", CrawlerLease._get_collection, owner="worker",
                       ttl=lambda: float(settings.HEARTBEAT_TTL),
                       max_recoveries=lambda: int(settings.MAX_RECOVERIES),
                       held={"state": RUNNING}, alert="task_dead")


# --- the guard --------------------------------------------------------------------------

def _held_by(lease: str, attempt_kind: str, sent_at: datetime | None = None) -> Doc:
    """What a task must still look like to belong to the entry ``lease``: the one guard of
    every change that settles or gives back an entry's tasks (worker, defender, dispatcher).
    Fresh tasks and revisits are sent without a write of their own: a fresh task is LIVE and
    never due, a revisit SUCCESS and due at the latest when its entry was made (``sent_at``, the
    lease's ``created_at``); any settle or release moves ``retry_at`` past that, so no other
    attempt under the same entry, nor one of an entry made before, can match it again."""
    if attempt_kind == FRESH:
        return {"status": LIVE, "retry_at": None}
    if attempt_kind == REVISIT:
        if sent_at is None:
            raise ValueError("a revisit entry's guard needs the time it was made")
        return {"status": SUCCESS, "retry_at": {"$lte": sent_at}}
    return {"status": DISPATCH, "lease": lease}


def held_status(attempt_kind: str) -> str:
    """The status of a task while an entry of ``attempt_kind`` holds it (``_held_by``)."""
    return {FRESH: LIVE, REVISIT: SUCCESS}.get(attempt_kind, DISPATCH)


def holds(task_id: ObjectId, lease: str, attempt_kind: str, sent_at: datetime | None = None) -> bool:
    """Whether the entry ``lease`` still holds the task (``_held_by``)."""
    return bool(held_of([task_id], lease, attempt_kind, sent_at))


def held_of(ids: list[ObjectId], lease: str, attempt_kind: str,
            sent_at: datetime | None = None) -> set[ObjectId]:
    """The tasks among ``ids`` that the entry ``lease`` still holds (``_held_by``)."""
    if not ids:
        return set()
    return {d["_id"] for d in CrawlerTask._get_collection().find(
        {"_id": {"$in": ids}, **_held_by(lease, attempt_kind, sent_at)}, {"_id": 1})}


# --- create, claim, beat, finish ------------------------------------------------------------

class Sent(Protocol):
    """A task as an entry carries it (``common.store.due.Picked``)."""

    id: ObjectId
    uri: str
    attempts: int
    prev: Prev | None
    sitemap: str | None
    depth: int


def new_lease(lease: str, job_id: ObjectId, queue: str, attempt_kind: str, tasks: Sequence[Sent],
              now: datetime) -> Lease:
    """The lease of a new entry of ``tasks``."""
    prev = [t.prev.to_doc() if t.prev else {} for t in tasks] if any(t.prev for t in tasks) else None
    maps = ([[t.sitemap, t.depth] if t.sitemap else [] for t in tasks]
            if any(t.sitemap for t in tasks) else None)
    depths = [t.depth for t in tasks] if any(t.depth for t in tasks) else None
    return Lease(id=lease, job=job_id, queue=queue, attempt_kind=attempt_kind, ids=[t.id for t in tasks],
                 uris=[t.uri for t in tasks], attempts=[t.attempts for t in tasks], prev=prev, sitemaps=maps,
                 depths=depths, state=QUEUED,
                 hostname=settings.HOSTNAME, created_at=now)


def create(made: list[Lease]) -> None:
    """Insert new entries' leases (``new_lease``), before their tasks are marked or pushed."""
    collection(CrawlerLease).insert_many([lease.to_doc() for lease in made], ordered=False)


def drop(lease_id: str) -> None:
    """An entry that never reached its queue, its tasks already given back: the lease ends."""
    CrawlerLease._get_collection().delete_one({"_id": lease_id})


def claim(lease_id: str, worker_id: str) -> Lease | None:
    """QUEUED -> RUNNING for ``worker_id``; None if the lease is gone or not QUEUED."""
    return Lease.maybe(claims.claim(LEASE, {"_id": lease_id, "state": QUEUED}, worker_id,
                                    {"$set": {"hostname": settings.HOSTNAME},
                                     "$currentDate": {"started_at": True}, "$unset": {"missing_at": ""}}))


def lease_tasks(lease: Lease) -> list[LeaseTask]:
    """The entry's tasks as the dispatcher wrote them into the lease (no read of the tasks:
    one cancelled meanwhile is downloaded, but the guarded settle stores nothing for it)."""
    prev: list[Mapping[str, Any] | None] = [*lease.prev] if lease.prev else [None] * len(lease.ids)
    maps: list[Sequence[Any]] = [*lease.sitemaps] if lease.sitemaps else [[]] * len(lease.ids)
    # each task's depth when the lease has them (tasks found on pages); else None: seeds, or a
    # lease written before depths were (the writer then reads them from the tasks)
    deep: list[int | None] = [*lease.depths] if lease.depths else [None] * len(lease.ids)
    return [LeaseTask(i, u, n, Prev.from_doc(p) if p else None, (m[0], int(m[1])) if m else None, d)
            for i, u, n, p, m, d in zip(lease.ids, lease.uris, lease.attempts, prev, maps, deep)]


def beat(lease_ids: Iterable[str], worker_id: str) -> None:
    claims.beat(LEASE, lease_ids, worker_id)


def finish(lease_ids: list[str], worker_id: str) -> None:
    """The entries' outcomes are all stored: their leases end."""
    CrawlerLease._get_collection().delete_many({"_id": {"$in": lease_ids}, "worker": worker_id})


# --- settle (the worker) and give back ------------------------------------------------------

SETTLE_GROUP = 16  # tasks named by one settle statement (see ``settle_success``)


def settle_success(ids: list[ObjectId], lease: str, attempt_kind: str, now: datetime,
                   sent_at: datetime | None = None) -> list[UpdateMany]:
    """The successes of one entry: each names its data (``data_lease``). One UpdateMany per
    SETTLE_GROUP tasks: a store that checks ``$in`` by walking its list (the embedded one does,
    twice per document) pays per task for the list's length, and per statement for the rest, so
    a group bounds the first (the choice of 16, measured with ``scripts/bench_settle.py``:
    docs/benchmarks.md). The guard and the change are the same for every group."""
    change = {"$set": {"status": SUCCESS, "data_lease": lease, "failed_reason": None, "retry_at": None,
                       "last_update_datetime": now},
              "$inc": {"download_times": 1}, "$unset": UNSET_LEASE}
    guard = _held_by(lease, attempt_kind, sent_at)
    return [UpdateMany({"_id": {"$in": ids[i:i + SETTLE_GROUP]}, **guard}, change)
            for i in range(0, len(ids), SETTLE_GROUP)]


def settle_visit(task_id: ObjectId, lease: str, attempt_kind: str, now: datetime, retry_at: datetime | None,
                 every: float, stored: Doc | None, not_modified: bool, reason: str | None = None,
                 sent_at: datetime | None = None, seen: Doc | None = None) -> UpdateOne:
    """A visit of a job with revisits: SUCCESS, due again at ``retry_at`` (``every`` seconds on).
    ``stored``: a new version was stored (``etag``, ``last_modified``, ``digest``, ``prev_lease``,
    the lease of the version it supersedes, None on a first visit): the task names it and keeps
    the earlier one in ``history``. Else the latest version stays named, and the visit counts as
    ``not_modified`` (``seen``: the validators and digest of a same body sent again), or, with
    ``reason``, as a revisit that failed for good."""
    change: Doc = {
        "$set": {"status": SUCCESS, "retry_at": retry_at, "revisit_every": every, "failed_reason": reason,
                 "last_update_datetime": now},
        "$inc": {"download_times": 1} if reason else {"download_times": 1, "visits": 1},
        "$unset": UNSET_LEASE,
    }
    if stored is not None:
        change["$set"].update(data_lease=lease, changed_at=now, etag=stored.get("etag"),
                              last_modified=stored.get("last_modified"), digest=stored.get("digest"))
        change["$inc"]["versions"] = 1
        if stored.get("prev_lease"):
            change["$push"] = {"history": stored["prev_lease"]}
    elif not_modified:
        change["$inc"]["not_modified"] = 1
        change["$set"].update(seen or {})  # the same body again: its validators, for the next visit
    return UpdateOne({"_id": task_id, **_held_by(lease, attempt_kind, sent_at)}, change)


def mark_superseded(settled: list[tuple[ObjectId, ObjectId, int, str | None]]) -> None:
    """(job, task, version, lease of the version before) settled as the page's latest: its data
    documents of lower versions are earlier versions — marked (a hint for readers of the latest
    only; the task's ``data_lease`` is the truth) and the one before listed for the retention
    (``crawler_old_version``). By version, so a mark that comes late never touches a version
    stored after it; marking again changes nothing, and a version listed twice is removed once."""
    if not settled:
        return
    CrawlerDownloadData._get_collection().bulk_write([
        UpdateMany({"task": task, "version": {"$not": {"$gte": version}}, "superseded": None},
                   {"$set": {"superseded": True}}) for _, task, version, _ in settled], ordered=False)
    listed = [{"job": job, "task": task, "lease": before} for job, task, _, before in settled if before]
    if listed:
        CrawlerOldVersion._get_collection().insert_many(listed, ordered=False)


def remark_versions(lease: str, ids: list[ObjectId]) -> None:
    """The ``superseded`` marks of the pages a dead worker settled under ``lease`` (it may have
    died between a settle and its marks): each page's versions below its latest."""
    flt = {"_id": {"$in": ids}, "data_lease": lease, "versions": {"$gt": 1}}
    settled = CrawlerTask._get_collection().find(flt, {"job": 1, "versions": 1, "history": 1})
    mark_superseded([(t["job"], t["_id"], t["versions"], (t.get("history") or [None])[-1]) for t in settled])


def settle_failure(
    task_id: ObjectId, lease: str, attempt_kind: str, reason: str, retry_at: datetime | None, now: datetime,
    sent_at: datetime | None = None,
) -> UpdateOne:
    """A failed attempt: FAIL, due again at ``retry_at`` (None: never)."""
    return UpdateOne(
        {"_id": task_id, **_held_by(lease, attempt_kind, sent_at)},
        {
            "$set": {
                "status": FAIL,
                "retry_at": retry_at,
                "failed_reason": reason[:10240],
                "last_update_datetime": now,
            },
            "$inc": {"download_times": 1},
            "$unset": UNSET_LEASE,
        },
    )


def hand_back(task_id: ObjectId, lease: str, attempt_kind: str, reason: str, after: float, now: datetime,
              sent_at: datetime | None = None) -> UpdateOne:
    """Handed back before any request (host busy, robots.txt unavailable): no attempt counted."""
    return UpdateOne(
        {"_id": task_id, **_held_by(lease, attempt_kind, sent_at)},
        {"$set": {"status": LIVE, "retry_at": now + timedelta(seconds=after), "last_update_datetime": now,
                  "failed_reason": reason[:10240]},
         "$unset": UNSET_LEASE})


def give_back(job_id: ObjectId, ids: list[ObjectId], lease: str, attempt_kind: str, reason: str,
              now: datetime, sent_at: datetime | None = None) -> int:
    """Tasks of an entry that made no attempt go again at once (LIVE, ``retry_at`` now)."""
    given = CrawlerTask._get_collection().update_many(
        {"_id": {"$in": ids}, **_held_by(lease, attempt_kind, sent_at)},
        {"$set": {"status": LIVE, "retry_at": now, "failed_reason": reason, "last_update_datetime": now},
         "$unset": UNSET_LEASE}).modified_count
    counts.move([(job_id, held_status(attempt_kind), LIVE, given)],
                floors={(job_id, LIVE): min(ids)} if ids else None)
    return int(given)


# --- the verdict and release (the defender) --------------------------------------------------

def lease_verdict(lease: Lease, present: bool, now: datetime, heartbeat_ttl: float, lease_timeout: float,
                  absence_grace: float) -> tuple[str, bool] | None:
    """(reason, counts as an attempt) when the lease can no longer settle its tasks, else None.

    A QUEUED lease whose entry is in no queue is lost only when it was already seen missing
    (``missing_at``) at least ``absence_grace`` seconds ago: a worker may have just popped the
    entry and not yet claimed it (see ``mark_missing``)."""
    state = lease.state
    if state == LOST:
        return lease.lost_reason or "lost", bool(lease.started_at)
    if state == QUEUED:
        missing = lease.missing_at
        if present or missing is None or now - missing < timedelta(seconds=absence_grace):
            return None
        return "queue entry lost before it started (Redis flushed or restarted)", False
    if state == RUNNING:
        started, beat_at = lease.started_at, lease.beat_at or lease.started_at
        if started and now - started > timedelta(seconds=lease_timeout):
            return f"attempt older than LEASE_TIMEOUT ({lease_timeout:g}s)", True
        if beat_at and now - beat_at > timedelta(seconds=heartbeat_ttl):
            return (
                f"worker died while downloading ({lease.worker or '?'}: "
                f"no heartbeat for {heartbeat_ttl:g}s)",
                True,
            )
    return None


def open_leases() -> list[Lease]:
    """Every lease the defender judges (QUEUED, RUNNING, LOST), without their task lists."""
    return [Lease.from_doc(d) for d in CrawlerLease._get_collection().find(
        {"state": {"$in": [QUEUED, RUNNING, LOST]}},
        {"ids": 0, "uris": 0, "attempts": 0, "prev": 0, "sitemaps": 0, "depths": 0})]


def existing(lease_ids: Iterable[str]) -> set[str]:
    """The leases among ``lease_ids`` that have a document."""
    found = CrawlerLease._get_collection().find({"_id": {"$in": list(lease_ids)}}, {"_id": 1})
    return {d["_id"] for d in found}


def tasks_out() -> dict[tuple[ObjectId, str], int]:
    """{(job id, QUEUED or RUNNING): tasks in such entries}: where the tasks sent out to be
    downloaded (LIVE or DISPATCH) are; a page out for a revisit is SUCCESS, and counted there."""
    rows = CrawlerLease._get_collection().aggregate([
        {"$match": {"state": {"$in": [QUEUED, RUNNING]}, "kind": {"$ne": REVISIT}}},
        {"$group": {"_id": {"job": "$job", "state": "$state"}, "n": {"$sum": {"$size": "$ids"}}}},
    ])
    return {(row["_id"]["job"], row["_id"]["state"]): row["n"] for row in rows}


def mark_missing(lease_ids: list[str], now: datetime) -> None:
    """QUEUED leases whose entry the defender did not find: judged on a later look."""
    if lease_ids:
        CrawlerLease._get_collection().update_many(
            {"_id": {"$in": lease_ids}, "state": QUEUED, "missing_at": None}, {"$set": {"missing_at": now}})


def unmark_missing(lease_ids: list[str]) -> None:
    if lease_ids:
        CrawlerLease._get_collection().update_many(
            {"_id": {"$in": lease_ids}}, {"$unset": {"missing_at": ""}}
        )


def mark_lost(lease: Lease, reason: str) -> bool:
    """Compare-and-set to LOST; False if the lease was claimed, beat or ended meanwhile."""
    judged = {"_id": lease.id, LEASE.owner: lease.worker, claims.BEAT: lease.beat_at}
    guard = claims.judged(LEASE, judged) if lease.state == RUNNING else {"_id": lease.id,
                                                                         "state": lease.state}
    changed: int = collection(CrawlerLease).update_one(
        guard, {"$set": {"state": LOST, "lost_reason": reason}}).modified_count
    return changed == 1


def release(lease_id: str, reason: str, attempt: bool, now: datetime) -> tuple[int, int, int]:
    """Give a LOST lease's unsettled tasks back (they go again at once), then forget the lease.
    Returns (recovered, dead, sent again without an attempt)."""
    lease = CrawlerLease._get_collection().find_one({"_id": lease_id})
    if lease is None:
        return 0, 0, 0
    ids = lease.get("ids") or []
    recovered = dead = again = 0
    if attempt:
        recovered, dead = _recover(lease, reason, now)
    else:
        again = give_back(lease.get("job"), ids, lease_id, lease["kind"], f"sent again: {reason}", now,
                          lease.get("created_at"))
    _forget(lease_id, lease.get("job"), ids, reason, now)
    return recovered, dead, again


def _recover(lease: Doc, reason: str, now: datetime) -> tuple[int, int]:
    """The tasks a lost attempt held go again at once, counting a recovery; those out of
    recoveries end DEAD (with an alert). Returns (recovered, dead)."""
    lease_id, job = lease["_id"], lease.get("job")
    tasks = CrawlerTask._get_collection()
    guard = _held_by(lease_id, lease["kind"], lease.get("created_at"))
    flt = {"_id": {"$in": lease.get("ids") or []}, **guard}
    dead: int = tasks.update_many(
        {**flt, **claims.spent(LEASE)},
        {
            "$set": {
                "status": DEAD,
                "failed_reason": f"dead after {settings.MAX_RECOVERIES} recoveries: {reason}",
                "retry_at": None,
                "last_update_datetime": now,
            },
            "$inc": {"recoveries": 1},
            "$unset": UNSET_LEASE,
        },
    ).modified_count
    recovered: int = tasks.update_many(
        flt,
        {
            "$set": {"status": LIVE, "retry_at": now, "failed_reason": f"recovered: {reason}",
                     "last_update_datetime": now},
            "$inc": {"recoveries": 1},
            "$unset": UNSET_LEASE,
        },
    ).modified_count
    held = held_status(lease["kind"])
    ids = lease.get("ids") or []
    counts.move([(job, held, DEAD, dead), (job, held, LIVE, recovered)],
                floors={(job, s): min(ids) for s in (DEAD, LIVE)} if ids else None)
    if dead:
        claims.give_up_alert(LEASE, job, f"{dead} task(s) of entry {lease_id} DEAD after "
                                         f"{settings.MAX_RECOVERIES} recoveries: {reason}")
    return recovered, dead


def _forget(lease_id: str, job: ObjectId | None, ids: list[ObjectId], reason: str, now: datetime) -> None:
    """The lease's tasks are given back: no attempt under it can settle one any more, so what it
    stored unsettled can go, and the lease ends (its tombstone first, for ``fence.shown``)."""
    tombstone(lease_id, job, reason, ids, now)  # before the lease ends (fence.shown)
    drop_unsettled(lease_id, ids)
    remark_versions(lease_id, ids)
    CrawlerLease._get_collection().delete_one({"_id": lease_id})
