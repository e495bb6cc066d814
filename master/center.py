"""The general download center (seed 000): download tasks whose rows come from the caller's own
``source_url`` or ``source_data``, delivered with the seed's parameters and limits, looked up by
``task_id`` or listed by ``project_ids``, deleted, and downloaded at once when small (sync).

A download task is an export (``common/store/exports.py``) with a ``project_id`` and a ``center``
document instead of a job: it is queued on ``down_export``, claimed, beaten, recovered, retried,
settled, linked, announced (callback, WebSocket) and expired (EXPORT_TTL, 7 days) by the one export
protocol; only where its rows come from differs (``slave/center.py``). The CLI (``downcluster
center``) and the API (``/v1/...``, ``master/web/routes/center.py``) are thin doors onto
``check``, ``deliver``, ``get``, ``listing``, ``delete`` and ``sync_source`` here.

Seed status values (the seed names no numbers; these are the center's, with the state word
beside them in every answer): 1 waiting (PENDING), 2 processing (RUNNING), 3 done (SUCCESS),
4 failed (FAIL), 5 cancelled (CANCEL), 6 expired (EXPIRED: the file was removed 7 days after).
"""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import IO, Any, cast
from urllib.parse import quote

from bson import ObjectId
from redis import Redis

from common.config import settings
from common.errors import Forbidden, NotFound, ValidationError
from common.exports.events import publish
from common.exports.sources import (
    Puller,
    check_source_url,
    inline_tables,
    look_of,
    pairs,
    parse_task_template,
    per_table,
    pull,
    pull_options,
    text,
    write_inline,
    write_pulled,
)
from common.exports.tabular import check_fits
from common.exports.templates import from_data, parse_template
from common.notify import check_callback
from common.queue.names import EXPORT_QUEUE
from common.queue.rqbridge import export_entry_id, rq_queue
from common.signing import export_url
from common.store import center as store
from common.store import exports, projects
from common.store.control import Token
from common.store.data import drop_export_file
from common.store.models import EXPORT_RUNNING, PENDING, SUCCESS, iso, utcnow
from common.store.records import ExportRecord
from master import access, audit
from master.exports.service import check_exec_time, may_see, owns, push, sync_slots

STATUS = {"PENDING": 1, "RUNNING": 2, "SUCCESS": 3, "FAIL": 4, "CANCEL": 5, "EXPIRED": 6}
STATUS_TEXT = {1: "waiting", 2: "processing", 3: "done", 4: "failed", 5: "cancelled", 6: "expired"}
STATE_OF = {n: s for s, n in STATUS.items()}
TYPES = {"csv": "csv", "excel": "xlsx", "xlsx": "xlsx"}
PARAMS = ("project_id", "name", "file_name", "type", "callback", "step", "operator_id", "merchant_type",
          "merchant_id", "template", "title", "summary", "header", "footer", "default_width",
          "default_height", "max_exec_time", "source_url", "source_data")
FILE_NAME_RE = re.compile(r"^[^/\\\"\x00-\x1f\x7f]{1,100}$")
MAX_PROJECT = 2**31 - 1


def check_project(token: Token | None, project_id: Any, what: str = "project_id") -> int:
    """A project id the token may use, as an integer: one that exists and that the token holds
    (``master.access``); any other answers 404, as a project nobody has."""
    number = integer(project_id, what, 1, MAX_PROJECT, required=True)
    access.check_project(token, number)
    return number


def private_allowed(project_id: int | None) -> bool:
    """Whether a task of ``project_id`` may pull from private addresses: the cluster's
    SOURCE_ALLOW_PRIVATE, or the project's own ``allow_private`` (``project create --allow-private``)."""
    return bool(settings.SOURCE_ALLOW_PRIVATE) or projects.allows_private(project_id)


