"""A job's tasks per status, kept as they change: what every page and metric shows without
reading the tasks (a count over them grows with the job: docs/scale.md).

One document per job in ``crawler_task_count``: ``{_id: job, LIVE: n, DISPATCH: n, ..., first, last}``
(no task, data or log of the job was made before ``first`` or after ``last``, give or take a host's
clock: where its pages begin, ``common.store.paging``) and, once counted by ``recount``,
``data_first`` and ``log_last`` (where its data begins and its download logs end: a store filled
from outside may hold them a long way from its tasks, and a page's windows would cross that
stretch in one window holding the job's whole data). Every
change of tasks' status is followed at once by its move here, with the number of tasks that
change's own result says it moved — the modified count of a guarded update, the writer's
read-back when a guard refused some: intake, dispatch, a worker's settles and hand-backs, the
defender's releases, cancel and requeue, migrate, retention. Only a process that dies between a
change and its move leaves a count off; ``recount`` rebuilds them from the tasks (one scan, for
an operator: ``downcluster stats --recount``).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Iterable

from bson import ObjectId
from pymongo import UpdateOne

from common.store.connection import collection
from common.store.log_models import CrawlerDownloadLog
from common.store.models import TASK_STATUSES, CrawlerDownloadData, CrawlerTask, CrawlerTaskCount
from common.store.paging import Span

TOP = ObjectId("f" * 24)  # the floor of a status with no task (``common.store.floors``)

Move = tuple[ObjectId | None, str | None, str | None, int]  # (job, status before / after or None, tasks)
Floors = dict[tuple[ObjectId | None, str], ObjectId]  # {(job, status entered): lowest ``_id`` entering}


def move(moves: Iterable[Move], first: dict[ObjectId, ObjectId] | None = None,
         floors: Floors | None = None) -> None:
    """Apply tasks' moves between statuses (None: added or removed), in one bulk write;
    ``first``: {job id: the lowest ``_id`` among tasks it adds}; ``floors``: the lowest ``_id``
    among the tasks each move put in its status, where known (``common.store.floors``: that
    status's floor is lowered to it, or forgotten where not known)."""
    by_job: dict[ObjectId | None, Counter[str]] = defaultdict(Counter)
    entered: dict[ObjectId | None, dict[str, ObjectId | None]] = defaultdict(dict)
    first, floors = first or {}, floors or {}
    for job, before, after, n in moves:
        if n and before != after:
            if before:
                by_job[job][before] -= n
            if after:
                by_job[job][after] += n
                low = floors.get((job, after))
                if low is None and before is None and job is not None:
                    low = first.get(job)
                had = entered[job].get(after, low)
                entered[job][after] = None if low is None or had is None else min(low, had)
    made = ObjectId()  # after whatever this move follows was written (by this process's clock)
    ops = [UpdateOne({"_id": job}, _change(c, entered[job], first.get(job) if job else None, made),
                     upsert=True) for job, c in by_job.items() if any(c.values())]
    if ops:
        collection(CrawlerTaskCount).bulk_write(ops, ordered=False)


def _change(counted: Counter[str], entered: dict[str, ObjectId | None], first: ObjectId | None,
            made: ObjectId) -> dict[str, Any]:
    """One job's update: its counts, ``last`` and ``first``; the floors of the statuses tasks
    entered lowered (``$min``) or forgotten (``$unset``), their versions each one up."""
    lower: dict[str, Any] = {f"floor.{s}": low for s, low in entered.items() if low is not None}
    if first is not None:
        lower["first"] = first
    out: dict[str, Any] = {"$inc": {**{k: v for k, v in counted.items() if v},
                                    **{f"floor_v.{s}": 1 for s in entered}},
                           "$max": {"last": made}}
    if lower:
        out["$min"] = lower
    forget = {f"{f}.{s}": "" for s, low in entered.items() if low is None for f in ("floor", "floor_ok")}
    if forget:
        out["$unset"] = forget
    return out


def of_jobs(job_ids: Iterable[ObjectId] | None = None) -> dict[ObjectId, dict[str, int]]:
    """{job id: {status: n}} (every status present, 0 where none)."""
    flt = {} if job_ids is None else {"_id": {"$in": list(job_ids)}}
    return {d["_id"]: {s: int(d.get(s) or 0) for s in TASK_STATUSES}
            for d in collection(CrawlerTaskCount).find(flt)}


def span(job_id: ObjectId | None = None, of: str = "") -> Span:
    """Where the ``_id``s of the job's tasks, data and logs lie (of every job when None); the
    job's own ``_id`` (made when it was registered) when its counts were never rebuilt since.
    ``of`` "data": where its data begins, when counted; "log": where its download logs end."""
    return spans(None if job_id is None else [job_id], of)[job_id]


def spans(job_ids: list[ObjectId] | None, of: str = "") -> dict[ObjectId | None, Span]:
    """{job id: ``span`` of the job} for each of ``job_ids`` (None: of every job with counts, and
    under the key None, of them all)."""
    flt = {} if job_ids is None else {"_id": {"$in": job_ids}}
    shown = {"first": 1, "last": 1, "data_first": 1, "log_last": 1}
    docs = list(collection(CrawlerTaskCount).find(flt, shown))
    out: dict[ObjectId | None, Span] = {}
    for d in docs:
        first = d.get("data_first") if of == "data" and d.get("data_first") else d.get("first")
        last = max(d["last"], d["log_last"]) if of == "log" and d.get("last") and d.get("log_last") \
            else d.get("last")
        out[d["_id"]] = Span(first or (d["_id"] if isinstance(d["_id"], ObjectId) else None), last)
    firsts = [s.first for s in out.values() if s.first]
    lasts = [s.last for s in out.values() if s.last]
    for job_id in job_ids or ():
        out.setdefault(job_id, Span(job_id if isinstance(job_id, ObjectId) else None))
    if job_ids is None:
        out[None] = Span(min(firsts) if firsts else None,
                         max(lasts) if lasts and len(lasts) == len(out) else None)
    return out


def raise_floor(job_id: ObjectId, first: ObjectId) -> None:
    """Retention removed every task of the job below ``first``, and their data: its pages begin there."""
    collection(CrawlerTaskCount).update_one({"_id": job_id}, {"$max": {"first": first, "data_first": first}})


def recount(job_id: ObjectId | None = None) -> dict[ObjectId, dict[str, int]]:
    match: list[dict[str, Any]] = [] if job_id is None else [{"$match": {"job": job_id}}]
    """Rebuild the counts (and the floors, ``common.store.floors``) from the tasks (of one job, or all)
    and return them."""
    counted: dict[ObjectId, dict[str, int]] = defaultdict(lambda: dict.fromkeys(TASK_STATUSES, 0))
    firsts: dict[ObjectId, ObjectId] = {}
    lasts: dict[ObjectId, ObjectId] = {}
    group = {"_id": {"job": "$job", "status": "$status"}, "n": {"$sum": 1}, "first": {"$min": "$_id"},
             "last": {"$max": "$_id"}, "changed": {"$max": "$last_update_datetime"}}
    floors: dict[ObjectId, dict[str, ObjectId]] = defaultdict(dict)
    for row in collection(CrawlerTask).aggregate([*match, {"$group": group}]):
        job = row["_id"]["job"]
        counted[job][row["_id"]["status"]] = row["n"]
        floors[job][row["_id"]["status"]] = row["first"]
        firsts[job] = min(firsts.get(job, row["first"]), row["first"])
        last = max(row["last"], ObjectId.from_datetime(row["changed"])) if row.get("changed") else row["last"]
        lasts[job] = max(lasts.get(job, last), last)
    coll = collection(CrawlerTaskCount)
    if job_id is None:
        coll.delete_many({"_id": {"$nin": list(counted)}})
    elif job_id not in counted:
        coll.delete_one({"_id": job_id})
    extents = {name: _extents(model, match) for name, model in (("data", CrawlerDownloadData),
                                                                 ("log", CrawlerDownloadLog))}
    for job, c in counted.items():
        data, log = extents["data"].get(job), extents["log"].get(job)
        coll.replace_one({"_id": job}, {
            "_id": job, **c, "first": firsts[job], "last": lasts[job],
            "floor": {s: floors[job].get(s, TOP) for s in TASK_STATUSES},
            "floor_ok": dict.fromkeys(TASK_STATUSES, True),
            **({"data_first": data[0]} if data else {}),
            **({"log_last": log[1]} if log else {})}, upsert=True)
    return dict(counted)


def _extents(model: Any, match: list[dict[str, Any]]) -> dict[ObjectId, tuple[ObjectId, ObjectId]]:
    """{job id: (lowest ``_id``, highest ``_id``)} of ``model``'s documents (one scan)."""
    group = {"$group": {"_id": "$job", "first": {"$min": "$_id"}, "last": {"$max": "$_id"}}}
    rows = collection(model).aggregate([*match, group])
    return {row["_id"]: (row["first"], row["last"]) for row in rows}
