"""What the API promises in /api/v1/openapi.json, in one place: the one error body, the statuses
each route can answer and why, the types of names and ids, and operation ids. Routes take their
parameter types from here, so the published constraints and the ones the server checks are the
same declarations (a request the description allows is accepted, one it forbids gets 422)."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path, Query
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field

from common.store.models import TASK_STATUSES
from master.registry import NAME_RE

OBJECT_ID = r"^[0-9a-fA-F]{24}$"
JOB_NAME = NAME_RE.pattern

JobName = Annotated[str, Path(pattern=JOB_NAME, max_length=128, description="a job's name",
                              examples=["news"])]
ObjectIdPath = Annotated[str, Path(pattern=OBJECT_ID, description="a MongoDB ObjectId, 24 hex digits",
                                   examples=["6561d2f0a1b2c3d4e5f60718"])]
After = Annotated[str | None, Query(pattern=OBJECT_ID, description="the `next` of the previous page")]
Limit = Annotated[int | None, Query(ge=1, description="items per page (default 100; more than API_MAX_LIMIT "
                                                      "is answered with API_MAX_LIMIT)")]
Versions = Annotated[Literal["latest", "all"], Query(
    description="revisited pages: `latest` (each page's newest version) or `all` (every stored version)")]
TaskStatus = Literal[TASK_STATUSES]  # type: ignore[valid-type]
JobFilter = Annotated[str | None, Query(min_length=1, max_length=128, description="only this job's entries")]


class ErrorOut(BaseModel):
    """Every error of the API and console: one line, never a traceback or a secret."""
    error: str = Field(examples=["no job named 'news'"])


WHY = {
    400: "malformed request framing (Content-Length not a number)",
    401: "no token, or an unknown or revoked one (carries WWW-Authenticate: Bearer)",
    403: "the token's role may not do this, or a console session sent no X-CSRF-Token",
    404: "the named job, export, document or log does not exist",
    409: "the thing exists but its state forbids this (another dispatcher runs, the export is final)",
    410: "the link or the export has expired",
    413: "request body over API_MAX_BODY",
    415: "a body of a media type this operation does not take",
    422: "the request breaks this description (the error names the field)",
    503: "Redis or MongoDB is unreachable (the error names which, host:port)",
}
EVERY = (400, 413, 422, 503)


def answers(*codes: int, invalid: str | None = None, why: dict[int, str] | None = None) -> dict:
    """The ``responses`` of an operation: its error statuses with the error schema. ``invalid``
    describes a 422 the schema cannot express (a TOML manifest that does not validate); ``why``
    replaces the general reason of a status for this operation."""
    reasons = {**WHY, **(why or {})}
    if invalid:
        reasons[422] = f"{WHY[422]}; or {invalid}"
    return {code: {"model": ErrorOut, "description": reasons[code]} for code in sorted({*codes, *EVERY})}


READ = answers(401)  # a reader's GET without a path parameter


def operation_id(route: APIRoute) -> str:
    """The route function's name (``list_jobs``, ``request_export``): stable, and a good method
    name in a generated client."""
    return route.name


def whole(value: Any) -> Any:
    """JSON has numbers, not integers: 200.0 is the integer 200 (JSON Schema says so too); used
    as a ``BeforeValidator`` of an integer field of a strict model."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
