"""The races of issue 13, driven step by step (hooks between the steps, no sleeps), on real
Redis and MongoDB: intake against the dispatcher's cursor, the defender against a settling
worker, a dispatcher that loses its lock, and the writer's per-task isolation."""
from __future__ import annotations

from datetime import timedelta

import pytest
from rq import Queue

from common.config import load, settings
from common.errors import DispatchLocked, DownloadError
from common.queue.names import LOCK_KEY
from common.store import due, leases
from common.store import tasks as task_store
from common.store.clock import utcnow
from common.store.log_models import CrawlerDownloadLog
from common.store.models import FRESH, LIVE, CrawlerDownloadData, CrawlerLease, CrawlerTask, Job
from master import intake
from master.dispatch import defender, dispatcher
from master.dispatch.dispatcher import dispatch_once
from master.dispatch.lock import DispatchLock
from slave.download.engines.base import Download
from slave.worker import context, page_data, writer
from tests.helpers import add_urls, register, sent, statuses, store_outcomes


def _all_ids_sent_once() -> list:
    ids = [i for doc in CrawlerLease._get_collection().find({}, {"ids": 1}) for i in doc["ids"]]
    assert len(ids) == len(set(ids))
    return ids


def _insert_reserved(job_id, first: int, urls: list[str]) -> None:
    """What intake does between its reservation and its commit."""
    now = utcnow()
    CrawlerTask._get_collection().insert_many([
        {"job": job_id, "uri": u, "seq": first + i, "status": LIVE, "download_times": 0, "recoveries": 0,
         "host_name": "", "add_datetime": now, "last_update_datetime": now} for i, u in enumerate(urls)])


# --- 1. intake against the cursor --------------------------------------------------------------

def test_reserved_numbers_stop_the_cursor_until_inserted(cluster, tmp_path):
    job = register(tmp_path, "c1", dispatch_num=1000)
    add_urls("c1", [f"http://127.0.0.1:1/a{i}" for i in range(10)])
    first = intake.reserve(job.id, 5)           # an intake has numbered its chunk ...
    add_urls("c1", [f"http://127.0.0.1:1/b{i}" for i in range(3)])  # ... a later one finished first
    assert dispatch_once(cluster.redis).total == 10  # not past the reservation: b* wait
    assert Job.objects.get(name="c1").seq_sent == first - 1
    _insert_reserved(job.id, first, [f"http://127.0.0.1:1/r{i}" for i in range(5)])
    intake.commit(job.id, first, 5)
    assert dispatch_once(cluster.redis).total == 8   # r* and b*: nothing stranded
    assert len(_all_ids_sent_once()) == 18 == CrawlerTask.objects.count()


def test_intake_during_a_dispatch_run_is_seen_by_the_next(cluster, tmp_path, monkeypatch):
    register(tmp_path, "c2", dispatch_num=1000)
    add_urls("c2", [f"http://127.0.0.1:1/a{i}" for i in range(4)])
    real = due.due_fresh

    def select_then_intake(job_doc, need, now):
        got = real(job_doc, need, now)  # the run has read the job and its tasks ...
        add_urls("c2", [f"http://127.0.0.1:1/late{i}" for i in range(6)])  # ... then intake runs whole
        return got

    monkeypatch.setattr(dispatcher, "due_fresh", select_then_intake)
    assert dispatch_once(cluster.redis).total == 4
    monkeypatch.setattr(dispatcher, "due_fresh", real)
    assert dispatch_once(cluster.redis).total == 6
    assert len(_all_ids_sent_once()) == 10


def test_a_dead_intakes_reservation_expires_and_its_late_tasks_go_again(cluster, tmp_path):
    job = register(tmp_path, "c3", dispatch_num=1000)
    first = intake.reserve(job.id, 2)
    add_urls("c3", [f"http://127.0.0.1:1/a{i}" for i in range(3)])
    assert dispatch_once(cluster.redis).total == 0   # held by the reservation
    old = utcnow() - task_store.INTAKE_STALE - timedelta(seconds=1)
    Job._get_collection().update_one({"_id": job.id}, {"$set": {"intake.0.at": old}})
    assert dispatch_once(cluster.redis).total == 3   # the stale reservation no longer holds it
    _insert_reserved(job.id, first, ["http://127.0.0.1:1/slow0", "http://127.0.0.1:1/slow1"])
    intake.commit(job.id, first, 2)                  # finds its reservation gone: retry path
    assert dispatch_once(cluster.redis).total == 2
    assert {t.status for t in CrawlerTask.objects(uri__contains="slow")} == {"DISPATCH"}


