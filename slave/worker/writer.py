"""The store side of a worker: one thread per process that writes what downloads produced, for
every running entry, in bulk: data documents (and GridFS files of large bodies), download logs,
then the settle of the tasks — on the happy path one insert of data, one of logs and one update.

Order matters: a task is settled (SUCCESS naming its data, or FAIL) only after its data is
stored, and only if it still belongs to this entry (``common.store.leases._held_by``). Data of a task
the entry could not settle (recovered meanwhile, cancelled) is an orphan that no reader sees
(the fence, ``common.store.leases``); it is removed at once here, else by the defender's sweep.
The links found on a following job's pages go to intake last (``common.intake.add_found``), as
do the pages and sitemaps read in sitemap tasks (``add_from_sitemaps``), of the pages settled
alone: a lost lease's page adds no task. A result
MongoDB cannot store fails that task alone. MongoDB hiccups are retried with backoff; if it stays
away the entry raises and the defender recovers it. The counts returned are what was settled.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Callable, TypeVar

from bson.errors import InvalidDocument
from pymongo.errors import BulkWriteError, ConnectionFailure, DocumentTooLarge, OperationFailure, PyMongoError

from common import intake, revisit
from common.config import settings
from common.errors import DownloadError, ValidationError
from common.metrics import count_pages, reason_class
from common.queue.retry import backoff, next_retry_at
from common.revisit import Revisit
from common.secrets import redact
from common.store import attempts, counts, leases, tasks
from common.store.connection import redis_conn
from common.store.models import FAIL, LIVE, SUCCESS, store_time
from common.store.records import DataDoc, Lease, LeaseTask
from slave.download.engines.base import Download

if TYPE_CHECKING:
    from slave.download.etiquette import Etiquette
    from slave.download.links import Found
    from slave.download.sitemaps import Read
    from slave.worker.context import JobContext

logger = logging.getLogger(__name__)
T = TypeVar("T")
WRITE_BATCH = 256   # outcomes per bulk write at most
LINGER = 0.002      # seconds the writer waits for more outcomes before a write


@dataclass
class Outcome:
    task: LeaseTask
    download: Download | None
    error: DownloadError | None
    spend_us: int
    request_size: int = 0
    deferred: float | None = None  # handed back (busy or closed site): due again in this many s, no attempt
    coalesce_key: str | None = None      # this download leads identical requests: publish it once stored
    coalesced_from: object = None        # the task whose stored download this one copied
    data_id: object = None               # set by store_many: the data document written
    not_modified: str | None = None      # set by store_many: a revisit that brought nothing new
    retry_at: datetime | None = None     # set by store_many: a failure's next attempt (None: final)
    kept: bool = False                   # set by store_many: a final failure of a revisit (``_kept``)
    links: Found | None = None           # a following job's links found on the page (store_many adds them)
    sitemap: Read | None = None          # a sitemap task's pages and sitemaps (store_many adds them)


def with_retries(fn: Callable[[], T], what: str, deadline: float = 120.0) -> T:
    """Call ``fn`` until it stops failing on a lost connection, for up to ``deadline`` seconds."""
    end, attempt = time.monotonic() + deadline, 0
    while True:
        try:
            return fn()
        except (ConnectionFailure, OperationFailure) as exc:
            if isinstance(exc, OperationFailure) and not exc.has_error_label("RetryableWriteError") \
                    and exc.code not in (91, 189, 11600, 11602, 10107, 13435, 13436):
                raise
            attempt += 1
            delay = backoff(attempt, base=0.2, cap=5.0, jitter=False)
            if time.monotonic() + delay > end:
                raise
            logger.warning(
                "MongoDB unavailable during %s (%s); retrying in %.1fs", what, type(exc).__name__, delay
            )
            time.sleep(delay)


def _data_doc(ctx, lease: str, outcome: Outcome, now: datetime) -> attempts.Insert:
    prev = outcome.task.prev
    version = int(prev.versions or 0 if prev else 0) + 1 if Revisit.of(ctx.settings).on or prev else None
    return attempts.data_doc(ctx.job_id, ctx.download_id, outcome.task, lease, outcome.download, now, version)


def _log_doc(ctx, lease: str, outcome: Outcome, now: datetime) -> attempts.Insert:
    return attempts.log_doc(ctx.job_id, outcome.task.id, lease,
                            redact(outcome.error.reason) if outcome.error else None, outcome.request_size,
                            len(outcome.download.body) if outcome.download else 0, outcome.spend_us,
                            outcome.coalesced_from, now, outcome.not_modified)


def _insert_data(outcomes: list[Outcome],
                 docs: list[attempts.Insert]) -> list[tuple[attempts.Insert, DataDoc | None]]:
    """Insert the data documents; one that MongoDB cannot take turns its outcome into a final
    failure instead of failing the others. Returns those refused because another document holds
    their page version (``attempts.insert_data``)."""
    try:
        return with_retries(lambda: attempts.insert_data(docs), "data insert")
    except (InvalidDocument, DocumentTooLarge, BulkWriteError) as exc:  # duplicates alone never raise
        logger.warning("a data document was refused (%s); storing the others", type(exc).__name__)
    keep_o, keep_d = [], []
    for o, d in zip(outcomes, docs):
        why = attempts.unstorable(d)
        if why:
            o.download, o.error = None, DownloadError(why, retryable=False)
        else:
            keep_o.append(o)
            keep_d.append(d)
    outcomes[:] = keep_o
    docs[:] = keep_d
    return with_retries(lambda: attempts.insert_data(docs), "data insert")


VERSION_TRIES = 3  # replacements of a page version's orphan before the attempt is tried again later


def _take_version(p: Part, o: Outcome, doc: attempts.Insert, held: DataDoc | None) -> bool:
    """A data document refused because ``held`` holds its page version. If this entry still
    holds the task, ``held`` is an orphan of a lost attempt (no other can settle the task): it
    is replaced. Else this attempt lost the task, and its settle will be refused. Returns
    whether ``doc`` is stored; a version that cannot be taken makes the outcome a retryable
    failure, so that no settle names data that is not stored."""
    for _ in range(VERSION_TRIES):
        if not with_retries(partial(leases.holds, o.task.id, p.lease, p.kind, p.sent_at), "task held"):
            return False
        stored, held = with_retries(partial(attempts.replace, held, doc), "data replace")
        if stored:
            logger.info("replaced an orphan of task %s's page version with %s's", o.task.id, p.lease)
            return True
    o.download, o.error = None, DownloadError("page version held by another attempt", retryable=True)
    return False


@dataclass
class Part:
    """Outcomes of one entry in one write."""

    ctx: JobContext
    lease: str
    kind: str
    outcomes: list[Outcome]
    sent_at: datetime | None = None  # the lease's created_at (a revisit entry's guard)


def _counted(parts: list[Part], ok: list, kept: list, bad: list, later: list, settled: int, backs: int,
             now: datetime) -> list[dict[str, int]]:
    """What each part settled. When every guarded update matched (the usual case) that is every
    outcome; otherwise some tasks were released or cancelled meanwhile: the successes that
    settled are those whose task names their data, the rest is read back. ``kept``: revisits
    that settle SUCCESS keeping their latest version (not modified, or failed for good)."""
    got = [{"success": 0, "fail": 0, "handed_back": 0} for _ in parts]
    index = {id(p): i for i, p in enumerate(parts)}
    if settled == len(ok) + len(kept) + len(bad) and backs == len(later):
        for name, group in (("success", ok), ("success", kept), ("fail", bad), ("handed_back", later)):
            for p, _ in group:
                got[index[id(p)]][name] += 1
        return got
    for p in parts:
        c = got[index[id(p)]]
        ok_ids = [o.task.id for q, o in ok if q is p]
        kept_ids = [o.task.id for q, o in kept if q is p]
        bad_ids = [o.task.id for q, o in bad if q is p]
        back_ids = [o.task.id for q, o in later if q is p]
        c["success"] = len(leases.settled_of(p.lease, ok_ids))
        if kept_ids:
            c["success"] += tasks.changed_to(kept_ids, SUCCESS, now)
        if c["success"] < len(ok_ids):  # refused settles: readers check this lease's data one by one
            refused = partial(leases.tombstone, p.lease, p.ctx.job_id, "a settle was refused", ok_ids, now)
            with_retries(refused, "tombstone")
        if bad_ids:
            c["fail"] = tasks.changed_to(bad_ids, FAIL, now)
        if back_ids:
            c["handed_back"] = tasks.changed_to(back_ids, LIVE, now)
        dropped = (
            with_retries(partial(leases.drop_unsettled, p.lease, ok_ids), "orphan cleanup")
            if ok_ids
            else 0
        )
        if dropped:
            logger.info("dropped data of %s tasks no longer held by %s", dropped, p.lease)
    return got


def store_many(parts: list[Part], now: datetime) -> list[dict[str, int]]:
    """Store outcomes of one or more entries, in bulk: one insert of data (then GridFS files of
    large bodies), one insert of logs, one bulk of settles (UpdateManys of the successes of
    each entry, ``leases.SETTLE_GROUP`` tasks each, an UpdateOne per failure) and, apart, one
    of hand-backs, so the settles' count says exactly whether every guarded settle matched.
    Returns each part's settled counts."""
    done = [(p, o) for p in parts for o in p.outcomes if o.error is None and o.deferred is None]
    same = [(p, o) for p, o in done if _not_modified(p, o)]  # a revisit with nothing new: a log only
    ok = _store_data([(p, o) for p, o in done if not o.not_modified], now)
    bad = [(p, o) for p in parts for o in p.outcomes if o.error is not None and o.deferred is None]
    for p, o in bad:
        o.retry_at = _retry_at(p, o, now)
        o.kept = _kept(p, o)
    later = [(p, o) for p in parts for o in p.outcomes if o.deferred is not None]
    logs = [_log_doc(p.ctx, p.lease, o, now) for p, o in (*ok, *same, *bad)]
    if logs:
        with_retries(lambda: attempts.insert_logs(logs), "log insert")
        count_pages(redis_conn(), [(p.ctx.name, "stored", "") for p, _ in ok]
                    + [(p.ctx.name, "not_modified", "") for p, _ in same]
                    + [(p.ctx.name, "failed", reason_class(o.error.reason)) for p, o in bad if o.error])
    settles = _settles(ok, same, bad, now)
    backs = [leases.hand_back(o.task.id, p.lease, p.kind,
                              redact(o.error.reason if o.error else "handed back"), o.deferred or 0.0, now,
                              p.sent_at)
             for p, o in later]
    settled = with_retries(lambda: tasks.settle(settles), "task settle")
    handed = with_retries(lambda: tasks.settle(backs), "hand back")
    counted = _counted(parts, ok, [*same, *(x for x in bad if x[1].kept)], [x for x in bad if not x[1].kept],
                       later, settled, handed, now)
    _supersede(ok, settled == len(settles))
    moves = []
    for p, c in zip(parts, counted):
        held = leases.held_status(p.kind)
        moves += [(p.ctx.job_id, held, SUCCESS, c["success"]), (p.ctx.job_id, held, FAIL, c["fail"]),
                  (p.ctx.job_id, held, LIVE, c["handed_back"])]
    with_retries(lambda: counts.move(moves), "task counts")
    _follow(ok, settled == len(settles))
    return counted


