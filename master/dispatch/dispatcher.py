"""The dispatcher: move due tasks of ON jobs into the rq priority queues, within every cap.

One run (``dispatch_download``):
  1. take the cluster-wide lock (a second dispatcher exits at once; a ``--loop`` stands by) and
     arm a watchdog that ends the run after DISPATCH_USE_POOL_TIMEOUT (releasing the lock on the
     way out);
  2. recover leases whose entry was lost or whose worker died (the defender, time-bounded);
  3. per ON job: up to ``dispatch_num`` due tasks, those that go again first, then fresh ones
     above the job's seq cursor (``common.store.tasks``);
  4. plan entries of DISPATCH_BATCH_SIZE tasks per target queue, in job order (priority, host
     or both), against each queue's free room and the run's total cap; fresh tasks are taken
     in seq order and stop at the first that does not fit, so the cursor never skips one;
  5. per job: insert the entries' lease documents, mark tasks that go again DISPATCH, move the
     cursor (compare-and-set), then push each entry with a Redis script that checks the lock
     and the cap atomically; an entry refused is released at once, and a lost lock ends the run;
  6. dispatch logs are written per job as its entries go out; alerts at the end;
  7. the chores that are due cluster-wide (master/maintenance.py), within a tenth of the run's budget.

Per task the dispatcher writes nothing on the fresh path: its cost is per entry (50 tasks).
"""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from redis import Redis

from common.config import settings
from common.errors import ConfigError, DispatchLocked
from common.jobsettings import PRIOR_FOREIGN, PRIOR_URGENCY
from common.queue.names import LOCK_KEY, WORKER_AHEAD, cap, queue_for_priority, queue_name
from common.queue.rqbridge import (
    FULL,
    NOT_OWNER,
    PUSHED,
    entry_id,
    entry_mapping,
    push_entry,
    queue_key,
    rq_queue,
)
from common.store import due, leases
from common.store import logs as store_logs
from common.store.clock import store_now, utcnow
from common.store.connection import redis_conn
from common.store.due import Picked, due_again, due_fresh, due_revisits, fresh_cursor
from common.store.jobs import UNSET, dispatch_settings, on_jobs
from common.store.models import AGAIN, FRESH, REVISIT
from common.store.records import Job
from master import maintenance as chores
from master.dispatch import defender
from master.dispatch.lock import DispatchLock

logger = logging.getLogger(__name__)

ORDERS = ("priority", "host", "priority,host", "host,priority")


@dataclass
class PlannedEntry:
    """A queue entry the run means to send: its attempt kind (FRESH, AGAIN or REVISIT), target
    queue and tasks."""

    attempt_kind: str
    queue: str
    tasks: list[Picked] = field(default_factory=list)

    @property
    def ids(self) -> list:
        return [t.id for t in self.tasks]


@dataclass
class JobWork:
    job: Job
    dispatch_num: int
    max_retry_times: int
    prior: int = 0
    again: list[Picked] = field(default_factory=list)
    fresh: list[Picked] = field(default_factory=list)
    read_to: int = 0
    entries: list[PlannedEntry] = field(default_factory=list)
    fresh_taken: int = 0
    revisits: list[Picked] = field(default_factory=list)  # in (due, _id) order
    revisit_floor: tuple | None = None  # (due, _id) up to which revisits went out, if all of them go

    def next_revisit_floor(self) -> tuple | None:
        """The floor once the planned entries are sent: the last revisit before the first one
        left behind (queues full), else what ``due_revisits`` said."""
        sent = {i for e in self.entries for i in e.ids}
        for n, t in enumerate(self.revisits):
            if t.id not in sent:
                return (self.revisits[n - 1].due, self.revisits[n - 1].id) if n else None
        return self.revisit_floor

    @property
    def name(self) -> str:
        return self.job.name or ""

    def queue_of(self, picked: Picked) -> str:
        """The job's level; a host's own queue when the task or job names one, else the
        foreign queue for ``prior = 2``, else the shared queue."""
        level = queue_for_priority(self.job.priority)
        host = picked.worker_host or self.job.worker_host or ""
        return queue_name(level, host, foreign=self.prior == PRIOR_FOREIGN)


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

    def as_dict(self) -> dict:
        return {
            "tasks": dict(self.tasks),
            "entries": dict(self.entries),
            "total": self.total,
            "recovered": self.recovered,
            "failed_entries": self.failed_entries,
            "alerts": list(self.alerts),
        }


