"""The /api/v1 routes. Each is a thin door onto the function the CLI calls for the same action
(master.registry, master.intake, master.ops.tasks, master.views, master.ops.stats, the dispatcher)."""
from __future__ import annotations

import hmac
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response, Security
from fastapi.responses import StreamingResponse
from fastapi.security import APIKeyCookie, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic import ValidationError as PydanticError
from starlette.concurrency import run_in_threadpool

from common.config import settings
from common.errors import ValidationError
from common.store.clock import iso
from common.store.connection import redis_conn
from common.store.control import Token
from common.store.control_models import ADMIN
from common.store.records import DownloadType
from master import access, audit, dryrun, generators, projects, registry, tokens, views
from master.dispatch.runs import dispatch_in_child
from master.intake import add_tasks
from master.ops import stats, tasks
from master.web.contract import (
    READ,
    After,
    JobFilter,
    JobName,
    Limit,
    ObjectIdPath,
    TaskStatus,
    Versions,
    answers,
    whole,
)
from master.web.errors import ApiError

router = APIRouter()
COOKIE = "dc_session"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# Declared for the description (the schemes a client may use); ``caller`` reads the headers itself
# so that every refusal is the API's one-line 401.
BEARER = HTTPBearer(
    auto_error=False, scheme_name="bearer", description="a token from `downcluster token create`"
)
SESSION = APIKeyCookie(name=COOKIE, auto_error=False, scheme_name="session",
                       description="the console's session (POST /session); state changes need X-CSRF-Token")


# --- who is asking -----------------------------------------------------------------------

def bearer(auth: str) -> Token:
    """The token of an ``Authorization: Bearer`` header value (401 otherwise): every door's check."""
    scheme, _, secret = auth.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise ApiError(401, "the Authorization header must hold a Bearer token")
    token = tokens.authenticate(secret.strip())
    if token is None:
        raise ApiError(401, "unknown or revoked token")
    return token


def caller(request: Request, _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
           _session: Annotated[str | None, Security(SESSION)]) -> Token:
    """The token behind a request: ``Authorization: Bearer`` or a console session (whose
    state-changing requests must carry the session's X-CSRF-Token)."""
    auth = request.headers.get("authorization")
    if auth is not None:
        return bearer(auth)
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


def admin(token: Annotated[Token, Depends(caller)]) -> Token:
    if token.role != ADMIN:
        raise ApiError(403, f"role {token.role} may not change anything: an admin token is needed")
    return token


Reader = Annotated[Token, Depends(caller)]
Admin = Annotated[Token, Depends(admin)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# --- session (console sign-in) -----------------------------------------------------------

class SignIn(Strict):
    token: str = Field(min_length=1, max_length=256)
    model_config = ConfigDict(json_schema_extra={"examples": [{"token": "dct_..."}]})


@router.post("/session", tags=["session"], responses=answers(401))
def sign_in(body: SignIn, request: Request, response: Response) -> dict:
    """Exchange a token for an HttpOnly, SameSite=Strict session cookie (the console's sign-in)."""
    token = tokens.authenticate(body.token)
    if token is None:
        raise ApiError(401, "unknown or revoked token")
    secret, csrf = tokens.start_session(token)
    response.set_cookie(COOKIE, secret, max_age=settings.WEB_SESSION_TTL, httponly=True, samesite="strict",
                        secure=settings.WEB_COOKIE_SECURE or request.url.scheme == "https", path="/")
    return {"name": token.name, "role": token.role, "projects": access.held(token), "csrf": csrf}


@router.get("/session", tags=["session"], responses=READ)
def whoami(request: Request, token: Reader) -> dict:
    found = tokens.session_of(request.cookies.get(COOKIE))
    return {"name": token.name, "role": token.role, "projects": access.held(token),
            "csrf": found[1] if found else None}


@router.post("/session/end", tags=["session"], responses=answers())
def sign_out(request: Request, response: Response) -> dict:
    tokens.end_session(request.cookies.get(COOKIE))
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return {"signed_out": True}


# --- jobs --------------------------------------------------------------------------------

class JobIn(Strict):
    manifest: str = Field(min_length=1, description="the TOML manifest")
    code: str | None = Field(None, description="the downloader's code, for a python or shell job")
    project: int | None = Field(None, ge=1, description=(
        "the project of a new job (default: the token's only project; an admin's: `default`); "
        "an existing job keeps its own unless an admin names another"))
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"manifest": 'name = "news"\npriority = 5\ntype = "none"\n'},
                {
                    "manifest": 'name = "shop"\npriority = 3\ntype = "python"\ncode = "shop.py"\n',
                    "code": "import urllib.request\n\n\ndef download(task):\n"
                    "    with urllib.request.urlopen(task['url'], timeout=30) as resp:\n"
                    "        return {'status_code': resp.status, 'headers': dict(resp.headers),\n"
                    "                'body': resp.read()}\n",
                },
            ]
        }
    )


