"""The dispatcher: move due tasks of ON jobs into the rq priority queues, within every cap.

One run (seed 003, ``dispatch_download``):
  1. take the cluster-wide lock (a second dispatcher exits at once) and arm a watchdog that
     kills the run after DISPATCH_USE_POOL_TIMEOUT;
  2. recover tasks whose queue entry was lost (the defender);
  3. select, per ON job and in parallel, up to ``dispatch_num`` due tasks: retryable FAIL
     tasks first, then LIVE ones (an ``_id`` watermark per job keeps this independent of the
     backlog);
  4. allocate queue entries in job order (priority, host, or both) against each queue's free
     room and the run's total cap; what does not fit stays in MongoDB and an alert says so;
  5. per batch of DISPATCH_BATCH_SIZE tasks of one job: enqueue one rq entry ``dc-<lease>``,
     then mark exactly the selected tasks DISPATCH with that lease (one update);
  6. write the dispatch and alert logs, release the lock.

A queue entry carries (lease, job id, task count); the worker finds its tasks by lease.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from bson import ObjectId
from redis import Redis
from rq import Queue

from common.config import settings
from common.connections import redis_conn
from common.errors import DispatchLocked
from common.models import (
    DISPATCH,
    FAIL,
    LIVE,
    ON,
    SUCCESS,
    CrawlerDispatchAlertLog,
    CrawlerDispatchLog,
    CrawlerDownloadSetting,
    CrawlerTask,
    Job,
    utcnow,
)
from common.queues import LOCK_KEY, cap, queue_for_priority, queue_name, rq_job_id
from master import defender, watermark

logger = logging.getLogger(__name__)

JOB_FUNCTION = "slave.jobs.run_batch"


@dataclass
class Group:
    """Due tasks of one job, one status and one target queue, sorted by _id."""

    status: str
    host: str
    queue: str
    ids: list[ObjectId]
    granted: int = 0


@dataclass
class JobWork:
    job: Job
    dispatch_num: int
    max_retry_times: int
    groups: list[Group] = field(default_factory=list)
    live_bounds: tuple = (None, None)  # watermark (old, new) if every selected task goes out

    @property
    def wanted(self) -> int:
        return sum(len(g.ids) for g in self.groups)


@dataclass
class DispatchReport:
    tasks: Counter = field(default_factory=Counter)    # per queue
    entries: Counter = field(default_factory=Counter)  # per queue
    alerts: list[str] = field(default_factory=list)
    recovered: int = 0
    failed_entries: int = 0

    @property
    def total(self) -> int:
        return sum(self.tasks.values())


# --- pure parts --------------------------------------------------------------------------

def order_key(job: Job, order: str = "priority") -> tuple:
    """Sort key for jobs drawing on the caps: by priority, by host (host-bound first), or both."""
    host_key = (0 if job.host else 1, job.host or "")
    if order == "host":
        return (*host_key, job.priority, job.name)
    if order in ("priority,host", "host,priority"):
        return (job.priority, *host_key, job.name)
    return (job.priority, job.name)


def allocate(works: list[JobWork], free: dict[str, int], total: int, batch_size: int) -> list[tuple[JobWork, str, str]]:
    """Grant tasks to each group in order without exceeding any queue's free entries or
    the run's total; return alerts as (work, type, reason)."""
    alerts = []
    for work in works:
        for group in work.groups:
            want = len(group.ids)
            room = free.get(group.queue, 0)
            grant = min(want, room * batch_size, total)
            group.granted = grant
            free[group.queue] = room - math.ceil(grant / batch_size)
            total -= grant
            if grant < want:
                if grant == min(want, room * batch_size):  # the queue, not the total, ran out
                    kind, why = "queue_full", f"queue {group.queue} is full (cap {cap(group.queue)} entries)"
                else:
                    kind, why = "total_cap", "MAX_TOTAL_DISPATCH_COUNT_ONCE reached"
                alerts.append((work, kind, f"{why}: {want - grant} of {want} {group.status} tasks stay for a later run"))
    return alerts


def batches(ids: list, size: int) -> list[list]:
    return [ids[i:i + size] for i in range(0, len(ids), size)]


