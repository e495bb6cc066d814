"""Claimed work: the one protocol by which a process takes a document, holds it while it lives,
and hands it back — used by download leases (``leases``), exports (``exports``), generator runs
(``generators``) and the notification outbox (``notifications``).

A held document names its holder (the field ``Claimed.owner``) and carries ``beat_at``, stamped
with the store's clock (``$currentDate``) by the claim and by every beat; the hold's deadline is
``beat_at`` + ``Claimed.ttl()``. Its states, for every user:

    free      what the user's ``match`` of a claim says (QUEUED, PENDING, no run under way ...)
    held      ``Claimed.held`` and ``owner`` set; ``beat_at`` younger than the ttl
    expired   held, ``beat_at`` older than the ttl: its holder is taken as dead
    ended     the user's own final states (SUCCESS, FAIL, DEAD ..., or the document gone)

Who writes what:
  * ``claim`` (a worker): free -> held, compare-and-set, so one holder at a time.
  * ``beat`` (the holder, every HEARTBEAT_INTERVAL): ``beat_at`` again, only while it holds it.
  * ``holding`` (the holder): the guard of every write it makes as holder — a settle, a give
    back, a progress note. A holder whose document was taken back matches nothing: the fence.
  * ``recover`` (the judge: the defender, the export center's ``tend``, the generators' ``tend``,
    the outbox's ``deliver_due``): expired -> free again, or ended when given up; a
    compare-and-set on the holder and ``beat_at`` as judged, so a holder that beat meanwhile
    keeps its hold. One counter (``recoveries``), one give-up rule (``gives_up``: the recovery
    that reaches ``max_recoveries``), one alert (``alert``) and one log line when it gives up.

What each user sets is its ``Claimed``: where its documents are, what "held" means, the holder's
field, the ttl, how many recoveries it allows and the alert type; what "free again" and "given
up" change is passed by the user to ``recover``. Leases keep their counter on their tasks, one
per task: ``spent`` is the same rule as a query.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Callable, Iterable, Mapping

from bson import ObjectId
from pymongo import ReturnDocument
from pymongo.collection import Collection

from common.store import logs
from common.store.clock import utcnow

logger = logging.getLogger(__name__)

BEAT = "beat_at"        # the holder's last sign of life, by the store's clock
COUNTER = "recoveries"  # times a dead holder's work was taken back
Doc = dict[str, Any]    # a raw document, or a query or update of one: this module is the store's plumbing


@dataclass(frozen=True)
class Claimed:
    """One user of the protocol and what it sets."""

    name: str                               # in log lines and alerts: "download lease", "export" ...
    coll: Callable[[], Collection[Doc]]
    owner: str                              # the field naming the holder
    ttl: Callable[[], float]                # seconds a hold lives after its last beat
    max_recoveries: Callable[[], int]       # the recovery that reaches it gives the work up
    held: Mapping[str, Any] = field(default_factory=dict)  # what a held document also matches
    alert: str | None = None                # the alert type written when work is given up


def holding(kind: Claimed, owner: str) -> Doc:
    """What a document must still look like for ``owner`` to write to it as its holder."""
    return {**kind.held, kind.owner: owner}


def claim(kind: Claimed, match: Doc, owner: str, change: Doc | None = None) -> Doc | None:
    """Take the document that ``match`` (its free state) finds for ``owner``, by compare-and-set,
    with ``change`` (more update operators); the document after, or None if none was free."""
    update: Doc = {k: dict(v) for k, v in (change or {}).items()}
    update.setdefault("$set", {}).update({**kind.held, kind.owner: owner})
    update.setdefault("$currentDate", {})[BEAT] = True
    return kind.coll().find_one_and_update(match, update, return_document=ReturnDocument.AFTER)


def beat(kind: Claimed, ids: Iterable[Any], owner: str) -> int:
    """Extend ``owner``'s holds of ``ids``; how many it still holds."""
    ids = list(ids)
    if not ids:
        return 0
    return kind.coll().update_many({"_id": {"$in": ids}, **holding(kind, owner)},
                                   {"$currentDate": {BEAT: True}}).matched_count


