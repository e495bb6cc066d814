"""The maintenance chores' schedule: ``defender_state``, one document per chore
(``_id`` ``chore:<name>``, ``at``: when it is next due, by the store's clock).

No secondary index: every read and write is by ``_id``.

Invariant: a chore is taken by compare-and-set on its ``at``, so however many processes ask at
once, one of them runs it per interval (``claim_chore``).
"""
from __future__ import annotations

from datetime import datetime, timedelta

from pymongo.errors import DuplicateKeyError

from common.store.models import DefenderState


def claim_chore(name: str, every: float, now: datetime) -> bool:
    """Take chore ``name`` if it is due (its next time set ``every`` seconds on); False if
    another process has it or it is not due."""
    state, key, after = DefenderState._get_collection(), f"chore:{name}", now + timedelta(seconds=every)
    if state.update_one({"_id": key, "at": {"$lte": now}}, {"$set": {"at": after}}).modified_count:
        return True
    try:
        state.insert_one({"_id": key, "at": after})  # never run before
        return True
    except DuplicateKeyError:
        return False
