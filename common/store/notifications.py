"""The outbox: webhooks and mails to deliver (``notification``) and the record of each delivery
attempt (``notification_log``, on the log alias).

Index ``(state, next_at)``: the due PENDING notifications, which ``claim`` reads oldest-due first.
Invariant: a notification is attempted by one process at a time, the one that holds its claim
(``common.store.claims``, as ``OUTBOX``: ``worker`` and ``beat_at``, HOLD seconds); every
attempt bumps ``attempts`` before it is made, and each ends PENDING again (with a later
``next_at``), SUCCESS or FAIL, its claim cleared, written only while its claim is still held. A
claim whose deliverer died is taken back by ``recover`` (FAIL at MAX_RECOVERIES).
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from pymongo.collection import Collection

from common.config import settings
from common.store import claims
from common.store.connection import collection
from common.store.log_models import NotificationLog
from common.store.models import FAIL, PENDING, SUCCESS, Notification
from common.store.records import NotificationRecord

HOLD = 120  # seconds a delivery may take (connect and read timeouts included) before its claim lapses


def _coll() -> Collection[dict[str, Any]]:
    return collection(Notification)


OUTBOX = claims.Claimed("notification", _coll, owner="worker", ttl=lambda: float(HOLD),
                        max_recoveries=lambda: int(settings.MAX_RECOVERIES), held={"state": PENDING})
RELEASE = {"worker": None, claims.BEAT: None}  # a claim cleared


def add(channel: str, target: str, event: str, body: str, subject: str = "") -> None:
    """Queue a notification, due now."""
    Notification(channel=channel, target=target, event=event, subject=subject, body=body).save()


def claim(now: datetime, owner: str) -> NotificationRecord | None:
    """Claim one due notification for ``owner`` (counting the attempt), or None."""
    due = {"state": PENDING, "next_at": {"$lte": now}, "worker": None}
    return NotificationRecord.maybe(claims.claim(OUTBOX, due, owner, {"$inc": {"attempts": 1}}))


def recover(now: datetime) -> int:
    """Take back the claims whose deliverer died (``now``: the store's clock); how many."""
    taken = 0
    for doc in claims.expired(OUTBOX, now, limit=50):
        error = "its deliverer died"
        again = {"$set": {"last_error": error, "next_at": now, claims.BEAT: None}}
        given_up = {"$set": {"state": FAIL, "last_error": f"{error} {OUTBOX.max_recoveries()} times",
                             claims.BEAT: None}}
        taken += claims.recover(OUTBOX, doc, error, again, given_up) is not None
    return taken


def delivered(claimed: NotificationRecord) -> None:
    _coll().update_one({"_id": claimed.id, **claims.holding(OUTBOX, claimed.worker or "")},
                       {"$set": {"state": SUCCESS, "last_error": None, **RELEASE}})


def failed(claimed: NotificationRecord, error: str, final: bool, next_at: datetime) -> None:
    """An attempt failed: FAIL for good if ``final``, else PENDING again from ``next_at``."""
    _coll().update_one({"_id": claimed.id, **claims.holding(OUTBOX, claimed.worker or "")},
                       {"$set": {"state": FAIL if final else PENDING, "last_error": error, "next_at": next_at,
                                 **RELEASE}})


def upgrade_claims() -> int:
    """The upgrade to the one claim protocol: a claim an earlier version held (``claimed_until``)
    becomes one held by ``earlier version``, lapsing when it did; how many moved."""
    moved = 0
    for doc in _coll().find({"claimed_until": {"$exists": True}}, {"claimed_until": 1}):
        until = doc.get("claimed_until")
        change: dict[str, Any] = {"$unset": {"claimed_until": 1}}
        if until is not None:
            change["$set"] = {"worker": "earlier version", claims.BEAT: until - timedelta(seconds=HOLD)}
        moved += _coll().update_one({"_id": doc["_id"], "claimed_until": until}, change).modified_count
    return moved


def log_attempt(target: str, channel: str, event: str, status: str, attempt: int, error: str | None) -> None:
    NotificationLog(target=target, channel=channel, event=event, status=status, attempt=attempt,
                    error=error).save()
