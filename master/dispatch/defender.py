"""The defender: give back to the dispatcher every task whose queue entry can no longer settle
it, and remove data that no task names.

It judges leases (``crawler_lease``), never tasks, and only by facts that cannot be wrong (the
verdicts are ``common.store.leases.lease_verdict``):
  * QUEUED and absent from every queue on two looks at least ABSENCE_GRACE apart: the entry was
    lost (Redis flushed or restarted) or popped by a worker that died (or froze) before claiming
    it; a live worker claims what it pops well within the grace. Not an attempt: nothing is
    counted. An entry still waiting in its queue is never touched, however long it waits. One
    that an rq worker failed unread (started without ``--serializer json``: rq's failed registry
    holds it with a DeserializationError) is given back the same way, with that reason; each such
    worker is named once in the alert log (``unreadable_entry``) and the defender's log.
  * RUNNING with no heartbeat (``beat_at``, written to MongoDB by the worker, so a Redis restart
    does not fake a death) for HEARTBEAT_TTL, or started longer than LEASE_TIMEOUT ago: the
    attempt died. Its tasks get ``recoveries`` + 1; at MAX_RECOVERIES they end DEAD (poison).
A judged lease is first marked LOST by compare-and-set on what was judged (a worker claiming
or beating at that moment makes it fail: ``common.store.claims.judged``), then released
(``common.store.leases.release``). Then the sweep removes data documents that no task names,
once their lease is gone (``common.store.orphans.sweep_orphans``).

Runs at the start of every dispatch (under the dispatcher lock, which the "absent from Redis"
judgement needs) and as ``downcluster defender``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime

from redis import Redis

from common.config import settings
from common.queue.rqbridge import delete_entry, entries_waiting, entry_id, failed_unread, our_queues
from common.store import leases, orphans
from common.store import logs as store_logs
from common.store.clock import store_now
from common.store.connection import redis_conn
from common.store.models import LOST, QUEUED
from common.store.records import Lease

logger = logging.getLogger(__name__)
UNREADABLE_ALERT = "unreadable_entry"


@dataclass
class RecoveryReport:
    recovered: int = 0
    dead: int = 0
    requeued: int = 0  # tasks of entries lost before any attempt
    reasons: list[str] = field(default_factory=list)


def recover(redis: Redis | None = None, now: datetime | None = None, budget: float | None = None,
            locked: bool = False) -> RecoveryReport:
    """One defender pass. ``locked``: the caller holds the dispatcher lock (else it is taken)."""
    if not locked:
        from master.dispatch.lock import DispatchLock

        redis = redis or redis_conn()
        with DispatchLock(redis):
            return recover(redis, now, budget, locked=True)
    redis = redis or redis_conn()
    end = time.monotonic() + (budget if budget is not None else float("inf"))
    leases_ = leases.open_leases()
    report = RecoveryReport()
    if not leases_:
        return report
    waiting = entries_waiting(redis, our_queues(redis))
    now = now or store_now()  # the clock the worker's stamps come from
    seen, missing = [], []
    for lease in leases_:
        if time.monotonic() > end:
            logger.warning("defender: time budget spent; %s leases left for the next run", len(leases_))
            break
        here = entry_id(lease.id) in waiting
        if lease.state == QUEUED:
            if here and lease.missing_at:
                seen.append(lease.id)
            elif not here and not lease.missing_at:
                missing.append(lease.id)
        _judge(redis, lease, here, now, report)
    leases.mark_missing(missing, now)
    leases.unmark_missing(seen)
    if report.recovered or report.dead or report.requeued:
        logger.warning("defender: %s tasks back to the dispatcher, %s DEAD, %s never started",
                       report.recovered, report.dead, report.requeued)
    return report


def _judge(redis: Redis, lease: Lease, here: bool, now: datetime, report: RecoveryReport) -> None:
    """Give the lease's tasks back if its verdict says so (and it is still what was judged)."""
    verdict = leases.lease_verdict(lease, here, now, leases.LEASE.ttl(), settings.LEASE_TIMEOUT,
                                   settings.ABSENCE_GRACE)
    if verdict is None:
        return
    reason, attempt = verdict
    if lease.state == QUEUED:
        reason = _unread(redis, lease, now) or reason
    if lease.state != LOST and not leases.mark_lost(lease, reason):
        return  # claimed or beat meanwhile: alive after all
    recovered, dead, again = leases.release(lease.id, reason, attempt, now)
    report.recovered += recovered
    report.dead += dead
    report.requeued += again
    report.reasons.append(f"{recovered + dead + again} tasks: {reason}")
    try:
        delete_entry(redis, entry_id(lease.id))
    except Exception:  # Redis away: the entry is harmless (its lease is gone) and expires with rq's cleanup
        pass


def _unread(redis: Redis, lease: Lease, now: datetime) -> str | None:
    """The reason of an entry lost to an rq worker that could not read it (started without the
    JSON serializer), said once per such worker in the alert log and this log; else None."""
    worker = failed_unread(redis, entry_id(lease.id))
    if worker is None:
        return None
    alert = (f"rq worker {worker} took queue entries it cannot read (it unpickles; downcluster's entries "
             "are JSON): start rq workers with `--serializer json`")
    if store_logs.add_alert_once(None, UNREADABLE_ALERT, alert, now):
        logger.warning("defender: %s", alert)
    return f"queue entry failed unread by rq worker {worker}: start rq workers with `--serializer json`"


def sweep(budget: float | None = None) -> int:
    """The defender's periodic share (master/maintenance.py): data documents that no task names
    (``common.store.leases``)."""
    return orphans.sweep_orphans(budget=budget if budget is not None else 30.0)
