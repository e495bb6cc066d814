"""The one error shape of the HTTP API and console, ``{"error": "one line"}``, and the security
headers every answer carries (the guards in ``app.py`` and the routers both use them)."""
from __future__ import annotations

import json

from fastapi.responses import JSONResponse

from common.secrets import redact

SECURITY_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy",
     b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
     b"connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"),
]


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": redact(message).splitlines()[0][:500] if message else "error"},
                        status_code=status, headers=headers)


async def send_error(send, status: int, message: str) -> None:
    payload = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"), *SECURITY_HEADERS]})
    await send({"type": "http.response.body", "body": payload})