# --- selection ---------------------------------------------------------------------------

def _load_work(job: Job, now: datetime) -> JobWork:
    setting = CrawlerDownloadSetting.objects(job=job).only("dispatch_num", "max_retry_times").first()
    work = JobWork(
        job=job,
        dispatch_num=setting.dispatch_num if setting else settings.DEFAULT_DISPATCH_NUM,
        max_retry_times=setting.max_retry_times if setting else settings.DEFAULT_MAX_RETRY_TIMES,
    )
    coll = CrawlerTask._get_collection()
    need = work.dispatch_num
    picked: list[tuple[str, dict]] = []
    if work.max_retry_times > 0:
        retry_filter = _fail_filter(job.id, work.max_retry_times, now)
        for doc in coll.find(retry_filter, {"_id": 1, "host_name": 1}).sort("_id", 1).limit(need):
            picked.append((FAIL, doc))
    if len(picked) < need:
        docs, work.live_bounds = watermark.select_live(coll, job, need - len(picked), now)
        picked.extend((LIVE, doc) for doc in docs)
    by_key: dict[tuple[str, str], Group] = {}
    base = queue_for_priority(job.priority)
    for status, doc in picked:
        host = doc.get("host_name") or job.host or ""
        key = (status, host)
        if key not in by_key:
            by_key[key] = Group(status=status, host=host, queue=queue_name(base, host), ids=[])
        by_key[key].ids.append(doc["_id"])
    work.groups = list(by_key.values())
    return work


def _fail_filter(job_id, max_retry_times: int, now: datetime) -> dict:
    return {"job": job_id, "status": FAIL, "retry_at": {"$lte": now}, "download_times": {"$lt": max_retry_times}}


def _batch_filter(work: JobWork, group: Group, ids: list[ObjectId], now: datetime) -> dict:
    """Exactly the selected tasks of one batch that are still due (``$in`` of at most a batch:
    cheap on any MongoDB, and within SecantusDB's comfortable list length)."""
    flt = _fail_filter(work.job.id, work.max_retry_times, now) if group.status == FAIL else {"job": work.job.id, "status": LIVE}
    flt["_id"] = {"$in": ids}
    return flt


# --- enqueue -----------------------------------------------------------------------------

def entry_timeout() -> int:
    rounds = math.ceil(settings.DISPATCH_BATCH_SIZE / max(1, settings.DOWNLOAD_CONCURRENCY))
    return int(settings.DOWNLOAD_TIMEOUT * rounds + 120)


def _enqueue_work(work: JobWork, redis: Redis, now: datetime, report: DispatchReport, lock: threading.Lock) -> list:
    """Enqueue and mark every granted batch of one job; return its dispatch log documents."""
    coll = CrawlerTask._get_collection()
    logs = []
    complete = True
    for group in work.groups:
        queue = Queue(group.queue, connection=redis)
        for ids in batches(group.ids[: group.granted], settings.DISPATCH_BATCH_SIZE):
            lease = uuid.uuid4().hex
            log = {"job": work.job.id, "queue": group.queue, "lease": lease, "count": len(ids),
                   "hostname": settings.HOSTNAME, "add_datetime": now}
            try:
                queue.enqueue_call(
                    JOB_FUNCTION, args=(lease, str(work.job.id), len(ids)), job_id=rq_job_id(lease),
                    timeout=entry_timeout(), result_ttl=0, failure_ttl=settings.LEASE_TIMEOUT,
                    description=f"{work.job.name} x{len(ids)}",
                )
                coll.update_many(
                    _batch_filter(work, group, ids, now),
                    {"$set": {"status": DISPATCH, "lease": lease, "queue": group.queue,
                              "dispatched_at": now, "last_update_datetime": now}},
                )
            except Exception as exc:  # Redis or MongoDB down: the tasks stay due for the next run
                complete = False
                logger.warning("dispatch of %s tasks of job %s to %s failed: %s", len(ids), work.job.name, group.queue, exc)
                logs.append({**log, "status": FAIL, "reason": f"{type(exc).__name__}: {exc}"})
                with lock:
                    report.failed_entries += 1
                continue
            logs.append({**log, "status": SUCCESS})
            with lock:
                report.tasks[group.queue] += len(ids)
                report.entries[group.queue] += 1
        if group.granted < len(group.ids):
            complete = False
    if complete:
        watermark.advance(work.job, work.live_bounds)
    return logs


