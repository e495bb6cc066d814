"""What stored pages yield, into their jobs' tasks: the links found on a following job's pages
(``common.intake.add_found``) and the pages and sitemaps read in sitemap tasks
(``common.intake.add_from_sitemaps``), handed over by the writer (``store_many``) after the
pages' data is stored and BEFORE their tasks are settled, of the pages whose entry still holds
their task (``common.store.leases.held_of``).

Why before the settle: a worker that dies after it has settled a page and before it has handed
over what the page yields loses that for ever (the task is SUCCESS: nothing runs it again). In
this order, one that dies after the hand-over and before the settle leaves the task held by a
dead entry: the defender recovers it, it runs again, and its links come again; intake counts
them as known (each URL's key in ``crawler_task_key``), so nothing is added twice, a found URL keeps the
depth and parent of its first offer (its page's depth is read from its task, which does not
change), and ``max_pages`` counts tasks, not offers (a known URL takes no room).

What remains of "a page whose lease was lost adds no task": a lease lost between the check and
the hand-over (the defender releases the task in those few milliseconds) adds its page's links;
its next attempt offers the same ones. And a page whose links were handed over but whose task
never settles SUCCESS after all (the worker died and the recoveries ran out, the job was
cancelled) has added them. Both are rare and add only what the page links to; the other order
lost links whenever a worker died in its window, which no later step could find again.

A page's depth comes with its task in the entry's lease (``LeaseTask.depth``), else intake reads
it from the task. When any task was added the dispatcher is woken (``common.queue.wake``), after
the tasks are stored: found links go out at its next run, within a fraction of a second, not at
its next scheduled one.

A job removed meanwhile takes none (logged: nothing to add to), as does a store that refuses
the insert; MongoDB away past the retries raises, as every write of the writer does: the entry
fails before any settle and is recovered, its links offered again by the next attempt.
"""
from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Callable

from pymongo.errors import PyMongoError

from common import intake
from common.errors import ValidationError
from common.queue.wake import wake
from common.store import leases
from common.store.connection import redis_conn, transient, with_retries
from slave.worker.outcome import Outcome, Pair, Part

if TYPE_CHECKING:
    from bson import ObjectId

    from slave.download.job import JobContext

logger = logging.getLogger(__name__)


def hand_over(ok: list[Pair], held: set[ObjectId] | None = None) -> None:
    """Add what the stored pages ``ok`` yield to their jobs' tasks, of those still held (``held``:
    the tasks found held by ``held_of`` beside the data's insert, else read now); when any task
    was added, wake the dispatcher (``common.queue.wake``): they go out now, not at its next
    scheduled run."""
    found = _yielding(ok)
    kept = _held(found) if held is None else [(p, o) for p, o in found if o.task.id in held]
    added = 0
    for job_id, (ctx, pages, read, deep) in _by_job(kept).items():
        added += _add(job_id, ctx, "found links", partial(intake.add_found, carried=deep), pages)
        added += _add(job_id, ctx, "sitemap entries", intake.add_from_sitemaps, read)
    if added:
        wake(redis_conn())


def _yields(p: Part, o: Outcome) -> bool:
    """Whether the page of ``o`` brings anything to add: links of a following job's page, or
    entries of a sitemap. A page "not modified" is never among the stored: its links are those
    of its stored version, handed over when that was stored."""
    links = o.links is not None and bool(o.links.urls) and p.ctx.follow is not None
    entries = o.sitemap is not None and bool(o.sitemap.pages or o.sitemap.sitemaps or o.sitemap.lastmods)
    return links or entries


def _yielding(ok: list[Pair]) -> list[Pair]:
    return [(p, o) for p, o in ok if (o.links is not None or o.sitemap is not None) and _yields(p, o)]


def held_of(pairs: list[Pair]) -> set[ObjectId]:
    """The tasks of the pages among ``pairs`` that may yield something (before their data is
    stored) whose entry still holds them: one read per entry. Read beside the data's insert, it
    moves the check earlier by that insert: a lease lost meanwhile adds its page's links, as one
    lost between the check and the hand-over always could (its next attempt offers the same)."""
    return {o.task.id for _, o in _held(_yielding(pairs))}


def _held(found: list[Pair]) -> list[Pair]:
    """The pages of ``found`` whose entry still holds their task: one read per entry."""
    held: set[ObjectId] = set()
    for p in {id(p): p for p, _ in found}.values():
        ids = [o.task.id for q, o in found if q is p]
        held |= with_retries(partial(leases.held_of, ids, p.lease, p.attempt_kind, p.sent_at), "task held")
    return [(p, o) for p, o in found if o.task.id in held]


def _by_job(found: list[Pair]) -> dict[ObjectId, tuple[JobContext, list, list, dict]]:
    """{job id: (its context, found links as ``add_found`` takes them, sitemap entries as
    ``add_from_sitemaps`` takes them, the pages' depths their leases carried)}."""
    by_job: dict[ObjectId, tuple[JobContext, list, list, dict]] = {}
    for p, o in found:
        _, pages, read, deep = by_job.setdefault(p.ctx.job_id, (p.ctx, [], [], {}))
        if o.task.depth is not None:
            deep[o.task.id] = o.task.depth
        if o.sitemap is not None:
            s = o.sitemap
            read.append((o.task.id, o.task.uri, s.depth, s.pages, s.sitemaps, s.lastmods))
        elif o.links is not None:
            pages.append((o.task.id, o.task.uri, o.links.urls))
    return by_job


def _add(job_id: ObjectId, ctx: JobContext, what: str, add: Callable, items: list) -> int:
    """Hand ``items`` to intake's ``add``; returns how many tasks it added."""
    if not items:
        return 0
    try:
        report = with_retries(partial(add, job_id, ctx.follow, items), what)
    except (ValidationError, PyMongoError) as exc:
        if isinstance(exc, PyMongoError) and transient(exc):
            raise  # MongoDB away past the retries: the entry fails unsettled, its pages run again
        logger.warning("job %s: %s not added: %s", ctx.name, what, exc)  # the job removed meanwhile
        return 0
    logger.debug("job %s: %d %s added, %d known, %d refused, %d due by lastmod", ctx.name,
                 report.added, what, report.duplicate, report.refused + report.rejected, report.due)
    return report.added + report.due
