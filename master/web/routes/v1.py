"""The /v1 interface (that of linvanda/download, which existing callers use) under /v1, so that a
caller switches by changing its base URL (``master.center.v1`` translates;
``master.center.service`` does the work).

Who is asking: a registered caller's signed parameters (``app_id`` + ``token``:
``master.center.callers.signed``), or ``Authorization: Bearer`` as on /api/v1. Parameters come from the
query and a form or JSON body; a ``data`` parameter (JSON text) holds them all when a caller
wraps them (the signature is then over ``app_id`` and ``data``). Every answer but a file is
``{"status", "msg", "info", "data", "retry"}`` with HTTP 200: status 200 when it went well, else
the /v1 codes (300 bad parameters or no signature, 301 a signature that does not verify, 502 no
such project, 503-505 projects and groups, 507 no such download task, 509 not now, 510 the source
failed, 513 no file to download, 500 anything else).

The WebSocket (``download|<task id>`` on any path, ``ws_router``) needs no token: the tagged
download task id is the credential (``master.center.v1.tagged``).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from fastapi import APIRouter, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from common.errors import (
    Conflict,
    DownclusterError,
    Forbidden,
    NotFound,
    SourceFailed,
    ValidationError,
    too_many_digits,
)
from common.exports.tabular import CONTENT_TYPES
from common.signing import check_export_sig, export_url
from common.store import exports, projects
from common.store.connection import redis_conn
from common.store.control import Token
from common.store.models import SUCCESS
from master import access, audit
from master.center import callers, v1
from master.center import service as center
from master.web.errors import ApiError
from master.web.routes.api import bearer
from master.web.routes.center import _params
from master.web.routes.files import stream_file

router = APIRouter(include_in_schema=False)
ws_router = APIRouter(include_in_schema=False)
CODES: dict[type, int] = {ValidationError: 300, Forbidden: 301, Conflict: 509, SourceFailed: 510}


def envelope(data: Any = None, status: int = 200, msg: str = "") -> JSONResponse:
    """The /v1 answer: always HTTP 200, the outcome in ``status``."""
    return JSONResponse({"status": status, "msg": msg, "info": msg, "data": data if data is not None else [],
                         "retry": 0})


def _who(request: Request, params: dict) -> Token:
    """A Bearer token, else the caller whose signature ``params`` carry."""
    auth = request.headers.get("authorization")
    if auth is not None:
        try:
            return bearer(auth)
        except ApiError as exc:
            raise callers.Refused(301, exc.message) from None
    return callers.signed(params)


def _unwrapped(params: dict) -> dict:
    """The parameters inside ``data`` (JSON text of an object) when a caller wraps them."""
    if "data" not in params:
        return params
    inner = params["data"]
    if isinstance(inner, str):
        try:
            inner = json.loads(inner)
        except (json.JSONDecodeError, RecursionError):
            raise ValidationError("data is not valid JSON") from None
        except ValueError:  # an integer past Python's digit limit
            raise too_many_digits("data") from None
    if not isinstance(inner, dict):
        raise ValidationError("data must be a JSON object of the parameters")
    return inner


Handler = Callable[[dict, Token], Any]


async def _answer(request: Request, work: Handler, missing: int = 507,
                  params: dict | None = None) -> Response:
    """Read, authorise and unwrap the request, run ``work`` (in a thread), and answer it: a
    Response as it is, anything else as the envelope's data; errors as the /v1 codes."""
    try:
        raw = await _params(request) if params is None else params
        token = await run_in_threadpool(_who, request, raw)
        got = await run_in_threadpool(work, _unwrapped(raw), token)
    except (callers.Refused, callers.Exists) as exc:
        return envelope(None, exc.code, str(exc))
    except NotFound as exc:
        return envelope(None, missing, str(exc) if missing == 502 else "任务不存在")
    except ApiError as exc:
        return envelope(None, 300 if exc.status < 500 else 500, exc.message)
    except DownclusterError as exc:
        return envelope(None, next((c for t, c in CODES.items() if isinstance(exc, t)), 500), str(exc))
    return got if isinstance(got, Response) else envelope(got)


def _download_task(params: dict, token: Token | None) -> Any:
    return center.get(v1.download_task_oid(params.get("task_id")), token)


# --- download tasks -------------------------------------------------------------------------

def _deliver(multiple: bool = False) -> Handler:
    def work(params: dict, token: Token) -> dict:
        if multiple:
            params = {**params, "type": "excel"}
        given, extra = v1.params_of(params)
        export = center.deliver(redis_conn(), given, token, extra)
        return {"task_id": v1.tagged(export.id)}
    return work