def integer(value: Any, what: str, low: int, high: int, required: bool = False,
             default: int | None = None) -> int:
    if value is None or value == "":
        if required:
            raise ValidationError(f"{what} is required")
        return default  # type: ignore[return-value]
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value.strip()):
        value = int(value)
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"{what} must be a whole number from {low} to {high}")
    return value


def _points(value: Any, what: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not 1 <= number <= 1000:
        raise ValidationError(f"{what} must be a number of points from 1 to 1000")
    return number


@dataclass
class Task:
    """A delivered task's parameters, checked: what ``deliver`` stores and ``sync_source`` writes."""
    project_id: int
    format: str
    center: dict
    callback: str | None = None
    max_exec_time: int | None = None
    tables: list = field(default_factory=list)   # source_data's tables, parsed


def check(params: dict, token: Token | None = None) -> Task:
    """The seed's parameters checked (one line naming the first that is wrong); nothing stored."""
    unknown = sorted(set(params) - set(PARAMS))
    if unknown:
        raise ValidationError(f"unknown parameter {unknown[0][:40]!r}")
    project_id = check_project(token, params.get("project_id"))
    name = _name(params.get("name"))
    fmt = _format(params.get("type"))
    center: dict[str, Any] = {"name": name, "file_name": _file_name(params.get("file_name")),
                              "step": integer(params.get("step"), "step", 100, 5000, default=1000),
                              "operator_id": _operator(params.get("operator_id")),
                              "merchant_type": integer(params.get("merchant_type"), "merchant_type", 0, 3),
                              "merchant_id": integer(params.get("merchant_id"), "merchant_id", 0, 2**53)}
    callback = _callback(params.get("callback") or None)
    max_exec_time = check_exec_time(integer(params.get("max_exec_time"), "max_exec_time", 10,
                                             settings.EXPORT_MAX_EXEC_TIME_LIMIT))
    tables = _source(params.get("source_url"), params.get("source_data"), project_id, center)
    n = max(1, len(tables))
    center["tables"] = n
    template = _look(params, n, center)
    _check_layout(template, n, fmt)
    return Task(project_id, fmt, center, callback, max_exec_time, tables)


def _name(name: Any) -> str:
    if not isinstance(name, str) or not 2 <= len(name.strip()) <= 60:
        raise ValidationError("name must be 2 to 60 characters")
    return name.strip()


def _format(kind: Any) -> str:
    """The file format of the seed's ``type`` (csv when not given)."""
    kind = kind or "csv"
    if kind not in TYPES:
        raise ValidationError(f"type must be csv or excel, got {str(kind)[:20]!r}")
    return TYPES[kind]


def _file_name(file_name: Any) -> str:
    """The given file name, checked, or a new one from the time and a random number."""
    file_name = file_name or ""
    if file_name and (not isinstance(file_name, str) or not FILE_NAME_RE.match(file_name)):
        raise ValidationError("file_name must be 1 to 100 characters without / \\ \" or control characters")
    if not file_name:
        file_name = datetime.now(timezone.utc).strftime("%Y%m%d%H%M%S") + f"_{secrets.randbelow(10**6):06d}"
    return file_name


def _operator(operator_id: Any) -> str | None:
    if operator_id is not None and (isinstance(operator_id, bool) or not isinstance(operator_id, (str, int))
                                    or len(str(operator_id)) > 64):
        raise ValidationError("operator_id must be text of at most 64 characters")
    return None if operator_id is None else str(operator_id)


def _callback(callback: Any) -> Any:
    """The callback URL, checked (``common.notify``) and named as the seed names it."""
    if callback is not None:
        try:
            check_callback(callback)
        except ValidationError as exc:
            raise ValidationError(str(exc).replace("callback_url", "callback", 1)) from None
    return callback


def _source(source_url: Any, source_data: Any, project_id: int, center: dict[str, Any]) -> list:
    """Where the rows come from, kept in ``center``: source_data first (the seed), parsed into its
    tables; else source_url, checked, and no tables yet."""
    if source_data not in (None, ""):
        raw = source_data if isinstance(source_data, str) else json.dumps(source_data, ensure_ascii=False)
        if len(raw.encode()) > settings.SOURCE_DATA_MAX_BYTES:
            raise ValidationError(f"source_data is larger than SOURCE_DATA_MAX_BYTES "
                                  f"({settings.SOURCE_DATA_MAX_BYTES} bytes): give a source_url")
        tables = inline_tables(raw)
        center["source_data"] = raw
        return tables
    if source_url not in (None, ""):
        check_source_url(source_url, private_allowed(project_id))
        center["source_url"] = source_url
        return []
    raise ValidationError("give source_url or source_data")


def _look(params: dict, n: int, center: dict[str, Any]) -> Any:
    """The file's look for ``n`` tables (template, title, summary, header, footer, default sizes),
    kept in ``center``; the template as given."""
    template = parse_task_template(params.get("template"), n)
    center["template"] = None if template is None else (
        template if isinstance(template, str) else json.dumps(template, ensure_ascii=False))
    center["title"] = list(per_table(params.get("title"), n, "title", text))
    center["summary"] = list(per_table(params.get("summary"), n, "summary", text))
    for key in ("header", "footer"):
        got = per_table(params.get(key), n, key, pairs)
        center[key] = [None if p is None else [list(x) for x in p] for p in got]
    center["default_width"] = _points(params.get("default_width"), "default_width")
    center["default_height"] = _points(params.get("default_height"), "default_height")
    return template


def _check_layout(template: Any, n: int, fmt: str) -> None:
    """Row headers or several tables need excel."""
    if template is not None and n == 1:
        parsed = parse_template(template, general=True) if isinstance(template, str) else from_data(
            template, general=True)
        check_fits(parsed, fmt)
    elif n > 1 and fmt != "xlsx":
        raise ValidationError("multi-table mode (source_data as a list of tables) needs type excel")


def deliver(redis: Redis, params: dict, token: Token | None = None,
            extra: dict | None = None) -> ExportRecord:
    """Check a task and queue it on down_export (a worker pulls its source and writes its file);
    audited as ``center.deliver``. ``extra``: kept in the task's ``center`` beside the checked
    parameters (the /v1 interface's: ``master.center_v1``); a /v1 task identical to one of the
    same caller underway, or done within EXPORT_DEDUP_WINDOW, is that one (seeds 001, 004)."""
    task = check(params, token)
    task.center.update(extra or {})
    if not (extra or {}).get("v1"):
        return _store(redis, task, token)
    digest = "center:" + hashlib.sha256(json.dumps([params, extra], sort_keys=True, default=str,
                                                   ensure_ascii=False).encode()).hexdigest()
    window = timedelta(seconds=settings.EXPORT_DEDUP_WINDOW)
    same = exports.earlier(digest, utcnow(), window, token.id if token else None)
    return same if same is not None else _store(redis, task, token, digest)


def _store(redis: Redis, task: Task, token: Token | None, digest: str | None = None) -> ExportRecord:
    now = utcnow()
    export = exports.add(ExportRecord(
        id=ObjectId(), format=task.format, template="", filter={}, digest=digest or f"center:{ObjectId()}",
        callback_urls=[task.callback] if task.callback else [], mails=[],
        requested_by=token.name if token else "", created_at=now, retry_at=now,
        max_exec_time=task.max_exec_time, project=task.project_id, center=task.center,
        owner=token.id if token else None))
    push(redis, export)
    audit.record(token, "center.deliver", export.id, export.project, name=task.center.get("name"))
    return export


# --- synchronous download ----------------------------------------------------------------

@dataclass
class Written:
    """A file written at once: rewound, ``size`` bytes, ``rows`` rows; the caller closes ``out``."""
    out: IO[bytes]
    size: int
    rows: int
    name: str
    format: str


@dataclass
class Queued:
    """Too large (or every slot busy) for a synchronous answer: the task queued instead."""
    export: ExportRecord
    reason: str


def sync(redis: Redis, params: dict, token: Token | None = None,
         extra: dict | None = None) -> Written | Queued:
    """The seed's synchronous download: the same parameters, the file written here and now when
    the rows are at most EXPORT_SYNC_MAX_ROWS (source_data's count, or source_url's first page's
    total) and a slot is free; otherwise the task is queued as ``deliver`` would. A source that
    breaks its word raises SourceFailed (nothing is answered but the one line)."""
    task = check(params, token)
    task.center.update(extra or {})
    limit = settings.EXPORT_SYNC_MAX_ROWS
    slots = sync_slots()
    if not slots.acquire(blocking=False):
        return Queued(_store(redis, task, token),
                      f"all {settings.EXPORT_SYNC_SLOTS} synchronous slots of this process are busy")
    out = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)
    try:
        look = look_of(task.center)
        if task.tables:
            if sum(len(t) for t in task.tables) > limit:
                out.close()
                return Queued(_store(redis, task, token), f"more than EXPORT_SYNC_MAX_ROWS ({limit}) rows")
            _, rows = write_inline(look, task.tables, task.format, out)
        else:
            step = task.center["step"]
            with Puller(task.center["source_url"], step, f"sync-{secrets.token_hex(6)}",
                        private_allowed(task.project_id), **pull_options(task.center)) as puller:
                pulled = pull(puller, look)
                if pulled.total is None or pulled.total > limit:
                    out.close()
                    why = ("the source gives no total" if pulled.total is None else
                           f"the source's total {pulled.total} is more than EXPORT_SYNC_MAX_ROWS ({limit})")
                    return Queued(_store(redis, task, token), why)
                rows = write_pulled(pulled, task.format, out)
    except BaseException:
        out.close()
        raise
    finally:
        slots.release()
    size = out.tell()
    out.seek(0)
    return Written(cast(IO[bytes], out), size, rows, f"{task.center['file_name']}.{task.format}", task.format)