# --- 2. the defender against a settling worker ---------------------------------------------------

def _claimed_entry(cluster, tmp_path, name: str, n: int = 3):
    register(tmp_path, name)
    add_urls(name, [f"http://127.0.0.1:1/{name}/{i}" for i in range(n)])
    dispatch_once(cluster.redis)
    lease = CrawlerLease._get_collection().find_one({})
    lease = leases.claim(lease["_id"], "w1")
    ctx = context.load_context(lease.job)
    outcomes = [
        writer.Outcome(
            task=t,
            download=Download(200, {"X": "1"}, b"body-" + str(t.id).encode(), t.uri),
            error=None,
            spend_us=5,
        )
        for t in leases.lease_tasks(lease)
    ]
    return lease, ctx, outcomes


def _stale(lease_id: str) -> None:
    CrawlerLease._get_collection().update_one(
        {"_id": lease_id}, {"$set": {"beat_at": utcnow() - timedelta(seconds=settings.HEARTBEAT_TTL + 5)}})


def _success_has_its_data() -> None:
    for t in CrawlerTask.objects:
        data = CrawlerDownloadData.objects(task=t)
        if t.status == "SUCCESS":
            assert data.count() == 1 and data.first().lease == t.data_lease
        else:
            assert data.count() == 0


def test_worker_settles_while_the_defender_releases(cluster, tmp_path, monkeypatch):
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "d1")
    _stale(lease.id)
    real_release = leases.release

    def settle_then_release(*args, **kw):  # the lease is LOST; the worker settles just now
        assert store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())["success"] == 3
        return real_release(*args, **kw)

    monkeypatch.setattr(leases, "release", settle_then_release)
    report = defender.recover(cluster.redis)
    assert report.recovered == 0 and report.dead == 0
    assert statuses("d1") == {"SUCCESS": 3}
    _success_has_its_data()


def test_defender_releases_before_the_worker_settles(cluster, tmp_path):
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "d2")
    _stale(lease.id)
    assert defender.recover(cluster.redis).recovered == 3
    got = store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())  # the zombie worker comes back
    assert got["success"] == 0
    assert statuses("d2") == {"LIVE": 3} and all(t.recoveries == 1 for t in CrawlerTask.objects)
    _success_has_its_data()
    assert CrawlerDownloadLog.objects.count() == 3  # its attempt is logged, its data is not kept
    assert dispatch_once(cluster.redis).total == 3  # and the tasks go again


def test_a_long_wait_in_the_queue_is_never_a_death(cluster, tmp_path):
    register(tmp_path, "q1", priority=5)
    add_urls("q1", [f"http://127.0.0.1:1/{i}" for i in range(3)])
    dispatch_once(cluster.redis)
    week = utcnow() - timedelta(days=7)
    CrawlerLease._get_collection().update_many({}, {"$set": {"created_at": week}})
    assert defender.recover(cluster.redis).recovered == 0
    assert Queue("down_low", connection=cluster.redis).count == 1 and sent("q1") == 3


# --- 12. a dispatcher that loses its lock ---------------------------------------------------------

def test_a_run_that_lost_its_lock_pushes_nothing_and_stops(cluster, tmp_path, monkeypatch):
    register(tmp_path, "l1", dispatch_num=1000)
    add_urls("l1", [f"http://127.0.0.1:1/{i}" for i in range(120)])
    real_send = dispatcher.Run.send

    def steal_then_send(self, work):  # Redis restarted and another dispatcher took the lock
        cluster.redis.set(LOCK_KEY, "the-other-dispatcher")
        return real_send(self, work)

    monkeypatch.setattr(dispatcher.Run, "send", steal_then_send)
    with pytest.raises(DispatchLocked):
        dispatch_once(cluster.redis)
    assert Queue("down_low", connection=cluster.redis).count == 0
    monkeypatch.setattr(dispatcher.Run, "send", real_send)
    cluster.redis.delete(LOCK_KEY)
    assert dispatch_once(cluster.redis).total == 120  # refused entries went back: none lost
    assert len(_all_ids_sent_once()) == 120


