"""Running queue entries: claim, download, store; many at once in one process.

A download entry (an rq job of kind ``download``, ``common/queue/rqbridge.py``) names a lease
listing its tasks (``common/store/leases.py``). Running it:
  1. claim the lease (compare-and-set QUEUED -> RUNNING): an entry is never run twice;
  2. load the job (``slave/worker/context.py``, cached a few seconds); a disabled job gives the tasks
     back untouched;
  3. download them all at once (``slave/download/fetching.py``), each within its limits and etiquette;
  4. hand each outcome, as it completes, to the process's one writer thread
     (``slave/worker/writer.py``), which stores the outcomes of all running entries in bulk and ends
     the lease once every outcome is stored.
A heartbeat thread (``slave/worker/heartbeat.py``) keeps the leases and rq informed; a thread of the
etiquette's keeps the host slots (``slave/download/etiquette.py``).

``serve`` is ``downcluster worker``: an rq worker (``slave/worker/rqworker.py``) whose loop takes
each entry through the lane of its entry kind (``Loop.lanes``, entry kind -> lane): download
entries, in strict queue order, while fewer than twice WORKER_INFLIGHT of their tasks are loaded
and not yet done, looked for again as soon as room opens; at most WORKER_INFLIGHT of them download at once
(``Runner.gate``: a higher queue's first, then first come first served), the rest wait their
turn in the process, so a page that ends is followed at once by the next, not after an entry's
claim (looking only when a whole entry ended left downloads idle: docs/benchmarks.md, its
fifth session); export entries from down_export one at a time in a
thread of their own, so neither waits for the other (an idle export lane delivers due
notifications); generator runs from down_generate (read first; up to GENERATE_LANES at once, each
in a thread of its own: ``slave/generate.py``). ``run_one`` runs a single download entry: the job
function of a plain ``rq worker``.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rq.executions import Execution

from common import heap
from common.config import settings
from common.notify import deliver_due
from common.queue import rqbridge
from common.queue.names import EXPORT_QUEUE, GENERATE_QUEUE, QUEUE_NAMES, WORKER_AHEAD, base_of
from common.queue.rqbridge import EntryKind
from common.secrets import redact
from common.sentry import capture
from common.store import leases
from common.store.clock import store_time
from common.store.connection import connect_mongo, redis_conn
from common.store.models import OFF
from common.store.records import Lease
from slave.download.fetching import Fetcher
from slave.worker.context import load_context
from slave.worker.gate import Gate
from slave.worker.heartbeat import Heartbeat, new_worker_id
from slave.worker.outcome import Outcome
from slave.worker.rqworker import LoopWorker
from slave.worker.writer import RunningEntry, Writer

logger = logging.getLogger(__name__)
NOTIFY_EVERY = 30.0  # seconds between deliveries of due notifications by an idle export lane
GENERATE_LANES = 2  # generator runs at once (each a sandbox, in a thread of its own)


class Runner:
    """Runs entries on one event loop; ``store_pool`` is one thread for the lease's reads."""

    def __init__(self, worker_id: str | None = None) -> None:
        self.worker_id = worker_id or new_worker_id()
        self.fetcher = Fetcher()
        self.store_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self.writer = Writer(self.worker_id)
        self.heartbeat = Heartbeat(self)
        self.rq: LoopWorker | None = None  # set by serve: rq's view of this worker
        self.active: set[str] = set()  # leases being run (and beaten for)
        self.gate = Gate(settings.WORKER_INFLIGHT, settings.HOST_WAIT_MAX)  # a download holds a place
        self.peak_inflight = 0
        self.inflight = 0   # downloads running (holding the gate)
        self.loaded = 0     # tasks of running entries not yet downloaded (running or at the gate)
        self.roomy = asyncio.Event()  # set when room for another entry opens (``room``)
        self.pending = 0    # entries taken from a queue whose tasks are not loaded yet
        self.entries_done = 0

    async def _db(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.store_pool, fn, *args)

    async def run_entry(self, lease_id: str, pending: bool = False) -> dict[str, int] | None:
        """Claim, download, store and finish one entry; None if it was not ours to run.
        ``pending``: the entry counts in ``self.pending`` until its tasks are loaded."""
        def loaded() -> None:
            nonlocal pending
            if pending:
                self.pending, pending = self.pending - 1, False
                self._maybe_room()

        try:
            lease = await self._db(leases.claim, lease_id, self.worker_id)
        except BaseException:
            loaded()
            raise
        if lease is None:
            loaded()
            logger.info("entry %s was recovered or taken before it started: skipped", lease_id)
            return None
        self.active.add(lease_id)
        try:
            ctx = await self._db(load_context, lease.job)
            if ctx is None or ctx.status == OFF:
                return await self._give_back_all(lease)
            tasks = leases.lease_tasks(lease)
            entry = RunningEntry(lease, ctx, tasks, asyncio.get_running_loop())
            entry.etiquette = self.fetcher.etiquette
            self.loaded += len(tasks)
            loaded()
            left = len(tasks)
            try:
                if not tasks:
                    self.writer.submit(entry, None)
                plans = await self.fetcher.prepare(ctx, tasks)
                rank = _rank(lease.queue)
                downloads = [self._download(ctx, t, plans.get(t.id), rank) for t in tasks]
                for next_done in asyncio.as_completed(downloads):
                    outcome = await next_done
                    self.loaded, left = self.loaded - 1, left - 1
                    self.writer.submit(entry, outcome)
                    self._maybe_room()
                counts = await entry.done
            finally:
                self.loaded -= left
                self._maybe_room()
            logger.debug("job %s entry %s: %s", ctx.name, lease_id, counts)
            return counts
        finally:
            loaded()
            self.active.discard(lease_id)
            self.entries_done += 1

    def room(self) -> bool:
        """Whether another download entry may be taken: fewer than WORKER_AHEAD x WORKER_INFLIGHT
        tasks loaded or being loaded (the gate lets WORKER_INFLIGHT download; the rest are next),
        and the writer not far behind."""
        loading = settings.DISPATCH_BATCH_SIZE * self.pending
        return (self.loaded + loading < WORKER_AHEAD * settings.WORKER_INFLIGHT
                and self.writer.backlog() < settings.WORKER_INFLIGHT * 4)

    def _maybe_room(self) -> None:
        if self.room():
            self.roomy.set()

    async def _download(self, ctx, task, plan, rank: int):
        """One task's download once the gate lets it in (at most WORKER_INFLIGHT at once; an
        entry of a higher queue's first)."""
        await self.gate.acquire(rank)
        self.inflight += 1
        self.peak_inflight = max(self.peak_inflight, self.inflight)
        try:
            return Outcome.of(await self.fetcher.download(ctx, task, plan))
        finally:
            self.inflight -= 1
            self.gate.release()

    async def _give_back_all(self, lease: Lease) -> dict[str, int]:
        """The entry's job is off or gone: its tasks go back unattempted and the lease ends."""
        back = await self._db(leases.give_back, lease.job, list(lease.ids), lease.id, lease.attempt_kind,
                              "job disabled before download", store_time(), lease.created_at)
        logger.info("job %s is off or gone: %s tasks given back", lease.job, back)
        await self._db(leases.finish, [lease.id], self.worker_id)
        return {"success": 0, "fail": 0, "handed_back": back}

    def start(self) -> None:
        self.writer.start()
        self.heartbeat.start()
        self.fetcher.etiquette.start()

    async def close(self) -> None:
        self.heartbeat.halt.set()
        self.writer.stop()
        await self.fetcher.close()
        self.store_pool.shutdown(wait=True)
        self.writer.join(timeout=60)
        self.heartbeat.forget()


