"""Keeping secrets (proxy credentials, cookies, authorization headers, DSNs) out of logs,
failure reasons and Sentry events."""
from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from typing import Iterable

_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_HEADER_SECRET = re.compile(
    r"(?i)(authorization|proxy-authorization|cookie|set-cookie)(['\"]?\s*[:=]\s*['\"]?)[^'\"\n,}]+"
)

SENSITIVE_KEYS = (
    "proxy", "proxies", "cookie", "cookies", "authorization", "proxy-authorization",
    "proxy_authorization", "set-cookie", "dsn", "sentry_dsn", "password", "mongo_uri",
    "mongo_log_uri", "redis_url",
)

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


def install_logging_filter(logger: logging.Logger | None = None) -> None:
    target = logger or logging.getLogger()
    if not any(isinstance(f, RedactingFilter) for f in target.filters):
        target.addFilter(RedactingFilter())
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