# --- pure parts --------------------------------------------------------------------------

def order_key(job: Job, order: str = "priority") -> tuple:
    """Sort key for jobs drawing on the caps: by priority, by host (host-bound first), or both."""
    host, priority, name = job.worker_host or "", job.priority, job.name or ""
    host_key = (0 if host else 1, host)
    if order == "host":
        return (*host_key, priority, name)
    if order in ("priority,host", "host,priority"):
        return (priority, *host_key, name)
    return (priority, name)


def pack(attempt_kind: str, tasks: list[Picked], queue_of, free: dict[str, int], total: int,
         batch_size: int) -> tuple[list[PlannedEntry], int, str | None]:
    """Fill entries of ``batch_size`` per queue from ``tasks`` within each queue's free entries
    and ``total`` tasks. FRESH tasks and revisits stop at the first that does not fit, so the
    cursor (the revisit floor) can follow. Returns (entries, tasks taken, why some were left or None)."""
    prefix = attempt_kind in (FRESH, REVISIT)
    entries: list[PlannedEntry] = []
    open_: dict[str, PlannedEntry] = {}
    taken, why = 0, None
    for t in tasks:
        if total - taken <= 0:
            why = "total_cap"
            break
        q = queue_of(t)
        cur = open_.get(q)
        if cur is None or len(cur.tasks) >= batch_size:
            if free.get(q, 0) <= 0:
                why = why or f"queue_full:{q}"
                if prefix:
                    break
                continue
            free[q] = free.get(q, 0) - 1
            cur = open_[q] = PlannedEntry(attempt_kind, q)
            entries.append(cur)
        cur.tasks.append(t)
        taken += 1
    return entries, taken, why


def plan(
    works: list[JobWork], free: dict[str, int], total: int, batch_size: int
) -> list[tuple[JobWork, str, str]]:
    """Give each work its entries in job order; return alerts as (work, type, reason)."""
    alerts = []
    for work in works:
        for attempt_kind, picked in ((AGAIN, work.again), (FRESH, work.fresh), (REVISIT, work.revisits)):
            entries, taken, why = pack(attempt_kind, picked, work.queue_of, free, total, batch_size)
            work.entries += entries
            total -= taken
            if attempt_kind == FRESH:
                work.fresh_taken = taken
            if taken < len(picked):
                what = {FRESH: "fresh", AGAIN: "retry", REVISIT: "revisit"}[attempt_kind]
                left = f"{len(picked) - taken} of {len(picked)} {what} tasks stay for a later run"
                if why and why.startswith("queue_full:"):
                    q = why.split(":", 1)[1]
                    alerts.append((work, "queue_full", f"queue {q} is full (cap {cap(q)} entries): {left}"))
                else:
                    alerts.append((work, "total_cap", f"MAX_TOTAL_DISPATCH_COUNT_ONCE reached: {left}"))
    return alerts


