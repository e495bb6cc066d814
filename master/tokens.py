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
from common.store import control
from common.store import projects as stored_projects
from common.store.clock import utcnow
from common.store.control_models import ADMIN, ROLES

TOKEN_PREFIX = "dct_"
RESERVED = "cli"  # ``requested_by`` of the command line's exports (read by name before owners)
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def holding(role: str, projects: list[int] | None) -> list[int]:
    """The projects a new token of ROLE holds: ``projects``, or when none are named the
    ``default`` project, where jobs registered without a project go (an admin holds every
    project whatever it is given). Every door that makes tokens (the CLI, the API) asks here."""
    if projects or role == ADMIN:
        return sorted(set(projects or []))
    return [stored_projects.default_id()]


def create(name: str, role: str, projects: list[int] | None = None) -> str:
    """Store a new token NAME with ROLE holding ``projects`` (ids; none: see ``holding``); return
    the token (the only time it exists in clear)."""
    if not NAME_RE.match(name or ""):
        raise ValidationError(f"token name must be 1-64 letters, digits, '_', '.', '@' or '-', got {name!r}")
    if name == RESERVED:
        raise ValidationError(f"token name {RESERVED!r} is reserved: it names the command line's exports")
    if role not in ROLES:
        raise ValidationError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if control.token(name) is not None:
        raise ValidationError(f"a token named {name!r} exists: revoke it first")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    control.add_token(name, role, digest(token), holding(role, projects))
    return token


def listing() -> list[dict]:
    return [
        {
            "name": t.name,
            "role": t.role,
            "created": t.add_datetime,
            "last_used": t.last_used_at,
            "jobs": t.jobs,
            "projects": sorted(t.projects),
        }
        for t in control.tokens()
    ]


def grant(name: str, jobs: list[str], remove: bool = False) -> list[str]:
    """Let token NAME see every export of ``jobs`` (or no longer, with ``remove``); its grants after."""
    from common.store.jobs import named as job_named

    token = control.token(name)
    if token is None:
        raise NotFound(f"no token named {name!r}")
    names = [job_named(j).name for j in jobs] if not remove else list(jobs)  # granting needs the job to exist
    return control.grant(token.id, names, remove)


def revoke(name: str) -> None:
    token = control.token(name)
    if token is None:
        raise NotFound(f"no token named {name!r}")
    control.revoke(token)


def authenticate(secret: str | None) -> control.Token | None:
    """The token whose secret is ``secret``, or None (unknown, revoked or malformed)."""
    if not secret or len(secret) > 256:
        return None
    wanted = digest(secret)
    token = control.token_by_digest(wanted)
    if token is None or not hmac.compare_digest(token.digest, wanted):
        return None
    now = utcnow()
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        control.touch(token.id, now)  # coarse: one write a minute
    return token


def start_session(token: control.Token) -> tuple[str, str]:
    """A new console session for ``token``: (cookie secret, CSRF token)."""
    secret, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    expires_at = utcnow() + timedelta(seconds=settings.WEB_SESSION_TTL)
    control.add_session(digest(secret), token.digest, csrf, expires_at)
    return secret, csrf


def session_of(secret: str | None) -> tuple[control.Token, str] | None:
    """(token, CSRF token) of a live session, or None."""
    if not secret or len(secret) > 256:
        return None
    session = control.session(digest(secret))
    if session is None or session.expires_at < utcnow():
        return None
    token = control.token_by_digest(session.token)
    return (token, session.csrf) if token is not None else None


def end_session(secret: str | None) -> None:
    if secret and len(secret) <= 256:
        control.end_session(digest(secret))