INVALID_MANIFEST = "the manifest or code does not validate (the error says where)"


@router.get("/jobs", tags=["jobs"], responses=READ)
def list_jobs(token: Reader) -> dict:
    """The jobs of the token's projects."""
    return {"jobs": views.job_rows(access.visible_job_names(token))}


@router.post("/jobs", tags=["jobs"], status_code=201, responses={
    200: {"description": "an existing job was updated"}, **answers(401, 403, 404, invalid=INVALID_MANIFEST)})
def register_job(body: JobIn, response: Response, token: Reader) -> dict:
    """Validate and store a job, as ``downcluster job register`` does (nothing stored when invalid):
    an admin, or a user in one of its projects."""
    job, created = registry.register_text(body.manifest, body.code, token, body.project)
    audit.record(token, "job.register" if created else "job.change", job.name, job.project)
    response.status_code = 201 if created else 200
    return {"name": job.name, "project": job.project}


@router.get("/jobs/{name}", tags=["jobs"], responses=answers(401, 404))
def show_job(name: JobName, token: Reader) -> dict:
    """One job: counts, settings (to a user or admin of its project also its proxy, password
    masked, its cookie and its headers' values: a change hands them back), its last failures."""
    return views.job_detail(access.job(name, token).name, secrets=access.may_change(token))


@router.post("/jobs/{name}/enable", tags=["jobs"], responses=answers(401, 403, 404))
def enable_job(name: JobName, token: Reader) -> dict:
    job = access.job(name, token, change=True)
    audit.record(token, "job.on", name, job.project)
    return {"name": name, "status": registry.set_status(name, "ON").status}


@router.post("/jobs/{name}/disable", tags=["jobs"], responses=answers(401, 403, 404))
def disable_job(name: JobName, token: Reader) -> dict:
    job = access.job(name, token, change=True)
    audit.record(token, "job.off", name, job.project)
    return {"name": name, "status": registry.set_status(name, "OFF").status}


class DryRunIn(Strict):
    url: str = Field(min_length=1, max_length=8192, pattern=r"^[^\r\n]*$", description="the one URL to fetch")
    model_config = ConfigDict(json_schema_extra={"examples": [{"url": "https://example.org/a"}]})


DRY_RUN_WHY = {403: "the token's role may not change this job (an analyst)",
               404: "no such job (or not one of the token's projects), or no such dry run of it "
                    "(kept 10 minutes)"}
DRY_RUN_INVALID = "the URL is not one intake accepts (an http or https URL with a host)"
RunId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the `id` of a dry run")]
DryWait = Annotated[float, Query(ge=0, le=dryrun.WAIT_MAX, description="seconds to wait for the answer")]


@router.post("/jobs/{name}/dry-run", tags=["jobs"], status_code=202, responses={
    202: {"description": "queued: its answer is read with GET .../dry-run/{id} (which may wait for it)"},
    **answers(401, 403, 404, why=DRY_RUN_WHY, invalid=DRY_RUN_INVALID)})
def dry_run_job(name: JobName, body: DryRunIn, token: Reader) -> dict:
    """Run the job's engine on one URL on a worker, with every wall a task has (sandbox, private
    reach, time and size limits, robots.txt), storing nothing; ``show_dry_run`` answers what it
    fetched (status, headers, the body's text cut to 20,000 characters, or the failure in one line)."""
    job = access.job(name, token, change=True)
    redis = redis_conn()
    ref = dryrun.start(redis, job, body.url)
    audit.record(token, "job.dry_run", name, job.project)
    return dryrun.show(redis, job, ref, 0)


@router.get("/jobs/{name}/dry-run/{run_id}", tags=["jobs"], responses={
    200: {"description": "answered: `state` done, with `response` or `error`"},
    202: {"description": "not answered within `wait`: `state` queued"},
    **answers(401, 403, 404, why=DRY_RUN_WHY)})