def get(task_id: Any, token: Token | None = None, project_ids: list[int] | None = None) -> ExportRecord:
    """A download task by id that the token may see: one of a project it holds, as every task of
    the project is for the systems that share it (404 otherwise, and for an export of a job)."""
    try:
        export = exports.get(ObjectId(str(task_id)))
    except Exception:
        export = None
    if (export is None or not export.center or not may_see(token, export)
            or (project_ids is not None and export.project not in project_ids)):
        raise NotFound(f"no task {str(task_id)[:40]!r}")
    return export


def describe(export: ExportRecord) -> dict:
    """A task as the seed's callers read it (status number and the state word beside it)."""
    center = export.center or {}
    status = STATUS.get(export.state, 0)
    ok = export.state == SUCCESS
    return {
        "task_id": str(export.id), "project_id": export.project, "name": center.get("name"),
        "file_name": center.get("file_name"), "type": "excel" if export.format == "xlsx" else export.format,
        "status": status, "status_text": STATUS_TEXT.get(status, ""), "state": export.state,
        "operator_id": center.get("operator_id"), "merchant_type": center.get("merchant_type"),
        "merchant_id": center.get("merchant_id"), "source": "source_url" if center.get("source_url")
        else "source_data", "step": center.get("step"), "rows": export.rows_done, "total": export.rows_total,
        "bytes": export.bytes, "attempts": export.attempts, "error": export.error,
        "url": export_url(str(export.id)) if ok else None,
        "file": f"/api/v1/exports/{export.id}/file" if ok else None,
        "events": f"/api/v1/exports/{export.id}/events",
        "created_at": iso(export.created_at), "finished_at": iso(export.finished_at),
        "expires_at": iso(export.expires_at),
    }


