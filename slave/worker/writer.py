"""The store side of a worker: one thread per process that writes what downloads produced, for
every running entry, in bulk: data documents (and GridFS files of large bodies), download logs,
what the pages yield handed to intake, then the settle of the tasks — on the happy path one
insert of data, one of logs and one update.

Order matters: a task is settled (SUCCESS naming its data, or FAIL) only after its data is
stored, and only if it still belongs to this entry (the guard of ``common.store.leases``,
``_held_by``). Data of a task the entry could not settle (recovered meanwhile, cancelled) is an
orphan that no reader sees (the fence, ``common.store.orphans``); it is removed at once here, else
by the defender's sweep.
The links found on a following job's pages (``common.intake.add_found``), and the pages and
sitemaps read in sitemap tasks (``add_from_sitemaps``), go to intake after the data is stored and
before the settle (beside the logs' insert, on a helper thread), of the pages whose entry still
holds their task (``slave/worker/found.py``): a worker that dies between the two loses none,
its page runs again and offers them again (known by then), and a page whose lease was lost
before adds no task. A result MongoDB cannot store fails that task alone. MongoDB hiccups are
retried with backoff; if it stays away the entry raises and the defender recovers it. The
counts returned are what was settled.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING

from bson import ObjectId

from common import revisit
from common.config import settings
from common.metrics import count_pages, reason_class
from common.queue.retry import next_retry_at
from common.revisit import Revisit
from common.secrets import redact
from common.store import attempts, counts, leases, tasks
from common.store.clock import store_time
from common.store.connection import redis_conn, with_retries
from common.store.models import FAIL, LIVE, SUCCESS
from common.store.records import Lease, LeaseTask
from slave.worker import found, page_data
from slave.worker.outcome import Outcome, Pair, Part

if TYPE_CHECKING:
    from slave.download.etiquette import Etiquette
    from slave.download.job import JobContext

logger = logging.getLogger(__name__)
WRITE_BATCH = 256   # outcomes per bulk write at most
_helpers: dict[int, ThreadPoolExecutor] = {}  # the writer's second thread, one per process


def _helper() -> ThreadPoolExecutor:
    """This process's helper thread pool: made on first use in each process, so a process forked
    after its parent used one (an rq work-horse) never waits on a thread it did not inherit."""
    pid = os.getpid()
    if pid not in _helpers:
        _helpers.clear()
        _helpers[pid] = ThreadPoolExecutor(1, thread_name_prefix="hand-over")
    return _helpers[pid]
LINGER = 0.002      # seconds the writer waits for more outcomes before a write


def _log_doc(ctx, lease: str, outcome: Outcome, now: datetime) -> attempts.Insert:
    return attempts.log_doc(ctx.job_id, outcome.task.id, lease,
                            redact(outcome.error.reason) if outcome.error else None, outcome.request_size,
                            len(outcome.download.body) if outcome.download else 0, outcome.spend_us,
                            outcome.coalesced_from, now, outcome.not_modified,
                            outcome.download.fetched_at if outcome.download else None)


@dataclass
class Sorted:
    """One write's outcomes by what their settle does."""

    ok: list[Pair]     # successes whose data is stored: SUCCESS naming it
    same: list[Pair]   # revisits that brought nothing new: a log, and SUCCESS keeping their version
    bad: list[Pair]    # failures: FAIL, or due again (``retry_at``), or kept (``_kept``)
    later: list[Pair]  # handed back (a busy or closed site): LIVE again, no attempt

    def kept(self) -> list[Pair]:
        """Revisits that settle SUCCESS keeping their latest version (not modified, or failed for good)."""
        return [*self.same, *(x for x in self.bad if x[1].kept)]

    def failed(self) -> list[Pair]:
        return [x for x in self.bad if not x[1].kept]

    def settled(self) -> int:
        """Tasks the guarded settles change when each matches (the hand-backs apart)."""
        return len(self.ok) + len(self.same) + len(self.bad)


