"""``downcluster migrate``: bring data written by an earlier downcluster to this version's model.

Earlier versions kept a per-job ``_id`` watermark and marked every dispatched task DISPATCH
with a lease that had no ``crawler_lease`` document. This numbers every task without a
``seq`` (in ``_id`` order, through intake's reservations, so it is safe while intake and the
dispatcher run) and sends again, at once and without counting an attempt, every DISPATCH
task whose lease has no document older than a minute (its entry can no longer be claimed).
It also moves the cluster's secrets, token digests and console sessions out of the source
database (which analysts read) into the control database (``MONGO_CONTROL_URI``): each document
is written there, then removed from the source. Last it counts each job's tasks per status
(``common/store/counts.py``; run it while no dispatcher or worker runs, as after an upgrade).

Idempotent: a second run finds nothing to do.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from pymongo import UpdateOne

from common.store import counts
from common.store.leases import UNSET_LEASE
from common.store.models import DISPATCH, LIVE, ApiToken, ClusterSecret, CrawlerLease, CrawlerTask, Job, WebSession, utcnow
from master.intake import commit, reserve

CHUNK = 5000


@dataclass
class MigrationReport:
    numbered: int = 0
    sent_again: int = 0
    secrets_moved: int = 0
    secrets_kept: list[str] | None = None  # documents left in the source: the control database has another by that name


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
        job = (tasks.find_one({"status": DISPATCH, "lease": lease}, {"job": 1}) or {}).get("job")
        again = tasks.update_many(
            {"status": DISPATCH, "lease": lease},
            {"$set": {"status": LIVE, "retry_at": now, "failed_reason": "sent again: entry of an earlier version",
                      "last_update_datetime": now},
             "$unset": UNSET_LEASE}).modified_count
        counts.move([(job, DISPATCH, LIVE, again)])
        report.sent_again += again
    Job._get_collection().update_many({"live_from": {"$exists": True}}, {"$unset": {"live_from": ""}})
    counts.recount()  # tasks per job and status, kept from now on as they change
    report.secrets_moved, report.secrets_kept = move_secrets()
    return report


def move_secrets() -> tuple[int, list[str]]:
    """Move cluster_secret, api_token and web_session documents from the source database to the
    control database: written there first (same _id), then removed from the source."""
    from pymongo.errors import DuplicateKeyError

    source = CrawlerTask._get_collection().database
    moved, kept = 0, []
    for model in (ClusterSecret, ApiToken, WebSession):
        target = model._get_collection()
        if target.database.name == source.name and target.database.client is source.client:
            continue  # MONGO_CONTROL_URI names the source database itself: nothing to move
        old = source[target.name]
        for doc in old.find():
            try:
                target.replace_one({"_id": doc["_id"]}, doc, upsert=True)
            except DuplicateKeyError:  # a token of that name already lives in the control database
                kept.append(f"{target.name} {doc.get('name', doc['_id'])}")
                continue
            old.delete_one({"_id": doc["_id"]})
            moved += 1
        if not old.estimated_document_count():
            old.drop()
    return moved, kept
