"""The /api/v1 routes. Each is a thin door onto the function the CLI calls for the same action
(master.registry, master.intake, master.tasks, master.views, master.stats, the dispatcher)."""
from __future__ import annotations

import hmac
import json
import subprocess
import sys
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, ValidationError as PydanticError
from starlette.concurrency import run_in_threadpool

from common.config import settings
from common.connections import redis_conn
from common.errors import ValidationError
from common.models import ADMIN, TASK_STATUSES, ApiToken
from master import registry, stats, tasks, tokens, views
from master.intake import add_tasks
from master.web.errors import ApiError

router = APIRouter()
COOKIE = "dc_session"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


# --- who is asking -----------------------------------------------------------------------

def caller(request: Request) -> ApiToken:
    """The token behind a request: ``Authorization: Bearer`` or a console session (whose
    state-changing requests must carry the session's X-CSRF-Token)."""
    auth = request.headers.get("authorization")
    if auth is not None:
        scheme, _, secret = auth.partition(" ")
        if scheme.lower() != "bearer" or not secret.strip():
            raise ApiError(401, "the Authorization header must hold a Bearer token")
        token = tokens.authenticate(secret.strip())
        if token is None:
            raise ApiError(401, "unknown or revoked token")
        return token
    cookie = request.cookies.get(COOKIE)
    if cookie:
        found = tokens.session_of(cookie)
        if found is None:
            raise ApiError(401, "session ended: sign in again")
        token, csrf = found
        if request.method not in SAFE_METHODS and not hmac.compare_digest(
                request.headers.get("x-csrf-token", "").encode(), csrf.encode()):
            raise ApiError(403, "missing or wrong X-CSRF-Token for a console session")
        return token
    raise ApiError(401, "missing token: send it as a Bearer token in the Authorization header")


def admin(token: Annotated[ApiToken, Depends(caller)]) -> ApiToken:
    if token.role != ADMIN:
        raise ApiError(403, f"role {token.role} may not change anything: an admin token is needed")
    return token


Reader = Annotated[ApiToken, Depends(caller)]
Admin = Annotated[ApiToken, Depends(admin)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- session (console sign-in) -----------------------------------------------------------

class SignIn(Strict):
    token: str


@router.post("/session", tags=["session"])
def sign_in(body: SignIn, request: Request, response: Response) -> dict:
    """Exchange a token for an HttpOnly, SameSite=Strict session cookie (the console's sign-in)."""
    token = tokens.authenticate(body.token)
    if token is None:
        raise ApiError(401, "unknown or revoked token")
    secret, csrf = tokens.start_session(token)
    response.set_cookie(COOKIE, secret, max_age=settings.WEB_SESSION_TTL, httponly=True, samesite="strict",
                        secure=settings.WEB_COOKIE_SECURE or request.url.scheme == "https", path="/")
    return {"name": token.name, "role": token.role, "csrf": csrf}


@router.get("/session", tags=["session"])
def whoami(request: Request, token: Reader) -> dict:
    found = tokens.session_of(request.cookies.get(COOKIE))
    return {"name": token.name, "role": token.role, "csrf": found[1] if found else None}


@router.post("/session/end", tags=["session"])
def sign_out(request: Request, response: Response) -> dict:
    tokens.end_session(request.cookies.get(COOKIE))
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return {"signed_out": True}


# --- jobs --------------------------------------------------------------------------------

class JobIn(Strict):
    manifest: str
    code: str | None = None


@router.get("/jobs", tags=["jobs"])
def list_jobs(_: Reader) -> dict:
    return {"jobs": views.job_rows()}


@router.post("/jobs", tags=["jobs"], status_code=201,
             responses={200: {"description": "an existing job was updated"}, 422: {"description": "invalid"}})
def register_job(body: JobIn, response: Response, _: Admin) -> dict:
    """Validate and store a job, as ``downcluster job register`` does (nothing stored when invalid)."""
    job, created = registry.register_text(body.manifest, body.code)
    response.status_code = 201 if created else 200
    return {"name": job.name}


@router.get("/jobs/{name}", tags=["jobs"])
def show_job(name: str, _: Reader) -> dict:
    return views.job_detail(name)


@router.post("/jobs/{name}/enable", tags=["jobs"])
def enable_job(name: str, _: Admin) -> dict:
    return {"name": name, "status": registry.set_status(name, "ON").status}


@router.post("/jobs/{name}/disable", tags=["jobs"])
def disable_job(name: str, _: Admin) -> dict:
    return {"name": name, "status": registry.set_status(name, "OFF").status}


# --- tasks -------------------------------------------------------------------------------

class UrlsIn(Strict):
    urls: list[str]
    host: str = ""


class StatusesIn(Strict):
    status: list[Literal[TASK_STATUSES]] | None = None  # type: ignore[valid-type]


def _intake(name: str, lines: list[str], host: str) -> dict:
    report = add_tasks(name, lines, host=host)
    return {"added": report.added, "duplicate": report.duplicate,
            "rejected": [{"line": n, "reason": r} for n, r in report.errors[:1000]]}


@router.post("/jobs/{name}/tasks", tags=["tasks"], openapi_extra={"requestBody": {"required": True, "content": {
    "text/plain": {"schema": {"type": "string", "description": "one URL a line"}},
    "application/json": {"schema": UrlsIn.model_json_schema()}}}})
async def add_job_tasks(name: str, request: Request, _: Admin) -> dict:
    """Add URLs: a text/plain body (one a line) or JSON {"urls": [...], "host": "..."}."""
    raw = await request.body()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind == "application/json":
        try:
            body = UrlsIn.model_validate_json(raw)
        except PydanticError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "body"
            raise ValidationError(f"{where}: {first.get('msg', 'invalid')}") from None
        lines, host = body.urls, body.host
    elif kind in ("text/plain", ""):
        lines, host = raw.decode("utf-8", errors="replace").splitlines(), ""
    else:
        raise ApiError(415, "send text/plain (one URL a line) or application/json")
    if any("\n" in u or "\r" in u for u in lines):
        raise ValidationError("a URL must be one line")
    return await run_in_threadpool(_intake, name, lines, host)


@router.get("/jobs/{name}/tasks", tags=["tasks"])
def list_tasks(name: str, _: Reader, status: str | None = None, limit: int | None = None,
               after: str | None = None) -> dict:
    return views.task_page(name, status, limit, after)


@router.post("/jobs/{name}/tasks/cancel", tags=["tasks"])
def cancel_tasks(name: str, body: StatusesIn, _: Admin) -> dict:
    return {"cancelled": tasks.cancel(name, tuple(body.status or tasks.CANCELLABLE_DEFAULT))}


@router.post("/jobs/{name}/tasks/requeue", tags=["tasks"])
def requeue_tasks(name: str, body: StatusesIn, _: Admin) -> dict:
    return {"requeued": tasks.requeue(name, tuple(body.status or tasks.REQUEUE_DEFAULT))}


# --- dispatch, stats ---------------------------------------------------------------------

@router.post("/dispatch", tags=["cluster"], responses={409: {"description": "another dispatcher holds the lock"}})
def dispatch(_: Admin) -> dict:
    """One dispatcher run, as ``downcluster dispatch`` (in a child process, so its watchdog
    can stop a run that overstays without stopping this server)."""
    proc = subprocess.run([sys.executable, "-m", "common.cli", "dispatch", "--json"], capture_output=True,
                          text=True, timeout=settings.DISPATCH_USE_POOL_TIMEOUT + 60)
    line = (proc.stderr.strip().splitlines() or [""])[-1].removeprefix("error: ")
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    status = {75: 409, 2: 422, 1: 503 if "unreachable" in line else 500}.get(proc.returncode, 500)
    raise ApiError(status, line or f"dispatcher exited with {proc.returncode}")


@router.get("/stats", tags=["cluster"])
def get_stats(_: Reader) -> dict:
    """The same object as ``downcluster stats --json``."""
    return stats.collect(redis_conn())


@router.get("/overview", tags=["cluster"])
def get_overview(_: Reader) -> dict:
    """Stats, workers alive (host, downloads in flight, jobs they run) and the last alerts."""
    return views.overview(redis_conn())


# --- data, logs --------------------------------------------------------------------------

@router.get("/jobs/{name}/data", tags=["data"])
def list_data(name: str, _: Reader, limit: int | None = None, after: str | None = None) -> dict:
    return views.data_page(name, limit, after)


@router.get("/data/{data_id}/body", tags=["data"], response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}}})
def get_body(data_id: str, _: Reader) -> StreamingResponse:
    """The stored response body, byte-exact, as an attachment (never rendered on this origin)."""
    length, chunks = views.body(data_id)
    return StreamingResponse(chunks, media_type="application/octet-stream", headers={
        "Content-Length": str(length), "Content-Disposition": f'attachment; filename="{data_id}.body"',
        "Content-Security-Policy": "sandbox", "Cache-Control": "private, no-store"})


