"""Backlog-independent selection of a job's LIVE tasks.

Each job keeps ``live_from``, an ``_id`` below which it has no LIVE task. Selection scans
``_id`` windows upward from it (each query bounded on both sides, so its cost follows what
it returns, not the backlog) and the dispatcher advances it after a complete run. Anything
that makes a task LIVE again (intake, recovery, requeue) lowers it with ``$min``; the
dispatcher's advance is a compare-and-set, so a concurrent lowering always wins.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from bson import ObjectId
from pymongo.collection import Collection

from common.models import LIVE, Job

CLOCK_SKEW = timedelta(seconds=60)  # ids made on hosts whose clocks run a little ahead
FIRST_SPAN = 1.0                    # seconds of ids in the first window


def select_live(coll: Collection, job: Job, need: int, now: datetime):
    """Up to ``need`` LIVE tasks of ``job`` in ``_id`` order: (docs, (old, new) watermark).

    ``new`` is where the next run may start if every selected task gets dispatched."""
    start = job.live_from
    if start is None or need <= 0:
        return [], (start, start)
    end = ObjectId.from_datetime(now.replace(tzinfo=timezone.utc) + CLOCK_SKEW)
    lo, span, docs = start, FIRST_SPAN, []
    while lo < end:
        hi = min(ObjectId.from_datetime(lo.generation_time + timedelta(seconds=span)), end)
        want = need - len(docs)
        got = list(coll.find({"job": job.id, "status": LIVE, "_id": {"$gte": lo, "$lt": hi}},
                             {"_id": 1, "host_name": 1}).sort("_id", 1).limit(want))
        docs.extend(got)
        if len(got) == want:
            return docs, (start, docs[-1]["_id"])
        lo = hi
        if len(got) < want // 2:
            span *= 2
    return docs, (start, end)


def advance(job: Job, bounds: tuple) -> None:
    """Compare-and-set ``live_from`` from ``old`` to ``new`` (a no-op if it moved meanwhile)."""
    old, new = bounds
    if old is not None and new is not None and new != old:
        Job._get_collection().update_one({"_id": job.id, "live_from": old}, {"$set": {"live_from": new}})
