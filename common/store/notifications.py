"""The outbox: webhooks and mails to deliver (``notification``) and the record of each delivery
attempt (``notification_log``, on the log alias).

Index ``(state, next_at)``: the due PENDING notifications, which ``claim`` reads oldest-due first.
Invariant: a notification is attempted by one process at a time, the one whose claim
(``claimed_until``) is current; every attempt bumps ``attempts`` before it is made, and each
ends PENDING again (with a later ``next_at``), SUCCESS or FAIL with its claim cleared.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from common.store.models import FAIL, PENDING, SUCCESS, Notification, NotificationLog


def add(kind: str, target: str, event: str, body: str, subject: str = "") -> None:
    """Queue a notification, due now."""
    Notification(kind=kind, target=target, event=event, subject=subject, body=body).save()


def claim(now: datetime, hold: timedelta) -> dict | None:
    """Claim one due notification for ``hold`` (counting the attempt); its document, or None."""
    return Notification._get_collection().find_one_and_update(
        {"state": PENDING, "next_at": {"$lte": now},
         "$or": [{"claimed_until": None}, {"claimed_until": {"$lt": now}}]},
        {"$set": {"claimed_until": now + hold}, "$inc": {"attempts": 1}}, return_document=True)


def delivered(doc: dict) -> None:
    Notification._get_collection().update_one(
        {"_id": doc["_id"]}, {"$set": {"state": SUCCESS, "last_error": None}, "$unset": {"claimed_until": 1}})


def failed(doc: dict, error: str, final: bool, next_at: datetime) -> None:
    """An attempt failed: FAIL for good if ``final``, else PENDING again from ``next_at``."""
    Notification._get_collection().update_one(
        {"_id": doc["_id"]},
        {"$set": {"state": FAIL if final else PENDING, "last_error": error, "next_at": next_at},
         "$unset": {"claimed_until": 1}})


def log_attempt(target: str, kind: str, event: str, status: str, attempt: int, error: str | None) -> None:
    NotificationLog(target=target, kind=kind, event=event, status=status, attempt=attempt, error=error).save()
