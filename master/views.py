"""Read-side views of the cluster shared by the CLI, the HTTP API and the console: jobs with
their counts, pages of tasks, data and logs, a stored body, workers alive, the overview.

Listings are pages in ``_id`` order with an ``after`` cursor (tasks and data oldest first,
logs newest first); every filter value is checked to be a plain string of a known form before
it goes into a query, so no caller can smuggle a MongoDB operator in.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from bson import ObjectId
from bson.errors import InvalidId
from redis import Redis

from common.config import settings
from common.errors import NotFound, ValidationError
from common.queue.names import WORKER_KEY_PREFIX
from common.secrets import mask_proxy
from common.store import data as store_data
from common.store import jobs, logs, pages, projects
from common.store.clock import iso
from common.store.connection import as_text
from common.store.logrecords import DownloadLog
from common.store.models import TASK_STATUSES
from common.store.records import DataDoc, Task
from master import access, generators
from master.ops.stats import COLUMNS, collect, task_counts

if TYPE_CHECKING:
    from common.store.control import Token

OBJECT_ID = re.compile(r"^[0-9a-fA-F]{24}$")


def plain(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(f"{what} must be a string")
    return value


def object_id(value: Any, what: str = "id") -> ObjectId:
    try:
        return ObjectId(plain(value, what))
    except InvalidId:
        raise ValidationError(f"{what} is not an id: {str(value)[:40]!r}") from None


def clamp(limit: Any, default: int = 100) -> int:
    if limit is None:
        return default
    try:
        n = int(limit)
    except (TypeError, ValueError):
        raise ValidationError(f"limit must be an integer, got {str(limit)[:40]!r}") from None
    if n < 1:
        raise ValidationError("limit must be at least 1")
    return min(n, settings.API_MAX_LIMIT)


def as_json(record: pages.Shown, shape: pages.Shape, names: dict[ObjectId, str] | None = None,
            id_key: str = "id") -> dict:
    """A record as people read it (the one conversion of a record to JSON: pages, the archive):
    its id (as ``id_key``), then the attributes of ``shape`` (``common.store.pages.SHOWN``) in its
    order, ObjectIds as text, times as RFC 3339; with ``names``, a ``job`` is the job's name."""
    out: dict[str, Any] = {id_key: str(record.id)}
    for attr, always in shape:
        value = getattr(record, attr)
        if value is None and not always:
            continue
        if attr == "job" and names is not None:
            value = names.get(value, str(value))
        elif isinstance(value, ObjectId):
            value = str(value)
        elif isinstance(value, (list, tuple)):
            value = [str(v) if isinstance(v, ObjectId) else iso(v) for v in value]
        out[attr] = iso(value)
    return out


def _page(records: Sequence[pages.Shown], limit: int, shape: pages.Shape,
          names: dict[ObjectId, str] | None = None) -> dict:
    """Up to ``limit`` of ``records`` as JSON, and the cursor of the next page (None: the last)."""
    shown = records[:limit]
    return {"items": [as_json(r, shape, names) for r in shown],
            "next": str(shown[-1].id) if len(records) > limit else None}


# --- jobs --------------------------------------------------------------------------------

def job_rows(names: set[str] | None = None) -> list[dict]:
    """Every job (of ``names``, when given) with its status, priority, downloader type, host,
    project and task counts."""
    kinds = jobs.type_names()
    counts = {row["job"]: {k: row[k] for k in COLUMNS} for row in task_counts()}
    default = projects.default_id()
    return [{"name": j.name, "status": j.status, "priority": j.priority, "type": kinds.get(j.id, "?"),
             "host": j.worker_host or "", "project": j.project if j.project is not None else default,
             "counts": counts.get(j.name, dict.fromkeys(COLUMNS, 0))}
            for j in jobs.ordered() if names is None or j.name in names]


MEANING_OF_PRIOR = {0: "normal", 1: "urgency: entries go to the front of their queue",
                    2: "foreign: entries go to the foreign queues (workers with --foreign)"}