def _follow(ok: list[tuple[Part, Outcome]], all_settled: bool) -> None:
    """Add the links found on the pages just stored, and what was read in the sitemaps just
    stored, to their jobs' tasks, of the pages whose task names their data (every one when all
    settles matched): a page whose lease was lost adds nothing. A page "not modified" is not
    among them: its links are those of its stored version, followed when it was stored. A job
    removed meanwhile, or MongoDB away past the retries, takes none (logged; the pages stay stored)."""
    found = [(p, o) for p, o in ok if o.links is not None and o.links.urls and p.ctx.follow is not None
             or o.sitemap is not None and (o.sitemap.pages or o.sitemap.sitemaps or o.sitemap.lastmods)]
    if found and not all_settled:
        held = {i for p in {id(p): p for p, _ in found}.values()
                for i in leases.settled_of(p.lease, [o.task.id for q, o in found if q is p])}
        found = [(p, o) for p, o in found if o.task.id in held]
    by_job: dict = {}
    for p, o in found:
        pages, read = by_job.setdefault(p.ctx.job_id, (p.ctx, [], []))[1:]
        if o.sitemap is not None:
            s = o.sitemap
            read.append((o.task.id, o.task.uri, s.depth, s.pages, s.sitemaps, s.lastmods))
        elif o.links is not None:
            pages.append((o.task.id, o.task.uri, o.links.urls))
    for job_id, (ctx, pages, read) in by_job.items():
        for what, add, items in (("found links", intake.add_found, pages),
                                 ("sitemap entries", intake.add_from_sitemaps, read)):
            if not items:
                continue
            try:
                report = with_retries(partial(add, job_id, ctx.follow, items), what)
            except (ValidationError, PyMongoError) as exc:  # the job removed meanwhile; MongoDB past retries
                logger.warning("job %s: %s not added: %s", ctx.name, what, exc)  # the pages stay stored
                continue
            logger.debug("job %s: %d %s added, %d known, %d refused, %d due by lastmod", ctx.name,
                         report.added, what, report.duplicate, report.refused + report.rejected, report.due)


