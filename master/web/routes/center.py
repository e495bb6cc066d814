"""The download center's download tasks with typed JSON, in the /api/v1 description
(``api_router``: /api/v1/center/tasks), and the parameter reading the /v1 interface shares
(``_params``: the query, and a form or JSON body over it; ``master/web/routes/v1.py``).
Thin: each route reads its parameters and calls ``master.center.service``.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query, Request
from pydantic import BeforeValidator, ConfigDict, Field

from common.config import settings
from common.errors import ValidationError, too_many_digits
from common.store.connection import redis_conn
from master import audit
from master.center import callers
from master.center import service as center
from master.center.params import MAX_PROJECT
from master.projects import resolve
from master.web.contract import ObjectIdPath, answers, whole
from master.web.errors import ApiError
from master.web.routes.api import Admin, Reader, Strict

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
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                raise ValidationError("the body is not valid JSON") from None
            except ValueError:  # an integer past Python's digit limit
                raise too_many_digits("the body") from None
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


# --- the same actions in the /api/v1 description (typed JSON; OpenAPI) -------------------------

api_router = APIRouter(tags=["center"])
SOURCE_URL = r"^[hH][tT][tT][pP][sS]?://[^/?#\s]+"
ProjectId = Annotated[int, Field(ge=1, le=MAX_PROJECT)]
ProjectIds = Annotated[str, Query(pattern=r"^[1-9][0-9]{0,8}(,[1-9][0-9]{0,8}){0,99}$",
                                  description="project ids, comma-separated")]
Pairs = dict[str, Annotated[str, Field(max_length=1024)]]
INVALID_TASK = ("source_url or callback does not resolve to addresses a source may have, the template or "
                "source_data does not fit the forms the center takes, or a name is blank")


class TaskIn(Strict):
    """A download task: the center's parameters with their limits (docs/exports.md)."""
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
        None, description="the Excel template (leaves name keys of the rows); one per table")
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
    """Download tasks of these projects, newest first, with the center's filters and paging."""
    params = {"project_ids": project_ids, "page": page, "page_size": page_size, "status": status,
              "operator_id": operator_id, "merchant_type": merchant_type, "merchant_id": merchant_id,
              "task_name": task_name}
    got = center.listing({k: v for k, v in params.items() if v is not None}, token)
    return {"total": got.total, "page": got.page, "page_size": got.page_size,
            "tasks": [center.describe(t) for t in got.download_tasks]}


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


# --- the callers of the /v1 interface (admins) ----------------------------------------------

WholeProject = Annotated[int, Field(ge=1, le=MAX_PROJECT), BeforeValidator(whole)]


class CallerIn(Strict):
    """A calling system: the app id and secret it signs its /v1 requests with, and its projects."""
    app_id: str = Field(min_length=1, max_length=48, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    projects: list[WholeProject] = Field(min_length=1, max_length=100, description="project ids")
    secret: str | None = Field(None, min_length=8, max_length=128,
                               description="the secret it already has (default: a new one, answered once)")
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"app_id": "mp-backend", "projects": [7]}]})


@api_router.post("/center/callers", status_code=201, responses=answers(
    401, 403, 404, 409, why={409: "a caller of that app_id exists"}))
def add_caller(body: CallerIn, token: Admin) -> dict:
    """Register a caller; ``secret`` in the answer only when the cluster generated it."""
    added = callers.add(body.app_id, [resolve(p, token) for p in body.projects], body.secret)
    audit.record(token, "caller.add", added.app_id, projects=added.projects)
    answer: dict = {"app_id": added.app_id, "projects": added.projects}
    if added.secret is not None:
        answer["secret"] = added.secret
    return answer


@api_router.get("/center/callers", responses=answers(401, 403))
def list_callers(token: Admin) -> dict:
    """Every caller (app id and projects; never a secret)."""
    return {"callers": [{**c, "added": c["added"].isoformat() + "Z" if c["added"] else None}
                        for c in callers.listing()]}


@api_router.delete("/center/callers/{app_id}", responses=answers(401, 403, 404))
def remove_caller(app_id: str, token: Admin) -> dict:
    callers.remove(app_id)
    audit.record(token, "caller.remove", app_id)
    return {"removed": app_id}


class KeyIn(Strict):
    key: str = Field(min_length=1, max_length=80, pattern=callers.KEY_PATTERN,
                     description="the string id callers send (not a plain number)")
    project: WholeProject = Field(description="the project (its id) it names")
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"key": "bf1fd528-b505-4e7c-9c3b-8a1f5d0c2e77", "project": 7}]})


@api_router.post("/center/keys", status_code=201, responses=answers(
    401, 403, 404, 409, why={409: "the key, or a key of that project, exists"}))
def add_key(body: KeyIn, token: Admin) -> dict:
    """Let callers name a project by the string id an earlier center gave them."""
    number = resolve(body.project, token)
    callers.alias(body.key, number)
    audit.record(token, "caller.alias", body.key, number)
    return {"key": body.key, "project": number}
