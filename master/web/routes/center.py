"""The seed's own interface (seed 000, the general download center) under /v1, so a caller of such
a center switches by changing its base URL: deliver a task (``POST /v1/task``, form or JSON), the
synchronous download (``GET``/``POST /v1/download/sync``), a task by ``task_id``, a list by
``project_ids``, delete by ``task_ids`` + ``project_ids``. The same tokens as /api/v1
(``Authorization: Bearer``); every error is ``{"error": "one line"}``. Thin: each route reads its
parameters and calls ``master.center``; its file, link and WebSocket are the export's
(/api/v1/exports/{task_id}/...).

These routes are outside the /api/v1 OpenAPI description (they take form or JSON bodies with the
seed's loose types); docs/exports.md describes them.
"""
from __future__ import annotations

import json
from urllib.parse import parse_qsl

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from common.config import settings
from common.errors import SourceFailed, ValidationError
from common.exports.tabular import CONTENT_TYPES
from common.store.connection import redis_conn
from master import center
from master.exports.service import link
from master.web.errors import ApiError
from master.web.routes.api import Reader

router = APIRouter(include_in_schema=False)


async def _params(request: Request) -> dict:
    """The request's parameters: the query, and a JSON or form (urlencoded) body over it."""
    params: dict = dict(request.query_params)
    if request.method in ("POST", "DELETE"):
        body = await request.body()
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if body and kind == "application/json":
            try:
                got = json.loads(body)
            except (ValueError, RecursionError):
                raise ValidationError("the body is not valid JSON") from None
            if not isinstance(got, dict):
                raise ValidationError("the body must be a JSON object of the task's parameters")
            params.update(got)
        elif body and kind in ("application/x-www-form-urlencoded", ""):
            try:
                fields = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=True)
            except (UnicodeDecodeError, ValueError):
                raise ValidationError("the body is not a valid urlencoded form") from None
            for key, value in fields:
                if key in params and key not in request.query_params:
                    raise ValidationError(f"parameter {key[:40]!r} given twice")
                params[key] = value
        elif body:
            raise ApiError(415, "send the parameters as application/json or "
                                "application/x-www-form-urlencoded")
    return params


@router.post("/v1/task", status_code=201)
async def deliver_task(request: Request, token: Reader) -> dict:
    """Deliver a task: its id, state and status; a worker pulls its rows and writes its file."""
    params = await _params(request)
    export = await run_in_threadpool(center.deliver, redis_conn(), params, token)
    return center.describe(export)


@router.get("/v1/task")
def find_task(token: Reader, task_id: str = "", project_id: str = "") -> dict:
    """A task by ``task_id`` (and, when given, its ``project_id``)."""
    projects = [center.check_project(token, project_id)] if project_id else None
    return center.describe(center.get(task_id, token, projects))


@router.get("/v1/task/{task_id}")
def show_task(task_id: str, token: Reader) -> dict:
    return center.describe(center.get(task_id, token))


@router.get("/v1/task/{task_id}/url")
def task_link(task_id: str, token: Reader, ttl: str = "") -> dict:
    """A temporary signed link to a done task's file (default 5 minutes; ``ttl`` seconds)."""
    export = center.get(task_id, token)
    seconds = center.integer(ttl, "ttl", 1, settings.EXPORT_URL_MAX_TTL) if ttl else None
    url, ends = link(str(export.id), seconds, token)
    return {"url": url, "expires_at": ends.isoformat() + "Z"}


@router.get("/v1/tasks")
def list_tasks(request: Request, token: Reader) -> dict:
    """Tasks of ``project_ids`` with the seed's filters and paging (page from 1)."""
    page = center.listing(dict(request.query_params), token)
    return {"total": page.total, "page": page.page, "page_size": page.page_size,
            "tasks": [center.describe(t) for t in page.tasks]}


@router.delete("/v1/tasks")
@router.post("/v1/tasks/delete")
async def delete_tasks(request: Request, token: Reader) -> dict:
    """Delete tasks by ``task_ids`` within ``project_ids`` (comma-separated, or JSON lists)."""
    params = await _params(request)
    unknown = sorted(set(params) - {"task_ids", "project_ids"})
    if unknown:
        raise ValidationError(f"unknown parameter {unknown[0][:40]!r}")
    return await run_in_threadpool(center.delete, redis_conn(), params.get("task_ids"),
                                   params.get("project_ids"), token)


@router.get("/v1/download/sync")
@router.post("/v1/download/sync")
async def download_sync(request: Request, token: Reader) -> Response:
    """The file at once (small data), or 202 and the queued task when it is too large."""
    params = await _params(request)
    try:
        got = await run_in_threadpool(center.sync, redis_conn(), params, token)
    except SourceFailed as exc:
        raise ApiError(502, str(exc)) from None
    if isinstance(got, center.Queued):
        where = f"/v1/task/{got.export.id}"
        return JSONResponse({**center.describe(got.export), "reason": got.reason}, status_code=202,
                            headers={"Location": where})
    return StreamingResponse(
        iter(lambda: got.out.read(256 * 1024), b""),
        media_type=CONTENT_TYPES[got.format],
        background=BackgroundTask(got.out.close),
        headers={"Content-Length": str(got.size), "Cache-Control": "private, no-store",
                 "X-Export-Rows": str(got.rows), "Content-Disposition": center.disposition(got.name)},
    )
