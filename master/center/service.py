"""The general download center's service: download tasks whose rows come from their caller's own
``source_url`` or ``source_data``, delivered (``params.check``), looked up by ``task_id`` or
listed by ``project_ids``, deleted, and downloaded at once when small (``sync``).

A download task is an export (``common/store/exports.py``) with a ``project`` and a ``center``
document (its parameters, ``DownloadTaskParams``) instead of a job: it is queued on
``down_export``, claimed, beaten, recovered, retried, settled, linked, announced (callback,
WebSocket) and expired (EXPORT_TTL, 7 days) by the one export protocol, reached through the
export service's public functions (``submit``, ``delete``, ``may_see``, ``owns``, ``sync_slots``);
only where its rows come from differs (``slave/center.py``). The command line
(``master.center.cli``), the /api/v1 center and the /v1 interface (``master/web/routes/center.py``,
``v1.py``) are thin doors onto ``deliver``, ``get``, ``listing``, ``delete`` and ``sync`` here.

Status numbers of the /api/v1 center, with the state word beside them in every answer: 1 waiting
(PENDING), 2 processing (RUNNING), 3 done (SUCCESS), 4 failed (FAIL), 5 cancelled (CANCEL),
6 expired (EXPIRED: the file was removed 7 days after). The /v1 interface has its own (``v1.py``).
"""
from __future__ import annotations

import hashlib
import json
import secrets
import tempfile
from dataclasses import dataclass, replace
from typing import IO, Any, cast
from urllib.parse import quote

from bson import ObjectId
from redis import Redis

from common.config import settings
from common.errors import Forbidden, NotFound, ValidationError
from common.exports.sources import Puller, look_of, pull, pull_options, write_inline, write_pulled
from common.signing import export_url
from common.store import center as store
from common.store import exports
from common.store.clock import iso, utcnow
from common.store.control import Token
from common.store.models import SUCCESS
from common.store.records import DownloadTaskParams, ExportRecord
from master import access, audit
from master.center.params import Delivery, check, check_project, integer, private_allowed
from master.exports.service import delete as delete_export
from master.exports.service import may_see, owns, submit, sync_slots

STATUS = {"PENDING": 1, "RUNNING": 2, "SUCCESS": 3, "FAIL": 4, "CANCEL": 5, "EXPIRED": 6}
STATUS_TEXT = {1: "waiting", 2: "processing", 3: "done", 4: "failed", 5: "cancelled", 6: "expired"}
STATE_OF = {n: s for s, n in STATUS.items()}


def deliver(redis: Redis, given: dict, token: Token | None = None,
            extra: dict | None = None) -> ExportRecord:
    """Check a download task and queue it on down_export (a worker pulls its source and writes its
    file); audited as ``center.deliver``. ``extra``: parameters of the /v1 interface kept beside
    the checked ones (``master.center.v1.params_of``); a /v1 download task identical to one of
    the same caller underway, or done within EXPORT_DEDUP_WINDOW, is that one."""
    delivery = _with(check(given, token), extra)
    if not (extra or {}).get("v1"):
        return _store(redis, delivery, token)
    digest = "center:" + hashlib.sha256(json.dumps([given, extra], sort_keys=True, default=str,
                                                   ensure_ascii=False).encode()).hexdigest()
    return _store(redis, delivery, token, digest)


def _with(delivery: Delivery, extra: dict | None) -> Delivery:
    """The delivery with the /v1 interface's parameters (``extra``) in its ``params``."""
    return replace(delivery, params=replace(delivery.params, **extra)) if extra else delivery


def _store(redis: Redis, delivery: Delivery, token: Token | None, digest: str | None = None) -> ExportRecord:
    """Store and queue the download task (with ``digest``: or answer the identical one underway)."""
    now = utcnow()
    record = ExportRecord(
        id=ObjectId(), format=delivery.format, template="", filter={},
        digest=digest or f"center:{ObjectId()}",
        callback_urls=[delivery.callback] if delivery.callback else [], mails=[],
        requested_by=token.name if token else "", created_at=now, retry_at=now,
        max_exec_time=delivery.max_exec_time, project=delivery.project_id, center=delivery.params,
        owner=token.id if token else None)
    export = submit(redis, record, dedup=digest is not None)
    if export.id == record.id:
        audit.record(token, "center.deliver", export.id, export.project, name=delivery.params.name)
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
    """Too large (or every slot busy) for a synchronous answer: the download task queued instead."""
    export: ExportRecord
    reason: str


def sync(redis: Redis, given: dict, token: Token | None = None,
         extra: dict | None = None) -> Written | Queued:
    """The synchronous download: the same parameters, the file written here and now when the
    rows are at most EXPORT_SYNC_MAX_ROWS (source_data's count, or source_url's first page's
    total) and a slot is free; otherwise the download task is queued as ``deliver`` would. A
    source that breaks its word raises SourceFailed (nothing is answered but the one line)."""
    delivery = _with(check(given, token), extra)
    slots = sync_slots()
    if not slots.acquire(blocking=False):
        return Queued(_store(redis, delivery, token),
                      f"all {settings.EXPORT_SYNC_SLOTS} synchronous slots of this process are busy")
    out = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)
    try:
        rows = _write_now(delivery, cast(IO[bytes], out), settings.EXPORT_SYNC_MAX_ROWS)
    except BaseException:
        out.close()
        raise
    finally:
        slots.release()
    if isinstance(rows, str):
        out.close()
        return Queued(_store(redis, delivery, token), rows)
    size = out.tell()
    out.seek(0)
    return Written(cast(IO[bytes], out), size, rows, f"{delivery.params.file_name}.{delivery.format}",
                   delivery.format)