def show_dry_run(name: JobName, run_id: RunId, response: Response, token: Reader,
                 wait: DryWait = 0.0) -> dict:
    """A dry run of the job (``dry_run_job``): its answer, waiting up to ``wait`` seconds (at most
    60) for it to come."""
    job = access.job(name, token, change=True)
    shown = dryrun.show(redis_conn(), job, run_id, wait)
    response.status_code = 200 if shown["state"] == "done" else 202
    return shown


# --- generators ----------------------------------------------------------------------------

GENERATOR_404 = {404: "no such job, or the job declares no generator"}


@router.get("/jobs/{name}/generator", tags=["generators"], responses=answers(401, 404, why=GENERATOR_404))
def show_generator(name: JobName, token: Reader, limit: Limit = None, after: After = None) -> dict:
    """The job's generator, as ``downcluster generator show --json``: type, schedule, schemes, state
    (test, on, off), next run, and a page of its runs newest first (``next``: the cursor of the
    following page, for ``after``)."""
    return generators.show(access.job(name, token).name, views.clamp(limit, 10), after)


@router.post("/jobs/{name}/generator/on", tags=["generators"], responses=answers(
    401, 403, 404, 409, why={**GENERATOR_404, 409: "no dry run passed since the generator last changed"}))
def generator_on(name: JobName, token: Reader) -> dict:
    """Switch the generator on, as ``downcluster generator on`` (the dry run is the CLI's
    ``generator test``: it runs the code in a sandbox where it is typed)."""
    job = access.job(name, token, change=True)
    shown = generators.set_state(name, "on")
    audit.record(token, "job.generator.on", name, job.project)
    return shown


@router.post("/jobs/{name}/generator/off", tags=["generators"],
             responses=answers(401, 403, 404, why=GENERATOR_404))
def generator_off(name: JobName, token: Reader) -> dict:
    """Switch the generator off, as ``downcluster generator off`` (a run under way finishes)."""
    job = access.job(name, token, change=True)
    shown = generators.set_state(name, "off")
    audit.record(token, "job.generator.off", name, job.project)
    return shown


@router.post("/jobs/{name}/generator/run", tags=["generators"], responses=answers(
    401, 403, 404, 409, why={**GENERATOR_404, 409: "a run of the generator is under way"}))
def generator_run(name: JobName, token: Reader) -> dict:
    """Run the generator once now, through the queue (``downcluster generator run``)."""
    job = access.job(name, token, change=True)
    got = generators.run_now(name, redis_conn())
    audit.record(token, "job.generator.run", name, job.project)
    return got


# --- tasks -------------------------------------------------------------------------------

class UrlsIn(Strict):
    urls: list[Annotated[str, Field(pattern=r"^[^\r\n]*$")]] = Field(
        description="one URL each (no line breaks); ones that are not http(s) URLs are reported in `rejected`"
    )
    host: str = Field("", max_length=255, description="run these tasks on this host only (empty: any host)")
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"urls": ["https://example.org/a"], "host": ""}]}
    )


class CancelIn(Strict):
    status: list[Literal[tuple(sorted(tasks.CANCELLABLE))]] | None = Field(  # type: ignore[misc,valid-type]
        None, description=f"the statuses to cancel (default: {', '.join(tasks.CANCELLABLE_DEFAULT)})")
    model_config = ConfigDict(json_schema_extra={"examples": [{"status": ["LIVE", "FAIL"]}]})


class RequeueIn(Strict):
    status: list[Literal[tuple(sorted(tasks.REQUEUEABLE))]] | None = Field(  # type: ignore[misc,valid-type]
        None, description=f"the statuses to requeue (default: {', '.join(tasks.REQUEUE_DEFAULT)})")
    model_config = ConfigDict(json_schema_extra={"examples": [{"status": ["FAIL", "DEAD"]}]})


def _intake(name: str, lines: list[str], host: str, token: Token) -> dict:
    job = access.job(name, token, change=True)
    report = add_tasks(name, lines, worker_host=host)
    audit.record(token, "tasks.add", name, job.project, added=report.added)
    return {"added": report.added, "duplicate": report.duplicate,
            "rejected": [{"line": n, "reason": r} for n, r in report.errors[:1000]]}


