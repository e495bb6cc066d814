"""The defender: return to the retry path every dispatched task whose queue entry is gone.

A DISPATCH task names its entry by ``lease`` (rq job ``dc-<lease>``). Its lease is broken
when the entry no longer exists (Redis flushed or restarted), rq gave up on it (failed,
stopped, cancelled; e.g. the work-horse was killed), it started but its heartbeat stopped
(the worker died), or it is older than LEASE_TIMEOUT. Such tasks go back to LIVE with
``recoveries`` + 1; a task recovered MAX_RECOVERIES times becomes DEAD (a poison task).
Runs at the start of every dispatch and as ``downcluster defender``; rq's own maintenance
is never waited for.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from redis import Redis

from common.config import settings
from common.connections import redis_conn
from common.models import DEAD, DISPATCH, LIVE, CrawlerDownloadData, CrawlerTask, lower_live_from, utcnow
from common.queues import HEARTBEAT_PREFIX, rq_job_id

logger = logging.getLogger(__name__)

WAITING = {"queued", "deferred", "scheduled", "created"}
GAVE_UP = {"failed", "stopped", "canceled"}


@dataclass
class RecoveryReport:
    recovered: int = 0
    dead: int = 0
    reasons: list[str] = field(default_factory=list)


def lease_verdict(rq_status: str | None, heartbeat: bool, dispatched_at: datetime | None,
                  now: datetime, lease_timeout: float) -> str | None:
    """Why a lease is broken, or None while its entry may still settle the task."""
    if dispatched_at is not None and now - dispatched_at > timedelta(seconds=lease_timeout):
        return f"lease older than {lease_timeout:g}s"
    if rq_status is None:
        return "queue entry lost (Redis flushed or restarted)"
    if rq_status in WAITING:
        return None
    if rq_status == "started":
        return None if heartbeat else "worker died while downloading (no heartbeat)"
    if rq_status in GAVE_UP:
        return f"queue entry {rq_status}"
    return f"queue entry {rq_status} without settling the task"


def recover(redis: Redis | None = None, now: datetime | None = None) -> RecoveryReport:
    redis = redis or redis_conn()
    now = now or utcnow()
    coll = CrawlerTask._get_collection()
    leases = list(coll.aggregate([
        {"$match": {"status": DISPATCH}},
        {"$group": {"_id": "$lease", "at": {"$min": "$dispatched_at"}}},
    ]))
    if not leases:
        return RecoveryReport()
    pipe = redis.pipeline(transaction=False)
    for row in leases:
        pipe.hget("rq:job:" + rq_job_id(str(row["_id"])), "status")
        pipe.exists(HEARTBEAT_PREFIX + str(row["_id"]))
    answers = pipe.execute()
    report = RecoveryReport()
    for i, row in enumerate(leases):
        status, beat = answers[2 * i], answers[2 * i + 1]
        status = status.decode() if isinstance(status, bytes) else status
        # The started check needs its heartbeat a little after start: a fresh entry gets a grace.
        if status == "started" and not beat and row["at"] and now - row["at"] < timedelta(seconds=settings.HEARTBEAT_TTL):
            continue
        reason = lease_verdict(status, bool(beat), row["at"], now, settings.LEASE_TIMEOUT)
        if reason:
            _release(coll, row["_id"], reason, now, report)
            if status is not None:
                redis.delete("rq:job:" + rq_job_id(str(row["_id"])))
    if report.recovered or report.dead:
        logger.warning("defender: %s tasks back to LIVE, %s DEAD", report.recovered, report.dead)
    return report


def _release(coll, lease, reason: str, now: datetime, report: RecoveryReport) -> None:
    base = {"lease": lease, "status": DISPATCH}
    unset = {"lease": "", "queue": "", "dispatched_at": ""}
    docs = list(coll.find(base, {"_id": 1, "job": 1}))
    if not docs:
        return
    dead = coll.update_many(
        {**base, "recoveries": {"$gte": settings.MAX_RECOVERIES - 1}},
        {"$set": {"status": DEAD, "failed_reason": f"dead after {settings.MAX_RECOVERIES} recoveries: {reason}",
                  "last_update_datetime": now}, "$inc": {"recoveries": 1}, "$unset": unset},
    ).modified_count
    back = coll.update_many(
        base,
        {"$set": {"status": LIVE, "failed_reason": f"recovered: {reason}", "last_update_datetime": now},
         "$inc": {"recoveries": 1}, "$unset": unset},
    ).modified_count
    # Data an unsettled attempt may have written before it died is not that task's data.
    CrawlerDownloadData._get_collection().delete_many({"task": {"$in": [d["_id"] for d in docs]}, "lease": lease})
    if back:  # one entry holds tasks of one job
        lower_live_from(docs[0]["job"], min(d["_id"] for d in docs))
    report.recovered += back
    report.dead += dead
    report.reasons.append(f"{back + dead} tasks: {reason}")
