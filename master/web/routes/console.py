"""The console: one HTML page, its script and its style, served from this package (no CDN).
It talks to the API with the session cookie set at sign-in."""
from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from master.web.errors import ApiError

router = APIRouter(include_in_schema=False)
STATIC = Path(__file__).parent.parent / "static"
FILES = {"app.js": "text/javascript", "app.css": "text/css"}


@router.get("/")
def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    if name not in FILES:
        raise ApiError(404, "no such file")
    return FileResponse(STATIC / name, media_type=FILES[name], headers={"Cache-Control": "no-cache"})
