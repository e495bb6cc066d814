"""The control database: API tokens (``api_token``), console sessions (``web_session``) and the
cluster's generated secrets (``cluster_secret``).

Indexes: ``api_token`` is unique on ``name`` and on ``digest`` (a token is found by the SHA-256
of its secret, never by the secret); ``web_session`` is keyed by the SHA-256 of its cookie secret
and indexed by ``token`` so that revoking a token ends its sessions in one delete.
Invariant: no secret is stored in clear; a session names its token by digest, and a token's
sessions are removed before the token itself.
"""
from __future__ import annotations

import secrets
from datetime import datetime
from typing import Protocol

from pymongo.errors import DuplicateKeyError

from common.store.models import ApiToken, ClusterSecret, WebSession


class Token(Protocol):
    """What callers read of a stored token."""

    id: object
    name: str
    role: str
    digest: str
    jobs: list[str]
    projects: list[int]
    add_datetime: datetime


def token(name: str) -> ApiToken | None:
    """The token called ``name``, or None."""
    return ApiToken.objects(name=name).first()


def token_by_digest(digest: str) -> ApiToken | None:
    return ApiToken.objects(digest=digest).first()


def add_token(name: str, role: str, digest: str, projects: list[int] | None = None) -> ApiToken:
    """Insert a token holding ``projects`` (DuplicateKeyError if the name or digest exists)."""
    token = ApiToken(name=name, role=role, digest=digest, projects=list(projects or []))
    token.save(force_insert=True)
    return token


def tokens() -> list[ApiToken]:
    """Every token, by name."""
    return list(ApiToken.objects.order_by("name"))


def grant(token_id, names: list[str], remove: bool = False) -> list[str]:
    """Add ``names`` to (or pull them from) the token's job grants; its grants after, sorted."""
    if remove:
        ApiToken.objects(id=token_id).update_one(pull_all__jobs=names)
    else:
        ApiToken.objects(id=token_id).update_one(add_to_set__jobs=names)
    return sorted(ApiToken.objects.get(id=token_id).jobs)


def revoke(found: ApiToken) -> None:
    """Remove a token and, first, every session it opened."""
    WebSession.objects(token=found.digest).delete()
    found.delete()


def touch(token_id, now: datetime) -> None:
    """Record that a token was used at ``now``."""
    ApiToken.objects(id=token_id).update_one(set__last_used_at=now)


def add_session(session_id: str, token_digest: str, csrf: str, expires_at: datetime) -> None:
    WebSession(id=session_id, token=token_digest, csrf=csrf, expires_at=expires_at).save(force_insert=True)


def session(session_id: str) -> WebSession | None:
    return WebSession.objects(id=session_id).first()


def end_session(session_id: str) -> None:
    WebSession.objects(id=session_id).delete()


def secret(name: str) -> str:
    """The cluster secret ``name``, generated (once, whichever process is first) if missing."""
    found = ClusterSecret.objects(id=name).first()
    if found is None:
        try:
            ClusterSecret(id=name, value=secrets.token_hex(32)).save(force_insert=True)
        except DuplicateKeyError:  # another process made it first: use theirs
            pass
        found = ClusterSecret.objects.get(id=name)
    return found.value
