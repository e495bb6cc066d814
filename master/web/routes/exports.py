"""The download center's routes under /api/v1: request an asynchronous export, list,
show, cancel; a synchronous download that answers small exports at once and turns large ones
into asynchronous exports; temporary signed links of a chosen lifetime and a permanent,
token-checked file route; and a WebSocket that tells an export's changes as they happen.

Every route sees only the exports its token may (``master.exports.service.may_see``): to anyone else an
export does not exist (404).
"""
from __future__ import annotations

import asyncio
import json
import tempfile
import time
from datetime import datetime, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BeforeValidator, ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from common.config import settings
from common.errors import NotFound
from common.exports.events import FINAL_STATES, channel, snapshot
from common.exports.tabular import CONTENT_TYPES, WRITERS, file_name
from common.notify import MAIL_RE
from common.store.connection import redis_client, redis_conn
from common.store.control_models import ADMIN
from common.store.data import export_fits, export_source
from master import audit, tokens, views
from master.exports import service as exports
from master.web.contract import (
    JOB_NAME,
    READ,
    JobFilter,
    JobName,
    Limit,
    ObjectIdPath,
    Versions,
    answers,
    whole,
)
from master.web.errors import ApiError
from master.web.routes.api import COOKIE, Reader, Strict, bearer
from master.web.routes.files import stream_file

router = APIRouter(tags=["exports"])
FORMATS = Literal["csv", "jsonl", "xlsx", "warc"]
TEMPLATE_DOC = "an export template, TOML or JSON (columns, header trees, row headers, tables; see the README)"


# constraints before the validator: after it, pydantic publishes them as "ge"/"le", not JSON
# Schema's minimum/maximum
ExecTime = Annotated[int, Field(ge=10, le=settings.EXPORT_MAX_EXEC_TIME_LIMIT), BeforeValidator(whole)]


class ExportFilter(Strict):
    status: list[Annotated[int, Field(ge=100, le=599), BeforeValidator(whole)]] | None = Field(
        None, description="HTTP status codes to keep")
    since: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="downloaded at or after"
    )
    until: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="downloaded before"
    )
    versions: Literal["latest", "all"] | None = Field(
        None, description="revisited pages: each page's latest version (the default) or every stored version")


class ExportIn(Strict):
    job: str = Field(pattern=JOB_NAME, max_length=128)
    format: FORMATS
    template: str | None = Field(None, description=TEMPLATE_DOC)
    filter: ExportFilter | None = None
    callback_url: str | None = Field(None, max_length=2048, pattern=r"^[hH][tT][tT][pP][sS]?://[^/?#\s]+",
                                     description="POSTed the signed link when done (a public http(s) URL)")
    mails: list[Annotated[str, Field(max_length=254, pattern=MAIL_RE.pattern)]] = Field([], max_length=20)
    max_exec_time: ExecTime | None = Field(None, description=(
        "seconds an attempt may run before it is stopped and retried (default EXPORT_MAX_EXEC_TIME)"))
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"job": "news", "format": "xlsx", "filter": {"status": [200], "since": "2026-11-01T00:00:00Z"},
         "mails": ["analyst@example.org"], "max_exec_time": 600}]})


INVALID_EXPORT = ("the template does not validate or does not fit the format, `since` is not before `until`, "
                  "or `callback_url` does not resolve to public addresses")


@router.post("/exports", status_code=202, responses=answers(401, 404, invalid=INVALID_EXPORT))
def request_export(body: ExportIn, token: Reader) -> dict:
    """Queue an export (analysts may); an identical one underway or fresh is returned instead."""
    got = exports.request(redis_conn(), body.job, body.format, body.template or "",
                          body.filter.model_dump() if body.filter else None, body.callback_url, body.mails,
                          max_exec_time=body.max_exec_time, token=token)
    if not got.deduplicated:
        audit.record(token, "export.request", got.export.id, got.export.project, job=got.export.job_name,
                     format=got.export.format)
    return {"id": str(got.export.id), "state": got.export.state, "deduplicated": got.deduplicated}


@router.get("/exports", responses=READ)
def list_exports(token: Reader, job: JobFilter = None, limit: Limit = None) -> dict:
    """The latest exports this token may see (an analyst: its own and its granted jobs')."""
    return {"exports": [exports.describe(e) for e in exports.listing(job, views.clamp(limit, 50), token)]}


@router.get("/exports/{export_id}", responses=answers(401, 404))
def show_export(export_id: ObjectIdPath, token: Reader) -> dict:
    """{"id", "state", "rows_done", "rows_total", "bytes", "url", "error", ...}; ``url`` is a
    temporary signed link (EXPORT_URL_TTL) once SUCCESS."""
    return exports.describe(exports.get(export_id, token))


