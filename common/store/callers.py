"""The download center's callers (``center_caller``) and their string ids of projects and groups
(``center_key``), control database; the rules are ``master/callers.py``'s.

Invariant: a caller's secret is read only to check a signature (``secret_of``); listings never
carry it.
"""
from __future__ import annotations

from datetime import datetime

from bson import ObjectId
from mongoengine.errors import NotUniqueError
from pymongo.errors import DuplicateKeyError

from common.store.connection import collection
from common.store.control_models import ApiToken, CenterCaller, CenterKey
from common.store.records import Token


def add(app_id: str, secret: str, token_id: ObjectId) -> bool:
    """Store a caller; False if its app id exists."""
    try:
        CenterCaller(id=app_id, secret=secret, token=token_id).save(force_insert=True)
    except (DuplicateKeyError, NotUniqueError):
        return False
    return True


def exists(app_id: str) -> bool:
    return collection(CenterCaller).count_documents({"_id": app_id}, limit=1) > 0


def secret_of(app_id: str) -> tuple[str, Token | None] | None:
    """The caller's secret and its token (None: no such caller)."""
    doc = collection(CenterCaller).find_one({"_id": app_id})
    if doc is None:
        return None
    return str(doc["secret"]), Token.maybe(collection(ApiToken).find_one({"_id": doc["token"]}))


def remove(app_id: str) -> Token | None | bool:
    """Remove a caller: its token (to revoke), None if it had none left; False: no such caller."""
    doc = collection(CenterCaller).find_one_and_delete({"_id": app_id})
    if doc is None:
        return False
    return Token.maybe(collection(ApiToken).find_one({"_id": doc["token"]}))


def listing() -> list[tuple[str, list[int], datetime | None]]:
    """Every caller: app id, its token's projects, when it was added (no secret)."""
    out = []
    for doc in collection(CenterCaller).find({}, {"secret": 0}).sort("_id", 1):
        token = collection(ApiToken).find_one({"_id": doc["token"]}, {"projects": 1})
        out.append((str(doc["_id"]), sorted((token or {}).get("projects") or []), doc.get("add_datetime")))
    return out


def add_key(key: str, kind: str, name: str, project: int | None = None, group: str | None = None) -> bool:
    """Store a string id; False if the id, or the name within its kind, exists."""
    try:
        CenterKey(id=key, kind=kind, name=name, project=project, group=group).save(force_insert=True)
    except (DuplicateKeyError, NotUniqueError):
        return False
    return True


def project_of(key_id: str) -> int | None:
    """The project a caller's string id names, or None."""
    doc = collection(CenterKey).find_one({"_id": key_id, "kind": "project"}, {"project": 1})
    return None if doc is None else int(doc["project"])


def is_group(key_id: str) -> bool:
    return collection(CenterKey).count_documents({"_id": key_id, "kind": "group"}, limit=1) > 0


def named(kind: str, name: str) -> bool:
    return collection(CenterKey).count_documents({"kind": kind, "name": name}, limit=1) > 0


def key_of(project: int) -> str | None:
    """The string id callers know project ``project`` by, if it has one."""
    doc = collection(CenterKey).find_one({"kind": "project", "project": project}, {"_id": 1})
    return None if doc is None else str(doc["_id"])