def _store_data(ok: list[tuple[Part, Outcome]], now: datetime) -> list[tuple[Part, Outcome]]:
    """Insert the data documents of the successes (then the GridFS files of large bodies); each
    outcome learns its ``data_id``. Returns the successes whose data is stored, and those whose
    page version another attempt holds (their guarded settle is refused: they lost the task)."""
    data_docs = [_data_doc(p.ctx, p.lease, o, now) for p, o in ok]
    for (_, o), d in zip(ok, data_docs):
        o.data_id = d.id
    if not data_docs:
        return ok
    outs = [o for _, o in ok]
    taken = _insert_data(outs, data_docs)
    part_of, out_of = {id(o): p for p, o in ok}, {id(d): o for o, d in zip(outs, data_docs)}
    lost = {id(doc) for doc, held in taken if not _take_version(part_of[id(out_of[id(doc)])],
                                                                out_of[id(doc)], doc, held)}
    kept = {id(o) for o in outs if o.error is None}
    for o, d in zip(outs, data_docs):
        if id(d) in lost:
            o.data_id = None  # (nothing for a coalesced waiter to copy)
        elif (file_id := d.body_file) and o.error is None:
            body = o.download.body if o.download else b""
            put = partial(attempts.put_body, file_id, body, f"{o.task.id}-{d.lease}")
            with_retries(put, "GridFS put")
    return [(p, o) for p, o in ok if id(o) in kept]


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
    return leases.settle_visit(o.task.id, p.lease, p.kind, now, due, every,
                               stored, bool(o.not_modified), reason, p.sent_at, seen)


