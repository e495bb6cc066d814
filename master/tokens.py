"""API tokens and console sessions.

A token is shown once, at creation; MongoDB keeps only its SHA-256, so a stolen database does
not open the API. Lookups go by digest and the stored digest is compared in constant time.
Console sessions live in MongoDB too (any web process knows them; signing out or revoking the
token ends them at once).
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import timedelta

from common.config import settings
from common.errors import NotFound, ValidationError
from common.store.models import ROLES, ApiToken, WebSession, utcnow

TOKEN_PREFIX = "dct_"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def create(name: str, role: str) -> str:
    """Store a new token NAME with ROLE; return the token (the only time it exists in clear)."""
    if not NAME_RE.match(name or ""):
        raise ValidationError(f"token name must be 1-64 letters, digits, '_', '.', '@' or '-', got {name!r}")
    if role not in ROLES:
        raise ValidationError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if ApiToken.objects(name=name).first() is not None:
        raise ValidationError(f"a token named {name!r} exists: revoke it first")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken(name=name, role=role, digest=digest(token)).save(force_insert=True)
    return token


def listing() -> list[dict]:
    return [{"name": t.name, "role": t.role, "created": t.add_datetime, "last_used": t.last_used_at, "jobs": t.jobs}
            for t in ApiToken.objects.order_by("name")]


def grant(name: str, jobs: list[str], remove: bool = False) -> list[str]:
    """Let token NAME see every export of ``jobs`` (or no longer, with ``remove``); its grants after."""
    from common.store.models import job_named

    token = ApiToken.objects(name=name).first()
    if token is None:
        raise NotFound(f"no token named {name!r}")
    names = [job_named(j).name for j in jobs] if not remove else list(jobs)  # granting needs the job to exist
    if remove:
        ApiToken.objects(id=token.id).update_one(pull_all__jobs=names)
    else:
        ApiToken.objects(id=token.id).update_one(add_to_set__jobs=names)
    token.reload()
    return sorted(token.jobs)


def revoke(name: str) -> None:
    token = ApiToken.objects(name=name).first()
    if token is None:
        raise NotFound(f"no token named {name!r}")
    WebSession.objects(token=token.digest).delete()
    token.delete()


def authenticate(secret: str | None) -> ApiToken | None:
    """The token whose secret is ``secret``, or None (unknown, revoked or malformed)."""
    if not secret or len(secret) > 256:
        return None
    wanted = digest(secret)
    token = ApiToken.objects(digest=wanted).first()
    if token is None or not hmac.compare_digest(token.digest, wanted):
        return None
    now = utcnow()
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects(id=token.id).update_one(set__last_used_at=now)  # coarse: one write a minute
    return token


def start_session(token: ApiToken) -> tuple[str, str]:
    """A new console session for ``token``: (cookie secret, CSRF token)."""
    secret, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    WebSession(id=digest(secret), token=token.digest, csrf=csrf,
               expires_at=utcnow() + timedelta(seconds=settings.WEB_SESSION_TTL)).save(force_insert=True)
    return secret, csrf


def session_of(secret: str | None) -> tuple[ApiToken, str] | None:
    """(token, CSRF token) of a live session, or None."""
    if not secret or len(secret) > 256:
        return None
    session = WebSession.objects(id=digest(secret)).first()
    if session is None or session.expires_at < utcnow():
        return None
    token = ApiToken.objects(digest=session.token).first()
    return (token, session.csrf) if token is not None else None


def end_session(secret: str | None) -> None:
    if secret and len(secret) <= 256:
        WebSession.objects(id=digest(secret)).delete()
