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
from typing import Any

from bson import ObjectId
from pymongo.collection import Collection
from pymongo.errors import DuplicateKeyError

from common.store.connection import collection
from common.store.control_models import ApiToken, ClusterSecret, WebSession
from common.store.records import Session, Token

__all__ = ["Token", "Session"]


def _tokens() -> Collection[dict[str, Any]]:
    return collection(ApiToken)


def token(name: str) -> Token | None:
    """The token called ``name``, or None."""
    return Token.maybe(_tokens().find_one({"name": name}))


def token_by_digest(digest: str) -> Token | None:
    return Token.maybe(_tokens().find_one({"digest": digest}))


def add_token(name: str, role: str, digest: str, projects: list[int] | None = None) -> Token:
    """Insert a token holding ``projects`` (DuplicateKeyError if the name or digest exists)."""
    doc = ApiToken(name=name, role=role, digest=digest, projects=list(projects or []))
    doc.save(force_insert=True)
    return Token.from_doc(doc.to_mongo())


def tokens() -> list[Token]:
    """Every token, by name."""
    return [Token.from_doc(d) for d in _tokens().find({}).sort("name", 1)]


def grant(token_id: ObjectId, names: list[str], remove: bool = False) -> list[str]:
    """Add ``names`` to (or pull them from) the token's job grants; its grants after, sorted."""
    if remove:
        ApiToken.objects(id=token_id).update_one(pull_all__jobs=names)
    else:
        ApiToken.objects(id=token_id).update_one(add_to_set__jobs=names)
    after = _tokens().find_one({"_id": token_id}, {"jobs": 1}) or {"_id": token_id}
    return sorted(Token.from_doc(after).jobs)


def revoke(found: Token) -> None:
    """Remove a token and, first, every session it opened."""
    WebSession.objects(token=found.digest).delete()
    _tokens().delete_one({"_id": found.id})


def touch(token_id: ObjectId, now: datetime) -> None:
    """Record that a token was used at ``now``."""
    ApiToken.objects(id=token_id).update_one(set__last_used_at=now)


def add_session(session_id: str, token_digest: str, csrf: str, expires_at: datetime) -> None:
    WebSession(id=session_id, token=token_digest, csrf=csrf, expires_at=expires_at).save(force_insert=True)


def session(session_id: str) -> Session | None:
    return Session.maybe(collection(WebSession).find_one({"_id": session_id}))


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
    return str(found.value)