def store_many(parts: list[Part], now: datetime) -> list[dict[str, int]]:
    """Store outcomes of one or more entries, in bulk: one insert of data (then GridFS files of
    large bodies), one insert of logs, what the pages yield handed to intake (``found``), one
    bulk of settles (UpdateManys of the successes of each entry, ``leases.SETTLE_GROUP`` tasks
    each, an UpdateOne per failure) and, apart, one of hand-backs, so the settles' count says
    exactly whether every guarded settle matched. Returns each part's settled counts."""
    s, held = _stored_and_held(parts, now)
    _log_and_hand_over(s, now, held)  # both before the settle: no crash between loses a page's links
    settles = _settles(s.ok, s.same, s.bad, now)
    settled = with_retries(lambda: tasks.settle(settles), "task settle")
    handed = with_retries(partial(tasks.settle, _hand_backs(s.later, now)), "hand back")
    counted = _counted(parts, s, settled == s.settled() and handed == len(s.later), now)
    _supersede(s.ok, settled == s.settled())
    _move_counts(parts, counted)
    return counted


def _stored_and_sorted(parts: list[Part], now: datetime) -> Sorted:
    """The write's outcomes sorted by what their settle does, the successes' data stored on the
    way (``page_data.store``); the failures are sorted after it, since a result MongoDB cannot
    store becomes one."""
    done = [(p, o) for p in parts for o in p.outcomes if o.error is None and o.deferred is None]
    same = [(p, o) for p, o in done if _not_modified(p, o)]  # a revisit with nothing new: a log only
    ok = page_data.store([(p, o) for p, o in done if not o.not_modified], now)
    later = [(p, o) for p in parts for o in p.outcomes if o.deferred is not None]
    return Sorted(ok, same, _failures(parts, now), later)


def _failures(parts: list[Part], now: datetime) -> list[Pair]:
    """The failed attempts, each with its next attempt's time (None: final) and whether it is
    a revisit's that keeps its stored version (``_kept``)."""
    bad = [(p, o) for p in parts for o in p.outcomes if o.error is not None and o.deferred is None]
    for p, o in bad:
        o.retry_at = _retry_at(p, o, now)
        o.kept = _kept(p, o)
    return bad


def _log(s: Sorted, now: datetime) -> None:
    """One insert of the attempts' download logs (a hand-back is no attempt: none), and the
    pages counted by outcome (``common.metrics``)."""
    logs = [_log_doc(p.ctx, p.lease, o, now) for p, o in (*s.ok, *s.same, *s.bad)]
    if not logs:
        return
    with_retries(lambda: attempts.insert_logs(logs), "log insert")
    count_pages(redis_conn(), [(p.ctx.name, "stored", "") for p, _ in s.ok]
                + [(p.ctx.name, "not_modified", "") for p, _ in s.same]
                + [(p.ctx.name, "failed", reason_class(o.error)) for p, o in s.bad if o.error])


def _stored_and_held(parts: list[Part], now: datetime) -> tuple[Sorted, set | None]:
    """``_stored_and_sorted``, and beside the data's insert (on the helper thread) the read of
    which pages that may yield links are still held (``found.held_of``; None: no such page)."""
    maybe = [(p, o) for p in parts for o in p.outcomes
             if o.error is None and o.deferred is None and (o.links is not None or o.sitemap is not None)]
    if not maybe:
        return _stored_and_sorted(parts, now), None
    held = _helper().submit(found.held_of, maybe)  # (its reads retried as the hand-over's)
    try:
        s = _stored_and_sorted(parts, now)
    finally:
        got = held.result()
    return s, got


def _log_and_hand_over(s: Sorted, now: datetime, held: set | None = None) -> None:
    """The logs' insert (``_log``) and the hand-over of what the stored pages yield
    (``found.hand_over``) at once, the hand-over on a helper thread: neither needs the other,
    both end before the settle. In a crawl the hand-over is half the writer's time (its reads and
    inserts: a round trip each), and the writer is one thread a worker. Either failing fails the
    write (the hand-over's error first), after both have ended: nothing is settled."""
    if not any(o.links is not None or o.sitemap is not None for _, o in s.ok):
        _log(s, now)  # nothing to hand over (no following job's page, no sitemap)
        return
    handed = _helper().submit(found.hand_over, s.ok, held)
    try:
        _log(s, now)
    finally:
        handed.result()


