"""Keys and signatures: signed export links (HMAC-SHA256 under SECRET_KEY) and webhook
signatures (``t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` under WEBHOOK_SECRET).

A key left empty in the settings is generated once for the whole cluster and kept in the
control database (never the source database analysts read), so every web host signs and checks
with the same one.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import time

from common.config import settings
from common.store import control


def key(name: str) -> bytes:
    """The setting ``name`` (SECRET_KEY or WEBHOOK_SECRET), or the cluster's generated key."""
    value = getattr(settings, name)
    if value:
        return value.encode()
    return control.secret(name).encode()


def _mac(secret: bytes, message: str) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def public_base() -> str:
    return (settings.PUBLIC_URL or "http://" + settings.WEB_BIND).rstrip("/")


def export_url(export_id: str, ttl: int | None = None) -> str:
    """An absolute, signed link to an export's file, valid for ``ttl`` seconds."""
    expires = int(time.time()) + int(ttl if ttl is not None else settings.EXPORT_URL_TTL)
    sig = _mac(key("SECRET_KEY"), f"export:{export_id}:{expires}")
    return f"{public_base()}/files/exports/{export_id}?expires={expires}&sig={sig}"


EXPIRES_RE, SIG_RE = re.compile(r"[0-9]{1,20}"), re.compile(r"[0-9a-fA-F]{64}")


def check_export_sig(export_id: str, expires: str, sig: str) -> str | None:
    """None when the link is good; else "tampered" or "expired" (any text a client sends: an
    ASCII-only shape first, as ``hmac.compare_digest`` raises on other strings)."""
    if not EXPIRES_RE.fullmatch(expires) or not SIG_RE.fullmatch(sig):
        return "tampered"
    want = _mac(key("SECRET_KEY"), f"export:{export_id}:{expires}")
    if not hmac.compare_digest(want, sig.lower()):
        return "tampered"
    return "expired" if int(expires) < time.time() else None


def webhook_signature(body: bytes, at: int | None = None) -> str:
    at = int(time.time()) if at is None else at
    mac = hmac.new(key("WEBHOOK_SECRET"), f"{at}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={at},v1={mac}"
