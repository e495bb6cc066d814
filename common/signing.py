"""Keys and signatures: signed export links (HMAC-SHA256 under SECRET_KEY), webhook
signatures (``t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<body>">`` under WEBHOOK_SECRET), and the
download center's caller signatures (``wecar_token``: the scheme /v1 callers sign with).

A key left empty in the settings is generated once for the whole cluster and kept in the
control database (never the source database analysts read), so every web host signs and checks
with the same one.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import time
from typing import Any
from urllib.parse import quote_plus

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


def php_query(params: dict[Any, Any], prefix: str = "") -> str:
    """``params`` as PHP's ``http_build_query`` writes them (RFC 1738: a space is ``+``, every byte
    but letters, digits and ``-_.`` percent-encoded; None left out, booleans 1/0; a nested list or
    object as ``key[sub]=``), in the given order."""
    parts = []
    for name, value in params.items():
        key = f"{prefix}[{name}]" if prefix else str(name)
        if value is None:
            continue
        if isinstance(value, (dict, list)):
            inner = value if isinstance(value, dict) else dict(enumerate(value))
            nested = php_query(inner, key)
            if nested:
                parts.append(nested)
            continue
        text = ("1" if value else "0") if isinstance(value, bool) else str(value)
        parts.append(f"{_php_encode(key)}={_php_encode(text)}")
    return "&".join(parts)


def _php_encode(text: str) -> str:
    return quote_plus(text, safe="").replace("~", "%7E")


def wecar_token(params: dict[str, Any], secret: str) -> str:
    """The token a /v1 caller (and the center, on its pulls and callbacks) sends with
    ``params``: md5 of the parameters other than ``token`` sorted by name and written as
    ``http_build_query`` writes them, followed by the secret. It carries no time: see
    docs/exports.md for how replays are bounded."""
    signed = {k: params[k] for k in sorted(params) if k != "token"}
    return hashlib.md5((php_query(signed) + secret).encode()).hexdigest()  # noqa: S324 (the callers' scheme)


def wecar_ok(params: dict[str, Any], secret: str, token: str) -> bool:
    return hmac.compare_digest(wecar_token(params, secret).encode(), str(token).lower().encode())


def center_tag(export_id: str) -> str:
    """The 16-hex tag of a /v1 task id (HMAC under SECRET_KEY): ``master.center_v1``."""
    return _mac(key("SECRET_KEY"), f"center-task:{export_id}")[:16]


def center_task_id(export_id: Any) -> str:
    """The task id a /v1 caller is given: the ObjectId and its tag (40 hex characters)."""
    return f"{export_id}{center_tag(str(export_id))}"


def center_download_url(export_id: Any, ttl: int | None = None) -> str:
    """A link to a /v1 task's file that needs no token: /v1/download/async with the task id and
    an export link's ``expires`` and ``sig``."""
    signed = export_url(str(export_id), ttl)
    return f"{public_base()}/v1/download/async?task_id={center_task_id(export_id)}&{signed.split('?', 1)[1]}"
