"""The store's times: this machine's clock in the shape BSON stores (naive UTC), the source
store's clock that leases, exports and claims are stamped and judged by, ``_id`` ranges by time,
and the one text form a stored time is shown in (API JSON, exports, the CLI).

Protocol: the store's clock is the one clock of the cluster. Workers stamp with ``$currentDate``
or with ``store_time`` (this machine's clock corrected by the offset ``sync_store_clock`` last
measured, every heartbeat); the defender judges leases by ``store_now``. ``utcnow`` is for
what no other machine compares against (log lines, creation stamps).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from bson import ObjectId
from mongoengine.connection import get_db


def utcnow() -> datetime:
    """Naive UTC, as BSON stores it."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def store_now() -> datetime:
    """The source store's clock (naive UTC): the one clock leases and exports are stamped with
    (``$currentDate`` by workers) and judged by (the defender), whatever each machine's clock says."""
    now: datetime = get_db("source").command("hello")["localTime"]
    return now


_store_offset = timedelta(0)  # the store's clock minus this machine's, as last measured


def sync_store_clock() -> None:
    """Measure this machine's clock against the store's (to within half a round trip); the
    worker's heartbeat does so every beat."""
    global _store_offset
    before = utcnow()
    store = store_now()
    after = utcnow()
    _store_offset = store - (before + (after - before) / 2)


def store_time() -> datetime:
    """Now by the store's clock without asking it (this machine's, corrected by the last
    ``sync_store_clock``): the due times and stamps a worker writes."""
    return utcnow() + _store_offset


OBJECT_ID_TIMES = (
    datetime(1970, 1, 1),
    datetime(2106, 2, 7, 6, 28, 15),
)  # what an ObjectId's 4-byte time holds


def id_at(when: datetime) -> ObjectId:
    """The smallest ObjectId made at ``when`` (naive UTC), for ranges by ``_id`` time: times
    outside what an ObjectId can hold are clamped (a 100-year retention, a date in 9999)."""
    return ObjectId.from_datetime(min(max(when, OBJECT_ID_TIMES[0]), OBJECT_ID_TIMES[1]))


def iso(value: object) -> object:
    """A stored (naive UTC) time as RFC 3339 in one shape, to the millisecond BSON keeps
    (``2026-11-25T09:40:35.120Z``, ``.000Z`` on a whole second); anything else unchanged."""
    return value.isoformat(timespec="milliseconds") + "Z" if isinstance(value, datetime) else value