@router.post("/jobs/{name}/tasks", tags=["tasks"], responses=answers(401, 403, 404, 415), openapi_extra={
    "requestBody": {"required": True, "content": {
        "text/plain": {"schema": {"type": "string", "description": "one URL a line"},
                       "example": "https://example.org/a\nhttps://example.org/b\n"},
        "application/json": {"schema": UrlsIn.model_json_schema()}}}})
async def add_job_tasks(name: JobName, request: Request, token: Reader) -> dict:
    """Add URLs: a text/plain body (one a line) or JSON {"urls": [...], "host": "..."}."""
    raw = await request.body()
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "application/json":
        try:
            body = UrlsIn.model_validate_json(raw)
        except PydanticError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "body"
            raise ValidationError(f"{where}: {first.get('msg', 'invalid')}") from None
        lines, host = body.urls, body.host
    elif content_type == "text/plain" or (content_type == "" and raw):
        lines, host = raw.decode("utf-8", errors="replace").splitlines(), ""
    elif content_type == "":
        raise ValidationError("a request body is required: text/plain (one URL a line) or application/json")
    else:
        raise ApiError(415, "send text/plain (one URL a line) or application/json")
    return await run_in_threadpool(_intake, name, lines, host, token)


@router.get("/jobs/{name}/tasks", tags=["tasks"], responses=answers(401, 404))
def list_tasks(name: JobName, token: Reader, status: TaskStatus | None = None, limit: Limit = None,
               after: After = None) -> dict:
    return views.task_page(access.job(name, token).name, status, limit, after)


@router.post("/jobs/{name}/tasks/cancel", tags=["tasks"], responses=answers(401, 403, 404))
def cancel_tasks(name: JobName, body: CancelIn, token: Reader) -> dict:
    job = access.job(name, token, change=True)
    statuses = tuple(body.status or tasks.CANCELLABLE_DEFAULT)
    n = tasks.cancel(name, statuses)
    audit.record(token, "tasks.cancel", name, job.project, tasks=n, statuses=list(statuses))
    return {"cancelled": n}


@router.post("/jobs/{name}/tasks/requeue", tags=["tasks"], responses=answers(401, 403, 404))
def requeue_tasks(name: JobName, body: RequeueIn, token: Reader) -> dict:
    job = access.job(name, token, change=True)
    statuses = tuple(body.status or tasks.REQUEUE_DEFAULT)
    n = tasks.requeue(name, statuses)
    audit.record(token, "tasks.requeue", name, job.project, tasks=n, statuses=list(statuses))
    return {"requeued": n}


@router.get("/jobs/{name}/tasks/lookup", tags=["tasks"], responses=answers(401, 404))
def find_task(name: JobName, token: Reader, url: Annotated[str, Query(min_length=1, max_length=1024,
                                                                   description="the URL as added")]) -> dict:
    """One task of the job by its URL (see GET /tasks/{id})."""
    return views.task_detail(access.job(name, token).name, url)


@router.get("/tasks/{task_id}", tags=["tasks"], responses=answers(401, 404))
def show_task(task_id: ObjectIdPath, token: Reader) -> dict:
    """One task: status, attempts, reasons, its data id and its download logs (newest first)."""
    return views.task_by_id(task_id, token)


# --- downloader types ---------------------------------------------------------------------

Language = Literal["python", "shell", "none"]


@router.get("/types", tags=["cluster"], responses=READ)
def list_types(token: Reader) -> dict:
    """The downloader languages, whether each is supported, and how many jobs use it (for a user
    or analyst: how many of its projects' jobs)."""
    rows = registry.type_rows()
    names = access.visible_job_names(token)
    if names is not None:
        used: dict[str, int] = {}
        for j in views.job_rows(names):
            used[j["type"]] = used.get(j["type"], 0) + 1
        rows = [(t, used.get(t.language, 0)) for t, _ in rows]
    return {"types": [_type_row(t, n) | {"add_datetime": iso(t.add_datetime)} for t, n in rows]}


def _type_row(t: DownloadType, used: int) -> dict:
    return {"language": t.language, "is_support": t.is_support, "jobs": used}


@router.post("/types/{language}/enable", tags=["cluster"], responses=answers(401, 403, 404))
def enable_type(language: Language, _: Admin) -> dict:
    return _type_row(*registry.set_type_support(language, True))


