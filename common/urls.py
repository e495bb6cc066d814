"""URL checks shared by task intake and the engines."""
from __future__ import annotations

import re
from functools import lru_cache
from urllib.parse import urlsplit

from common.errors import ValidationError

ALLOWED_SCHEMES = ("http", "https")
# the ASCII characters check_url refuses (whitespace, controls, DEL): what its per-character
# test finds in an ASCII URL, found by one search (every page's URL is checked on the worker)
_ASCII_REFUSED = re.compile(r"[\x00-\x20\x7f]")


def _refused_char(url: str) -> bool:
    """Whether ``url`` holds whitespace or a control character."""
    if url.isascii():
        return _ASCII_REFUSED.search(url) is not None
    return any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url)


@lru_cache(maxsize=4096)
def _idna_ok(host: str) -> bool:
    """Whether ``host`` is IDNA-encodable (remembered per host: pages share their hosts)."""
    try:
        host.encode("idna")
    except UnicodeError:
        return False
    return True


def check_url(url: str, max_length: int = 8192) -> str:
    """Return ``url`` if it is an absolute http(s) URL we can fetch, else raise ValidationError.

    Non-ASCII host names are accepted (IDNA-encodable); whitespace and control characters,
    other schemes and over-long URLs are not.
    """
    if not url:
        raise ValidationError("empty URL")
    if len(url) > max_length:
        raise ValidationError(f"URL longer than {max_length} characters")
    if _refused_char(url):
        raise ValidationError("URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValidationError(f"malformed URL: {exc}") from None
    if parts.scheme.lower() not in ALLOWED_SCHEMES:
        raise ValidationError(f"scheme must be http or https, got {parts.scheme or 'none'!r}")
    host = parts.hostname
    if not host:
        raise ValidationError("URL has no host")
    if not _idna_ok(host):
        raise ValidationError(f"invalid host name {host!r}")
    if port == 0:
        raise ValidationError("port 0 is not valid")
    return url


def site_name(text: str, where: str) -> str:
    """A site's host name as written in a manifest (``example.com``, no scheme or port), lower-cased and
    IDNA-encoded, else a one-line ValidationError naming ``where``."""
    host = text.strip().lower().rstrip(".")
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        ascii_host = ""
    if not ascii_host or any(ch in ascii_host for ch in "/:@?#[]*,; \\"):
        raise ValidationError(f"{where}: {text[:80]!r} is not a host name")
    return ascii_host


def canonical(url: str, max_length: int = 8192) -> str:
    """``url`` normalised as w3lib's ``canonicalize_url`` does (query sorted, percent-encoding
    made uniform, spaces encoded, fragment dropped), then held to ``check_url``; ValidationError
    if it is not one we fetch."""
    from w3lib.url import canonicalize_url

    if len(url) > max_length:  # before any work on it
        raise ValidationError(f"URL longer than {max_length} characters")
    try:
        out = canonicalize_url(url)
    except (ValueError, UnicodeError) as exc:
        raise ValidationError(f"malformed URL: {exc}") from None
    return check_url(out, max_length)


def url_pattern(pattern: str):
    """A URL pattern (a job's ``follow.allow`` / ``deny``) compiled by RE2: Python's syntax without
    backreferences and lookaround, matched in time linear in the URL, so no job's pattern can stall
    the worker or intake judging it (``re`` backtracks: ``(a+)+$`` takes years on 2,000
    characters). ValueError with RE2's one-line reason if it does not compile."""
    import re2

    options = re2.Options()
    options.log_errors = False  # the reason goes into the error, never to stderr
    try:
        return re2.compile(pattern, options=options)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else "invalid pattern"
        text = reason.decode(errors="replace") if isinstance(reason, bytes) else str(reason)
        raise ValueError(text) from None
