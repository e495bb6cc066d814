"""What people read of tasks, leases, data and logs (the console, the API, the CLI, report mails):
pages in ``_id`` order read window by window (``common.store.paging``), single documents, and
the few counts that report mails give. Writes live with each collection's own module.

Indexes these reads use: ``crawler_task`` ``(job, _id)`` and ``(job, status, _id)`` (a job's tasks,
of one status or all, in ``_id`` order), ``(job, uri)`` (a task by its URL);
``crawler_download_data`` ``(job, _id)`` (a job's data) and ``(task, lease)`` (the data of a
task's settled lease); the logs' ``(job, _id)`` (the download log of several jobs: job by job,
merged); ``crawler_lease`` ``(state, beat_at)``. The embedded store serves a range only behind an
equality on an index's first field: ``_id`` alone or ``job`` ``$in`` reads the whole collection.
Invariant: data pages and bodies show only documents their task names (``common.store.fence.shown``);
every filter value comes from the caller already checked, never as an operator.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Iterator

from bson import ObjectId
from mongoengine import Document
from pymongo.collection import Collection

from common.store import counts, floors
from common.store.connection import collection
from common.store.data import gridfs_of
from common.store.fence import shown
from common.store.log_models import (
    CrawlerDispatchAlertLog,
    CrawlerDispatchLog,
    CrawlerDownloadLog,
    CrawlerRegistrationErrorLog,
)
from common.store.logrecords import AlertLog, DispatchLog, DownloadLog, RegistrationError
from common.store.models import (
    DEAD,
    DISPATCH,
    FAIL,
    LIVE,
    QUEUED,
    RUNNING,
    CrawlerDownloadData,
    CrawlerLease,
    CrawlerTask,
    Job,
)
from common.store.paging import Doc, Span, by_id
from common.store.records import DataDoc, Task
from common.store.tasks import task_by_uri

LogRecord = DownloadLog | DispatchLog | AlertLog | RegistrationError
Shown = Task | DataDoc | LogRecord  # what a page shows

LOGS: dict[str, tuple[type[Document], type[LogRecord]]] = {
    "download": (CrawlerDownloadLog, DownloadLog),
    "dispatch": (CrawlerDispatchLog, DispatchLog),
    "alert": (CrawlerDispatchAlertLog, AlertLog),
    "registration": (CrawlerRegistrationErrorLog, RegistrationError),
}
TASK_FIELDS = {"uri": 1, "status": 1, "download_times": 1, "recoveries": 1, "failed_reason": 1,
               "retry_at": 1, "host_name": 1, "add_datetime": 1, "last_update_datetime": 1}
DATA_FIELDS = {"url": 1, "status_code": 1, "task": 1, "lease": 1, "add_datetime": 1,
               "response_body_gridfs": 1, "version": 1, "superseded": 1,
               "size": {"$cond": [{"$ifNull": ["$response_body", False]},
                                  {"$binarySize": "$response_body"}, 0]}}

# What a page shows of each record, after its ``id``, in the order its writer stores the fields:
# (attribute, shown when None). The views turn a record into its JSON by this (``master.views``).
Shape = tuple[tuple[str, bool], ...]
SHOWN: dict[str, Shape] = {
    "tasks": (("uri", True), ("status", True), ("download_times", True), ("recoveries", True),
              ("host_name", True), ("add_datetime", True), ("last_update_datetime", True),
              ("failed_reason", True), ("retry_at", True)),
    "data": (("task", True), ("url", True), ("status_code", True), ("add_datetime", True),
             ("version", False), ("superseded", False)),  # then the body's size
    "download": (("job", True), ("task", True), ("lease", True), ("status", True), ("requests_size", True),
                 ("response_size", True), ("failed_reason", True), ("downloads_hostname", True),
                 ("spend_time", True), ("add_datetime", True), ("coalesced_from", False),
                 ("not_modified", False)),
    "dispatch": (("job", True), ("status", False), ("queue", False), ("lease", False), ("count", True),
                 ("reason", False), ("hostname", False), ("add_datetime", False)),
    "alert": (("job", True), ("type", True), ("reason", True), ("content_bytes", True), ("hostname", True),
              ("add_datetime", True)),
    "registration": (("name", True), ("manifest", False), ("reason", True), ("hostname", False),
                     ("project", False), ("actor", False), ("add_datetime", True)),
}


# --- tasks -------------------------------------------------------------------------------

def tasks(job_id: ObjectId, status: str | None, limit: int, after: ObjectId | None,
          newest: bool) -> list[Task]:
    """Up to ``limit`` of the job's tasks (of ``status``) after ``after`` in ``_id`` order (what
    ``SHOWN["tasks"]`` shows of each: the rest of a record is left at its defaults)."""
    if status is not None and not newest:  # from where the status's tasks begin (common.store.floors)
        return floors.page(job_id, status, limit, after, counts.span(job_id), TASK_FIELDS)
    flt: dict[str, Any] = {"job": job_id}
    if status is not None:
        flt["status"] = status
    found = by_id(CrawlerTask._get_collection(), flt, limit, span=counts.span(job_id), after=after,
                  newest=newest, projection=TASK_FIELDS)
    return [Task.from_doc(d) for d in found]


def task(job_id: ObjectId, task_id: ObjectId | None, uri: str | None) -> Task | None:
    """The job's task with id ``task_id``, else the one whose URL is ``uri``, or None."""
    coll = CrawlerTask._get_collection()
    found = coll.find_one({"_id": task_id, "job": job_id}) if task_id is not None else None
    if found is None and uri is not None:
        return task_by_uri(job_id, uri)
    return Task.maybe(found)