@router.get("/logs/{kind}", tags=["logs"])
def list_logs(kind: Literal["download", "dispatch", "alert", "registration"], _: Reader, job: str | None = None,
              limit: int | None = None, after: str | None = None) -> dict[str, Any]:
    """One log, newest first: download, dispatch, alert or registration."""
    return views.log_page(kind, job, limit, after)


# --- exports -----------------------------------------------------------------------------

class ExportFilter(Strict):
    status: list[int | str] | None = None
    since: str | None = None
    until: str | None = None


class ExportIn(Strict):
    job: str
    format: Literal["csv", "jsonl", "xlsx"]
    template: str | None = None
    filter: ExportFilter | None = None
    callback_url: str | None = None
    mails: list[str] = []


@router.post("/exports", tags=["exports"], status_code=202)
def request_export(body: ExportIn, token: Reader) -> dict:
    """Queue an export (analysts may); an identical one underway or fresh is returned instead."""
    from master.exports import request

    got = request(redis_conn(), body.job, body.format, body.template or "",
                  body.filter.model_dump() if body.filter else None, body.callback_url, body.mails,
                  requested_by=token.name)
    return {"id": str(got.export.id), "state": got.export.state, "deduplicated": got.deduplicated}


@router.get("/exports", tags=["exports"])
def list_exports(_: Reader, job: str | None = None, limit: int | None = None) -> dict:
    from master.exports import describe, listing

    return {"exports": [describe(e) for e in listing(job, views.clamp(limit, 50))]}


@router.get("/exports/{export_id}", tags=["exports"])
def show_export(export_id: str, _: Reader) -> dict:
    """{"id", "state", "rows_done", "rows_total", "bytes", "url", "error", ...}; ``url`` is a signed link once SUCCESS."""
    from master.exports import describe, get

    return describe(get(export_id))


@router.post("/exports/{export_id}/cancel", tags=["exports"])
def cancel_export(export_id: str, token: Reader) -> dict:
    """Cancel a PENDING or RUNNING export: its requester or an admin."""
    from master.exports import cancel, describe, get

    if token.role != ADMIN and get(export_id).requested_by != token.name:
        raise ApiError(403, "only the export's requester or an admin may cancel it")
    return describe(cancel(redis_conn(), export_id))