def test_the_cap_holds_against_a_second_filler(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("DOWNCLUSTER_Q_DOWN_LOW_LEN", "3")
    monkeypatch.setenv("DOWNCLUSTER_DISPATCH_BATCH_SIZE", "1")
    load()
    register(tmp_path, "l2", dispatch_num=100)
    add_urls("l2", [f"http://127.0.0.1:1/{i}" for i in range(10)])
    real_plan = dispatcher.plan

    def plan_then_someone_fills(works, free, total, batch_size):
        alerts = real_plan(works, free, total, batch_size)  # planned against 3 free entries ...
        cluster.redis.rpush(Queue("down_low", connection=cluster.redis).key, "dc-other-1", "dc-other-2")
        return alerts  # ... but another dispatcher pushed two meanwhile

    monkeypatch.setattr(dispatcher, "plan", plan_then_someone_fills)
    report = dispatch_once(cluster.redis)
    assert Queue("down_low", connection=cluster.redis).count == 3 and report.total == 1
    assert report.failed_entries == 2
    assert statuses("l2") == {"LIVE": 10} and sent("l2") == 1


def test_keep_reports_a_lost_lock(cluster):
    with DispatchLock(cluster.redis) as lock:
        cluster.redis.delete(LOCK_KEY)
        with pytest.raises(DispatchLocked):
            lock.keep()


def test_a_lock_left_behind_while_redis_was_away_is_taken_back_at_once(cluster):
    """Released while Redis is away (a Sentinel failover, say: the promoted replica keeps the
    key), the lock is freed by its own holder's next acquire, not left to block for its TTL."""
    import redis as redis_lib

    from tests.relay import Relay

    relay = Relay(cluster.redis_server.port)
    try:
        mine = DispatchLock(
            redis_lib.Redis.from_url(cluster.redis_server.url_at(relay.port), socket_timeout=0.5)
        )
        assert mine.acquire()
        relay.partition()
        mine.release()  # times out: the key stays
        relay.heal(old_after=3600)  # the held release never arrives (as on a promoted replica)
        assert cluster.redis.exists(LOCK_KEY) and not DispatchLock(cluster.redis).acquire()
        assert mine.acquire()  # its own left-behind token frees it first
        mine.release()
        other = DispatchLock(cluster.redis)
        assert other.acquire()
        mine._missed = b"a-token-long-expired"  # never frees another holder's lock
        assert not mine.acquire() and cluster.redis.exists(LOCK_KEY)
        other.release()
    finally:
        relay.close()


# --- 6 and 7. one bad result, GridFS files --------------------------------------------------------

def test_one_unstorable_result_fails_alone(cluster, tmp_path):
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "w1")
    outcomes[1].download.headers = {"bad\0name": "x"}  # BSON refuses NUL in a key
    got = store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())
    assert got == {"success": 2, "fail": 1, "handed_back": 0}
    bad = CrawlerTask.objects.get(id=outcomes[1].task.id)
    assert (
        bad.status == "FAIL"
        and bad.retry_at is None
        and bad.failed_reason.startswith("response not storable")
    )
    _success_has_its_data()


def test_unsettled_large_bodies_leave_no_gridfs_file(cluster, tmp_path, monkeypatch):
    from common.store.data import gridfs_of

    monkeypatch.setenv("DOWNCLUSTER_GRIDFS_THRESHOLD", "16")
    load()
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "g1", n=2)
    CrawlerTask._get_collection().update_one({"_id": outcomes[0].task.id}, {"$set": {"status": "CANCEL"}})
    store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow())
    fs = gridfs_of(CrawlerDownloadData._get_collection().database)
    kept = CrawlerDownloadData.objects.get()
    assert (
        kept.task.id == outcomes[1].task.id
        and fs.get(kept.response_body_gridfs).read() == outcomes[1].download.body
    )
    assert len(list(fs.find())) == 1  # the cancelled task's file went with its document


def test_dead_attempts_gridfs_files_are_removed_by_the_defender(cluster, tmp_path, monkeypatch):
    from common.store.data import gridfs_of

    monkeypatch.setenv("DOWNCLUSTER_GRIDFS_THRESHOLD", "16")
    load()
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "g2", n=2)
    data = CrawlerDownloadData._get_collection()
    docs = [page_data._data_doc(ctx, lease.id, o, utcnow()) for o in outcomes]
    data.insert_many([d.doc for d in docs])  # the worker stored data and files, then died before settling
    fs = gridfs_of(data.database)
    for o, d in zip(outcomes, docs):
        fs.put(o.download.body, _id=d.body_file)
    _stale(lease.id)
    assert defender.recover(cluster.redis).recovered == 2
    assert data.count_documents({}) == 0 and len(list(fs.find())) == 0


