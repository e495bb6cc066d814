"""Keeping secrets (proxy credentials, cookies, authorization headers, DSNs) out of logs,
failure reasons and Sentry events."""
from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from typing import Iterable
from urllib.parse import unquote_plus, urlsplit

_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
# a secret header or field, also inside JSON that was escaped once more (``\"cookie\": \"…\"``, as
# pymongo's command log writes a reply)
_HEADER_SECRET = re.compile(
    r"(?i)(authorization|proxy-authorization|cookie|set-cookie)(\\*['\"]?\s*[:=]\s*\\*['\"]?)[^'\"\\\n,}]+"
)

SENSITIVE_KEYS = (
    "proxy", "proxies", "cookie", "cookies", "authorization", "proxy-authorization",
    "proxy_authorization", "set-cookie", "dsn", "sentry_dsn", "password", "mongo_uri",
    "mongo_log_uri", "redis_url",
)

# Request headers that carry no secret. Every other header a job sets (X-Api-Key, a token of any
# name) is one: redacted wherever it may show, masked in stored request headers, and sent only to
# the site of the task's URL (dropped on a redirect to another, never added to another site's
# resources in the browser).
PUBLIC_HEADERS = frozenset({
    "accept", "accept-charset", "accept-encoding", "accept-language", "cache-control", "connection",
    "content-length", "content-type", "dnt", "host", "if-modified-since", "if-none-match", "origin",
    "pragma", "range", "referer", "te", "upgrade-insecure-requests", "user-agent",
})


def is_secret_header(name: str) -> bool:
    return str(name).strip().lower() not in PUBLIC_HEADERS


def secret_header_values(headers: dict | None) -> list[str]:
    """The values of a job's headers that are secrets."""
    return [str(v) for k, v in (headers or {}).items() if is_secret_header(k) and v]


def mask_proxy(url: str) -> str:
    """A proxy URL as the API shows it to those who may change its job: its password ``***``
    (``user:***@host:port``; a userinfo without ``:``, a token, is masked whole)."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at:
        return url
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}://{user}:***@{host}" if colon else f"{scheme}://***@{host}"


def keeps_credentials(first: str, then: str) -> bool:
    """Whether a request to ``then`` may carry the credentials (cookie, secret headers) meant for
    ``first``: the same host, and not from https down to http, nor to another port (an upgrade
    from http to https on the default ports keeps them), as requests decides for Authorization."""
    a, b = urlsplit(first), urlsplit(then)
    try:
        pa, pb = a.port, b.port
    except ValueError:
        return False
    if (a.hostname or "").lower() != (b.hostname or "").lower():
        return False
    sa, sb = a.scheme.lower(), b.scheme.lower()
    if sa == "http" and sb == "https" and pa in (80, None) and pb in (443, None):
        return True
    return sa == sb and (pa or DEFAULT_PORT.get(sa)) == (pb or DEFAULT_PORT.get(sb))


DEFAULT_PORT = {"http": 80, "https": 443}

# The secrets remembered, least recently remembered first, at most MAX_KNOWN. A worker remembers
# a job's secrets each time it reads the job's settings (every CONTEXT_TTL while it runs the job's
# entries), so a secret is dropped only once MAX_KNOWN others were remembered after it: thousands
# of other jobs' settings read by this process meanwhile, far more than it runs at once.
MAX_KNOWN = 4096
_known: OrderedDict[str, None] = OrderedDict()
_known_lock = threading.Lock()


def remember(*values: str | None) -> None:
    """Register literal secret values (a job's proxy, cookie) to be masked wherever they appear."""
    with _known_lock:
        for value in values:
            if value and len(value) >= 4:
                _known[value] = None
                _known.move_to_end(value)
        while len(_known) > MAX_KNOWN:
            _known.popitem(last=False)


def redact(text: str, extra: Iterable[str] = ()) -> str:
    """``text`` with URL credentials, secret headers and every remembered secret masked."""
    if not text:
        return text
    with _known_lock:
        literal = sorted({*_known, *(v for v in extra if v and len(v) >= 4)}, key=len, reverse=True)
    for value in literal:
        text = text.replace(value, "***")
    text = _URL_USERINFO.sub(r"\g<scheme>***@", text)
    return _HEADER_SECRET.sub(r"\1\2***", text)


class RedactingFilter(logging.Filter):
    """A logging filter that redacts the formatted message of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string must not hide the record
            return True
        record.msg, record.args = redact(message), None
        return True


# query parameters that are credentials or a caller's data: never written whole in an access log
QUERY_SECRETS = frozenset({"sig", "token", "ticket", "secret", "password", "source_data", "access_token",
                           "session", "key"})
_QUERY_PAIR = re.compile(r"(?P<key>[^&=?#]+)=(?P<value>[^&#]*)")


def mask_query(path: str) -> str:
    """``path`` with the values of its credential and data parameters (QUERY_SECRETS, however
    percent-encoded or cased) replaced by ``***``."""
    head, sep, query = path.partition("?")
    if not sep:
        return path

    def mask(found: re.Match) -> str:
        key = unquote_plus(found["key"]).strip().lower()
        return f"{found['key']}=***" if key in QUERY_SECRETS else found[0]
    return head + sep + _QUERY_PAIR.sub(mask, query)


class AccessLogFilter(logging.Filter):
    """uvicorn's access log with ``mask_query`` applied to each request's path (its third
    argument), the rest of its format untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], mask_query(args[2]), *args[3:])
        return True


def install_logging_filter(logger: logging.Logger | None = None) -> None:
    target = logger or logging.getLogger()
    if not any(isinstance(f, RedactingFilter) for f in target.filters):
        target.addFilter(RedactingFilter())
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
