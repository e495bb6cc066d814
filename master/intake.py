"""Task intake: one URL a line into ``CrawlerTask`` (status LIVE), in bulk.

Each chunk is numbered from the job's counter: reserve ``seq`` numbers (listed in
``job.intake`` while the insert runs, so the dispatcher's cursor cannot pass them), insert,
then drop the reservation. Duplicates of a (job, url) already stored are ignored by the
unique index; bad lines are reported with their line number and skipped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from bson import ObjectId
from pymongo.errors import BulkWriteError

from common.store import counts
from common.config import settings
from common.errors import ValidationError
from common.store.models import LIVE, CrawlerTask, Job, job_named, utcnow
from common.urls import check_url
from master.dispatch.selection import INTAKE_STALE

CHUNK = 1000
DUPLICATE_KEY = 11000


@dataclass
class IntakeReport:
    added: int = 0
    duplicate: int = 0
    rejected: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)


def parse_lines(lines: Iterable[str], report: IntakeReport, max_length: int) -> Iterable[str]:
    """Yield valid URLs; record rejected ones (line number, reason). Blank and # lines are skipped."""
    for number, line in enumerate(lines, 1):
        url = line.rstrip("\r\n").strip()
        if not url or url.startswith("#"):
            continue
        try:
            yield check_url(url, max_length)
        except ValidationError as exc:
            report.rejected += 1
            report.errors.append((number, str(exc)))


def add_tasks(
    job_name: str,
    lines: Iterable[str],
    host: str = "",
    progress: Callable[[int], None] | None = None,
) -> IntakeReport:
    job = job_named(job_name)
    collection = CrawlerTask._get_collection()
    report = IntakeReport()
    seen: set[str] = set()
    chunk: list[dict] = []

    def flush() -> None:
        if not chunk:
            return
        known = {d["uri"] for d in collection.find({"job": job.id, "uri": {"$in": [d["uri"] for d in chunk]}}, {"uri": 1})}
        fresh = [d for d in chunk if d["uri"] not in known]
        report.duplicate += len(chunk) - len(fresh)
        if fresh:
            first = reserve(job.id, len(fresh))
            for i, doc in enumerate(fresh):
                doc["seq"], doc["_id"] = first + i, ObjectId()
            lowest = {job.id: min(d["_id"] for d in fresh)}
            try:
                result = collection.insert_many(fresh, ordered=False)
                added = len(result.inserted_ids)
            except BulkWriteError as exc:
                details = exc.details
                added = details["nInserted"]
                counts.move([(job.id, None, LIVE, added)], lowest)
                dupes = sum(1 for e in details["writeErrors"] if e["code"] == DUPLICATE_KEY)
                if dupes != len(details["writeErrors"]):
                    raise
                report.duplicate += dupes
            else:
                counts.move([(job.id, None, LIVE, added)], lowest)
            finally:
                commit(job.id, first, len(fresh))
            report.added += added
        if progress:
            progress(len(chunk))
        chunk.clear()

    now = utcnow()
    for url in parse_lines(lines, report, settings.MAX_URL_LENGTH):
        if url in seen:
            report.duplicate += 1
            continue
        seen.add(url)
        chunk.append({
            "job": job.id, "uri": url, "status": LIVE, "download_times": 0, "recoveries": 0,
            "host_name": host, "add_datetime": now, "last_update_datetime": now,
        })
        if len(chunk) >= CHUNK:
            flush()
    flush()
    return report


def reserve(job_id, count: int) -> int:
    """Reserve ``count`` seq numbers of a job (compare-and-set on its counter); returns the first."""
    coll = Job._get_collection()
    while True:
        doc = coll.find_one({"_id": job_id}, {"seq_next": 1})
        if doc is None:
            raise ValidationError("the job was removed while its tasks were being added")
        top = doc.get("seq_next", 0)
        first = top + 1
        if coll.update_one({"_id": job_id, "seq_next": top},
                           {"$set": {"seq_next": top + count}, "$push": {"intake": {"seq": first, "at": utcnow()}}}
                           ).modified_count:
            return first


def commit(job_id, first: int, count: int) -> None:
    """Drop the reservation. One that grew old (a stalled intake; the dispatcher stops honouring
    reservations at INTAKE_STALE) may lie below the cursor: its tasks are sent as retries."""
    before = Job._get_collection().find_one_and_update(
        {"_id": job_id, "intake.seq": first}, {"$pull": {"intake": {"seq": first}}}, projection={"intake": 1})
    mine = next((r for r in (before or {}).get("intake") or () if r.get("seq") == first), None)
    if mine is not None and utcnow() - mine["at"] < INTAKE_STALE / 2:
        return
    now = utcnow()
    CrawlerTask._get_collection().update_many(
        {"job": job_id, "status": LIVE, "retry_at": None, "seq": {"$gte": first, "$lt": first + count}},
        {"$set": {"retry_at": now, "last_update_datetime": now}})