def _hand_backs(later: list[Pair], now: datetime) -> list:
    """The guarded hand-backs of the outcomes ``later`` (``leases.hand_back``)."""
    return [leases.hand_back(o.task.id, p.lease, p.attempt_kind,
                             redact(o.error.reason if o.error else "handed back"), o.deferred or 0.0, now,
                             p.sent_at)
            for p, o in later]


def _counted(parts: list[Part], s: Sorted, all_matched: bool, now: datetime) -> list[dict[str, int]]:
    """What each part settled. When every guarded update matched (the usual case) that is every
    outcome; otherwise some tasks were released or cancelled meanwhile: ``_read_back``."""
    kept, failed = s.kept(), s.failed()
    if not all_matched:
        return [_read_back(p, s.ok, kept, failed, s.later, now) for p in parts]
    got = [{"success": 0, "fail": 0, "handed_back": 0} for _ in parts]
    index = {id(p): i for i, p in enumerate(parts)}
    for name, group in (("success", s.ok), ("success", kept), ("fail", failed), ("handed_back", s.later)):
        for p, _ in group:
            got[index[id(p)]][name] += 1
    return got


def _ids_of(p: Part, group: list[Pair]) -> list:
    return [o.task.id for q, o in group if q is p]


def _changed(ids: list, status: str, now: datetime) -> int:
    return tasks.changed_to(ids, status, now) if ids else 0


def _read_back(p: Part, ok: list[Pair], kept: list[Pair], failed: list[Pair], later: list[Pair],
               now: datetime) -> dict[str, int]:
    """What part ``p`` settled when some guarded updates were refused: the successes whose task
    names their data (``leases.settled_of``), the rest read back (``tasks.changed_to``). Refused
    successes tombstone the lease (readers check its data one by one) and their data goes now."""
    ok_ids = _ids_of(p, ok)
    named = len(leases.settled_of(p.lease, ok_ids))
    got = {"success": named + _changed(_ids_of(p, kept), SUCCESS, now),
           "fail": _changed(_ids_of(p, failed), FAIL, now),
           "handed_back": _changed(_ids_of(p, later), LIVE, now)}
    if named < len(ok_ids):  # refused settles: readers check this lease's data one by one
        refused = partial(leases.tombstone, p.lease, p.ctx.job_id, "a settle was refused", ok_ids, now)
        with_retries(refused, "tombstone")
    dropped = with_retries(partial(leases.drop_unsettled, p.lease, ok_ids), "orphan cleanup") if ok_ids else 0
    if dropped:
        logger.info("dropped data of %s tasks no longer held by %s", dropped, p.lease)
    return got


def _move_counts(parts: list[Part], counted: list[dict[str, int]]) -> None:
    """The jobs' kept counts follow what each part settled (``common.store.counts``)."""
    moves: list[counts.Move] = []
    floors: counts.Floors = {}
    for p, c in zip(parts, counted):
        held = leases.held_status(p.attempt_kind)
        moves += [(p.ctx.job_id, held, SUCCESS, c["success"]), (p.ctx.job_id, held, FAIL, c["fail"]),
                  (p.ctx.job_id, held, LIVE, c["handed_back"])]
        ids: list[ObjectId] = [o.task.id for o in p.outcomes]
        if not ids:
            continue
        lowest = min(ids)  # of every task the part held: at or below any it settled
        for status in (SUCCESS, FAIL, LIVE):
            key = (p.ctx.job_id, status)
            floors[key] = min(floors.get(key, lowest), lowest)
    with_retries(lambda: counts.move(moves, floors=floors), "task counts")


def _retry_at(p: Part, o: Outcome, now: datetime) -> datetime | None:
    assert o.error is not None  # a failure
    return next_retry_at(o.error, o.task.attempts + 1, p.ctx.max_retry_times, now,
                         settings.RETRY_BACKOFF_BASE, settings.RETRY_BACKOFF_MAX)


def _kept(p: Part, o: Outcome) -> bool:
    """A failure that is final (``o.retry_at`` None) on a page with a stored version of a job with
    revisits: the task stays SUCCESS, naming that version, and is visited again after its interval."""
    prev = o.task.prev
    return bool(prev and prev.data_lease) and Revisit.of(p.ctx.settings).on and o.retry_at is None