@router.post("/exports/{export_id}/cancel", responses=answers(401, 403, 404, 409))
def cancel_export(export_id: ObjectIdPath, token: Reader) -> dict:
    """Cancel a PENDING or RUNNING export: its requester or an admin."""
    if token.role != ADMIN and not exports.owns(token, exports.get(export_id, token)):
        raise ApiError(403, "only the export's requester or an admin may cancel it")
    cancelled = exports.cancel(redis_conn(), export_id, token)
    audit.record(token, "export.cancel", cancelled.id, cancelled.project)
    return exports.describe(cancelled)


@router.post("/exports/{export_id}/retry", responses=answers(
    401, 403, 404, 409, why={409: "the export is not FAIL"}))
def retry_export(export_id: ObjectIdPath, token: Reader) -> dict:
    """A FAIL export back to PENDING, its attempts counted afresh (``downcluster export retry``):
    its requester or an admin."""
    retried = exports.retry(redis_conn(), export_id, token)
    audit.record(token, "export.retry", retried.id, retried.project)
    return exports.describe(retried)


Ttl = Annotated[int | None, Query(ge=1, le=settings.EXPORT_URL_MAX_TTL, description=(
    "seconds the link lives (default EXPORT_URL_TTL, 5 minutes; at most EXPORT_URL_MAX_TTL)"))]


@router.get("/exports/{export_id}/link", responses=answers(401, 404, 409))
def export_link(export_id: ObjectIdPath, token: Reader, ttl: Ttl = None) -> dict:
    """A temporary signed link to the file, for a browser: no token needed to follow
    it, it names one file and ends after ``ttl`` seconds."""
    url, ends = exports.link(export_id, ttl, token)
    return {"url": url, "expires_at": ends.isoformat() + "Z"}


@router.get(
    "/exports/{export_id}/file",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "the export's file"},
        **answers(
            401, 404, 409, 410, why={409: "the export is not finished", 410: "the export's file has expired"}
        ),
    },
)
def download_export(export_id: ObjectIdPath, token: Reader) -> StreamingResponse:
    """The file itself for back-end callers (the permanent route; the token is the credential)."""
    return stream_file(exports.get(export_id, token))


# --- synchronous download ----------------------------------------------------------------

class SyncIn(Strict):
    format: FORMATS = "csv"
    template: str | None = Field(None, description=TEMPLATE_DOC)
    filter: ExportFilter | None = None
    max_exec_time: ExecTime | None = Field(
        None, description="for the asynchronous export a large one becomes"
    )
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"format": "xlsx", "filter": {"status": [200]}}]}
    )


SYNC_ANSWERS = {
    200: {
        "description": "the file, written at once",
        "content": {t.split(";")[0]: {} for t in CONTENT_TYPES.values()},
    },
    202: {
        "description": "too many rows (EXPORT_SYNC_MAX_ROWS) or every slot busy (EXPORT_SYNC_SLOTS): an "
        "asynchronous export was queued; `Location` is its address",
        "headers": {"Location": {"schema": {"type": "string"}, "description": "/api/v1/exports/{id}"}},
    },
    **answers(401, 404, invalid=INVALID_EXPORT),
}


def _download(name: str, body: SyncIn, token) -> Response:
    flt = body.filter.model_dump() if body.filter else None
    checked = exports.check(name, body.format, body.template or "", flt, token)
    fits = export_fits(checked.job.id, checked.filter, checked.template, settings.EXPORT_SYNC_MAX_ROWS)
    reason = None if fits else f"more than EXPORT_SYNC_MAX_ROWS ({settings.EXPORT_SYNC_MAX_ROWS}) rows"
    slots = exports.sync_slots()
    if reason is None and not slots.acquire(blocking=False):
        reason = f"all {settings.EXPORT_SYNC_SLOTS} synchronous slots of this web process are busy"
    if reason:
        got = exports.request(redis_conn(), name, body.format, body.template or "", flt,
                              max_exec_time=body.max_exec_time, token=token)
        where = f"/api/v1/exports/{got.export.id}"
        return JSONResponse(
            {
                "id": str(got.export.id),
                "state": got.export.state,
                "deduplicated": got.deduplicated,
                "reason": reason,
            },
            status_code=202,
            headers={"Location": where},
        )
    out = tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024)
    try:
        source = export_source(checked.job.id, checked.filter, checked.template, body.format)
        rows = WRITERS[body.format](checked.template, source, out)
    except BaseException:
        out.close()
        raise
    finally:
        slots.release()
    size = out.tell()
    out.seek(0)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return StreamingResponse(
        iter(lambda: out.read(256 * 1024), b""),
        media_type=CONTENT_TYPES[body.format],
        background=BackgroundTask(out.close),
        headers={
            "Content-Length": str(size),
            "Cache-Control": "private, no-store",
            "X-Export-Rows": str(rows),
            "Content-Disposition": f'attachment; filename="{file_name(f"{name}-{stamp}", body.format)}"',
        },
    )


