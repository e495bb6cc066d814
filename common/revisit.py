"""Revisits: when a page is visited again, and how a visit is told apart from a change.

A job with ``revisit`` (seconds) makes each SUCCESS task due again that long after its visit.
With ``revisit_max`` the interval adapts per page between the two: it halves when a visit
brought new content and doubles when it did not (a 304, or the same body), so a page that keeps
changing is read often and a page that never changes costs a request per ``revisit_max``.

A visit sends the validators of the latest version (``If-None-Match`` / ``If-Modified-Since``);
an answer of 304, or a body whose SHA-256 equals the latest version's, is "not modified": a log,
no data. Pure functions; the worker's writer applies them (``slave/worker/writer.py``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from common.store.records import JobSettings, Prev

NOT_MODIFIED = 304


@dataclass(frozen=True)
class Revisit:
    """A job's revisit settings: ``every`` seconds (0: never), adaptive up to ``ceiling``."""

    every: float = 0.0
    ceiling: float = 0.0

    @classmethod
    def of(cls, conf: JobSettings) -> "Revisit":
        return cls(float(conf.revisit or 0), float(conf.revisit_max or 0))

    @property
    def on(self) -> bool:
        return self.every > 0

    def next_interval(self, current: float | None, changed: bool) -> float:
        """The interval after a visit: fixed, or (adaptive) halved on a change, doubled without,
        kept between ``every`` and ``ceiling``; a first visit starts at ``every``."""
        if not self.ceiling or self.ceiling <= self.every or not current:
            return self.every
        moved = current / 2 if changed else current * 2
        return min(max(moved, self.every), self.ceiling)


def validators(prev: Prev | None) -> dict[str, str]:
    """The conditional request headers of a visit, from the latest version's validators."""
    if not prev:
        return {}
    headers = {}
    if prev.etag:
        headers["If-None-Match"] = prev.etag
    if prev.last_modified:
        headers["If-Modified-Since"] = prev.last_modified
    return headers


MAX_VALIDATOR = 512  # characters: a longer ETag or Last-Modified is not kept (nor sent again)


def _kept_validator(value: str | None) -> str | None:
    """A validator as received, if it can be sent back as a header: printable, one line, short
    (what a site or a downloader returns is copied into every entry of its page's revisits)."""
    if value is None or len(value) > MAX_VALIDATOR or not value.isprintable():
        return None
    return value


def response_validators(headers: dict) -> tuple[str | None, str | None]:
    """(ETag, Last-Modified) of a response, header names in any case; None where absent or unfit."""
    lower = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
    return _kept_validator(lower.get("etag")), _kept_validator(lower.get("last-modified"))


def digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def unchanged(prev: Prev | None, status_code: int, body: bytes) -> str | None:
    """Why a revisit's answer is "not modified" ("HTTP 304" or "same content"), else None.
    A first visit (no ``prev``) always brings a version."""
    if not prev or not prev.data_lease:
        return None
    if status_code == NOT_MODIFIED:
        return "HTTP 304"
    if prev.digest and digest(body) == prev.digest:
        return "same content"
    return None