def job_detail(name: Any, secrets: bool = False) -> dict:
    """One job: its row, its settings with secrets masked, and its last failures. ``secrets``
    (for a caller who may change the job): its proxy with the password masked, its cookie and its
    headers' values too, so that a change can hand them back (the masked proxy unchanged keeps
    the stored one: ``master.registry``)."""
    job = jobs.named(name)
    row = next(r for r in job_rows() if r["name"] == job.name)
    s = jobs.settings_of(job)
    if s:
        row["settings"] = {
            "dispatch_num": s.dispatch_num,
            "max_retry_times": s.max_retry_times,
            "download_engine": s.download_engine,
            "prior": s.prior,
            "prior_meaning": MEANING_OF_PRIOR.get(s.prior or 0, "?"),
            "report_mails": s.report_mails,
            "headers": sorted(s.headers or {}),  # header names only
            "proxy": "***" if s.proxy else "",
            "cookie": "***" if s.cookie else "",
            "download_js_chars": len(s.download_js or ""),
            "host_concurrency": s.host_concurrency or None,
            "host_delay": s.host_delay or 0.0,
            "obey_robots": s.obey_robots is not False,
            "allow_private": bool(s.allow_private and s.private_grant),  # as the workers honour it
        }
        if secrets:
            row["settings"].update(proxy=mask_proxy(s.proxy or ""), cookie=s.cookie or "",
                                   header_values=dict(s.headers or {}))
    row["code_chars"] = jobs.code_chars(job)
    row["generator"] = generators.summary(job.id)
    row["follow"] = dict(job.follow) if job.follow else None  # its [follow] table (None: follows no links)
    row["sitemaps"] = dict(job.sitemaps) if job.sitemaps else None  # its [sitemaps] table (None: none)
    row["recent_failures"] = task_page(job.name, status="FAIL", limit=20, newest=True)["tasks"]
    return row


# --- tasks, data, bodies, logs -----------------------------------------------------------

def task_page(
    name: Any, status: Any = None, limit: Any = None, after: Any = None, newest: bool = False
) -> dict:
    job = jobs.named(name)
    if status is not None and plain(status, "status") not in TASK_STATUSES:
        raise ValidationError(f"status must be one of {', '.join(TASK_STATUSES)}")
    mark = object_id(after, "after") if after is not None else None
    n = clamp(limit)
    page = _page(pages.tasks(job.id, status, n + 1, mark, newest), n, pages.SHOWN["tasks"])
    return {"tasks": page["items"], "next": page["next"]}


def task_detail(name: Any, key: Any) -> dict:
    """One task of job ``name`` by its id or its URL: status, attempts, reasons, the data document
    that is its page (if any) and every download log of it, newest first."""
    job = jobs.named(name)
    key = plain(key, "task")
    found = pages.task(job.id, ObjectId(key) if OBJECT_ID.match(key) else None, key)
    if found is None:
        raise NotFound(f"job {job.name} has no task {key[:80]!r} (an id or a URL as added)")
    return _task(found, job.name)


def task_by_id(task_id: Any, token: Token | None = None) -> dict:
    found = pages.task_by_id(object_id(task_id, "id"))
    if found is None:
        raise NotFound(f"no task {str(task_id)[:40]!r}")
    access.job_by_id(found.job, token, f"no task {str(task_id)[:40]!r}")
    return _task(found, jobs.name_of(found.job))


def _task(task: Task, job_name: str) -> dict:
    data = pages.data_of(task)
    task_logs = [_log_row(log) for log in logs.of_task(task.id)]
    return {
        "id": str(task.id),
        "job": job_name,
        "url": task.uri,
        "status": task.status,
        "attempts": task.download_times,
        "recoveries": task.recoveries,
        "failed_reason": task.failed_reason,
        "retry_at": iso(task.retry_at),
        "host": task.host_name or "",
        "depth": task.depth or 0,
        "parent": str(task.parent) if task.parent else None,
        "sitemap": task.sitemap,  # "xml": a sitemap, "robots": a robots.txt (for its sitemaps); None: a page
        "queue": task.queue,
        "data_id": str(data) if data else None,
        "visits": task.visits or 0,
        "not_modified": task.not_modified or 0,
        "revisit_every": task.revisit_every,
        "changed_at": iso(task.changed_at),
        "versions": [_version(v, latest) for v, latest in store_data.versions_of(task.id)],
        "add_datetime": iso(task.add_datetime),
        "last_update_datetime": iso(task.last_update_datetime),
        "download_logs": task_logs,
    }


def _log_row(log: DownloadLog) -> dict:
    """One download attempt, as the task's page lists it."""
    row = {"id": str(log.id), "status": log.status, "response_size": log.response_size,
           "failed_reason": log.failed_reason, "downloads_hostname": log.downloads_hostname,
           "spend_time": log.spend_time, "add_datetime": iso(log.add_datetime)}
    return row if log.coalesced_from is None else {**row, "coalesced_from": str(log.coalesced_from)}


