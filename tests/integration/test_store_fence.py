"""The fence: a worker whose lease was given back changes nothing a reader sees, driven step by
step (no sleeps): a late insert after cleanup (refused by the store: one document per page
version), hand-backs sharing a bulk write with refused settles, a task cancelled mid-download in
such a batch, an entry popped and not yet claimed."""
from __future__ import annotations

from datetime import timedelta

import pytest
from pymongo.errors import BulkWriteError

from common.config import load, settings
from common.errors import DownloadError, NotFound
from common.queue import rqbridge
from common.store import attempts, leases, orphans
from common.store.clock import utcnow
from common.store.data import data_rows
from common.store.models import AGAIN, FRESH, CrawlerDownloadData, CrawlerLease, CrawlerTask, Job
from common.store.records import ExportFilter, Lease
from master import views
from master.dispatch import defender
from master.dispatch.dispatcher import dispatch_once
from master.exports.dump import rows as export_rows
from master.ops import tasks
from slave.download.engines.base import Download
from slave.worker import context, page_data, writer
from tests.helpers import add_urls, register, statuses, store_outcomes
from tests.integration.test_races import _claimed_entry, _stale


def _outcomes(lease: Lease, body: bytes = b"body-") -> list[writer.Outcome]:
    return [
        writer.Outcome(
            task=t,
            download=Download(200, {"X": "1"}, body + str(t.id).encode(), t.uri),
            error=None,
            spend_us=5,
        )
        for t in leases.lease_tasks(lease)
    ]


def _visible_everywhere(name: str) -> dict:
    """What every reader shows of job ``name``: task id -> the data's lease (one per task)."""
    job = Job.objects.get(name=name)
    by_export = [str(m["task_id"]) for m, _ in export_rows(name)]
    by_rows = [r.task for r in data_rows(job.id, ExportFilter(), needs_body=True)]
    page = views.data_page(name, limit=1000)["data"]
    assert sorted(by_export) == sorted(by_rows) == sorted(d["task"] for d in page)
    assert len(set(by_rows)) == len(by_rows)  # never two for one task
    for d in page:
        views.body(d["id"])  # each readable
    docs = {str(d["_id"]): d for d in CrawlerDownloadData._get_collection().find({"job": job.id})}
    return {docs[d["id"]]["task"]: docs[d["id"]]["lease"] for d in page}


def _one_named_document_per_success(name: str) -> None:
    job = Job.objects.get(name=name)
    for t in CrawlerTask.objects(job=job):
        data = list(CrawlerDownloadData._get_collection().find({"task": t.id}))
        if t.status == "SUCCESS":
            assert len(data) == 1 and data[0]["lease"] == t.data_lease, t.uri
        else:
            assert data == [], t.uri


def test_a_late_insert_after_the_lease_was_lost_is_refused_by_the_store(cluster, tmp_path):
    """Issue 41: a zombie's insert arriving after the task's new attempt stored and settled its
    page is refused by the store itself: the raw collection (what an analyst reads with plain
    pymongo) holds one document per page version, the one readers show."""
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "late")
    _stale(lease.id)
    assert defender.recover(cluster.redis).recovered == 3
    assert store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())["success"] == 0  # refused, cleaned up
    stale_docs = [page_data._data_doc(ctx, lease.id, o, utcnow()) for o in outcomes]
    stale_docs = [d._replace(id=o.data_id, doc={**d.doc, "_id": o.data_id})  # the very insert the writer
                  for d, o in zip(stale_docs, outcomes)]  # sent first, arriving over the old connection
    # the tasks go again and another worker stores them
    assert dispatch_once(cluster.redis).total == 3
    again = CrawlerLease._get_collection().find_one({"kind": AGAIN})
    again = leases.claim(again["_id"], "w2")
    assert store_outcomes(ctx, again.id, AGAIN, _outcomes(again, b"new-"), utcnow())["success"] == 3
    with pytest.raises(BulkWriteError) as refused:  # late: after cleanup and the new settle
        CrawlerDownloadData._get_collection().insert_many([d.doc for d in stale_docs], ordered=False)
    assert [e["code"] for e in refused.value.details["writeErrors"]] == [11000] * 3
    assert len(attempts.insert_data(stale_docs)) == 3  # the writer's insert: each version held by another
    _one_named_document_per_success("late")  # in the raw collection
    seen = _visible_everywhere("late")
    assert len(seen) == 3 and set(seen.values()) == {again.id}
    for doc in stale_docs:
        with pytest.raises(NotFound):
            views.body(str(doc.id))
    assert orphans.sweep_orphans(now=utcnow() + timedelta(seconds=5), grace=1) == 0  # nothing left over