def task_by_id(task_id: ObjectId) -> Task | None:
    return Task.maybe(CrawlerTask._get_collection().find_one({"_id": task_id}))


def data_of(task: Task) -> ObjectId | None:
    """The id of the data document of the task's settled lease, or None."""
    if not task.data_lease:
        return None
    doc = CrawlerDownloadData._get_collection().find_one({"task": task.id, "lease": task.data_lease},
                                                         {"_id": 1})
    return doc["_id"] if doc else None


# --- data --------------------------------------------------------------------------------

def data(job_id: ObjectId, limit: int, after: ObjectId | None,
         all_versions: bool = False) -> list[tuple[DataDoc, int]]:
    """Up to ``limit`` + 1 of the job's shown data documents after ``after``, oldest first, each
    with its body's size (GridFS bodies too; the one past the page: 0) and without its lease or
    body: each page's latest version, or with ``all_versions`` its earlier ones too."""
    coll = CrawlerDownloadData._get_collection()
    docs: list[Doc] = []
    span = counts.span(job_id, "data")
    while len(docs) <= limit:
        raw = by_id(coll, {"job": job_id}, limit + 1, span=span, after=after, projection=DATA_FIELDS,
                    computed=True)
        keep = shown(raw)
        docs += [d for d in raw if d["_id"] in keep and (all_versions or not d.get("superseded"))]
        if len(raw) <= limit:
            break
        after = raw[-1]["_id"]
    found = []
    for i, d in enumerate(docs[:limit + 1]):
        gridfs_id = d.pop("response_body_gridfs", None)
        d.pop("lease", None)
        size = int(d.pop("size", 0) or 0)
        if gridfs_id and i < limit:  # the one past the page only says there is more
            size = gridfs_of(coll.database).get(gridfs_id).length
        found.append((DataDoc.from_doc(d), size))
    return found


def body(data_id: ObjectId, job_ids: list[ObjectId] | None = None) -> tuple[int, Iterator[bytes]] | None:
    """(length, chunks) of a shown data document's body (of one of ``job_ids``' jobs, when
    given), byte-exact (GridFS bodies streamed), or None."""
    coll = CrawlerDownloadData._get_collection()
    doc = coll.find_one({"_id": data_id, **({"job": {"$in": job_ids}} if job_ids is not None else {})},
                        {"response_body": 1, "response_body_gridfs": 1, "task": 1, "lease": 1})
    if doc is None or not shown([doc]):
        return None
    if doc.get("response_body_gridfs"):
        stored = gridfs_of(coll.database).get(doc["response_body_gridfs"])
        return stored.length, iter(lambda: stored.read(256 * 1024), b"")
    raw = bytes(doc.get("response_body") or b"")
    return len(raw), iter((raw,))


# --- logs --------------------------------------------------------------------------------

def logs(log: str, limit: int, after: ObjectId | None, job_id: ObjectId | None = None,
         job_name: str | None = None, job_ids: list[ObjectId] | None = None,
         project_ids: list[int] | None = None) -> list[LogRecord]:
    """Up to ``limit`` of log ``log`` (one of LOGS), newest first, as its records: of job
    ``job_id`` (the registration log: of ``job_name``), or of every job — of those of ``job_ids``
    (the registration log: submitted to a project of ``project_ids``) when given."""
    model, record = LOGS[log]
    found = _log_docs(model, limit, after, job_id, job_name, job_ids, project_ids)
    return [record.from_doc(d) for d in found]