@router.post("/types/{language}/disable", tags=["cluster"], responses=answers(401, 403, 404))
def disable_type(language: Language, _: Admin) -> dict:
    """New jobs of it are refused; workers fail its tasks with that reason (not retried)."""
    return _type_row(*registry.set_type_support(language, False))


# --- dispatch, stats ---------------------------------------------------------------------

@router.post("/dispatch", tags=["cluster"], responses=answers(401, 403, 409))
def dispatch(_: Admin) -> dict:
    """One dispatcher run, as ``downcluster dispatch --json`` (in a child process of its own, so
    its watchdog can stop a run that overstays without stopping this server)."""
    status, answer = dispatch_in_child(dict(settings.flags))
    if status != 200 or not isinstance(answer, dict):
        raise ApiError(status, str(answer))
    return answer


@router.get("/stats", tags=["cluster"], responses=READ)
def get_stats(token: Reader) -> dict:
    """The same object as ``downcluster stats --json`` (for a user or analyst: the jobs of its
    projects only)."""
    return views.scoped_stats(stats.collect(redis_conn()), access.visible_job_names(token))


@router.get("/series", tags=["cluster"], responses=READ)
def get_series(_: Reader) -> dict:
    """The last 24 hours minute by minute: pages stored and failed, and queue depths as sampled
    (the console's charts): {"from", "to", "pages": [{"minute", "stored", "failed"}],
    "depths": [{"minute", queue: depth, ...}]} (minutes as UNIX seconds; quiet minutes absent)."""
    from common.metrics import series

    return series(redis_conn())


@router.get("/overview", tags=["cluster"], responses=READ)
def get_overview(token: Reader) -> dict:
    """Stats, workers alive (host, downloads in flight, jobs they run) and the last alerts (for a
    user or analyst: of the jobs of its projects only)."""
    return views.overview(redis_conn(), access.visible_job_names(token), access.visible_job_ids(token))


# --- data, logs --------------------------------------------------------------------------

@router.get("/jobs/{name}/data", tags=["data"], responses=answers(401, 404))
def list_data(name: JobName, token: Reader, limit: Limit = None, after: After = None,
              versions: Versions = "latest") -> dict:
    """The job's stored data, oldest first: each page's latest version, or every version of a
    revisited page with ``versions=all`` (a task's own history: GET /tasks/{id})."""
    return views.data_page(access.job(name, token).name, limit, after, versions)


@router.get("/data/{data_id}/body", tags=["data"], response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}}, **answers(401, 404)})
def get_body(data_id: ObjectIdPath, token: Reader) -> StreamingResponse:
    """The stored response body, byte-exact, as an attachment (never rendered on this origin)."""
    length, chunks = views.body(data_id, access.visible_job_ids(token))
    return StreamingResponse(chunks, media_type="application/octet-stream", headers={
        "Content-Length": str(length), "Content-Disposition": f'attachment; filename="{data_id}.body"',
        "Content-Security-Policy": "sandbox", "Cache-Control": "private, no-store"})


@router.get("/logs/{log}", tags=["logs"], responses=answers(401, 404))
def list_logs(
    log: Literal["download", "dispatch", "alert", "registration"],
    token: Reader,
    job: JobFilter = None,
    limit: Limit = None,
    after: After = None,
) -> dict[str, Any]:
    """One log, newest first: download, dispatch, alert or registration (for a user or analyst:
    of the jobs of its projects only)."""
    if job is not None and log != "registration":
        access.job(job, token)
    return views.log_page(log, job, limit, after, access.visible_job_ids(token), access.held(token))


# --- projects, audit ---------------------------------------------------------------------