def _write_now(delivery: Delivery, out: IO[bytes], limit: int) -> int | str:
    """Write the file into ``out``: its rows, or why it is too large to write at once."""
    params = delivery.params
    look = look_of(params)
    if delivery.tables:
        if sum(len(t) for t in delivery.tables) > limit:
            return f"more than EXPORT_SYNC_MAX_ROWS ({limit}) rows"
        return write_inline(look, delivery.tables, delivery.format, out)[1]
    with Puller(params.source_url or "", params.step, f"sync-{secrets.token_hex(6)}",
                private_allowed(delivery.project_id), **pull_options(params)) as puller:
        pulled = pull(puller, look)
        if pulled.total is None or pulled.total > limit:
            return ("the source gives no total" if pulled.total is None else
                    f"the source's total {pulled.total} is more than EXPORT_SYNC_MAX_ROWS ({limit})")
        return write_pulled(pulled, delivery.format, out)


def get(task_id: Any, token: Token | None = None, project_ids: list[int] | None = None) -> ExportRecord:
    """A download task by id that the token may see: one of a project it holds, as every task of
    the project is for the systems that share it (404 otherwise, and for an export of a job)."""
    try:
        export = exports.get(ObjectId(str(task_id)))
    except Exception:
        export = None
    if (export is None or export.center is None or not may_see(token, export)
            or (project_ids is not None and export.project not in project_ids)):
        raise NotFound(f"no task {str(task_id)[:40]!r}")
    return export


def describe(export: ExportRecord) -> dict:
    """A download task as the /api/v1 center answers it (status number and the state word beside it)."""
    params = export.center or DownloadTaskParams()
    status = STATUS.get(export.state, 0)
    ok = export.state == SUCCESS
    return {
        "task_id": str(export.id), "project_id": export.project, "name": params.name or None,
        "file_name": params.file_name or None, "type": "excel" if export.format == "xlsx" else export.format,
        "status": status, "status_text": STATUS_TEXT.get(status, ""), "state": export.state,
        "operator_id": params.operator_id, "merchant_type": params.merchant_type,
        "merchant_id": params.merchant_id, "source": "source_url" if params.source_url
        else "source_data", "step": params.step, "rows": export.rows_done, "total": export.rows_total,
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
class Listing:
    """A page of download tasks: ``page`` of ``page_size``, ``total`` in all."""
    download_tasks: list[ExportRecord]
    total: int
    page: int
    page_size: int


def listing(params: dict, token: Token | None = None, states: list[str] | None = None,
            first: int = 1, most: int = 100) -> Listing:
    """Download tasks of ``project_ids`` newest first, with the center's filters (status, operator_id,
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
    states = _states(params) if states is None else states
    wanted = store.Wanted(
        projects, states,
        operator_id=None if params.get("operator_id") in (None, "") else str(params["operator_id"])[:64],
        merchant_type=_filter_number(params, "merchant_type"),
        merchant_id=_filter_number(params, "merchant_id"),
        name_part=None if params.get("task_name") in (None, "") else str(params["task_name"])[:60])
    found, total = store.page(wanted, (page - first) * size, size)
    return Listing(found, total, page, size)


def _states(params: dict) -> list[str] | None:
    """The states a listing's ``status`` numbers name (None: every state)."""
    if params.get("status") in (None, ""):
        return None
    numbers = id_list(params.get("status"), "status", lambda v: integer(v, "status", 1, 6))
    return [STATE_OF[n] for n in numbers]


def _filter_number(params: dict, key: str) -> int | None:
    return None if params.get(key) in (None, "") else integer(params[key], key, 0, 2**53)


def delete(redis: Redis, task_ids: Any, project_ids: Any, token: Token | None = None,
           operator_id: Any = None) -> dict:
    """Remove download tasks (named by id, within ``project_ids``; with ``operator_id``, only that
    operator's) and their files; a running one stops at its next progress write. Ids not found
    (or not visible) are listed, not an error. Deleting is the requester's or an admin's, as
    cancelling is: a download task of another requester refuses the whole call (Forbidden) before
    anything is removed. Each removal is audited as ``center.delete``."""
    projects = id_list(project_ids, "project_ids", lambda v: check_project(token, v, "project_ids"))
    ids = id_list(task_ids, "task_ids", str)
    found, missing = [], []
    for task_id in ids:
        try:
            export = get(task_id, token, projects)
        except NotFound:
            missing.append(task_id[:40])
            continue
        operator = export.center.operator_id if export.center is not None else None
        if operator_id not in (None, "") and operator != str(operator_id):
            missing.append(task_id[:40])
            continue
        if token is not None and not access.is_admin(token) and not owns(token, export):
            raise Forbidden("only the task's requester or an admin may delete it")
        found.append(export)
    return {"deleted": [_remove(redis, e, token) for e in found], "not_found": missing}


def _remove(redis: Redis, export: ExportRecord, token: Token | None) -> str:
    delete_export(redis, export)
    audit.record(token, "center.delete", export.id, export.project)
    return str(export.id)


def disposition(name: str) -> str:
    """A Content-Disposition naming ``name`` (RFC 6266: an ASCII fallback and the UTF-8 name)."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def file_name(export: ExportRecord) -> str | None:
    """A download task's file name with its extension (None for an export of a job)."""
    params = export.center
    return f"{params.file_name}.{export.format}" if params is not None and params.file_name else None