def _not_modified(p: Part, o: Outcome) -> bool:
    """Whether a success is a revisit that brought nothing new (sets ``o.not_modified``)."""
    prev = o.task.prev
    if o.download is None or prev is None:
        return False
    if prev.data_lease and not prev.digest and o.download.status_code != revisit.NOT_MODIFIED:
        prev = replace(prev, digest=with_retries(partial(attempts.stored_digest, o.task.id, prev.data_lease),
                                                 "stored digest"))
    o.not_modified = revisit.unchanged(prev, o.download.status_code, o.download.body)
    return o.not_modified is not None


def _visit(p: Part, o: Outcome, now: datetime):
    """The settle of a visit of a job with revisits (``leases.settle_visit``)."""
    rv, prev = Revisit.of(p.ctx.settings), o.task.prev
    changed = o.error is None and not o.not_modified
    every = rv.next_interval(prev.revisit_every if prev else None, changed)
    stored = seen = None
    if o.download is not None and o.download.status_code != revisit.NOT_MODIFIED:
        etag, last_modified = revisit.response_validators(o.download.headers)
        seen = {"etag": etag, "last_modified": last_modified, "digest": revisit.digest(o.download.body)}
        if changed:
            stored = {**seen, "prev_lease": prev.data_lease if prev else None}
    reason = f"revisit failed: {redact(o.error.reason)}" if o.error is not None else None
    due = now + timedelta(seconds=every) if rv.on else None  # (revisits turned off meanwhile: none)
    return leases.settle_visit(o.task.id, p.lease, p.attempt_kind, now, due, every,
                               stored, bool(o.not_modified), reason, p.sent_at, seen)


def _settles(ok: list[Pair], same: list[Pair],
             bad: list[Pair], now: datetime) -> list:
    """The guarded settles: one for each entry's successes (one per visit of a job with
    revisits: each has its own validators and next time), one per failure (with its retry time)."""
    settles: list = []
    ok_by_part: dict[int, tuple[Part, list]] = {}
    for p, o in [*ok, *same]:
        if Revisit.of(p.ctx.settings).on or o.task.prev:  # a page with versions keeps its history
            settles.append(_visit(p, o, now))
        else:
            ok_by_part.setdefault(id(p), (p, []))[1].append(o.task.id)
    for p, ids in ok_by_part.values():
        settles.extend(leases.settle_success(ids, p.lease, p.attempt_kind, now, p.sent_at))
    for p, o in bad:
        assert o.error is not None  # what puts an outcome in ``bad``
        if o.kept:
            settles.append(_visit(p, o, now))
            continue
        settles.append(leases.settle_failure(o.task.id, p.lease, p.attempt_kind, redact(o.error.reason),
                                             o.retry_at, now, p.sent_at))
    return settles


def _supersede(ok: list[Pair], all_settled: bool) -> None:
    """New versions now named by their tasks: mark the earlier ones (``leases.mark_superseded``);
    where some settles were refused, only the versions whose task names them."""
    news = [(p, o, o.task.prev) for p, o in ok if o.task.prev and o.task.prev.data_lease]
    if not all_settled:
        named = _named([(p, o) for p, o, _ in news])
        news = [(p, o, prev) for p, o, prev in news if o.task.id in named]
    marks = [(p.ctx.job_id, o.task.id, int(prev.versions or 0) + 1, prev.data_lease)
             for p, o, prev in news]
    if marks:
        with_retries(partial(leases.mark_superseded, marks), "superseded marks")


def _named(pairs: list[Pair]) -> set:
    """The tasks among ``pairs`` that name their entry's data (one read per entry)."""
    return {i for p in {id(p): p for p, _ in pairs}.values()
            for i in leases.settled_of(p.lease, _ids_of(p, pairs))}


# --- the writer thread ----------------------------------------------------------------------

class RunningEntry:
    """A queue entry this worker runs: its lease, job, tasks, and what the writer has stored of it."""

    def __init__(self, lease: Lease, ctx: JobContext, tasks: list[LeaseTask], loop) -> None:
        self.lease_id, self.attempt_kind, self.ctx, self.total = lease.id, lease.attempt_kind, ctx, len(tasks)
        self.sent_at = lease.created_at
        self.written, self.counts = 0, {"success": 0, "fail": 0, "handed_back": 0}
        self.etiquette: Etiquette | None = None  # set by the runner: publishes its coalesced leaders
        self.done = loop.create_future()
        self.loop = loop

    def _settle(self, result=None, error: BaseException | None = None) -> None:
        if self.done.done():
            return
        self.done.set_exception(error) if error else self.done.set_result(result)

    def resolve(self, error: BaseException | None = None) -> None:
        """From the writer thread: the entry is stored (or its store failed)."""
        self.loop.call_soon_threadsafe(self._settle, self.counts, error)


