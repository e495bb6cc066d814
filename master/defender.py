"""The defender: give back to the dispatcher every task whose queue entry can no longer settle it.

It judges leases (``crawler_lease``), never tasks, and only by facts that cannot be wrong:
  * QUEUED and absent from every rq queue list: the entry was lost (Redis flushed or restarted)
    or dequeued by a worker that died before claiming it. Not an attempt: nothing is counted.
    An entry still waiting in its queue is never touched, however long it waits.
  * RUNNING with no heartbeat (``beat_at``, written to MongoDB by the worker, so a Redis restart
    does not fake a death) for HEARTBEAT_TTL, or started longer than LEASE_TIMEOUT ago: the
    attempt died. Its tasks get ``recoveries`` + 1; at MAX_RECOVERIES they end DEAD (poison).
A judged lease is first marked LOST by compare-and-set (a worker claiming or beating at that
moment makes it fail), then its tasks are released with updates guarded exactly as the worker's
settle is, so each task ends either settled by the worker or released here, never both; data
the lost attempt wrote for tasks it did not settle is removed last, GridFS files included.

Runs at the start of every dispatch (under the dispatcher lock, which the "absent from Redis"
judgement needs) and as ``downcluster defender``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from redis import Redis

from common.config import settings
from common.connections import redis_conn
from common.data import drop_unsettled
from common.models import (
    DEAD,
    LIVE,
    LOST,
    QUEUED,
    RUNNING,
    UNSET_LEASE,
    CrawlerLease,
    CrawlerTask,
    give_back,
    held_by,
    utcnow,
)
from common.queues import QUEUE_NAMES, base_of, rq_job_id

logger = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    recovered: int = 0
    dead: int = 0
    requeued: int = 0  # tasks of entries lost before any attempt
    reasons: list[str] = field(default_factory=list)


def lease_verdict(lease: dict, in_queue: bool, now: datetime, heartbeat_ttl: float,
                  lease_timeout: float) -> tuple[str, bool] | None:
    """(reason, counts as an attempt) when the lease can no longer settle its tasks, else None."""
    state = lease.get("state")
    if state == LOST:
        return lease.get("lost_reason") or "lost", bool(lease.get("started_at"))
    if state == QUEUED:
        return None if in_queue else ("queue entry lost before it started (Redis flushed or restarted)", False)
    if state == RUNNING:
        started, beat = lease.get("started_at"), lease.get("beat_at") or lease.get("started_at")
        if started and now - started > timedelta(seconds=lease_timeout):
            return f"attempt older than LEASE_TIMEOUT ({lease_timeout:g}s)", True
        if beat and now - beat > timedelta(seconds=heartbeat_ttl):
            return f"worker died while downloading ({lease.get('worker') or '?'}: no heartbeat for {heartbeat_ttl:g}s)", True
    return None


def queued_entries(redis: Redis) -> set[str]:
    """rq job ids waiting in any of our queues (shared, host and foreign ones)."""
    keys = [k.decode() if isinstance(k, bytes) else k for k in redis.smembers("rq:queues")]
    keys = [k for k in keys if base_of(k.removeprefix("rq:queue:")) in QUEUE_NAMES]
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.lrange(key, 0, -1)
    return {i.decode() for ids in pipe.execute() for i in ids}


def recover(redis: Redis | None = None, now: datetime | None = None, budget: float | None = None,
            locked: bool = False) -> RecoveryReport:
    """One defender pass. ``locked``: the caller holds the dispatcher lock (else it is taken)."""
    if not locked:
        from master.lock import DispatchLock

        redis = redis or redis_conn()
        with DispatchLock(redis):
            return recover(redis, now, budget, locked=True)
    redis = redis or redis_conn()
    end = time.monotonic() + (budget if budget is not None else float("inf"))
    coll = CrawlerLease._get_collection()
    leases = list(coll.find({"state": {"$in": [QUEUED, RUNNING, LOST]}}, {"ids": 0}))
    report = RecoveryReport()
    if not leases:
        return report
    waiting = queued_entries(redis)
    now = now or utcnow()
    for lease in leases:
        if time.monotonic() > end:
            logger.warning("defender: time budget spent; %s leases left for the next run", len(leases))
            break
        verdict = lease_verdict(lease, rq_job_id(lease["_id"]) in waiting, now,
                                settings.HEARTBEAT_TTL, settings.LEASE_TIMEOUT)
        if verdict is None:
            continue
        reason, attempt = verdict
        if lease["state"] != LOST:
            guard = {"_id": lease["_id"], "state": lease["state"]}
            if lease["state"] == RUNNING:
                guard["beat_at"] = lease.get("beat_at")
            if coll.update_one(guard, {"$set": {"state": LOST, "lost_reason": reason}}).modified_count == 0:
                continue  # claimed or beat meanwhile: alive after all
        release(lease["_id"], reason, attempt, now, report)
        try:
            redis.delete("rq:job:" + rq_job_id(lease["_id"]))
        except Exception:  # Redis away: the hash is harmless and expires with rq's cleanup
            pass
    if report.recovered or report.dead or report.requeued:
        logger.warning("defender: %s tasks back to the dispatcher, %s DEAD, %s never started",
                       report.recovered, report.dead, report.requeued)
    return report


def release(lease_id: str, reason: str, attempt: bool, now: datetime, report: RecoveryReport) -> None:
    """Give a LOST lease's unsettled tasks back (they go again at once), then forget the lease."""
    lease = CrawlerLease._get_collection().find_one({"_id": lease_id})
    if lease is None:
        return
    ids = lease.get("ids") or []
    tasks = CrawlerTask._get_collection()
    flt = {"_id": {"$in": ids}, **held_by(lease_id, lease["kind"])}
    dead = back = 0
    if attempt:
        dead = tasks.update_many(
            {**flt, "recoveries": {"$gte": settings.MAX_RECOVERIES - 1}},
            {"$set": {"status": DEAD, "failed_reason": f"dead after {settings.MAX_RECOVERIES} recoveries: {reason}",
                      "retry_at": None, "last_update_datetime": now}, "$inc": {"recoveries": 1},
             "$unset": UNSET_LEASE},
        ).modified_count
        back = tasks.update_many(flt, {
            "$set": {"status": LIVE, "retry_at": now, "failed_reason": f"recovered: {reason}", "last_update_datetime": now},
            "$inc": {"recoveries": 1}, "$unset": UNSET_LEASE}).modified_count
        report.recovered += back
        report.dead += dead
    else:
        back = give_back(ids, lease_id, lease["kind"], f"sent again: {reason}", now)
        report.requeued += back
    # Only now can no attempt under this lease settle a task: its unsettled data can go.
    drop_unsettled(lease_id, ids)
    CrawlerLease._get_collection().delete_one({"_id": lease_id})
    report.reasons.append(f"{back + dead} tasks: {reason}")
