"""Where a job's tasks of one status begin: the floor of each (job, status).

The first page of a status is read window by window from the job's first task
(``common.store.paging``). After a long quiet stretch with no task in that status and a burst
(60,000 LIVE tasks added in ten seconds after 200,000 older ones), the window that reaches the
burst is as wide as the stretch and holds the whole burst, which the embedded store reads whole
before it applies the limit (12 s; docs/scale.md). The floor lets the windows begin at the burst.

Kept in the job's ``crawler_task_count`` document (``common.store.counts``):
``floor.<status>`` (an ``_id``), ``floor_ok.<status>`` (true once a reader found it) and
``floor_v.<status>`` (a version).

Invariant: while ``floor_ok.<status>``, no task of the job in ``status`` has an ``_id`` below
``floor.<status>``, except for a change of status whose move of the counts is not yet written.
Without it (a store kept before floors, a status whose floor was forgotten) nothing is known:
pages begin at the job's first task, and the first of them sets the floor.

- Lowered: every change of tasks' status is followed by its move of the counts
  (``counts.move``), which in the same write lowers the floor of the status the tasks entered to
  the lowest ``_id`` among them (``$min``), or forgets it when the change does not know its tasks
  (cancel and requeue of a whole status), and adds 1 to its version.
- Raised: only here, by the reader that found where the status's tasks begin (the first page,
  oldest first, from the floor; or ``tend``), with a compare-and-set on the version it read
  before it began: a change that moved tasks in meanwhile (even ones the reader did not see)
  has changed the version, so the stale raise is refused.
- Rebuilt: ``counts.recount`` sets each floor to its status's first task, exactly.

A process that dies between a change and its move leaves its tasks below the floor until
``downcluster stats --recount``, as it leaves the counts off.
"""
from __future__ import annotations

import time
from typing import Any

from bson import ObjectId

from common.store import counts
from common.store.connection import collection
from common.store.counts import TOP  # the floor of a status with no task: the next to enter lowers it
from common.store.models import TASK_STATUSES, CrawlerTask, CrawlerTaskCount
from common.store.paging import Doc, Span, by_id
from common.store.records import Task


def _below(oid: ObjectId) -> ObjectId:
    """The ``_id`` just below ``oid`` (a page after it begins at ``oid``)."""
    return ObjectId(f"{int(str(oid), 16) - 1:024x}") if int(str(oid), 16) else oid


def read(job_id: ObjectId, status: str) -> tuple[ObjectId | None, int | None]:
    """(the floor of the job's ``status`` or None, its version or None)."""
    shown = {"floor": 1, "floor_ok": 1, "floor_v": 1}
    doc = collection(CrawlerTaskCount).find_one({"_id": job_id}, shown) or {}
    known = (doc.get("floor_ok") or {}).get(status) is True
    return (doc.get("floor") or {}).get(status) if known else None, (doc.get("floor_v") or {}).get(status)


def raise_to(job_id: ObjectId, status: str, version: int | None, to: ObjectId) -> bool:
    """Set the floor to ``to`` (all of the status's tasks were read from where the floor was, or
    from the job's first task when none was known) if its version is still ``version`` (nothing
    entered the status since it was read) and ``to`` is above it; True if set."""
    field, known = f"floor.{status}", f"floor_ok.{status}"
    guard: dict[str, Any] = {"_id": job_id, f"floor_v.{status}": version,
                             "$or": [{known: {"$ne": True}}, {field: {"$lt": to}}]}
    change = {"$set": {field: to, known: True}}
    return bool(collection(CrawlerTaskCount).update_one(guard, change).modified_count)


def page(job_id: ObjectId, status: str, limit: int, after: ObjectId | None, span: Span,
         projection: Doc | None = None) -> list[Task]:
    """Up to ``limit`` of the job's tasks in ``status`` after ``after``, oldest first, read from
    the floor on in windows that begin a few ids wide; a page that began at the floor raises
    the floor to its first task (to ``TOP`` when the status has none)."""
    floor, version = read(job_id, status)
    start = after
    if floor is not None and (after is None or after < floor):
        start = _below(floor)
    found = by_id(collection(CrawlerTask), {"job": job_id, "status": status}, limit, span=span,
                  after=start, projection=projection, fine=start is not None)
    if after is None or (floor is not None and after < floor):
        first = found[0]["_id"] if found else (TOP if limit else None)
        if first is not None and (floor is None or first > floor):
            raise_to(job_id, status, version, first)
    return [Task.from_doc(d) for d in found]


def tend(budget: float) -> int:
    """Raise the floors of every job's statuses to where their tasks begin (a status emptied
    and refilled after a quiet stretch, with no page read between, would otherwise make its
    first page read from where it last began). Returns how many floors it read."""
    ends, done = time.monotonic() + budget, 0
    for doc in collection(CrawlerTaskCount).find({}, {"_id": 1}):
        span = counts.span(doc["_id"])
        for status in TASK_STATUSES:
            if time.monotonic() > ends:
                return done
            page(doc["_id"], status, 1, None, span, {"_id": 1})
            done += 1
    return done