class Writer(threading.Thread):
    """The one thread of a worker process that writes to MongoDB what downloads produced:
    outcomes of all running entries are gathered into bulk writes (up to WRITE_BATCH, or
    STORE_FLUSH_BYTES of bodies), so the store sees few, large commands from one connection."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(daemon=True, name="writer")
        self.worker_id = worker_id
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.submitted = self.written = 0

    def submit(self, entry: RunningEntry, outcome: Outcome | None) -> None:
        """Queue one outcome (None: the entry had no task left to download)."""
        self.submitted += 1
        self.q.put((entry, outcome))

    def backlog(self) -> int:
        """Outcomes waiting to be written (the worker takes no new entry while many wait)."""
        return self.submitted - self.written

    def stop(self) -> None:
        self.q.put(None)

    def run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            batch, size, end = [item], _size(item[1]), time.monotonic() + LINGER
            while len(batch) < WRITE_BATCH and size < settings.STORE_FLUSH_BYTES:
                try:
                    item = self.q.get(timeout=max(0.0, end - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self.q.put(None)
                    break
                batch.append(item)
                size += _size(item[1])
            # taken first: the write may turn an unstorable download into a failure and drop it
            slots = [(e.loop, o.download.release) for e, o in batch
                     if o is not None and o.download is not None and o.download.release]
            try:
                self._write(batch)
            finally:
                for (
                    _,
                    outcome,
                ) in batch:  # stored (or given up): the body goes now, whoever still holds the outcome
                    if outcome is not None:
                        outcome.download = None
                self.written += len(batch)
                for loop, release in slots:  # the bodies are stored (or given up): free their slots
                    loop.call_soon_threadsafe(release)

    def _publish(self, groups: dict) -> None:
        """Leaders of identical requests whose data is now stored: their waiters may copy it
        (handed to each entry's event loop, which sends it with its other Redis commands)."""
        for entry, outs in groups.items():
            leaders = [(o.coalesce_key, o.task.id, o.data_id) for o in outs
                       if o.coalesce_key and o.error is None and o.data_id is not None]
            if leaders and entry.etiquette is not None:
                entry.loop.call_soon_threadsafe(entry.etiquette.coalescing.publish_all, leaders)

    def _write(self, batch: list) -> None:
        groups = _by_entry(batch)
        try:
            self._store(groups)
            finished = [e for e in groups if e.written >= e.total]
            if finished:
                with_retries(
                    lambda: leases.finish([e.lease_id for e in finished], self.worker_id), "lease finish"
                )
            for e in finished:
                e.resolve()
        except Exception as exc:  # MongoDB gone past the retries: these entries are given up
            for e in groups:
                e.resolve(exc)

    def _store(self, groups: dict[RunningEntry, list[Outcome]]) -> None:
        """Store the outcomes of the entries that have some; each entry counts what it settled."""
        entries = [e for e, outs in groups.items() if outs]
        if not entries:
            return
        parts = [Part(e.ctx, e.lease_id, e.attempt_kind, groups[e], e.sent_at) for e in entries]
        for e, got in zip(entries, store_many(parts, store_time())):
            for name, n in got.items():
                e.counts[name] += n
        for e, outs in groups.items():
            e.written += len(outs)
        self._publish(groups)


def _by_entry(batch: list) -> dict[RunningEntry, list[Outcome]]:
    """A batch's outcomes by entry; an entry with none left (its None) is there too, to finish."""
    groups: dict[RunningEntry, list[Outcome]] = {}
    for entry, outcome in batch:
        groups.setdefault(entry, [])
        if outcome is not None:
            groups[entry].append(outcome)
    return groups


def _size(outcome) -> int:
    return len(outcome.download.body) if outcome is not None and outcome.download is not None else 0
