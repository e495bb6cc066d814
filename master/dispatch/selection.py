"""Which tasks of a job are due, read so that the cost follows what is taken, not the backlog.

Fresh tasks: intake numbers a job's tasks ``seq`` = 1, 2, ... and the dispatcher keeps a cursor,
``job.seq_sent``: every fresh task with a lower-or-equal seq has gone out. Selection reads
bounded seq windows above the cursor, never past a number that intake has handed out but not
yet inserted (``job.intake`` lists those reservations), so no task can appear behind the
cursor. Only the dispatcher moves the cursor, by compare-and-set.

Tasks that go again (retryable FAIL whose ``retry_at`` passed; LIVE with ``retry_at`` set:
recovered or requeued) are found by status and time and marked DISPATCH when sent.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from pymongo.collection import Collection

from common.store.models import FAIL, LIVE

EPOCH = datetime(1970, 1, 1)
INTAKE_STALE = timedelta(minutes=10)  # a reservation older than this belongs to a dead intake
WINDOW_MIN = 64


@dataclass
class Picked:
    """One due task: its id, target host and (fresh tasks) seq."""

    id: object
    host: str
    seq: int = 0
    uri: str = ""
    attempts: int = 0
    status: str = LIVE  # what it was when picked (a task that goes again: FAIL or LIVE)


def fresh_limit(job_doc: dict, now: datetime) -> int:
    """The highest seq whose task is surely inserted: below every live intake reservation."""
    top = job_doc.get("seq_next", 0)
    for r in job_doc.get("intake") or ():
        if r.get("at") and now - r["at"] < INTAKE_STALE:
            top = min(top, r["seq"] - 1)
    return top


def select_fresh(coll: Collection, job_doc: dict, need: int, now: datetime) -> tuple[list[Picked], int]:
    """Up to ``need`` fresh LIVE tasks above the cursor, in seq order, and the seq up to which
    the job was read (the cursor's new place if all of them go out)."""
    lo, top = job_doc.get("seq_sent", 0), fresh_limit(job_doc, now)
    picked: list[Picked] = []
    window = max(need, WINDOW_MIN)
    while lo < top and len(picked) < need:
        hi = min(lo + window, top)
        flt = {"job": job_doc["_id"], "status": LIVE, "retry_at": None, "seq": {"$gt": lo, "$lte": hi}}
        docs = sorted(coll.find(flt, {"_id": 1, "host_name": 1, "seq": 1, "uri": 1}), key=lambda d: d["seq"])
        picked.extend(Picked(d["_id"], d.get("host_name") or "", d["seq"], d["uri"])
                      for d in docs[: need - len(picked)])
        if len(picked) >= need:
            return picked, picked[-1].seq
        lo = hi
        window *= 2  # gaps (duplicates, cancelled tasks): widen
    return picked, max(lo, job_doc.get("seq_sent", 0))


def fresh_cursor(picked: list[Picked], read_to: int, sent: int) -> int:
    """Where the cursor may move once the first ``sent`` picked tasks went out: just below the
    first one that did not, or to the end of what was read when all went."""
    return picked[sent].seq - 1 if sent < len(picked) else read_to


def again_filter(job_id, max_retry_times: int, now: datetime) -> list[dict]:
    """Filters of the tasks that go again: retryable FAIL, and LIVE recovered or requeued."""
    due = {"$gte": EPOCH, "$lte": now}
    return [
        {"job": job_id, "status": FAIL, "retry_at": due, "download_times": {"$lt": max_retry_times}},
        {"job": job_id, "status": LIVE, "retry_at": due},
    ]


def select_again(coll: Collection, job_id, max_retry_times: int, need: int, now: datetime) -> list[Picked]:
    """Up to ``need`` tasks that go again. Queries name only the fields of the task index
    (job, status, retry_at): another predicate makes some servers scan the collection, so
    ``download_times`` is checked here."""
    picked: list[Picked] = []
    for flt in again_filter(job_id, max_retry_times, now):
        if len(picked) >= need:
            break
        if flt["status"] == FAIL and max_retry_times <= 0:
            continue
        indexed = {k: flt[k] for k in ("job", "status", "retry_at")}
        for d in coll.find(indexed, {"_id": 1, "host_name": 1, "download_times": 1, "uri": 1}):
            if d.get("download_times", 0) < max_retry_times or flt["status"] == LIVE:
                picked.append(Picked(d["_id"], d.get("host_name") or "", 0, d["uri"], d.get("download_times", 0),
                                     flt["status"]))
                if len(picked) >= need:
                    break
    return picked