def test_a_download_error_is_never_stored_as_data(cluster, tmp_path):
    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "e1", n=2)
    outcomes[0].download, outcomes[0].error = None, DownloadError("HTTP 503", retryable=True)
    assert store_outcomes(ctx, lease.id, FRESH, outcomes, utcnow()) == {
        "success": 1,
        "fail": 1,
        "handed_back": 0,
    }
    assert statuses("e1") == {"SUCCESS": 1, "FAIL": 1}
    _success_has_its_data()


# --- 13 and 15. the watchdog, settings that cannot work ---------------------------------------------

@pytest.mark.slow
def test_watchdog_ends_a_stuck_run_and_releases_the_lock(cluster, tmp_path):
    """A run past DISPATCH_USE_POOL_TIMEOUT is killed, and the next cron run is not locked out."""
    import os
    import subprocess
    import sys

    register(tmp_path, "wd")
    add_urls("wd", ["http://127.0.0.1:1/x"])
    script = ("import time\n"
              "from common.store.connection import connect_mongo\n"
              "from master.dispatch import dispatcher\n"
              "connect_mongo()\n"
              "dispatcher._load_works = lambda jobs, now: time.sleep(30)\n"
              "dispatcher.dispatch_once()\n")
    env = {**os.environ, **cluster.env, "DOWNCLUSTER_DISPATCH_USE_POOL_TIMEOUT": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                          cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    assert proc.returncode == 3 and "exceeded DISPATCH_USE_POOL_TIMEOUT" in proc.stderr
    assert not cluster.redis.exists(LOCK_KEY)
    assert dispatch_once(cluster.redis).total == 1


def test_settings_that_cannot_work_are_refused(cluster, monkeypatch):
    from common.errors import ConfigError

    monkeypatch.setenv("DOWNCLUSTER_DISPATCH_ORDER", "random")
    load()
    with pytest.raises(ConfigError, match="DISPATCH_ORDER"):
        dispatch_once(cluster.redis)
    monkeypatch.setenv("DOWNCLUSTER_DISPATCH_ORDER", "priority")
    monkeypatch.setenv("DOWNCLUSTER_LEASE_TIMEOUT", "60")
    load()
    with pytest.raises(ConfigError, match="LEASE_TIMEOUT"):
        dispatch_once(cluster.redis)
    # long enough for a plain rq worker's entry (one round of 64 at once: 420 s), not for a task
    # that waits at a worker's gate, overtaken for 10 s, then behind two rounds (10 + 3 x (10 + 300) + 120 s)
    monkeypatch.setenv("DOWNCLUSTER_DOWNLOAD_CONCURRENCY", "64")
    monkeypatch.setenv("DOWNCLUSTER_LEASE_TIMEOUT", "1000")
    load()
    with pytest.raises(ConfigError, match=r"longest a worker may hold an entry \(1060s"):
        dispatch_once(cluster.redis)


def test_an_unstorable_large_body_still_frees_its_slot(cluster, tmp_path):
    """A body holding a WORKER_LARGE_BODIES slot frees it even when the writer turns it into a
    failure (else a few such pages would stop every large download of the worker)."""
    import asyncio

    lease, ctx, outcomes = _claimed_entry(cluster, tmp_path, "s1", n=2)
    freed = []
    for n, o in enumerate(outcomes):
        o.download.release = lambda n=n: freed.append(n)
    outcomes[0].download.headers = {"bad\0name": "x"}

    async def released():
        while len(freed) < len(outcomes):
            await asyncio.sleep(0.01)

    async def main():
        w = writer.Writer("w1")
        w.start()
        entry = writer.RunningEntry(lease, ctx, [o.task for o in outcomes], asyncio.get_running_loop())
        for o in outcomes:
            w.submit(entry, o)
        counts = await asyncio.wait_for(entry.done, 30)
        await asyncio.wait_for(released(), 30)  # the releases are scheduled on this loop after the write
        w.stop()
        return counts

    assert asyncio.run(main()) == {"success": 1, "fail": 1, "handed_back": 0}
    assert sorted(freed) == [0, 1]
    assert statuses("s1") == {"SUCCESS": 1, "FAIL": 1}
