"""URL checks shared by task intake and the engines."""
from __future__ import annotations

from urllib.parse import urlsplit

from common.errors import ValidationError

ALLOWED_SCHEMES = ("http", "https")


def check_url(url: str, max_length: int = 8192) -> str:
    """Return ``url`` if it is an absolute http(s) URL we can fetch, else raise ValidationError.

    Non-ASCII host names are accepted (IDNA-encodable); whitespace and control characters,
    other schemes and over-long URLs are not.
    """
    if not url:
        raise ValidationError("empty URL")
    if len(url) > max_length:
        raise ValidationError(f"URL longer than {max_length} characters")
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
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
    try:
        host.encode("idna")
    except UnicodeError:
        raise ValidationError(f"invalid host name {host!r}") from None
    if port == 0:
        raise ValidationError("port 0 is not valid")
    return url