# --- the run -----------------------------------------------------------------------------

def acquire_lock(redis: Redis, ttl: int):
    lock = redis.lock(LOCK_KEY, timeout=ttl, blocking=False)
    if not lock.acquire(blocking=False):
        raise DispatchLocked("another dispatcher is running (lock held); this run exits")
    return lock


def _terminate(signum, frame) -> None:
    raise SystemExit(0)


def _force_exit() -> None:
    logger.error("dispatcher run exceeded DISPATCH_USE_POOL_TIMEOUT=%ss: killed", settings.DISPATCH_USE_POOL_TIMEOUT)
    os._exit(3)


def dispatch_once(redis: Redis | None = None, watchdog: bool = True) -> DispatchReport:
    """One dispatcher run under the cluster lock (raises DispatchLocked if it is held)."""
    return next(iter(_runs(redis or redis_conn(), 1, 0.0, watchdog)))


def dispatch_loop(redis: Redis, interval: float, max_runs: int | None = None, on_run=None) -> None:
    """``dispatch --loop``: keep the queues topped up, holding the lock between runs.
    SIGTERM (a supervisor stopping it) ends the loop cleanly and releases the lock."""
    signal.signal(signal.SIGTERM, _terminate)
    for report in _runs(redis, max_runs, interval, True):
        if on_run:
            on_run(report)


def _runs(redis: Redis, count: int | None, interval: float, watchdog: bool):
    ttl = settings.DISPATCH_USE_POOL_TIMEOUT + 30
    lock = acquire_lock(redis, ttl)
    done = 0
    try:
        while count is None or done < count:
            timer = threading.Timer(settings.DISPATCH_USE_POOL_TIMEOUT, _force_exit)
            timer.daemon = True
            if watchdog:
                timer.start()
            try:
                report = _run(redis)
            finally:
                timer.cancel()
            done += 1
            yield report
            if count is not None and done >= count:
                break
            time.sleep(interval)
            if not lock.reacquire():
                raise DispatchLocked("lost the dispatcher lock; stopping")
    finally:
        try:
            lock.release()
        except Exception:  # expired already; nothing to release
            pass


def _run(redis: Redis) -> DispatchReport:
    report = DispatchReport()
    report.recovered = defender.recover(redis).recovered
    now = utcnow()
    jobs = sorted(Job.objects(status=ON), key=lambda j: order_key(j, settings.DISPATCH_ORDER))
    if not jobs:
        return report
    with ThreadPoolExecutor(max_workers=settings.DISPATCH_POOL_SIZE) as pool:
        works = [w for w in pool.map(lambda j: _load_work(j, now), jobs) if w.wanted]
    queues = {g.queue for w in works for g in w.groups}
    pipe = redis.pipeline(transaction=False)
    for name in sorted(queues):
        pipe.llen(Queue(name, connection=redis).key)
    free = {name: max(0, cap(name) - n) for name, n in zip(sorted(queues), pipe.execute())}
    alerts = allocate(works, free, settings.MAX_TOTAL_DISPATCH_COUNT_ONCE, settings.DISPATCH_BATCH_SIZE)
    lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=settings.DISPATCH_POOL_SIZE) as pool:
        logs = [doc for docs in pool.map(lambda w: _enqueue_work(w, redis, now, report, lock), works) for doc in docs]
    if logs:
        CrawlerDispatchLog._get_collection().insert_many(logs, ordered=False)
    if alerts:
        CrawlerDispatchAlertLog._get_collection().insert_many([
            {"job": w.job.id, "type": kind, "reason": reason, "content_bytes": 0,
             "hostname": settings.HOSTNAME, "add_datetime": now}
            for w, kind, reason in alerts
        ])
        report.alerts = [f"{w.job.name}: {reason}" for w, _, reason in alerts]
    return report
