"""Download tasks of the general download center in the ``export`` collection: an export with a
``project`` and a ``center`` document (its parameters). The listing is served by the
``(project, -created_at)`` index; its filters narrow what that index finds.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bson import ObjectId

from common.store.connection import collection
from common.store.models import CANCELLED, EXPIRED, FAIL, Export
from common.store.records import ExportRecord


@dataclass(frozen=True)
class Wanted:
    """Which download tasks a listing takes: those of ``projects``, narrowed by each filter given
    (None: any); ``name_part``: a part of the name, matched as written."""
    projects: Sequence[int]
    states: Sequence[str] | None = None
    operator_id: str | None = None
    merchant_type: int | None = None
    merchant_id: int | None = None
    name_part: str | None = None


def _query(wanted: Wanted) -> dict[str, Any]:
    query: dict[str, Any] = {"project": {"$in": list(wanted.projects)}}
    if wanted.states is not None:
        query["state"] = {"$in": list(wanted.states)}
    for key, value in (("center.operator_id", wanted.operator_id),
                       ("center.merchant_type", wanted.merchant_type),
                       ("center.merchant_id", wanted.merchant_id)):
        if value is not None:
            query[key] = value
    if wanted.name_part is not None:
        query["center.name"] = {"$regex": re.escape(wanted.name_part)}
    return query


def page(wanted: Wanted, skip: int, limit: int) -> tuple[list[ExportRecord], int]:
    """The download tasks ``wanted`` names, newest first, ``limit`` from ``skip``; and how many
    match in all. The rows a download task carried inline (``center.source_data``, up to
    SOURCE_DATA_MAX_BYTES each) are not read."""
    tasks = {**_query(wanted), "center": {"$exists": True, "$ne": {}}}
    found = collection(Export).find(tasks, {"center.source_data": 0}).sort("created_at", -1)
    return ([ExportRecord.from_doc(d) for d in found.skip(skip).limit(limit)],
            collection(Export).count_documents(tasks))


def ended_before(cutoff: datetime, limit: int) -> list[ExportRecord]:
    """Download tasks that ended (FAIL, CANCEL, EXPIRED: a done one's file expires first) before
    ``cutoff``, oldest first, with everything they carry (for the archive)."""
    query = {"center": {"$exists": True, "$ne": {}}, "state": {"$in": [FAIL, CANCELLED, EXPIRED]},
             "finished_at": {"$lt": cutoff}}
    found = collection(Export).find(query).sort("finished_at", 1).limit(limit)
    return [ExportRecord.from_doc(d) for d in found]


def remove_many(export_ids: list[ObjectId]) -> int:
    return int(collection(Export).delete_many({"_id": {"$in": export_ids}}).deleted_count)