def id_list(value: Any, what: str, parse) -> list:
    """A comma-separated list (a query's form) or a JSON list of ids, at most 100."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not value or len(value) > 100:
        raise ValidationError(f"{what}: give 1 to 100 ids, comma-separated")
    return [parse(v) for v in value]


@dataclass
class Page:
    tasks: list[ExportRecord]
    total: int
    page: int
    page_size: int


def listing(params: dict, token: Token | None = None, states: list[str] | None = None,
            first: int = 1, most: int = 100) -> Page:
    """Tasks of ``project_ids`` newest first, with the seed's filters (status, operator_id,
    merchant_type, merchant_id, task_name: a part of the name) and paging (page from ``first``,
    at most ``most`` a page); ``states``: the states wanted (instead of ``status``)."""
    allowed = {"project_ids", "page", "page_size", "status", "operator_id", "merchant_type", "merchant_id",
               "task_name"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValidationError(f"unknown parameter {unknown[0][:40]!r}")
    projects = id_list(params.get("project_ids"), "project_ids",
                       lambda v: check_project(token, v, "project_ids"))
    page = integer(params.get("page"), "page", first, 10**6, default=first)
    size = integer(params.get("page_size"), "page_size", 1, most, default=20)
    query: dict[str, Any] = {"project": {"$in": projects}}
    if states is not None:
        query["state"] = {"$in": states}
    elif params.get("status") not in (None, ""):
        numbers = id_list(params.get("status"), "status", lambda v: integer(v, "status", 1, 6))
        query["state"] = {"$in": [STATE_OF[n] for n in numbers]}
    if params.get("operator_id") not in (None, ""):
        query["center.operator_id"] = str(params["operator_id"])[:64]
    for key in ("merchant_type", "merchant_id"):
        if params.get(key) not in (None, ""):
            query[f"center.{key}"] = integer(params[key], key, 0, 2**53)
    if params.get("task_name") not in (None, ""):
        query["center.name"] = {"$regex": re.escape(str(params["task_name"])[:60])}
    tasks, total = store.page(query, (page - first) * size, size)
    return Page(tasks, total, page, size)


def delete(redis: Redis, task_ids: Any, project_ids: Any, token: Token | None = None,
           operator_id: Any = None) -> dict:
    """Remove tasks (named by id, within ``project_ids``; with ``operator_id``, only that
    operator's) and their files; a running one stops at its next progress write. Ids not found
    (or not visible) are listed, not an error. Deleting is the requester's or an admin's, as
    cancelling is: a task of another requester refuses the whole call (Forbidden) before anything
    is removed. Each removal is audited as ``center.delete``."""
    projects = id_list(project_ids, "project_ids", lambda v: check_project(token, v, "project_ids"))
    ids = id_list(task_ids, "task_ids", str)
    found, missing = [], []
    for task_id in ids:
        try:
            export = get(task_id, token, projects)
        except NotFound:
            missing.append(task_id[:40])
            continue
        if operator_id not in (None, "") and (export.center or {}).get("operator_id") != str(operator_id):
            missing.append(task_id[:40])
            continue
        if token is not None and not access.is_admin(token) and not owns(token, export):
            raise Forbidden("only the task's requester or an admin may delete it")
        found.append(export)
    return {"deleted": [_remove(redis, e, token) for e in found], "not_found": missing}


def _remove(redis: Redis, export: ExportRecord, token: Token | None) -> str:
    if export.state in (PENDING, EXPORT_RUNNING):
        exports.cancel(export.id, utcnow())
        rq_queue(EXPORT_QUEUE, redis).remove(export_entry_id(export.id))
    store.remove(export.id)
    drop_export_file(export.file_id)
    publish(export.id)
    audit.record(token, "center.delete", export.id, export.project)
    return str(export.id)


def disposition(name: str) -> str:
    """A Content-Disposition naming ``name`` (RFC 6266: an ASCII fallback and the UTF-8 name)."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def file_name(export: ExportRecord) -> str | None:
    """A task's file name with its extension (None for an export of a job)."""
    center = export.center or {}
    return f"{center['file_name']}.{export.format}" if center.get("file_name") else None
