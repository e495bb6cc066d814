"""The /v1 dialect of the download center: the interface of linvanda/download that existing
callers use (their parameters, ids, status numbers and answers), translated onto
``master.center.service`` (whose typed form is /api/v1/center).

- Parameters: a caller's ``project_id`` is its own string (``callers.project_of``); a
  ``step`` outside 100-5000 becomes 1000; ``interval`` (ms between pages), ``rowoffset``,
  ``col_align``, ``header_align`` and ``footer_align`` are kept with the download task;
  parameters the center does not know are ignored (a caller sends ``app_id``, ``token``, ...).
- A CSV's header is the rows' keys (the template, title, header and footer are Excel's).
- The callback is a form POST of the center's own ``app_id``, ``data`` = JSON {task_id,
  download_url} and ``token``, on success only (``common.exports.events``).
- Download task ids (``task_id``): ``tagged`` adds a 16-hex tag (HMAC under SECRET_KEY) to the
  download task's ObjectId. The /v1 answers give the tagged form; every /v1 route takes either
  form (the caller is checked anyway); the WebSocket takes only the tagged form, so knowing it is
  what authorises listening.
- Statuses (the numbers /v1 callers know): waiting, queued, running and a failed run that will be retried
  are all shown 3 (处理中), success 4 (处理成功), failed and cancelled 6 (处理失败), expired 100
  (已过期). The list's status filter takes these numbers (3 also means 1, 2 and 5).
"""
from __future__ import annotations

import hmac
import re
from typing import Any

from bson import ObjectId

from common.errors import NotFound
from common.signing import center_tag, center_task_id
from common.store.models import CANCELLED, EXPIRED, EXPORT_RUNNING, FAIL, PENDING, SUCCESS
from common.store.records import DownloadTaskParams, ExportRecord
from master.center import callers
from master.center.params import PARAMS

DOING, SUC, ERR, GONE = 3, 4, 6, 100
STATUS_OF = {PENDING: DOING, EXPORT_RUNNING: DOING, SUCCESS: SUC, FAIL: ERR, CANCELLED: ERR, EXPIRED: GONE}
STATUS_NAME = {DOING: "处理中", SUC: "处理成功", ERR: "处理失败", GONE: "已过期"}
STATES_OF = {1: (PENDING,), 2: (PENDING,), 3: (PENDING, EXPORT_RUNNING), 5: (PENDING,), 4: (SUCCESS,),
             6: (FAIL, CANCELLED), 100: (EXPIRED,)}
ALIGNS = ("left", "center", "right")
TAG_RE = re.compile(r"^([0-9a-f]{24})([0-9a-f]{16})?$")


# --- download task ids ---------------------------------------------------------------------

def tagged(export_id: Any) -> str:
    """The download task id a /v1 caller is given: the ObjectId and its tag (40 hex characters)."""
    return center_task_id(export_id)


def download_task_oid(task_id: Any, need_tag: bool = False) -> str:
    """The ObjectId of a /v1 download task id (tagged or plain; with ``need_tag``, tagged and the
    tag right); NotFound otherwise, as for a download task nobody has."""
    match = TAG_RE.match(str(task_id or "").strip().lower())
    if match is None or (need_tag and (match.group(2) is None or not hmac.compare_digest(
            match.group(2), center_tag(match.group(1))))):
        raise NotFound("任务不存在")
    if match.group(2) is not None and not hmac.compare_digest(match.group(2), center_tag(match.group(1))):
        raise NotFound("任务不存在")
    return match.group(1)


# --- parameters ----------------------------------------------------------------------------

def params_of(params: dict) -> tuple[dict, dict]:
    """A caller's parameters as ``params.check`` takes them, and the /v1 interface's own kept
    beside them in the download task's parameters (interval, alignments, offsets)."""
    given = {k: v for k, v in params.items() if k in PARAMS and v is not None}
    given["project_id"] = callers.project_of(params.get("project_id"))
    given["step"] = _step(params.get("step"))
    for name in ("merchant_type", "merchant_id"):
        if given.get(name) == "":
            del given[name]
    extra = {"v1": True, "interval": _whole(params.get("interval"), 100, 3000, 100),
             "rowoffset": _whole(params.get("rowoffset"), 0, 1000, 0)}
    for name in ("col_align", "header_align", "footer_align"):
        if params.get(name) in ALIGNS:
            extra[name] = params[name]
    if (given.get("type") or "csv") == "csv":
        extra["keys_header"] = True
        for name in ("template", "title", "summary", "header", "footer"):
            given.pop(name, None)
    return given, extra


def _step(value: Any) -> int:
    """The /v1 step: a whole number from 100 to 5000, else 1000."""
    try:
        step = int(str(value).strip())
    except (TypeError, ValueError):
        return 1000
    return step if 100 <= step <= 5000 else 1000


def _whole(value: Any, low: int, high: int, default: int) -> int:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return default
    return min(max(number, low), high)


# --- answers -------------------------------------------------------------------------------

def status_of(export: ExportRecord) -> int:
    return STATUS_OF.get(export.state, DOING)


def _unix(at) -> int | None:
    from calendar import timegm

    return None if at is None else timegm(at.utctimetuple())


def describe(export: ExportRecord) -> dict:
    """A download task as /v1 callers read it (their fields, numbers and names)."""
    params = export.center or DownloadTaskParams()
    status = status_of(export)
    return {
        "id": tagged(export.id), "task_id": tagged(export.id), "name": params.name or None,
        "project_id": callers.key_of(export.project), "file_name": params.file_name or None,
        "type": "excel" if export.format == "xlsx" else export.format, "status": status,
        "status_name": STATUS_NAME[status], "operator_id": params.operator_id,
        "merchant_id": params.merchant_id, "merchant_type": params.merchant_type,
        "step": params.step, "rows": export.rows_done, "size": export.bytes,
        "retry_num": max(0, (export.attempts or 0) - 1), "failed_reason": export.error or "",
        "ctime": _unix(export.created_at), "ftime": _unix(export.finished_at),
    }


def states(status: Any) -> list[str] | None:
    """The states a list's ``status`` filter (comma-separated numbers) means; None: all."""
    wanted: list[str] = []
    for part in str(status or "").split(","):
        part = part.strip()
        if part.isdigit() and int(part) in STATES_OF:
            wanted += [s for s in STATES_OF[int(part)] if s not in wanted]
    return wanted or None


def as_object_id(text: str) -> ObjectId:
    return ObjectId(text)