def expired(kind: Claimed, now: datetime, fields: Mapping[str, int] | None = None,
            limit: int = 500) -> list[Doc]:
    """Held documents whose holder has not beaten for ``kind.ttl()`` seconds (``now``: the
    store's clock), with ``fields``, the holder, ``beat_at`` and the counter."""
    shown = {**(fields or {}), kind.owner: 1, BEAT: 1, COUNTER: 1}
    silent = {**kind.held, kind.owner: {"$ne": None}, BEAT: {"$lt": now - timedelta(seconds=kind.ttl())}}
    return list(kind.coll().find(silent, shown).limit(limit))


def gives_up(kind: Claimed, recoveries: int) -> bool:
    """The one give-up rule: whether one more recovery, after ``recoveries``, is the last."""
    return recoveries + 1 >= kind.max_recoveries()


def spent(kind: Claimed) -> Doc:
    """``gives_up`` as a query: the documents whose next recovery is their last."""
    return {COUNTER: {"$gte": kind.max_recoveries() - 1}}


def judged(kind: Claimed, doc: Doc) -> Doc:
    """The guard of a judge's write: the document still held as it was judged (same holder, no
    beat since)."""
    return {"_id": doc["_id"], **kind.held, kind.owner: doc.get(kind.owner), BEAT: doc.get(BEAT)}


def recover(kind: Claimed, doc: Doc, reason: str, again: Doc, given_up: Doc,
            guard: Doc | None = None, job: ObjectId | None = None, what: str | None = None) -> bool | None:
    """Take the work of a dead (or overrunning) holder back: ``again`` (update operators: free
    again) or, when ``gives_up``, ``given_up`` (ended), counting the recovery and clearing the
    holder. By compare-and-set on ``guard`` (default: ``judged``); ``job`` and ``what`` (default:
    the kind and id) say in the alert whose work it was. Whether it was given up, or None when
    the document changed meanwhile (its holder beat or ended it)."""
    final = gives_up(kind, doc.get(COUNTER) or 0)
    update: Doc = {k: dict(v) for k, v in (given_up if final else again).items()}
    update.setdefault("$set", {})[kind.owner] = None
    update.setdefault("$inc", {})[COUNTER] = 1
    if not kind.coll().update_one(guard or judged(kind, doc), update).modified_count:
        return None
    what = what or f"{kind.name} {doc['_id']}"
    if final:
        times = f" after {kind.max_recoveries()} recoveries" if kind.max_recoveries() > 1 else ""
        give_up_alert(kind, job, f"{what} given up{times}: {reason}")
    else:
        logger.warning("%s recovered: %s", what, reason)
    return final


def give_up_alert(kind: Claimed, job: ObjectId | None, text: str) -> None:
    """The one alert of work given up: a log line and, if ``kind`` has one, an alert record."""
    logger.warning("%s", text)
    if kind.alert:
        logs.add_alerts([(job, kind.alert, text[:10000])], utcnow())


class Beating(threading.Thread):
    """Beats ``owner``'s hold of ``doc_id`` every ``every`` seconds until ``halt`` is set (the
    holder's thread for work that runs in one piece: an export, a generator run)."""

    def __init__(self, kind: Claimed, doc_id: Any, owner: str, every: float) -> None:
        super().__init__(daemon=True, name=f"beat-{kind.name}")
        self.kind, self.doc_id, self.owner, self.every = kind, doc_id, owner, every
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.every):
            try:
                beat(self.kind, [self.doc_id], self.owner)
            except Exception as exc:  # MongoDB away: the judge may recover it; the holder then stops
                logger.warning("%s heartbeat failed: %s", self.kind.name, type(exc).__name__)

    def __enter__(self) -> Beating:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