def entry_timeout() -> int:
    """rq's limit for one entry when run by a plain ``rq worker``: its downloads run at once
    (up to DOWNLOAD_CONCURRENCY), each within DOWNLOAD_TIMEOUT, then the store."""
    rounds = -(-settings.DISPATCH_BATCH_SIZE // max(1, settings.DOWNLOAD_CONCURRENCY))
    return int(settings.DOWNLOAD_TIMEOUT * rounds + 120)


def held_timeout() -> int:
    """The longest a ``downcluster worker`` may hold an entry: a task at the worker's gate may be
    overtaken by higher queues' for HOST_WAIT_MAX (the gate's patience), then waits behind at most
    WORKER_AHEAD rounds of downloads, each a wait for its site (HOST_WAIT_MAX) and a download, then
    takes its own round."""
    rounds = (WORKER_AHEAD + 1) * (settings.HOST_WAIT_MAX + settings.DOWNLOAD_TIMEOUT)
    return int(settings.HOST_WAIT_MAX + rounds + 120)


def check_settings() -> None:
    """Refuse settings that would break the run's guarantees (one line each)."""
    if settings.DISPATCH_ORDER not in ORDERS:
        raise ConfigError(
            f"DISPATCH_ORDER must be one of {', '.join(ORDERS)}; got {settings.DISPATCH_ORDER!r}"
        )
    if settings.LEASE_TIMEOUT <= entry_timeout():
        raise ConfigError(
            f"LEASE_TIMEOUT ({settings.LEASE_TIMEOUT}s) must exceed an entry's longest run "
            f"({entry_timeout()}s from DOWNLOAD_TIMEOUT, DISPATCH_BATCH_SIZE, DOWNLOAD_CONCURRENCY)"
        )
    if settings.LEASE_TIMEOUT <= held_timeout():
        raise ConfigError(
            f"LEASE_TIMEOUT ({settings.LEASE_TIMEOUT}s) must exceed the longest a worker may hold an "
            f"entry ({held_timeout()}s from DOWNLOAD_TIMEOUT and HOST_WAIT_MAX)"
        )
    if settings.DISPATCH_BATCH_SIZE < 1:
        raise ConfigError("DISPATCH_BATCH_SIZE must be at least 1")


# --- selection ---------------------------------------------------------------------------

def _load_works(jobs: list[Job], now: datetime) -> list[JobWork]:
    conf = dispatch_settings([j.id for j in jobs])

    def load(job: Job) -> JobWork:
        c = (conf.get(job.id) or UNSET).resolved(settings)  # every setting set: ``or 0`` only says so
        work = JobWork(job=job, dispatch_num=c.dispatch_num or 0, max_retry_times=c.max_retry_times or 0,
                       prior=c.prior or 0)
        work.again = due_again(job.id, work.max_retry_times, work.dispatch_num, now)
        work.fresh, work.read_to = due_fresh(job, work.dispatch_num - len(work.again), now)
        if c.revisit:  # visits again take what retries and fresh tasks left
            need = work.dispatch_num - len(work.again) - len(work.fresh)
            work.revisits, work.revisit_floor = due_revisits(job, need, now)
        return work

    with ThreadPoolExecutor(max_workers=settings.DISPATCH_POOL_SIZE) as pool:
        return [w for w in pool.map(load, jobs) if w.again or w.fresh or w.revisits]


# --- sending -----------------------------------------------------------------------------

def release_entry(job_id, lease: str, attempt_kind: str, ids: list, reason: str, now: datetime) -> None:
    """An entry that never reached its queue: its tasks go again at once (no attempt counted)."""
    leases.give_back(job_id, ids, lease, attempt_kind, f"not sent: {reason}", now, now)
    leases.drop(lease)


class Run:
    """One dispatcher run's shared state (report, lock token, stop flag)."""

    def __init__(self, redis: Redis, token: bytes | str, now: datetime) -> None:
        self.redis, self.token, self.now = redis, token, now
        self.report = DispatchReport()
        self.lost_lock = False
        self._mutex = threading.Lock()

    def send(self, work: JobWork) -> None:
        """Send one job's planned entries (see the module docstring, step 5)."""
        if not work.entries or self.lost_lock:
            return
        now = self.now
        lease_ids = [uuid.uuid4().hex for _ in work.entries]
        leases.create([leases.new_lease(lease, work.job.id, e.queue, e.attempt_kind, e.tasks, now)
                       for lease, e in zip(lease_ids, work.entries)])
        again = [(lease, e.queue, e.tasks) for lease, e in zip(lease_ids, work.entries)
                 if e.attempt_kind == AGAIN]
        due.mark_sent(work.job.id, again, now)
        if work.fresh:
            new = fresh_cursor(work.fresh, work.read_to, work.fresh_taken)
            if not due.advance_cursor(work.job.id, work.job.seq_sent, new):
                # another dispatcher sent these fresh tasks: send nothing
                for lease, e in zip(lease_ids, work.entries):
                    if e.attempt_kind == AGAIN:
                        release_entry(work.job.id, lease, AGAIN, e.ids, "another dispatcher ran", now)
                    else:  # the other run owns them now
                        leases.drop(lease)
                self.lost_lock = True
                return
        self._push(work, lease_ids)
        floor = work.next_revisit_floor()
        if floor is not None:
            due.raise_revisit_floor(work.job.id, *floor)

    def _push(self, work: JobWork, lease_ids: list[str]) -> None:
        """Push the job's entries (leases ``lease_ids``) and log each; one refused is released."""
        now = self.now
        pipe = self.redis.pipeline(transaction=False)
        for lease, e in zip(lease_ids, work.entries):
            mapping = entry_mapping(rq_queue(e.queue, self.redis), lease, entry_timeout(),
                                    settings.LEASE_TIMEOUT, f"{work.name} x{len(e.tasks)}", utcnow())
            push_entry(self.redis, LOCK_KEY, e.queue, entry_id(lease), mapping, cap(e.queue), self.token,
                       at_front=work.prior == PRIOR_URGENCY, client=pipe)
        try:
            results = pipe.execute()
        except Exception as exc:  # Redis down: unknown which entries got in; their leases stay QUEUED and
            # the defender gives back those that are in no queue
            logger.warning("dispatch of job %s: Redis failed: %s", work.name, exc)
            results = [None] * len(lease_ids)
        logs = []
        for lease, e, res in zip(lease_ids, work.entries, results):
            if res == PUSHED:
                logs.append(store_logs.entry_log(work.job.id, e.queue, lease, len(e.tasks), now))
                with self._mutex:
                    self.report.tasks[e.queue] += len(e.tasks)
                    self.report.entries[e.queue] += 1
                continue
            why = {FULL: f"queue {e.queue} reached its cap", NOT_OWNER: "dispatcher lock lost"}.get(
                res, "Redis unavailable" if res is None else f"push failed: {res!r}")
            if res == NOT_OWNER:
                self.lost_lock = True
            # Only a missing reply leaves doubt whether the entry is in Redis: the defender decides
            if res is not None:
                release_entry(work.job.id, lease, e.attempt_kind, e.ids, why, now)
            logs.append(store_logs.entry_log(work.job.id, e.queue, lease, len(e.tasks), now, why))
            with self._mutex:
                self.report.failed_entries += 1
        store_logs.add_entry_logs(logs)


def _run(redis: Redis, token, defend: bool = True) -> DispatchReport:
    start = time.monotonic()
    recovered = (
        defender.recover(redis, budget=settings.DISPATCH_USE_POOL_TIMEOUT / 3, locked=True)
        if defend
        else defender.RecoveryReport()
    )
    now = store_now()  # the clock leases and retry times are judged by
    run = Run(redis, token, now)
    run.report.recovered = recovered.recovered + recovered.requeued
    jobs = sorted(on_jobs(), key=lambda j: order_key(j, settings.DISPATCH_ORDER))
    if not jobs:
        chores.run_due(redis, budget=settings.DISPATCH_USE_POOL_TIMEOUT / 10)
        return run.report
    works = _load_works(jobs, now)
    queues = sorted({w.queue_of(t) for w in works for t in (*w.again, *w.fresh, *w.revisits)})
    pipe = redis.pipeline(transaction=False)
    for name in queues:
        pipe.llen(queue_key(name))
    free = {name: max(0, cap(name) - n) for name, n in zip(queues, pipe.execute())}
    alerts = plan(works, free, settings.MAX_TOTAL_DISPATCH_COUNT_ONCE, settings.DISPATCH_BATCH_SIZE)
    with ThreadPoolExecutor(max_workers=settings.DISPATCH_POOL_SIZE) as pool:
        list(pool.map(run.send, works))
    if alerts:
        store_logs.add_alerts([(w.job.id, alert, reason) for w, alert, reason in alerts], now)
        run.report.alerts = [f"{w.name}: {reason}" for w, _, reason in alerts]
    if run.lost_lock:
        raise DispatchLocked("lost the dispatcher lock during the run; stopped")
    chores.run_due(redis, budget=settings.DISPATCH_USE_POOL_TIMEOUT / 10)
    logger.debug("dispatch run took %.3fs", time.monotonic() - start)
    return run.report


# --- the lock and the run ----------------------------------------------------------------

def _watchdog(lock: DispatchLock) -> threading.Timer:
    def fire() -> None:
        logger.error(
            "dispatcher run exceeded DISPATCH_USE_POOL_TIMEOUT=%ss: stopped",
            settings.DISPATCH_USE_POOL_TIMEOUT,
        )
        lock.release()
        os._exit(3)

    timer = threading.Timer(settings.DISPATCH_USE_POOL_TIMEOUT, fire)
    timer.daemon = True
    return timer


def timed_run(redis: Redis, lock: DispatchLock, watchdog: bool, defend: bool = True) -> DispatchReport:
    """One run under ``lock`` (held), ended by the watchdog past DISPATCH_USE_POOL_TIMEOUT."""
    timer = _watchdog(lock)
    if watchdog:
        timer.start()
    try:
        return _run(redis, lock.token, defend)
    finally:
        timer.cancel()


def dispatch_once(redis: Redis | None = None, watchdog: bool = True) -> DispatchReport:
    """One dispatcher run under the cluster lock (raises DispatchLocked if it is held)."""
    check_settings()
    redis = redis or redis_conn()
    with DispatchLock(redis) as lock:
        return timed_run(redis, lock, watchdog)
