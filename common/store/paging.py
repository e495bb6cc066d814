"""Reading a collection in ``_id`` order, window by window.

An ObjectId begins with the second it was made, so a range of ``_id`` is a span of time. A page
(or a scan with a time limit) is read in windows of that span — the first one second wide, each
next twice as wide as the last — until it holds what was asked or the range is done. Each window is one
query on the collection's (equality fields…, ``_id``) index, so a read costs what its windows
hold, not what the job holds: MongoDB stops at the limit inside any range, but the embedded store
reads a whole range before it applies one (what that cost: docs/scale.md).

The windows partition the ``_id`` order (each begins where the last ended, the last one is open),
so a page is exact whatever the clocks that made the ids; the job's ``Span`` (what it wrote lies
between two ids, give or take a host's clock) only decides where the windows begin and where the
open one does: a job idle since yesterday is read from yesterday, not by a day of empty windows
ending in one that holds all of its data.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

from bson import ObjectId
from pymongo.collection import Collection

FIRST_WINDOW = timedelta(seconds=1)
# values of one $in: the embedded store matches each document against the whole list, so a
# list's cost a value grows with its length (measured: docs/scale.md)
IN_MAX = 50
SKEW = timedelta(days=1)  # ids made by a host whose clock is behind (or ahead)
FINE_FIRST = 32  # ids: the first window of a ``fine`` read (one process's ids of one second are consecutive)
Doc = dict[str, Any]  # a raw document: what the store's own modules read here and make records of


@dataclass(frozen=True)
class Span:
    """No document of the job was made before ``first`` or after ``last`` (None: not known)."""

    first: ObjectId | None = None
    last: ObjectId | None = None


def _fine(after: ObjectId, before: ObjectId | None) -> Iterator[Doc]:
    """Ranges from just above ``after`` to the end of its second, the first ``FINE_FIRST`` ids
    wide, each next twice as wide (the last one ends at ``before`` if that comes first)."""
    low, width = int(str(after), 16) + 1, FINE_FIRST
    second_ends = min((low >> 64) + 1 << 64, (1 << 96) - 1)
    end = min(second_ends, int(str(before), 16)) if before is not None else second_ends
    while low < end:
        high = min(low + width, end)
        yield {"$gte": ObjectId(f"{low:024x}"), "$lt": ObjectId(f"{high:024x}")}
        low, width = high, width * 2


def windows(span: Span, after: ObjectId | None = None, newest: bool = False,
            before: ObjectId | None = None, fine: bool = False) -> Iterator[Doc]:
    """``_id`` ranges that partition everything beyond ``after`` (exclusive), in order; oldest
    first, ``before`` (exclusive) ends the last range instead of leaving it open. ``fine``
    (oldest first from ``after``): the rest of ``after``'s second is read first in ranges that
    begin a few ids wide (a page that starts where a burst of ids does reads a few of them,
    not the burst's first second)."""
    if fine and after is not None and not newest and int(str(after), 16) + 1 < 1 << 96:
        yield from _fine(after, before)
        second_ends = min((int(str(after), 16) + 1 >> 64) + 1 << 64, (1 << 96) - 1)
        if before is not None and int(str(before), 16) <= second_ends:
            return
        after = ObjectId(f"{second_ends - 1:024x}")
    now = datetime.now(timezone.utc)
    start = span.first.generation_time if span.first is not None else now
    end = span.last.generation_time + FIRST_WINDOW if span.last is not None else now
    low, high = start - SKEW, max(now, end) + SKEW  # a window reaching beyond either is the last, open one
    if before is not None and not newest:
        high = min(high, before.generation_time)
    edge = after.generation_time if after is not None else (end if newest else start)
    bound, width = after, FIRST_WINDOW
    while True:
        edge = edge - width if newest else edge + width
        last = edge <= low if newest else edge >= high
        rng: Doc = {} if last else {"$gte" if newest else "$lt": ObjectId.from_datetime(edge)}
        if last and before is not None and not newest:
            rng["$lt"] = before
        if bound is not None:
            rng[("$lt" if newest else ("$gt" if bound is after else "$gte"))] = bound
        yield rng
        if last:
            return
        bound, width = ObjectId.from_datetime(edge), width * 2


def _within(flt: Doc, rng: Doc) -> Doc:
    return {**flt, "_id": rng} if rng else flt


def by_id(coll: Collection[Doc], flt: Doc, limit: int, *, span: Span, after: ObjectId | None = None,
          newest: bool = False, before: ObjectId | None = None, projection: Doc | None = None,
          computed: bool = False, fine: bool = False) -> list[Doc]:
    """Up to ``limit`` documents matching ``flt`` (which names no ``_id``) in ``_id`` order — newest
    first if ``newest`` — beyond ``after`` (and, oldest first, below ``before``). ``computed``:
    ``projection`` is an aggregation ``$project`` (fields computed on the server, such as a body's size);
    ``fine``: see ``windows``."""
    out: list[Doc] = []
    order = -1 if newest else 1
    for rng in windows(span, after, newest, before, fine):
        query, k = _within(flt, rng), limit - len(out)
        if computed:
            out += coll.aggregate([{"$match": query}, {"$sort": {"_id": order}}, {"$limit": k},
                                   {"$project": projection}])
        else:
            out += coll.find(query, projection).sort("_id", order).limit(k)
        if len(out) >= limit:
            break
    return out


class OutOfTime(Exception):
    """A ``scan`` did not end within its time."""


def scan(coll: Collection[Doc], flt: Doc, *, span: Span, within: float,
         projection: Doc | None = None) -> Iterator[Doc]:
    """The documents matching ``flt``, newest first, window by window; OutOfTime when they take
    longer than ``within`` seconds (a window is not begun that would end beyond them at the pace
    of the last one)."""
    began, last_took = time.monotonic(), 0.0
    for rng in windows(span, newest=True):
        if time.monotonic() - began + 2 * last_took > within:
            raise OutOfTime(f"not read in {within} s")
        sent = time.monotonic()
        docs = list(coll.find(_within(flt, rng), projection))
        last_took = time.monotonic() - sent
        yield from docs


def in_chunks(values: list[Any], size: int = IN_MAX) -> Iterator[list[Any]]:
    """``values`` in lists of at most ``size``, one ``$in`` each."""
    for k in range(0, len(values), size):
        yield values[k:k + size]
