"""``downcluster web``: the HTTP API under /api/v1 and the console under /, one ASGI app.

FastAPI on uvicorn: the API description (/api/v1/openapi.json) is generated from the same
typed signatures that validate requests, and uvicorn is a real server. The process keeps no
state: tokens and console sessions live in MongoDB, so several can run behind a balancer.

Guards, outermost first: bodies over API_MAX_BODY are refused from Content-Length before they
are read (chunked bodies are counted); query parameters must be plain lower-case names given
once (``status[$ne]=x`` is refused, never parsed into an operator); security headers on every
answer. Every error is ``{"error": "one line"}``; Redis or MongoDB away is a 503 naming the
service and its host:port.
"""
from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from common.config import settings
from common.errors import DownclusterError, http_status, too_many_digits
from common.secrets import AccessLogFilter
from common.store.connection import connect_mongo, mongo_answers, unreachable
from master.web.contract import operation_id
from master.web.errors import SECURITY_HEADERS, ApiError, error, send_error
from master.web.routes import api, center, console, exports, files, metrics, v1

logger = logging.getLogger("downcluster.web")
QUERY_KEY = re.compile(r"^[a-z_]{1,32}$")
# a synchronous download's template (and the /v1 sync download's parameters) may be long;
# POST takes longer ones
LONG_QUERY = {"template": 8192, "source_data": 8192, "source_url": 2048, "header": 4096, "footer": 4096,
              "title": 2048, "summary": 4096}
