"""The data of a write's pages: one ``crawler_download_data`` document per success, built
(``_data_doc``), inserted in one bulk (one MongoDB cannot take fails its outcome alone), its page
version taken from an orphan of a lost attempt where the entry still holds the task
(``_take_version``), and the GridFS files of large bodies put after. Called by the writer
(``slave/worker/writer.py`` ``store_many``) before anything else of the write: a settle never names
data that is not stored (the fence, ``common.store.leases``).
"""
from __future__ import annotations

import logging
from datetime import datetime
from functools import partial

from bson.errors import InvalidDocument
from pymongo.errors import BulkWriteError, DocumentTooLarge

from common.errors import DownloadError
from common.revisit import Revisit
from common.store import attempts, leases
from common.store.connection import with_retries
from common.store.records import DataDoc
from slave.worker.outcome import Outcome, Pair, Part

logger = logging.getLogger(__name__)


def store(ok: list[Pair], now: datetime) -> list[Pair]:
    """Insert the data documents of the successes (then the GridFS files of large bodies); each
    outcome learns its ``data_id``. Returns the successes whose data is stored, and those whose
    page version another attempt holds (their guarded settle is refused: they lost the task)."""
    data_docs = [_data_doc(p.ctx, p.lease, o, now) for p, o in ok]
    for (_, o), d in zip(ok, data_docs):
        o.data_id = d.id
    if not data_docs:
        return ok
    outs = [o for _, o in ok]
    taken = _insert_data(outs, data_docs)
    lost = _lost_versions(ok, outs, data_docs, taken)
    kept = {id(o) for o in outs if o.error is None}
    _put_bodies(outs, data_docs, lost)
    return [(p, o) for p, o in ok if id(o) in kept]


def _lost_versions(ok: list[Pair], outs: list[Outcome], docs: list[attempts.Insert],
                   taken: list[tuple[attempts.Insert, DataDoc | None]]) -> set[int]:
    """The documents (by ``id``) refused because another holds their page version, that this
    entry could not take (``_take_version``)."""
    part_of, out_of = {id(o): p for p, o in ok}, {id(d): o for o, d in zip(outs, docs)}
    return {id(doc) for doc, held in taken if not _take_version(part_of[id(out_of[id(doc)])],
                                                                out_of[id(doc)], doc, held)}


def _put_bodies(outs: list[Outcome], docs: list[attempts.Insert], lost: set[int]) -> None:
    """The GridFS files of the large bodies stored (each document's ``body_file``)."""
    for o, d in zip(outs, docs):
        if id(d) in lost:
            o.data_id = None  # (nothing for a coalesced waiter to copy)
        elif (file_id := d.body_file) and o.error is None:
            body = o.download.body if o.download else b""
            put = partial(attempts.put_body, file_id, body, f"{o.task.id}-{d.lease}")
            with_retries(put, "GridFS put")


def _data_doc(ctx, lease: str, outcome: Outcome, now: datetime) -> attempts.Insert:
    prev = outcome.task.prev
    version = int(prev.versions or 0 if prev else 0) + 1 if Revisit.of(ctx.settings).on or prev else None
    return attempts.data_doc(ctx.job_id, ctx.download_id, outcome.task, lease, outcome.download, now, version)


def _insert_data(outcomes: list[Outcome],
                 docs: list[attempts.Insert]) -> list[tuple[attempts.Insert, DataDoc | None]]:
    """Insert the data documents; one that MongoDB cannot take turns its outcome into a final
    failure instead of failing the others. Returns those refused because another document holds
    their page version (``attempts.insert_data``)."""
    try:
        return with_retries(lambda: attempts.insert_data(docs), "data insert")
    except (InvalidDocument, DocumentTooLarge, BulkWriteError) as exc:  # duplicates alone never raise
        logger.warning("a data document was refused (%s); storing the others", type(exc).__name__)
    keep_o, keep_d = [], []
    for o, d in zip(outcomes, docs):
        why = attempts.unstorable(d)
        if why:
            o.download, o.error = None, DownloadError(why, retryable=False)
        else:
            keep_o.append(o)
            keep_d.append(d)
    outcomes[:] = keep_o
    docs[:] = keep_d
    return with_retries(lambda: attempts.insert_data(docs), "data insert")


VERSION_TRIES = 3  # replacements of a page version's orphan before the attempt is tried again later


def _take_version(p: Part, o: Outcome, doc: attempts.Insert, held: DataDoc | None) -> bool:
    """A data document refused because ``held`` holds its page version. If this entry still
    holds the task, ``held`` is an orphan of a lost attempt (no other can settle the task): it
    is replaced. Else this attempt lost the task, and its settle will be refused. Returns
    whether ``doc`` is stored; a version that cannot be taken makes the outcome a retryable
    failure, so that no settle names data that is not stored."""
    for _ in range(VERSION_TRIES):
        holds = partial(leases.holds, o.task.id, p.lease, p.attempt_kind, p.sent_at)
        if not with_retries(holds, "task held"):
            return False
        stored, held = with_retries(partial(attempts.replace, held, doc), "data replace")
        if stored:
            logger.info("replaced an orphan of task %s's page version with %s's", o.task.id, p.lease)
            return True
    o.download, o.error = None, DownloadError("page version held by another attempt", retryable=True)
    return False
