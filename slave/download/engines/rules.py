"""What every built-in engine applies alike (requests, aiohttp and, where it fits, the browser):
the redirect path, the body limit, how a final status reads, and which values of a request are
secrets.

The redirect path (``Redirects``) is the one place these rules live: the first URL checked
(``common/urls.py``), each hop's address judged before a byte of its request goes out
(``common/netguard.py``: through a proxy, which resolves names itself, only an address in the
URL can be), at most ``max_redirects`` hops, http/https only, the cookie and every secret
header dropped when a hop leaves the site they were given for (``common/secrets.py``), and, for a
page of a job that follows links, no hop out of the job's scope (``OUT_OF_SCOPE``, final).
"""
from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from urllib.parse import unquote, urljoin, urlsplit

import requests.utils

import settings as declared  # the cluster settings' one declaration: their defaults
from common import netguard
from common.errors import DownloadError, ValidationError
from common.secrets import is_secret_header, keeps_credentials
from common.urls import check_url
from slave.download.engines.base import Scope
from slave.download.engines.failures import (
    OUT_OF_SCOPE,
    HttpStatus,
    Invalid,
    OutOfScope,
    TooLarge,
    TooManyRedirects,
)

__all__ = ["CONNECT_TIMEOUT", "OUT_OF_SCOPE", "REDIRECT_CODES", "Body", "Redirects", "Scope",
           "classify_status", "drop_credentials", "masked", "one_line", "out_of_scope",
           "parse_retry_after", "redirect_target", "secrets_of", "too_big"]

CONNECT_TIMEOUT = 30.0          # seconds for one TCP connect, never more than the time left
MAX_RETRY_AFTER = float(declared.RETRY_BACKOFF_MAX)  # a server's Retry-After is capped here (and by
# next_retry_at at the effective RETRY_BACKOFF_MAX)
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})


# --- redirects ------------------------------------------------------------------------------

def redirect_target(url: str, location: str, hops: int, max_redirects: int) -> str:
    """Where the ``hops``-th redirect of ``url`` to ``location`` leads, checked as every
    built-in engine checks it: within ``max_redirects``, http/https only, a valid URL."""
    if hops > max_redirects:
        raise TooManyRedirects(f"too many redirects (more than {max_redirects})", retryable=False)
    location = location.encode("latin-1", "replace").decode("utf-8", "replace")
    target = urljoin(url, requests.utils.requote_uri(location.strip()))
    scheme = urlsplit(target).scheme.lower()
    if scheme not in ("http", "https"):
        raise Invalid(f"redirect to unsupported scheme {scheme or 'none'!r}", retryable=False)
    try:
        return check_url(target)
    except ValidationError as exc:
        raise Invalid(f"bad redirect: {exc}", retryable=False) from None


def out_of_scope(scope: Scope | None, target: str) -> DownloadError | None:
    """The final failure of a redirect to ``target`` that ``scope`` refuses, or None."""
    why = scope(target) if scope is not None else None
    return OutOfScope(target, why) if why else None


def drop_credentials(sent, first: str, then: str) -> None:
    """Take the cookie and every secret header out of ``sent`` (a case-insensitive mapping) when a
    redirect from ``first`` leads to ``then`` where they may not go."""
    if not keeps_credentials(first, then):
        for name in {str(k) for k in sent if is_secret_header(k)}:
            if name in sent:
                del sent[name]  # every value of that name


class Redirects:
    """The redirect path of one fetch. An engine asks ``url()`` for each request (its address
    judged first), and gives every response's status and Location to ``redirected``: True when
    the response is a redirect to follow (the engine closes it unread and asks ``url()`` again),
    False when it is the final one. ``sent``: the request headers, a case-insensitive mapping
    the engine sends from on every hop (credentials are dropped from it). ``scope``: a page of a
    following job, whose redirects may not leave the job's scope."""

    def __init__(self, url: str, sent, max_redirects: int, allow_private: bool,
                 scope: Scope | None = None) -> None:
        try:
            self.current = check_url(url)
        except ValidationError as exc:
            raise Invalid(f"invalid URL: {exc}", retryable=False) from None
        self.first, self.sent, self.hops = self.current, sent, 0
        self.max_redirects, self.allow_private, self.scope = max_redirects, allow_private, scope

    def url(self) -> str:
        """The URL to request now, its address judged (AddressRefused when it may not be reached)."""
        netguard.judge_url(self.current, self.allow_private)
        return self.current

    @staticmethod
    def location(status: int, headers: Mapping[str, str]) -> str | None:
        """Where a response of ``status`` and ``headers`` redirects to, or None (final)."""
        return headers.get("Location") if status in REDIRECT_CODES else None

    def follow(self, location: str) -> None:
        """The next hop, to ``location`` of the current URL's response: checked (hop cap, scheme,
        a valid URL, the job's scope), the credentials dropped when it leaves their site."""
        self.hops += 1
        target = redirect_target(self.current, location, self.hops, self.max_redirects)
        refused = out_of_scope(self.scope, target)
        if refused is not None:
            raise refused
        drop_credentials(self.sent, self.first, target)
        self.current = target


# --- the body limit -------------------------------------------------------------------------

def too_big(maxsize: int) -> TooLarge:
    return TooLarge(f"body larger than {maxsize} bytes", maxsize)


class Body:
    """A body read within ``maxsize`` bytes, counted after decompression: refused at once when
    its Content-Length says more, and as soon as what streams in passes it."""

    def __init__(self, maxsize: int, headers: Mapping[str, str]) -> None:
        self.maxsize, self.size = maxsize, 0
        self.chunks: list[bytes] = []
        length = headers.get("Content-Length", "")
        if length.strip().isdigit() and int(length) > maxsize:
            raise too_big(maxsize)

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.maxsize:
            raise too_big(self.maxsize)
        self.chunks.append(chunk)

    def take(self) -> bytes:
        """The whole body (its chunks let go of)."""
        chunks, self.chunks = self.chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# --- statuses -------------------------------------------------------------------------------

def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP-date), capped; None if absent."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(int(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None:
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - time.time()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def classify_status(status_code: int, retry_after_header: str | None = None) -> DownloadError | None:
    """None for a usable final status (2xx, or 3xx without a redirect), else the error."""
    if 200 <= status_code < 400:
        return None
    if status_code in (408, 429) or 500 <= status_code < 600:
        return HttpStatus(status_code, retryable=True, retry_after=parse_retry_after(retry_after_header))
    return HttpStatus(status_code, retryable=False)


# --- secrets --------------------------------------------------------------------------------

def one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def secrets_of(proxy: str, cookie: str, headers: Mapping[str, str]) -> list[str]:
    """The secret values to redact: the proxy's, the cookie, and ``headers``' secret ones (every
    header but the public ones: ``common.secrets.PUBLIC_HEADERS``)."""
    values = [proxy, cookie] + [str(v) for k, v in headers.items() if is_secret_header(k)]
    if proxy:
        try:
            parts = urlsplit(proxy)
            for v in (parts.username, parts.password):
                if v:
                    values += [v, unquote(v)]
            if "@" in parts.netloc:
                values.append(parts.netloc.rsplit("@", 1)[0])
        except ValueError:
            pass
    variants = []
    for v in filter(None, values):  # also as they show in one-line and repr'd messages
        variants += [v, " ".join(v.split()), repr(v)[1:-1]]
    return variants


def masked(headers) -> dict[str, str]:
    """Request headers as stored: every secret one masked."""
    return {str(k): ("***" if is_secret_header(k) else str(v)) for k, v in headers.items()}