@router.post("/v1/task")
async def deliver_task(request: Request) -> Response:
    """Deliver a download task: ``data.task_id``."""
    return await _answer(request, _deliver(), missing=502)


@router.post("/v1/task/multiple")
async def deliver_tables(request: Request) -> Response:
    """Deliver a download task of several tables on one sheet (excel; ``source_data`` a list of tables)."""
    return await _answer(request, _deliver(multiple=True), missing=502)


@router.get("/v1/task")
async def one_task(request: Request) -> Response:
    return await _answer(request, lambda p, t: v1.describe(_download_task(p, t)))


def _list(params: dict, token: Token) -> dict:
    keys = params.get("project_ids", params.get("project_id"))
    numbers = [str(callers.project_of(k)) for k in str(keys or "").split(",") if k.strip()]
    filters = {k: params[k] for k in ("operator_id", "merchant_type", "merchant_id", "task_name")
               if params.get(k) not in (None, "")}
    page = center.listing({"project_ids": ",".join(numbers), "page": params.get("page", 0),
                           "page_size": params.get("page_size") or 20, **filters}, token,
                          states=v1.states(params.get("status")), first=0, most=200)
    return {"total": page.total, "data": [v1.describe(t) for t in page.download_tasks]}


@router.get("/v1/tasks")
async def list_tasks(request: Request) -> Response:
    """Tasks of ``project_ids`` (page from 0): ``data: {total, data}``."""
    return await _answer(request, _list, missing=502)


def _plain(task_id: str) -> str:
    """A download task id's ObjectId (a wrong tag: the id as given, which none has)."""
    try:
        return v1.download_task_oid(task_id)
    except NotFound:
        return task_id.strip()[:40]


def _delete(params: dict, token: Token) -> list:
    ids = [_plain(t) for t in str(params.get("task_ids") or "").split(",") if t.strip()]
    keys = [str(callers.project_of(k)) for k in str(params.get("project_ids") or "").split(",") if k.strip()]
    center.delete(redis_conn(), ids, keys, token, params.get("operator_id"))
    return []


@router.post("/v1/tasks/delete")
@router.delete("/v1/tasks")
async def delete_tasks(request: Request) -> Response:
    """Delete tasks by ``task_ids`` within ``project_ids`` (and ``operator_id``'s only, if given)."""
    return await _answer(request, _delete, missing=502)


# --- files ----------------------------------------------------------------------------------

def _file_of(params: dict, token: Token | None) -> Response:
    export = _download_task(params, token)
    if export.state != SUCCESS:
        raise _NoFile(f"任务{v1.tagged(export.id)}未处理成功: {v1.STATUS_NAME[v1.status_of(export)]}")
    return stream_file(export)


class _NoFile(DownclusterError):
    """A download task without a file to give (the /v1 code 513)."""


CODES[_NoFile] = 513


@router.get("/v1/download/async")
async def download_by_task(request: Request) -> Response:
    """The file of a done download task: for a caller (signed or Bearer), or through the link a callback
    carries (``expires`` and ``sig`` beside ``task_id``: no token needed)."""
    query = dict(request.query_params)
    if "sig" in query and "expires" in query and "token" not in query:
        try:
            oid = v1.download_task_oid(query.get("task_id"))
            problem = check_export_sig(oid, query["expires"], query["sig"])
            if problem is not None:
                return envelope(None, 301, f"the link is {problem}")
            return await run_in_threadpool(_file_of, {"task_id": oid}, None)
        except NotFound:
            return envelope(None, 507, "任务不存在")
        except _NoFile as exc:
            return envelope(None, 513, str(exc))
    return await _answer(request, _file_of)


def _url(params: dict, token: Token) -> dict:
    export = _download_task(params, token)
    if export.state != SUCCESS:
        raise _NoFile(f"任务{v1.tagged(export.id)}未处理成功")
    signed = export_url(str(export.id))
    expires, sig = signed.split("expires=", 1)[1].split("&sig=")
    base = signed.split("/files/", 1)[0]
    return {"url": f"{base}/v1/download?ticket={export.id}.{expires}.{sig}"}


@router.get("/v1/download/url")
async def download_url(request: Request) -> Response:
    """A temporary link (EXPORT_URL_TTL, 5 minutes) a browser downloads the file with."""
    return await _answer(request, _url)


@router.get("/v1/download")
async def download_ticket(ticket: str = "") -> Response:
    """The file of a ticket (``/v1/download/url``): no token, the ticket is the credential."""
    oid, _, rest = ticket.partition(".")
    expires, _, sig = rest.partition(".")
    problem = check_export_sig(oid, expires, sig) if v1.TAG_RE.match(oid) else "tampered"
    if problem is not None:
        return envelope(None, 301, f"the ticket is {problem}")
    try:
        return await run_in_threadpool(_file_of, {"task_id": oid}, None)
    except NotFound:
        return envelope(None, 507, "任务不存在")
    except _NoFile as exc:
        return envelope(None, 513, str(exc))


