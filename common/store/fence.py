"""The fence's reading side: which data documents readers show. A task names its data (its
``data_lease``, its earlier versions' leases in ``history``); a data document no task names is an
orphan of a lost attempt (``common.store.orphans``) and is never read. The store's plumbing: raw
documents for the other store modules (``data``, ``pages``, ``retention``) to make records of.

Index: ``crawler_task`` by ``_id``; ``crawler_lease`` and ``crawler_lease_lost`` by ``_id``.
"""
from __future__ import annotations

from typing import Iterable, Iterator

from bson import ObjectId

from common.store.models import CrawlerLease, CrawlerTask, LostLease
from common.store.paging import Doc


def named(docs: list[Doc], latest: bool = False) -> set[ObjectId]:
    """Ids of the documents among ``docs`` (each with ``task`` and ``lease``) that their task
    names, as its latest version (``data_lease``) or an earlier one (``history``; not with
    ``latest``): the exact check, one task lookup per document."""
    if not docs:
        return set()
    owner = {t["_id"]: {t.get("data_lease"), *(() if latest else t.get("history") or ())}
             for t in CrawlerTask._get_collection().find(
                 {"_id": {"$in": list({d["task"] for d in docs})}}, {"data_lease": 1, "history": 1})}
    return {d["_id"] for d in docs if d.get("lease") is not None and d["lease"] in owner.get(d["task"], ())}


def latest_only(docs: Iterable[Doc]) -> Iterator[Doc]:
    """The documents (already ``visible``) that are their page's latest version: a document a
    later version superseded is skipped (the writer marks it once that version is named)."""
    return (d for d in docs if not d.get("superseded"))


def shown(docs: list[Doc]) -> set[ObjectId]:
    """Ids of the documents among ``docs`` that readers show: those their task names.

    The exact check costs a task lookup per document, so it is made only where an orphan can
    be: a document whose lease is still open (``crawler_lease``: its settle may not have come)
    or was ever refused or given back (``crawler_lease_lost``, written before the lease ends).
    The lease of any other document ended with every one of its settles matched, and a settled
    task never names other data. Leases are read first, then tombstones: a lease that ends in
    between was tombstoned before it ended, so it is found in one or the other."""
    if not docs:
        return set()
    leases = list({d.get("lease") for d in docs})
    open_ = {x["_id"] for x in CrawlerLease._get_collection().find({"_id": {"$in": leases}}, {"_id": 1})}
    lost = {x["_id"] for x in LostLease._get_collection().find({"_id": {"$in": leases}}, {"_id": 1})}
    doubtful = [d for d in docs if d.get("lease") in open_ or d.get("lease") in lost]
    doubtful_ids, keep = {d["_id"] for d in doubtful}, named(doubtful)
    return {
        d["_id"]
        for d in docs
        if d.get("lease") is not None and (d["_id"] not in doubtful_ids or d["_id"] in keep)
    }


def visible(cursor: Iterable[Doc], batch: int = 1000, max_bytes: int = 8 * 1024 * 1024) -> Iterator[Doc]:
    """The data documents of ``cursor`` (projected with ``task`` and ``lease``) that their task
    names, in cursor order: looked up ``batch`` documents (or ``max_bytes`` of bodies) at a time."""
    chunk: list[Doc] = []
    size = 0
    for doc in cursor:
        chunk.append(doc)
        size += len(doc.get("response_body") or b"")
        if len(chunk) >= batch or size >= max_bytes:
            keep = shown(chunk)
            yield from (d for d in chunk if d["_id"] in keep)
            chunk, size = [], 0
    keep = shown(chunk)
    yield from (d for d in chunk if d["_id"] in keep)