class ProjectIn(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{1,63}$")
    allow_private: bool = Field(False, description="its download tasks may pull from private addresses")
    model_config = ConfigDict(json_schema_extra={"examples": [{"name": "shop"}]})


@router.get("/projects", tags=["projects"], responses=READ)
def list_projects(token: Reader) -> dict:
    """The projects this token holds (an admin: every project), by id."""
    return {"projects": projects.listing(token)}


@router.post("/projects", tags=["projects"], status_code=201, responses=answers(
    401, 403, 409, why={409: "a project of that name exists"}))
def create_project(body: ProjectIn, token: Admin) -> dict:
    """A new project; the cluster assigns its id (``downcluster project create``)."""
    return projects.create(body.name, token, body.allow_private)


@router.get("/projects/{project_id}", tags=["projects"], responses=answers(401, 404))
def show_project(project_id: Annotated[int, Path(ge=1, le=2**31)], token: Reader) -> dict:
    return projects.show(project_id, token)


@router.get("/audit", tags=["cluster"], responses=answers(401, 403))
def get_audit(_: Admin, limit: Limit = None, before: Annotated[str | None, Query(
        pattern=r"^[0-9a-f]{24}$", description="the `next` of the previous page")] = None,
        action: Annotated[str | None, Query(max_length=64, pattern=r"^[a-z.]+$")] = None) -> dict:
    """Who changed what, and when, newest first (``downcluster audit --json``): jobs registered,
    changed or switched, their tasks and generators, tokens, projects, grants, exports requested,
    cancelled or retried."""
    return audit.page(limit, before, action)


# --- tokens (admins) -----------------------------------------------------------------------

TokenName = Annotated[str, Path(pattern=tokens.NAME_RE.pattern, description="the token's name")]
ProjectIdIn = Annotated[int, Field(ge=1, le=2**31), BeforeValidator(whole)]


class TokenIn(Strict):
    name: str = Field(pattern=tokens.NAME_RE.pattern)
    role: Literal["admin", "user", "analyst"]
    projects: list[ProjectIdIn] = Field([], max_length=100, description="the projects it holds (ids)")
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"name": "ana", "role": "user", "projects": [2]}]})


class GrantIn(Strict):
    projects: list[ProjectIdIn] = Field([], max_length=100, description="projects to give (ids)")
    jobs: list[Annotated[str, Field(max_length=128)]] = Field(
        [], max_length=100, description="jobs whose every export it may see and download")
    remove: bool = Field(False, description="take these away instead")
    model_config = ConfigDict(json_schema_extra={"examples": [{"projects": [2], "jobs": ["news"]}]})


def _token_row(t: dict) -> dict:
    return t | {"created": iso(t["created"]), "last_used": iso(t["last_used"])}


@router.get("/tokens", tags=["tokens"], responses=answers(401, 403))
def list_tokens(_: Admin) -> dict:
    """Every token: name, role, projects, granted jobs, created and last used (never a secret)."""
    return {"tokens": [_token_row(t) for t in tokens.listing()]}


@router.post("/tokens", tags=["tokens"], status_code=201, responses=answers(
    401, 403, 404, 409, why={409: "a token of that name exists (revoke it first)"}))
def create_token(body: TokenIn, token: Admin) -> dict:
    """A new token (``downcluster token create``): its secret is in this answer only (only its
    hash is kept)."""
    for project_id in body.projects:
        access.check_project(token, project_id)
    if any(t["name"] == body.name for t in tokens.listing()):
        raise ApiError(409, f"a token named {body.name!r} exists: revoke it first")
    held = sorted(set(body.projects))
    secret = tokens.create(body.name, body.role, held)
    audit.record(token, "token.create", body.name, role=body.role, projects=held)
    return {"name": body.name, "role": body.role, "projects": held, "token": secret}


@router.post("/tokens/{token_name}/grant", tags=["tokens"], responses=answers(401, 403, 404))
def grant_token(token_name: TokenName, body: GrantIn, token: Admin) -> dict:
    """Give the token projects, or let it see every export of jobs (``remove``: take them away),
    as ``downcluster token grant``; its projects and granted jobs after."""
    if body.projects:
        projects.grant(token_name, list(body.projects), body.remove, token)
    if body.jobs:
        tokens.grant(token_name, list(body.jobs), body.remove)
        action = "token.ungrant" if body.remove else "token.grant"
        audit.record(token, action, token_name, jobs=list(body.jobs))
    row = next((t for t in tokens.listing() if t["name"] == token_name), None)
    if row is None:
        raise ApiError(404, f"no token named {token_name!r}")
    return {"name": token_name, "projects": row["projects"], "jobs": row["jobs"]}


@router.post("/tokens/{token_name}/revoke", tags=["tokens"], responses=answers(401, 403, 404))
def revoke_token(token_name: TokenName, token: Admin) -> dict:
    """Revoke the token at once (its console sessions end too)."""
    tokens.revoke(token_name)
    audit.record(token, "token.revoke", token_name)
    return {"name": token_name, "revoked": True}