def _sync(multiple: bool = False) -> Handler:
    def work(params: dict, token: Token) -> Response | dict:
        if multiple:
            params = {**params, "type": "excel"}
        given, extra = v1.params_of(params)
        got = center.sync(redis_conn(), given, token, extra)
        if isinstance(got, center.Queued):
            raise _NoFile(f"{got.reason}: queued as task {v1.tagged(got.export.id)} instead")
        return StreamingResponse(
            iter(lambda: got.out.read(256 * 1024), b""), media_type=CONTENT_TYPES[got.format],
            background=BackgroundTask(got.out.close),
            headers={"Content-Length": str(got.size), "Cache-Control": "private, no-store",
                     "X-Export-Rows": str(got.rows), "Content-Disposition": center.disposition(got.name)})
    return work


@router.get("/v1/download/sync")
@router.post("/v1/download/sync")
async def download_sync(request: Request) -> Response:
    """The file at once (small data); too large: 513 naming the download task queued instead."""
    return await _answer(request, _sync(), missing=502)


@router.get("/v1/download/sync/multiple")
@router.post("/v1/download/sync/multiple")
async def download_sync_tables(request: Request) -> Response:
    return await _answer(request, _sync(multiple=True), missing=502)


# --- projects and groups ----------------------------------------------------------------------

def _may_create(token: Token) -> None:
    if not access.is_admin(token) and not token.name.startswith(callers.PREFIX):
        raise Forbidden("only a registered caller or an admin may create projects and groups")


def _group(params: dict, token: Token) -> dict:
    _may_create(token)
    gid = callers.add_group(params.get("name"))
    audit.record(token, "center.group", gid, name=params.get("name"))
    return {"group_id": gid}


def _project(params: dict, token: Token) -> dict:
    """A new project in a group, held from now on by the caller that created it."""
    _may_create(token)
    key, number = callers.add_project(params.get("name"), params.get("group_id"))
    if not access.is_admin(token):
        projects.grant(token.id, [number])
    audit.record(token, "center.project", key, number, name=params.get("name"))
    return {"project_id": key}


@router.post("/v1/group")
async def create_group(request: Request) -> Response:
    return await _answer(request, _group)


@router.post("/v1/project")
async def create_project(request: Request) -> Response:
    return await _answer(request, _project)


# --- the browser's channel ------------------------------------------------------------------

WS_POLL, WS_LIMIT = 1.0, 7200.0


def _final_status(oid: str) -> int | None:
    """The download task's /v1 status when it has ended (4, 6 or 100), None while it runs; NotFound."""
    export = exports.get(v1.as_object_id(oid))
    if export is None or export.center is None:
        raise NotFound("任务不存在")
    status = v1.status_of(export)
    return status if status in (v1.SUC, v1.ERR, v1.GONE) else None


async def _watch(websocket: WebSocket, message: str) -> bool:
    """Answer one ``download|<task id>``: when the download task ends, or at once for an unknown
    one (507).
    False when the message is not one (it is ignored, as /v1 callers expect)."""
    kind, _, task_id = message.partition("|")
    if kind.lower() != "download" or not task_id:
        return False
    try:
        oid = v1.download_task_oid(task_id, need_tag=True)
        waited = 0.0
        while (status := await run_in_threadpool(_final_status, oid)) is None and waited < WS_LIMIT:
            await asyncio.sleep(WS_POLL)
            waited += WS_POLL
    except NotFound:
        gone = {"code": 507, "msg": "任务不存在", "data": []}
        await websocket.send_text(json.dumps(gone, ensure_ascii=False))
        return True
    if status is None:
        answer = {"code": 500, "msg": "任务处理异常，请重试", "data": []}
    else:
        answer = {"code": 200, "msg": "任务处理" + ("成功" if status == v1.SUC else "失败"),
                  "data": {"status": status}}
    await websocket.send_text(json.dumps(answer, ensure_ascii=False))
    return True


@ws_router.websocket("/")
@ws_router.websocket("/{path:path}")
async def task_channel(websocket: WebSocket, path: str = "") -> None:
    """The /v1 WebSocket on any path: each ``download|<task id>`` is answered once the download task
    ends. No token: the tagged download task id, which only its creator was given, is the
    credential, and the answer says only whether the download task succeeded."""
    await websocket.accept()
    try:
        while True:
            message = await websocket.receive_text()
            if len(message) <= 200:
                await _watch(websocket, message)
    except WebSocketDisconnect:
        pass
