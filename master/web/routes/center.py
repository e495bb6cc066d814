"""The seed's own interface (seed 000, the general download center) under /v1, so a caller of such
a center switches by changing its base URL: deliver a task (``POST /v1/task``, form or JSON), the
synchronous download (``GET``/``POST /v1/download/sync``), a task by ``task_id``, a list by
``project_ids``, delete by ``task_ids`` + ``project_ids``. The same tokens as /api/v1
(``Authorization: Bearer``); every error is ``{"error": "one line"}``. Thin: each route reads its
parameters and calls ``master.center``; its file, link and WebSocket are the export's
(/api/v1/exports/{task_id}/...).

These /v1 routes are outside the /api/v1 OpenAPI description (they take form or JSON bodies with
the seed's loose types); docs/exports.md describes them. The same actions with typed JSON are in
the description, under /api/v1/center/tasks (``api_router``).
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ConfigDict, Field
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from common.config import settings
from common.errors import SourceFailed, ValidationError
from common.exports.tabular import CONTENT_TYPES
from common.store.connection import redis_conn
from master import center
from master.exports.service import link
from master.web.contract import ObjectIdPath, answers
from master.web.errors import ApiError
from master.web.routes.api import Reader, Strict

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


# --- the same actions in the /api/v1 description (typed JSON; OpenAPI) -------------------------

api_router = APIRouter(tags=["center"])
SOURCE_URL = r"^[hH][tT][tT][pP][sS]?://[^/?#\s]+"
ProjectId = Annotated[int, Field(ge=1, le=center.MAX_PROJECT)]
ProjectIds = Annotated[str, Query(pattern=r"^[1-9][0-9]{0,8}(,[1-9][0-9]{0,8}){0,99}$",
                                  description="project ids, comma-separated")]
Pairs = dict[str, Annotated[str, Field(max_length=1024)]]
INVALID_TASK = ("source_url or callback does not resolve to addresses a source may have, the template or "
                "source_data does not fit the seed's forms, or a name is blank")


class TaskIn(Strict):
    """A download task (seed 000): the seed's parameters with their limits (docs/exports.md)."""
    project_id: ProjectId
    name: str = Field(min_length=2, max_length=60)
    file_name: str | None = Field(None, min_length=1, max_length=100, pattern=r'^[^/\\"\x00-\x1f\x7f]+$')
    type: Literal["csv", "excel"] = "csv"
    callback: str | None = Field(None, max_length=2048, pattern=SOURCE_URL)
    step: int = Field(1000, ge=100, le=5000)
    operator_id: str | None = Field(None, max_length=64)
    merchant_type: int | None = Field(None, ge=0, le=3, description="0 platform 1 station 2 group 3 stations")
    merchant_id: int | None = Field(None, ge=0, le=2**53)
    template: str | dict[str, Any] | list[Any] | None = Field(
        None, description="the seed's Excel template (leaves name keys of the rows); one per table")
    title: str | list[str] | None = Field(None, description="a list, one per table, in multi-table mode")
    summary: str | list[str] | None = None
    header: Pairs | list[Pairs] | None = None
    footer: Pairs | list[Pairs] | None = None
    default_width: float | None = Field(None, ge=1, le=1000)
    default_height: float | None = Field(None, ge=1, le=1000)
    max_exec_time: int | None = Field(None, ge=10, le=settings.EXPORT_MAX_EXEC_TIME_LIMIT)
    source_url: str | None = Field(None, max_length=2048, pattern=SOURCE_URL,
                                   description="pulled page by page (page from 0, page_size, _task_id)")
    source_data: list[Any] | dict[str, Any] | None = Field(
        None, description="the rows (a list of objects; a list of such lists in multi-table mode); "
        "wins over source_url")
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"project_id": 7, "name": "orders today", "type": "excel", "step": 1000, "merchant_type": 2,
         "merchant_id": 88, "source_url": "https://erp.example.org/orders?day=2026-11-26",
         "template": {"order_no": "Order", "amount": "Amount"}}]})


NO_PROJECT = {404: "a project the token does not hold (or none has that id)"}


@api_router.post("/center/tasks", status_code=201, responses=answers(
    401, 404, invalid=INVALID_TASK, why=NO_PROJECT))
def deliver_center_task(body: TaskIn, token: Reader) -> dict:
    """Deliver a download task whose rows come from ``source_url`` or ``source_data`` (as POST /v1/task)."""
    return center.describe(center.deliver(redis_conn(), body.model_dump(exclude_none=True), token))


@api_router.get("/center/tasks", responses=answers(401, 404, why=NO_PROJECT))
def list_center_tasks(
    token: Reader,
    project_ids: ProjectIds,
    page: Annotated[int, Query(ge=1, le=10**6)] = 1,
    page_size: Annotated[int, Query(ge=1, le=100)] = 20,
    status: Annotated[str | None, Query(pattern=r"^[1-6](,[1-6]){0,5}$",
                                        description="status numbers: 1 waiting .. 6 expired")] = None,
    operator_id: Annotated[str | None, Query(max_length=64)] = None,
    merchant_type: Annotated[int | None, Query(ge=0, le=3)] = None,
    merchant_id: Annotated[int | None, Query(ge=0, le=2**53)] = None,
    task_name: Annotated[str | None, Query(max_length=60, description="a part of the task's name")] = None,
) -> dict:
    """Download tasks of these projects, newest first, with the seed's filters and paging."""
    params = {"project_ids": project_ids, "page": page, "page_size": page_size, "status": status,
              "operator_id": operator_id, "merchant_type": merchant_type, "merchant_id": merchant_id,
              "task_name": task_name}
    got = center.listing({k: v for k, v in params.items() if v is not None}, token)
    return {"total": got.total, "page": got.page, "page_size": got.page_size,
            "tasks": [center.describe(t) for t in got.tasks]}


@api_router.get("/center/tasks/{task_id}", responses=answers(401, 404))
def show_center_task(task_id: ObjectIdPath, token: Reader) -> dict:
    """A download task: state and status number, rows, its links once done."""
    return center.describe(center.get(task_id, token))


@api_router.delete("/center/tasks", responses=answers(401, 404, why=NO_PROJECT))
def delete_center_tasks(token: Reader, task_ids: Annotated[str, Query(
        pattern=r"^[0-9a-fA-F]{24}(,[0-9a-fA-F]{24}){0,99}$", description="task ids, comma-separated")],
        project_ids: ProjectIds) -> dict:
    """Remove download tasks (within these projects) and their files; a running one stops."""
    return center.delete(redis_conn(), task_ids, project_ids, token)