def test_an_orphan_stored_before_the_new_attempt_is_replaced_by_it(cluster, tmp_path):
    """The other order: the lost attempt's insert lands first; the attempt that holds the task
    replaces it (body included), and a lost attempt that comes after loses the version."""
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "first")
    stale_docs = [page_data._data_doc(ctx, lease.id, o, utcnow()) for o in outcomes]
    _stale(lease.id)
    assert defender.recover(cluster.redis).recovered == 3
    CrawlerDownloadData._get_collection().insert_many([d.doc for d in stale_docs])  # the zombie's, late
    assert dispatch_once(cluster.redis).total == 3
    again = leases.claim(CrawlerLease._get_collection().find_one({"kind": AGAIN})["_id"], "w2")
    assert store_outcomes(ctx, again.id, AGAIN, _outcomes(again, b"new-"), utcnow())["success"] == 3
    _one_named_document_per_success("first")
    assert set(_visible_everywhere("first").values()) == {again.id}
    for d in CrawlerDownloadData._get_collection().find({}):
        assert bytes(d["response_body"]).startswith(b"new-")
    # the zombie's writer, back: its version is held and its settle refused; nothing changes
    assert store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())["success"] == 0
    _one_named_document_per_success("first")
    assert set(_visible_everywhere("first").values()) == {again.id}


def test_the_sweep_waits_while_the_lease_of_an_orphan_lives(cluster, tmp_path):
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "alive")
    docs = [page_data._data_doc(ctx, lease.id, o, utcnow()) for o in outcomes]
    CrawlerDownloadData._get_collection().insert_many([d.doc for d in docs])  # inserted, not yet settled
    ids = [o.task.id for o in outcomes]
    orphans.tombstone(
        lease.id, lease.job, "a settle was refused", ids
    )  # as the writer does, then ends it
    later = utcnow() + timedelta(seconds=5)
    assert orphans.sweep_orphans(now=later, grace=1) == 0  # an attempt under that lease may still settle them
    assert _visible_everywhere("alive") == {}
    CrawlerLease._get_collection().delete_one({"_id": lease.id})  # the lease ends without settling them
    assert orphans.sweep_orphans(now=later, grace=1) == 3  # its tombstone is looked at again: found
    assert CrawlerDownloadData.objects.count() == 0
    assert orphans.sweep_orphans(now=later, grace=1) == 0  # each tombstone once


def test_the_sweep_reads_tombstones_not_the_data(cluster, tmp_path):
    """A store of settled data costs the sweep nothing: it finds orphans by their tombstone."""
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "many")
    assert store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())["success"] == 3
    leases.finish([lease.id], "w1")
    assert (
        orphans.sweep_orphans(now=utcnow() + timedelta(seconds=5), grace=1) == 0
    )  # no tombstone: nothing read
    _one_named_document_per_success("many")


def _two_claimed_entries(cluster, tmp_path, name: str):
    load(flags=dict(settings.flags, DISPATCH_BATCH_SIZE=2))
    register(tmp_path, name)
    add_urls(name, [f"http://127.0.0.1:1/{name}/{i}" for i in range(4)])
    dispatch_once(cluster.redis)
    got = [
        leases.claim(doc["_id"], "w1")
        for doc in CrawlerLease._get_collection().find({}).sort("created_at", 1)
    ]
    assert len(got) == 2
    return got, context.load_context(got[0].job)


def test_hand_backs_sharing_a_bulk_write_with_refused_settles(cluster, tmp_path):
    (stale, live), ctx = _two_claimed_entries(cluster, tmp_path, "mix")
    _stale(stale.id)
    assert defender.recover(cluster.redis).recovered == 2  # the returning worker has lost ``stale``
    ok = _outcomes(stale)
    later = [writer.Outcome(task=t, download=None, error=DownloadError("host busy"), spend_us=0, deferred=5.0)
             for t in leases.lease_tasks(live)]
    counts = writer.store_many([writer.Part(ctx, stale.id, FRESH, ok),
                                writer.Part(ctx, live.id, FRESH, later)], utcnow())
    assert counts == [
        {"success": 0, "fail": 0, "handed_back": 0},
        {"success": 0, "fail": 0, "handed_back": 2},
    ]
    assert CrawlerDownloadData.objects.count() == 0  # the refused successes kept nothing
    assert statuses("mix") == {"LIVE": 4}
    _one_named_document_per_success("mix")