@dataclass(frozen=True)
class _Lane:
    """How the loop takes entries of one kind."""

    queues: Callable[[], list[str]]  # the queues to read now: none while the kind has no room
    home: str | None  # the one queue entries of this kind run from (None: any queue read)
    start: Callable[[str, Execution, str], asyncio.Task | None]  # (record id, execution, entry id)
    # -> the task to wait for (None: the lane waits for it itself)


class Loop:
    """``downcluster worker``'s main loop: take entries while there is room, run each as an
    rq execution, until stopped (or, in burst mode, until the queues are empty). ``lanes`` is
    the one table from an entry's kind to how it is taken and run."""

    def __init__(self, runner: Runner, worker: LoopWorker, queues: list[str], exports: bool) -> None:
        self.runner, self.rq, self.queues, self.exports = runner, worker, queues, exports
        self.redis = redis_conn()
        self.export_pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="exports") if exports else None
        )
        self.export_running: asyncio.Task | None = None
        self.generate_pool = ThreadPoolExecutor(max_workers=GENERATE_LANES, thread_name_prefix="generate")
        self.generating = 0  # generator runs under way
        self.running: set[asyncio.Task] = set()  # download entries and generator runs under way
        self.last_notify = 0.0
        self.lanes = {  # in the order their queues are read
            EntryKind.GENERATE: _Lane(lambda: [GENERATE_QUEUE] if self.generating < GENERATE_LANES else [],
                                 GENERATE_QUEUE, self._generate),
            EntryKind.DOWNLOAD: _Lane(lambda: self.queues if self._room() else [], None, self._download),
            EntryKind.EXPORT: _Lane(lambda: [EXPORT_QUEUE] if self.exports and self._export_idle() else [],
                               EXPORT_QUEUE, self._export),
            # read from the download queues (a dry run waits in down_super, before any download)
            EntryKind.DRY_RUN: _Lane(lambda: [], None, self._dry_run),
        }

    def _room(self) -> bool:
        return self.runner.room() or not self.running

    def _export_idle(self) -> bool:
        return self.export_running is None or self.export_running.done()

    async def serve(self, burst: bool = False, max_jobs: int | None = None) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, _on_signal, stop)
        taken = 0
        while not stop.is_set() and (max_jobs is None or taken < max_jobs):
            names = [name for lane in self.lanes.values() for name in lane.queues()]
            got = await self._next(names)
            if got:
                taken += await self._start(*got)
            elif self.running:
                done = await self._wait()
                self.running -= done
            elif self._export_idle():  # (an export running: the blocking wait in _next paces the loop)
                # burst: done once a look that included down_export found nothing (an export
                # that ended during a look without it leaves its queue not yet looked at)
                if burst and (EXPORT_QUEUE in names or not self.exports):
                    break
                if not burst:
                    self._notify_when_idle(loop)
        pending = self.running | ({self.export_running} if self.export_running else set())
        if pending:
            await asyncio.wait(pending)
        if self.export_pool:
            self.export_pool.shutdown(wait=True)
        self.generate_pool.shutdown(wait=True)

    async def _wait(self) -> set[asyncio.Task]:
        """Until a running entry ends, or room opens (a look at the queues then), or a moment
        passes (the writer's backlog shrinks unannounced): the entries that ended."""
        if self._room():  # the queues were empty: look again in a moment
            done, _ = await asyncio.wait(self.running, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
            return done
        self.runner.roomy.clear()
        woke = asyncio.ensure_future(self.runner.roomy.wait())
        try:
            done, _ = await asyncio.wait({*self.running, woke}, timeout=0.5,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            woke.cancel()
        return {t for t in done if t is not woke}

    async def _next(self, names: list[str]) -> tuple[str, str] | None:
        """(queue, entry id) of the next entry in ``names``, waiting a moment when nothing runs."""
        if not names:
            return None
        loop = asyncio.get_running_loop()
        try:  # off the loop: a Redis that stopped answering must not stop the downloads' guards
            if self.running:
                return await loop.run_in_executor(None, rqbridge.pop_entry, self.redis, names)
            return await loop.run_in_executor(None, rqbridge.wait_entry, self.redis, names, 1)
        except Exception as exc:  # Redis away: keep finishing what runs, try again
            logger.warning("cannot read the queues: %s", type(exc).__name__)
            await asyncio.sleep(1.0)
            return None

    def _notify_when_idle(self, loop) -> None:
        if self.exports and self._export_idle() and time.monotonic() - self.last_notify >= NOTIFY_EVERY:
            self.last_notify = time.monotonic()
            self.export_running = asyncio.ensure_future(loop.run_in_executor(self.export_pool, _deliver))

    async def _start(self, queue_name: str, entry_id: str) -> bool:
        """Begin the rq execution of ``entry_id`` and run it through its kind's lane; whether a
        download entry or generator run started (what ``max_jobs`` counts)."""
        try:
            begun = await self._begin(queue_name, entry_id)
        # Redis away mid-start: the entry's lease stays QUEUED; the defender gives it back
        except Exception as exc:
            logger.warning("entry %s not started: %s", entry_id, redact(f"{type(exc).__name__}: {exc}"))
            return False
        if begun is None:
            return False
        entry, execution = begun
        task = self.lanes[entry.entry_kind].start(entry.ref, execution, entry_id)
        if task is not None:
            self.running.add(task)
        return task is not None

    async def _begin(self, queue_name: str, entry_id: str) -> tuple[rqbridge.Entry, Execution] | None:
        """The entry and its rq execution, or None: a foreign entry refused, a gone one skipped,
        one outside its kind's queue failed."""
        loop = asyncio.get_running_loop()
        try:
            entry = await loop.run_in_executor(None, rqbridge.fetch_entry, self.redis, entry_id)
        except rqbridge.ForeignEntry as exc:  # never deserialized, never run
            await loop.run_in_executor(None, rqbridge.refuse_entry, self.redis, queue_name, entry_id,
                                       str(exc))
            return None
        if entry is None:  # deleted while it waited (emptied queue, say): the defender gives back its tasks
            return None
        queue = rqbridge.rq_queue(queue_name, self.redis)
        execution = await loop.run_in_executor(None, self.rq.begin, entry.job, queue)
        home = self.lanes[entry.entry_kind].home
        if home not in (None, queue_name):
            why = f"a {entry.entry_kind.value} entry outside {home}: requeue it there"
            logger.warning("%s: %s in %s", why, entry_id, queue_name)
            await loop.run_in_executor(None, self.rq.failed, execution, why)
            return None
        return entry, execution

    # --- the lanes: one entry of each kind ---------------------------------------------------

    def _download(self, lease: str, execution: Execution, entry_id: str) -> asyncio.Task:
        self.runner.pending += 1
        return asyncio.create_task(self._run(execution, self.runner.run_entry(lease, pending=True), entry_id))

    def _generate(self, run_id: str, execution: Execution, entry_id: str) -> asyncio.Task:
        self.generating += 1
        work = asyncio.get_running_loop().run_in_executor(self.generate_pool, _generate, run_id)
        return asyncio.create_task(self._run(execution, work, entry_id, self._generated))

    def _export(self, export_id: str, execution: Execution, entry_id: str) -> None:
        work = asyncio.get_running_loop().run_in_executor(self.export_pool, _export, export_id,
                                                          self.runner.worker_id)
        self.export_running = asyncio.create_task(self._run(execution, work, entry_id))

    def _dry_run(self, ref: str, execution: Execution, entry_id: str) -> asyncio.Task:
        from slave.worker.dryrun import perform

        return asyncio.create_task(self._run(execution, perform(self.runner.fetcher, ref), entry_id))

    def _generated(self) -> None:
        self.generating -= 1

    async def _run(self, execution, work, entry: str, done=None) -> None:
        loop = asyncio.get_running_loop()
        try:
            try:
                await work
            finally:
                if done is not None:
                    done()
        # MongoDB gone for good: rq keeps the failure, the defender recovers the entry
        except Exception as exc:
            reason = redact(f"{type(exc).__name__}: {exc}")
            logger.error("entry %s failed: %s", entry, reason)
            capture(exc)
            tb = redact("".join(traceback.format_exception(exc)))
            await loop.run_in_executor(None, _quietly, self.rq.failed, execution, tb)
            return
        await loop.run_in_executor(None, _quietly, self.rq.succeeded, execution)


def _rank(queue: str) -> int:
    """Where an entry's queue stands at the gate: its level (down_super 0 … down_low 3)."""
    base = base_of(queue or "")
    return QUEUE_NAMES.index(base) if base in QUEUE_NAMES else len(QUEUE_NAMES)


def _quietly(fn, *args) -> None:
    """rq's bookkeeping of an ended entry; Redis away loses only that (rq cleans it up later)."""
    try:
        fn(*args)
    except Exception as exc:
        logger.warning("rq bookkeeping failed: %s", type(exc).__name__)


def _export(export_id: str, worker_id: str) -> str:
    from slave.exporter import run_export

    outcome = run_export(export_id, worker_id)
    logger.info("export %s: %s", export_id, outcome)
    return outcome


def _generate(run_id: str) -> dict:
    from slave.generate import run

    outcome = run(run_id)
    logger.info("generator run %s: %s", run_id, outcome)
    return outcome


def _deliver() -> None:
    try:
        deliver_due()
    except Exception as exc:  # MongoDB away: the next idle moment tries again
        logger.warning("notification delivery failed: %s", type(exc).__name__)


def _on_signal(stop: asyncio.Event) -> None:
    if stop.is_set():
        logger.warning("second signal: exiting now; the defender recovers unfinished entries")
        os._exit(1)
    logger.info("stopping after the running entries (signal again to exit at once)")
    stop.set()


def run_one(lease_id: str) -> dict[str, int] | None:
    """Run one entry to the end in a fresh event loop (a plain rq worker's job)."""
    connect_mongo()

    async def main():
        runner = Runner()
        runner.start()
        try:
            return await runner.run_entry(lease_id)
        finally:
            await runner.close()

    return asyncio.run(main())


def serve(queues: list[str], burst: bool = False, max_jobs: int | None = None, exports: bool = True,
          name: str | None = None) -> None:
    """``downcluster worker``: an rq worker on ``queues`` (and down_export) running many entries at once."""
    connect_mongo()

    async def main():
        runner = Runner(name)
        names = [GENERATE_QUEUE] + queues + ([EXPORT_QUEUE] if exports else [])
        runner.rq = LoopWorker(names, runner.worker_id, redis_conn(), settings.HEARTBEAT_INTERVAL)
        runner.rq.born()
        runner.start()
        logger.info("worker %s on %s (up to %s downloads in flight)", runner.worker_id, ", ".join(names),
                    settings.WORKER_INFLIGHT)
        loop = Loop(runner, runner.rq, queues, exports)
        heap.settle()  # all that the worker runs with is built
        try:
            await loop.serve(burst=burst, max_jobs=max_jobs)
        finally:
            await runner.close()
            runner.rq.died()

    asyncio.run(main())