def _settles(ok: list[tuple[Part, Outcome]], same: list[tuple[Part, Outcome]],
             bad: list[tuple[Part, Outcome]], now: datetime) -> list:
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
        settles.extend(leases.settle_success(ids, p.lease, p.kind, now, p.sent_at))
    for p, o in bad:
        assert o.error is not None  # what puts an outcome in ``bad``
        if o.kept:
            settles.append(_visit(p, o, now))
            continue
        settles.append(leases.settle_failure(o.task.id, p.lease, p.kind, redact(o.error.reason),
                                             o.retry_at, now, p.sent_at))
    return settles


def _supersede(ok: list[tuple[Part, Outcome]], all_settled: bool) -> None:
    """New versions now named by their tasks: mark the earlier ones (``leases.mark_superseded``);
    where some settles were refused, only the versions whose task names them."""
    news = [(p, o, o.task.prev) for p, o in ok if o.task.prev and o.task.prev.data_lease]
    if not all_settled:
        named = {i for p in {id(p): p for p, _, _ in news}.values()
                 for i in leases.settled_of(p.lease, [o.task.id for q, o, _ in news if q is p])}
        news = [(p, o, prev) for p, o, prev in news if o.task.id in named]
    marks = [(p.ctx.job_id, o.task.id, int(prev.versions or 0) + 1, prev.data_lease)
             for p, o, prev in news]
    if marks:
        with_retries(partial(leases.mark_superseded, marks), "superseded marks")


# --- the writer thread ----------------------------------------------------------------------

class RunningEntry:
    """A queue entry this worker runs: its lease, job, tasks, and what the writer has stored of it."""

    def __init__(self, lease: Lease, ctx: JobContext, tasks: list[LeaseTask], loop) -> None:
        self.lease_id, self.kind, self.ctx, self.total = lease.id, lease.kind, ctx, len(tasks)
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
        groups: dict[RunningEntry, list[Outcome]] = {}
        for entry, outcome in batch:
            groups.setdefault(entry, [])
            if outcome is not None:
                groups[entry].append(outcome)
        entries = [e for e, outs in groups.items() if outs]
        parts = [Part(e.ctx, e.lease_id, e.kind, groups[e], e.sent_at) for e in entries]
        try:
            if parts:
                for e, got in zip(entries, store_many(parts, store_time())):
                    for name, n in got.items():
                        e.counts[name] += n
                for e, outs in groups.items():
                    e.written += len(outs)
                self._publish(groups)
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


def _size(outcome) -> int:
    return len(outcome.download.body) if outcome is not None and outcome.download is not None else 0