def _log_docs(model: type[Document], limit: int, after: ObjectId | None, job_id: ObjectId | None,
              job_name: str | None, job_ids: list[ObjectId] | None,
              project_ids: list[int] | None) -> list[Doc]:
    flt: dict[str, Any] = {}
    span = Span()
    if model is CrawlerRegistrationErrorLog:
        flt = {"name": job_name} if job_name is not None else {}
        if project_ids is not None:  # a rejection is its submitter's project's, whatever name it gave
            flt = {**flt, "project": {"$in": project_ids}}
    elif model is CrawlerDownloadLog:
        return _newest_of_jobs(model._get_collection(), [job_id] if job_id is not None else job_ids, limit,
                               after)
    elif job_id is not None:
        flt, span = {"job": job_id}, counts.span(job_id)
    elif job_ids is not None:
        flt = {"job": {"$in": job_ids}}
    return by_id(model._get_collection(), flt, limit, span=span, after=after, newest=True)


def _newest_of_jobs(coll: Collection[Doc], job_ids: list[ObjectId] | None, limit: int,
                    after: ObjectId | None) -> list[Doc]:
    """The newest ``limit`` of the jobs' documents (of every job when None) beyond ``after``: each
    job's own newest, read by its (job, ``_id``) index window by window, merged. A filter of
    ``_id`` alone, or of ``job`` ``$in`` a list, makes the embedded store read the whole
    collection for every window (what that cost: docs/scale.md)."""
    spans = counts.spans(job_ids, "log")
    ids = job_ids if job_ids is not None else sorted(
        {*spans, *(j["_id"] for j in Job._get_collection().find({}, {"_id": 1}))} - {None})
    found: list[Doc] = []
    for job in ids:
        found += by_id(coll, {"job": job}, limit, span=spans.get(job) or counts.span(job), after=after,
                       newest=True)
    return sorted(found, key=lambda d: d["_id"], reverse=True)[:limit]


# --- leases ------------------------------------------------------------------------------

def running_by_worker() -> dict[str, set[ObjectId]]:
    """The jobs of the running leases, by worker."""
    running: dict[str, set[ObjectId]] = {}
    for lease in CrawlerLease._get_collection().find({"state": RUNNING}, {"worker": 1, "job": 1}):
        running.setdefault(lease.get("worker"), set()).add(lease["job"])
    return running


def jobs_queued_in(queue: str) -> list[ObjectId]:
    """The jobs with entries waiting in ``queue``."""
    return list(collection(CrawlerLease).distinct("job", {"queue": queue, "state": QUEUED}))


# --- what report mails tell --------------------------------------------------------------

def drained(job_id: ObjectId) -> bool:
    """Whether the job has no LIVE, DISPATCH or retryable FAIL task."""
    coll = CrawlerTask._get_collection()
    return (coll.find_one({"job": job_id, "status": {"$in": [LIVE, DISPATCH]}}, {"_id": 1}) is None
            and coll.find_one({"job": job_id, "status": FAIL, "retry_at": {"$ne": None}}, {"_id": 1}) is None)


def failure_reasons(job_id: ObjectId, n: int = 5) -> list[tuple[str | None, int]]:
    """The job's ``n`` most frequent failure reasons: (reason, tasks), most frequent first."""
    return [(r["_id"], r["n"]) for r in CrawlerTask._get_collection().aggregate([
        {"$match": {"job": job_id, "status": {"$in": [FAIL, DEAD]}}},
        {"$group": {"_id": "$failed_reason", "n": {"$sum": 1}}}, {"$sort": {"n": -1}}, {"$limit": n}])]


def time_span(job_id: ObjectId) -> tuple[datetime, datetime] | None:
    """(the first task's add time, the last change), or None for a job without tasks."""
    span = next(CrawlerTask._get_collection().aggregate([
        {"$match": {"job": job_id}},
        {"$group": {"_id": None, "first": {"$min": "$add_datetime"},
                    "last": {"$max": "$last_update_datetime"}}}]), None)
    return (span["first"], span["last"]) if span and span.get("first") else None


def dead_since(job_id: ObjectId, since: datetime) -> int:
    """How many of the job's tasks became DEAD after ``since``."""
    return collection(CrawlerTask).count_documents(
        {"job": job_id, "status": DEAD, "last_update_datetime": {"$gt": since}})