def test_a_task_cancelled_mid_download_in_a_batch_with_hand_backs(cluster, tmp_path):
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "cx", n=4)
    cancelled = outcomes[0].task.id
    CrawlerTask._get_collection().update_one({"_id": cancelled}, {"$set": {"status": "CANCEL"}})
    outcomes[3] = writer.Outcome(task=outcomes[3].task, download=None, error=DownloadError("host busy"),
                                 spend_us=0, deferred=5.0)
    outcomes[2] = writer.Outcome(
        task=outcomes[2].task, download=None, error=DownloadError("HTTP 404", retryable=False), spend_us=3
    )
    got = store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())
    assert got == {"success": 1, "fail": 1, "handed_back": 1}
    assert CrawlerDownloadData._get_collection().count_documents({"task": cancelled}) == 0
    assert statuses("cx") == {"CANCEL": 1, "SUCCESS": 1, "FAIL": 1, "LIVE": 1}
    _one_named_document_per_success("cx")
    assert tasks.cancel("cx") >= 0  # (the admin's door is the same update)


def test_an_entry_popped_and_not_yet_claimed_is_not_given_back(cluster, tmp_path):
    load(flags=dict(settings.flags, ABSENCE_GRACE=0))
    register(tmp_path, "pop")
    add_urls("pop", [f"http://127.0.0.1:1/pop/{i}" for i in range(3)])
    dispatch_once(cluster.redis)
    lease_id = CrawlerLease._get_collection().find_one({})["_id"]
    assert rqbridge.pop_entry(cluster.redis, ["down_low"]) == ("down_low", rqbridge.entry_id(lease_id))
    first = defender.recover(cluster.redis)  # popped by a worker that has not claimed it yet
    assert first.requeued == 0 and CrawlerLease.objects.get(id=lease_id).missing_at is not None
    assert leases.claim(lease_id, "w1") is not None  # the worker goes on: claim wins, no work done twice
    second = defender.recover(cluster.redis)
    assert second.requeued == 0 and second.recovered == 0
    assert CrawlerLease.objects.get(id=lease_id).state == "RUNNING"


def test_an_entry_missing_on_two_looks_is_given_back(cluster, tmp_path):
    load(flags=dict(settings.flags, ABSENCE_GRACE=0))
    register(tmp_path, "gone")
    add_urls("gone", [f"http://127.0.0.1:1/gone/{i}" for i in range(3)])
    dispatch_once(cluster.redis)
    lease_id = CrawlerLease._get_collection().find_one({})["_id"]
    rqbridge.pop_entry(cluster.redis, ["down_low"])  # popped by a worker that died at once
    assert defender.recover(cluster.redis).requeued == 0
    assert defender.recover(cluster.redis).requeued == 3
    assert leases.claim(lease_id, "late") is None
    assert dispatch_once(cluster.redis).total == 3


def test_an_entry_settled_in_several_groups_with_refused_settles_in_two_of_them(cluster, tmp_path):
    """The successes of an entry go in UpdateManys of ``leases.SETTLE_GROUP`` tasks: a task
    cancelled in the second group and one in the last refuse their settles alone, the counts
    say so, their data is dropped, and the kept counts match the tasks."""
    from common.store import counts

    n = 2 * leases.SETTLE_GROUP + 8
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "groups", n=n)
    assert len(outcomes) == n and len(leases.settle_success([o.task.id for o in outcomes], lease.id,
                                                            FRESH, utcnow())) == 3
    cancelled = [outcomes[leases.SETTLE_GROUP + 1].task.id, outcomes[-1].task.id]
    for task_id in cancelled:
        CrawlerTask._get_collection().update_one({"_id": task_id}, {"$set": {"status": "CANCEL"}})
    got = store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())
    assert got == {"success": n - 2, "fail": 0, "handed_back": 0}
    assert CrawlerDownloadData._get_collection().count_documents({"task": {"$in": cancelled}}) == 0
    assert statuses("groups") == {"SUCCESS": n - 2, "CANCEL": 2}
    _one_named_document_per_success("groups")
    job = Job.objects.get(name="groups")
    kept = counts.of_jobs([job.id])[job.id]
    assert kept["SUCCESS"] == n - 2 and kept["LIVE"] == 2  # the cancels were written behind the counts' back


def test_migrate_keeps_one_document_per_version_of_an_earlier_store(cluster, tmp_path):
    """A store of an earlier version: a (task, lease) index, a lost attempt's document beside a
    task's. ``migrate`` drops the retired index and that document, and makes the unique (task,
    version)."""
    from master.ops.migrate import migrate

    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "old")
    assert store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())["success"] == 3
    data = CrawlerDownloadData._get_collection()
    data.drop_index("task_1_version_1")
    data.create_index([("task", 1), ("lease", 1)])
    stale = page_data._data_doc(ctx, "lost-lease", outcomes[0], utcnow())
    data.insert_one(stale.doc)
    assert migrate().indexes_retired == 1
    _one_named_document_per_success("old")
    keys = {ix["name"]: ix.get("unique", False) for ix in data.list_indexes()}
    assert keys == {"_id_": False, "task_1_version_1": True, "job_1__id_1": False}
    assert migrate().indexes_retired == 0  # idempotent