@router.get("/jobs/{name}/export", status_code=200, response_class=StreamingResponse, responses=SYNC_ANSWERS)
def download_now(
    name: JobName,
    token: Reader,
    format: FORMATS = "csv",
    template: Annotated[str | None, Query(max_length=8192, description=TEMPLATE_DOC)] = None,
    status: Annotated[
        str | None,
        Query(
            pattern=r"^[1-5]\d\d(,[1-5]\d\d)*$",
            max_length=400,
            description="HTTP status codes to keep, comma-separated",
        ),
    ] = None,
    since: Annotated[str | None, Query(max_length=40, json_schema_extra={"format": "date-time"})] = None,
    until: Annotated[str | None, Query(max_length=40, json_schema_extra={"format": "date-time"})] = None,
    versions: Versions = "latest",
) -> Response:
    """The synchronous download: the file at once when the job's matching rows are at most
    EXPORT_SYNC_MAX_ROWS and a slot is free; otherwise 202 and an asynchronous export."""
    flt = ExportFilter(
        status=[int(s) for s in status.split(",")] if status else None, since=since, until=until,
        versions=versions,
    )
    return _download(name, SyncIn(format=format, template=template, filter=flt, max_exec_time=None), token)


@router.post("/jobs/{name}/export", status_code=200, response_class=StreamingResponse, responses=SYNC_ANSWERS)
def download_now_with_body(name: JobName, body: SyncIn, token: Reader) -> Response:
    """The synchronous download with its parameters in a JSON body (for templates too long for a URL)."""
    return _download(name, body, token)


# --- events ------------------------------------------------------------------------------

WS_RECHECK = 5.0  # seconds between two checks of a WebSocket's token while it streams


def _ws_token(websocket: WebSocket):
    """The token of a WebSocket handshake: ``Authorization: Bearer`` or the console's session
    cookie (same origin only: a page elsewhere cannot use a visitor's session)."""
    auth = websocket.headers.get("authorization")
    if auth is not None:
        try:
            return bearer(auth)
        except ApiError:
            return None
    origin, host = websocket.headers.get("origin"), websocket.headers.get("host", "")
    if origin is not None and origin.split("://", 1)[-1] != host:
        return None
    found = tokens.session_of(websocket.cookies.get(COOKIE))
    return found[0] if found else None


def _current(export_id: str, token) -> dict | None:
    try:
        return snapshot(exports.get(export_id, token))  # one read: the same fields its events carry
    except NotFound:
        return None


async def _follow(websocket: WebSocket, pubsub, export_id: str, token, last: dict) -> bool:
    """Send each change of the export after ``last`` until a final state (True); False when the
    client went away, or the token was revoked meanwhile (then closed with 1008)."""
    closed = asyncio.ensure_future(websocket.receive())
    checked = time.monotonic()
    while last["state"] not in FINAL_STATES:
        got = asyncio.ensure_future(
            pubsub.get_message(ignore_subscribe_messages=True, timeout=WS_RECHECK))
        done, _ = await asyncio.wait({got, closed}, return_when=asyncio.FIRST_COMPLETED)
        if closed in done:
            got.cancel()
            return False
        if time.monotonic() - checked >= WS_RECHECK:  # a token revoked meanwhile ends the stream
            checked = time.monotonic()
            if await run_in_threadpool(_ws_token, websocket) is None:
                got.cancel()
                await websocket.send_json({"error": "the token was revoked or the session ended"})
                await websocket.close(code=1008)
                return False
        message = got.result()
        now = (
            json.loads(message["data"])
            if message
            else await run_in_threadpool(_current, export_id, token)
        )
        if now and now != last:  # a quiet spell is checked by reading: a lost event is made good
            last = now
            await websocket.send_json(now)
    closed.cancel()
    return True


@router.websocket("/exports/{export_id}/events")
async def export_events(websocket: WebSocket, export_id: str) -> None:
    """Every change of the export's state and progress as a JSON text message (the same fields as
    its events: id, state, rows_done, rows_total, bytes, attempts, error, finished_at), starting
    with the current one; closed (1000) after a final state. A handshake without a valid token is
    refused; an export this token may not see ends with {"error"} and close code 4404; a token
    revoked (or a session ended) while it streams ends it within WS_RECHECK s, with close code 1008."""
    token = await run_in_threadpool(_ws_token, websocket)
    if token is None:
        await websocket.close(code=1008)
        return
    await websocket.accept()
    first = await run_in_threadpool(_current, export_id, token)
    if first is None:
        await websocket.send_json({"error": f"no export {export_id[:40]!r}"})
        await websocket.close(code=4404)
        return
    redis = redis_client(asynchronous=True)  # one connection: the subscription's own
    pubsub = redis.pubsub()
    try:
        await pubsub.subscribe(channel(export_id))
        last = (
            await run_in_threadpool(_current, export_id, token) or first
        )  # read after subscribing: nothing missed
        await websocket.send_json(last)
        if await _follow(websocket, pubsub, export_id, token, last):
            await websocket.close(code=1000)
    except WebSocketDisconnect:
        pass
    finally:
        await pubsub.aclose()
        await redis.aclose()
