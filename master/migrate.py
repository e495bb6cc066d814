"""``downcluster migrate``: bring data written by an earlier downcluster to this version's model.

Earlier versions kept a per-job ``_id`` watermark and marked every dispatched task DISPATCH
with a lease that had no ``crawler_lease`` document. This numbers every task without a
``seq`` (in ``_id`` order, through intake's reservations, so it is safe while intake and the
dispatcher run) and sends again, at once and without counting an attempt, every DISPATCH
task whose lease has no document older than a minute (its entry can no longer be claimed).
Idempotent: a second run finds nothing to do.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from pymongo import UpdateOne

from common.leases import UNSET_LEASE
from common.models import DISPATCH, LIVE, CrawlerLease, CrawlerTask, Job, utcnow
from master.intake import commit, reserve

CHUNK = 5000


@dataclass
class MigrationReport:
    numbered: int = 0
    sent_again: int = 0


def migrate() -> MigrationReport:
    report = MigrationReport()
    tasks = CrawlerTask._get_collection()
    for job in Job._get_collection().find({}, {"_id": 1}):
        while True:
            ids = [d["_id"] for d in tasks.find({"job": job["_id"], "seq": None}, {"_id": 1}).sort("_id", 1).limit(CHUNK)]
            if not ids:
                break
            first = reserve(job["_id"], len(ids))
            try:
                tasks.bulk_write([UpdateOne({"_id": i, "seq": None}, {"$set": {"seq": first + n}})
                                  for n, i in enumerate(ids)], ordered=False)
            finally:
                commit(job["_id"], first, len(ids))
            report.numbered += len(ids)
    old = utcnow() - timedelta(minutes=1)
    leases = {d["_id"] for d in tasks.aggregate([
        {"$match": {"status": DISPATCH, "dispatched_at": {"$lt": old}}}, {"$group": {"_id": "$lease"}}])}
    known = {d["_id"] for d in CrawlerLease._get_collection().find({"_id": {"$in": list(leases)}}, {"_id": 1})}
    now = utcnow()
    for lease in leases - known:
        report.sent_again += tasks.update_many(
            {"status": DISPATCH, "lease": lease},
            {"$set": {"status": LIVE, "retry_at": now, "failed_reason": "sent again: entry of an earlier version",
                      "last_update_datetime": now},
             "$unset": UNSET_LEASE}).modified_count
    Job._get_collection().update_many({"live_from": {"$exists": True}}, {"$unset": {"live_from": ""}})
    return report