class Guard:
    """Pure ASGI middleware: body size, query shape, security headers."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        head = scope["method"] == "HEAD"  # RFC 9110: HEAD is GET without the body
        if head:
            scope = {**scope, "method": "GET"}
        limit = settings.API_MAX_BODY
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return await send_error(send, 400, "Content-Length is not a number")
            if int(length) > limit:
                return await send_error(send, 413, f"request body over API_MAX_BODY ({limit} bytes)")
        elif scope["method"] in ("POST", "PUT", "PATCH"):  # chunked: count while buffering, at most the limit
            try:
                whole = await _buffered(receive, limit)
            except _Disconnected:
                return
            if whole is None:
                return await send_error(send, 413, f"request body over API_MAX_BODY ({limit} bytes)")
            receive = _replay(whole)
        refused = _query_refusal(scope.get("query_string", b"").decode("latin-1"))
        if refused:
            return await send_error(send, 422, refused)

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            elif head and message["type"] == "http.response.body" and message.get("body"):
                message = {**message, "body": b""}
            await send(message)

        return await self.app(scope, receive, send_with_headers)


class _Disconnected(Exception):
    """The client went away while its body was being read."""


async def _buffered(receive, limit: int) -> bytes | None:
    """The whole body of a chunked request; None once it passes ``limit`` bytes."""
    chunks, total, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        total += len(chunk)
        if total > limit:
            return None
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(whole: bytes):
    """An ASGI ``receive`` that gives the buffered body once, then a disconnect."""
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": whole, "more_body": False}

    return receive


def _query_refusal(query: str) -> str | None:
    """Why the query string is refused (names other than plain lower-case ones, a name given
    twice, a value too long), or None."""
    seen = set()
    for key, value in parse_qsl(query, keep_blank_values=True):
        if not QUERY_KEY.match(key):
            return f"query parameter {key[:40]!r} is not allowed: plain names only"
        if key in seen:
            return f"query parameter {key!r} given twice"
        if len(value) > LONG_QUERY.get(key, 1024):
            return f"query parameter {key!r} is too long"
        seen.add(key)
    return None


def _validation_line(exc: RequestValidationError) -> str:
    errors = exc.errors()
    if not errors:
        return "invalid request"
    first = errors[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path"))
    return f"{where or 'request'}: {first.get('msg', 'invalid')}"


def create_app() -> FastAPI:
    from common.sentry import init_sentry

    init_sentry(settings.SENTRY_DSN, server_name=settings.HOSTNAME or None)
    access_log = logging.getLogger("uvicorn.access")  # signed links' sig, tokens, source_data: masked
    if not any(isinstance(f, AccessLogFilter) for f in access_log.filters):
        access_log.addFilter(AccessLogFilter())
    connect_mongo(ensure_indexes=mongo_answers(seconds=1.0))
    app = FastAPI(
        title="downcluster",
        version="1.0.0",
        openapi_url="/api/v1/openapi.json",
        docs_url=None,
        redoc_url=None,  # their pages load scripts from a CDN
        generate_unique_id_function=operation_id,
        description="The downcluster HTTP API: `Authorization: Bearer TOKEN` on every call but "
        '`POST /session` and signed file links. Every error is `{"error": "one line"}`.',
    )
    _answer_errors(app)
    app.include_router(api.router, prefix="/api/v1")
    app.include_router(exports.router, prefix="/api/v1")
    app.include_router(center.api_router, prefix="/api/v1")
    app.include_router(v1.router)  # the /v1 interface of the download center, as its callers use it
    app.include_router(files.router)
    app.include_router(metrics.router)
    app.include_router(console.router)
    app.include_router(v1.ws_router)  # the center's WebSocket, on any path: last
    origins = [o.strip() for o in settings.API_CORS_ORIGINS.split(",") if o.strip()]
    if origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(Guard)
    return app


def _answer_errors(app: FastAPI) -> None:
    """Every error as the one shape: the error tree's statuses, 405 with Allow, and the failures."""

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error(exc.status, exc.message, {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None)

    @app.exception_handler(DownclusterError)
    async def _of_the_tree(request: Request, exc: DownclusterError):
        status = http_status(exc)
        return error(status, str(exc)) if status is not None else _failure(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError):
        return error(422, _validation_line(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # the path exists: say what it takes (RFC 9110 15.5.6)
            headers["Allow"] = ", ".join(_allowed(request))
            if request.method == "OPTIONS":
                return Response(status_code=204, headers=headers)
        if exc.status_code == 400 and isinstance(exc.__cause__, ValueError):  # a body FastAPI could not read
            return error(422, _unreadable(exc.__cause__))
        return error(exc.status_code, str(exc.detail), headers or None)

    _answer_failures(app)


def _unreadable(exc: ValueError) -> str:
    """A JSON body that is well formed but that ``json`` does not read: text not in UTF-8, or an
    integer past Python's digit limit for int-from-text."""
    if isinstance(exc, UnicodeDecodeError):
        return "the body is not valid JSON (not UTF-8 text)"
    return str(too_many_digits("the body"))


def _answer_failures(app: FastAPI) -> None:
    """A service unreachable: 503 naming it; anything else: 500, logged and sent to Sentry."""

    async def _unreachable(request: Request, exc: Exception):
        return error(503, unreachable(exc) or "a service is unreachable")

    from pymongo.errors import ConnectionFailure
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeout

    for cls in (ConnectionFailure, RedisConnectionError, RedisTimeout):
        app.add_exception_handler(cls, _unreachable)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        return _failure(request, exc)


def _failure(request: Request, exc: Exception) -> Response:
    line = unreachable(exc)
    if line:  # refused credentials (an OperationFailure or ResponseError of their own)
        return error(503, line)
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    from common.sentry import capture

    capture(exc)
    return error(500, "internal error (logged on the server)")


def _allowed(request: Request) -> list[str]:
    """Every method some route of this path takes (one route per method), with HEAD beside GET
    and OPTIONS (both answered for every path)."""
    methods = {method for method in ("GET", "POST", "PUT", "PATCH", "DELETE")
               if any(route.matches({**request.scope, "method": method})[0] == Match.FULL
                      for route in request.app.router.routes)}
    methods |= {"HEAD"} if "GET" in methods else set()
    return sorted(methods | {"OPTIONS"})