def _version(doc: DataDoc, latest: bool) -> dict:
    """One stored version of a page, as the task's history lists it."""
    return {"data_id": str(doc.id), "version": doc.version or 1, "latest": latest,
            "status_code": doc.status_code, "add_datetime": iso(doc.add_datetime)}


def data_page(name: Any, limit: Any = None, after: Any = None, versions: str = "latest") -> dict:
    """A page of the job's data that its tasks name (``common.store.fence.visible``), oldest first:
    each page's latest version, or (``versions`` "all") every stored version."""
    job = jobs.named(name)
    n = clamp(limit)
    mark = object_id(after, "after") if after is not None else None
    found = pages.data(job.id, n, mark, all_versions=versions == "all")
    page = _page([doc for doc, _ in found], n, pages.SHOWN["data"])
    items = [{**item, "size": size} for item, (_, size) in zip(page["items"], found)]
    return {"data": items, "next": page["next"]}


def body(data_id: Any, job_ids: list | None = None) -> tuple[int, Iterator[bytes]]:
    """(length, chunks) of a stored response body (of one of ``job_ids``' jobs, when given),
    byte-exact; GridFS bodies are streamed."""
    try:
        oid = object_id(data_id)
    except ValidationError:
        raise NotFound(f"no data document {str(data_id)[:40]!r}") from None
    found = pages.body(oid, job_ids)
    if found is None:
        raise NotFound(f"no data document {data_id}")
    return found


def log_page(log: Any, job: Any = None, limit: Any = None, after: Any = None,
             job_ids: list | None = None, project_ids: list[int] | None = None) -> dict:
    """A page of one log, newest first (of the jobs ``job_ids``, when given; the registration
    log: of the rejections submitted to the projects ``project_ids``)."""
    if plain(log, "log") not in pages.LOGS:
        raise NotFound(f"no log {log!r}: one of {', '.join(pages.LOGS)}")
    job_id = job_name = None
    if job is not None and log == "registration":
        job_name = plain(job, "job")
    elif job is not None:
        job_id = jobs.named(job).id
    mark = object_id(after, "after") if after is not None else None
    n = clamp(limit)
    found = pages.logs(log, n + 1, mark, job_id=job_id, job_name=job_name, job_ids=job_ids,
                       project_ids=project_ids)
    page = _page(found, n, pages.SHOWN[log], jobs.names())
    return {"logs": page["items"], "next": page["next"]}


# --- workers, overview -------------------------------------------------------------------

def workers(redis: Redis) -> list[dict]:
    """Workers that announced themselves within their TTL, with the jobs of the entries they run."""
    running = pages.running_by_worker()
    names = jobs.names()
    out = []
    for key in sorted(redis.scan_iter(WORKER_KEY_PREFIX + "*", count=500)):
        info = {as_text(k): as_text(v) for k, v in redis.hgetall(key).items()}
        if not info:
            continue
        worker_id = key.decode()[len(WORKER_KEY_PREFIX):]
        out.append({"id": worker_id, "host": info.get("host", "?"), "inflight": int(info.get("inflight", 0)),
                    "entries_done": int(info.get("entries", 0)),
                    "jobs": sorted(names.get(j, str(j)) for j in running.get(worker_id, ()))})
    return out


def scoped_stats(data: dict, names: set[str] | None) -> dict:
    """Stats as a user or analyst sees them (``names``: the jobs of its projects; None: all): its
    jobs' rows, and no throttled site (those name what other projects crawl). Queue depths and the
    last hour's success rate are the cluster's aggregates, shown to every role."""
    if names is not None:
        data["jobs"] = [row for row in data["jobs"] if row["job"] in names]
        data["throttled_hosts"] = []
    return data


def overview(redis: Redis, names: set[str] | None = None, job_ids: list | None = None) -> dict:
    """What the console's first page shows: stats, workers alive, recent alerts (of the jobs
    ``names`` / ``job_ids`` only, when given)."""
    data = scoped_stats(collect(redis), names)
    data["workers"] = workers(redis)
    if names is not None:
        for w in data["workers"]:
            w["jobs"] = [j for j in w["jobs"] if j in names]
    data["alerts"] = log_page("alert", limit=10, job_ids=job_ids)["logs"]
    return data
