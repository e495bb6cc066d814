"""The audit log (``audit_log``, control database): who changed what, and when.

Entries are only ever added, one per change (a job registered or switched, a token created,
revoked or granted, a project created, an export requested, cancelled or retried), and read
newest first by ``at`` (then ``_id``), window by window.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from bson import ObjectId

from common.store.connection import collection
from common.store.control_models import AuditEntry
from common.store.records import AuditEntry as Entry


def add(at: datetime, actor: str, actor_id: ObjectId | None, role: str | None, action: str, target: str,
        project: int | None, detail: dict[str, Any]) -> None:
    AuditEntry(at=at, actor=actor, actor_id=actor_id, role=role, action=action, target=target,
               project=project, detail=detail).save(force_insert=True)


def entries(limit: int, before: ObjectId | None = None, action: str | None = None) -> list[Entry]:
    """Up to ``limit`` entries, newest first (by ``at``, then ``_id``: ObjectIds made by two
    processes in one second are not in time order); ``before``: only those after that entry."""
    coll = collection(AuditEntry)
    query: dict[str, Any] = {}
    if before is not None:
        mark = coll.find_one({"_id": before}, {"at": 1})
        if mark is None:
            return []
        query["$or"] = [{"at": {"$lt": mark["at"]}}, {"at": mark["at"], "_id": {"$lt": before}}]
    if action:
        query["action"] = action
    return [Entry.from_doc(d) for d in coll.find(query).sort([("at", -1), ("_id", -1)]).limit(limit)]
