"""Registry, intake and dispatcher against real Redis and MongoDB (SecantusDB)."""
from __future__ import annotations

import threading

import pytest
from rq import Queue

from common.config import load
from common.errors import DispatchLocked
from common.queue.names import LOCK_KEY
from common.store.log_models import (
    CrawlerDispatchAlertLog,
    CrawlerDispatchLog,
    CrawlerRegistrationErrorLog,
)
from common.store.models import (
    CrawlerDownload,
    CrawlerDownloadSetting,
    CrawlerLease,
    CrawlerTask,
    Job,
)
from master.dispatch.dispatcher import dispatch_once
from tests.helpers import add_urls, burst_worker, cli, register, sent, statuses


def _nothing_stored():
    return (
        Job.objects.count() == 0
        and CrawlerDownload.objects.count() == 0
        and CrawlerDownloadSetting.objects.count() == 0
    )


@pytest.mark.parametrize("body,code,why", [
    ('name = "x"\npriority = [', None, "not valid TOML"),
    ('name = "x"\npriority = 7\n', None, "priority"),
    ('name = "x"\ntype = "python"\ncode = "d.py"\n', "def download(:\n", "does not parse"),
    ('name = "x"\ntype = "python"\ncode = "d.py"\n', "def fetch(task):\n    pass\n", "no top-level"),
    ('name = "x"\n[settings]\ndispatch_num = -3\n', None, "dispatch_num"),
    ('name = "x"\n[settings]\nproxy = "::nonsense"\n', None, "proxy"),
])
def test_invalid_manifest_stores_nothing_and_exits_2(cluster, tmp_path, body, code, why):
    if code is not None:
        (tmp_path / "d.py").write_text(code)
    manifest = tmp_path / "job.toml"
    manifest.write_text(body)
    result = cli("job", "register", str(manifest))
    assert result.exit_code == 2
    assert why in result.output and len(result.output.strip().splitlines()) == 1
    assert _nothing_stored()
    assert (
        CrawlerRegistrationErrorLog.objects.count() == 1
        and why in CrawlerRegistrationErrorLog.objects.first().reason
    )


def test_register_then_update_and_enable_disable(cluster, tmp_path):
    job = register(tmp_path, "news", priority=3, dispatch_num=7)
    assert CrawlerDownloadSetting.objects.get(job=job).dispatch_num == 7
    first_update = job.last_update_datetime
    register(tmp_path, "news", priority=1, dispatch_num=9)
    job.reload()
    assert job.priority == 1 and Job.objects.count() == 1 and job.last_update_datetime >= first_update
    assert CrawlerDownloadSetting.objects.get(job=job).dispatch_num == 9
    assert cli("job", "disable", "news").exit_code == 0 and Job.objects.get(name="news").status == "OFF"
    assert cli("job", "enable", "news").exit_code == 0 and Job.objects.get(name="news").status == "ON"
    listing = cli("job", "list").output
    assert "news" in listing and "none" in listing
    shown = cli("job", "show", "news").output
    assert "dispatch_num: 9" in shown
    assert cli("job", "show", "nope").exit_code == 2


def test_task_add_counts_duplicates_and_rejections(cluster, tmp_path):
    register(tmp_path, "news")
    urls = [f"http://127.0.0.1:1/p{i}" for i in range(2500)] + ["ftp://x/y", "not a url", "http://127.0.0.1:1/p1"]
    out = add_urls("news", urls)
    assert "added 2500, duplicate 1, rejected 2" in out
    assert "line 2501" in out and "line 2502" in out
    assert "added 0, duplicate 2500, rejected 0" in add_urls("news", urls[:2500])
    assert CrawlerTask.objects.count() == 2500
    assert cli("task", "add", "nope", "-", input="http://h/\n").exit_code == 2


def _queue_len(redis, name):
    return Queue(name, connection=redis).count


def test_dispatch_maps_priorities_to_queues_and_marks_tasks(cluster, tmp_path):
    for name, prio in (("s", -1), ("h", 1), ("m", 2), ("l", 5)):
        register(tmp_path, name, priority=prio, dispatch_num=30)
        add_urls(name, [f"http://127.0.0.1:1/{name}/{i}" for i in range(40)])
    report = dispatch_once(cluster.redis)
    assert dict(report.tasks) == {"down_super": 30, "down_high": 30, "down_mid": 30, "down_low": 30}
    for q in ("down_super", "down_high", "down_mid", "down_low"):
        assert _queue_len(cluster.redis, q) == 1  # 30 tasks, batch size 50: one entry
    # fresh tasks go out without a write of their own: LIVE, listed by their entry's lease
    assert statuses("s") == {"LIVE": 40} and sent("s") == 30
    lease = CrawlerLease.objects(job=Job.objects.get(name="s")).first()
    assert (
        lease.state == "QUEUED"
        and lease.queue == "down_super"
        and len(lease.ids) == 30
        and lease.attempt_kind == "FRESH"
    )
    assert Job.objects.get(name="s").seq_sent == 30
    assert CrawlerDispatchLog.objects(status="SUCCESS").count() == 4
    report = dispatch_once(cluster.redis)  # the rest, then nothing is dispatched twice
    assert report.total == 40 and sent("s") == 40
    assert dispatch_once(cluster.redis).total == 0
    ids = [i for doc in CrawlerLease._get_collection().find({}, {"ids": 1}) for i in doc["ids"]]
    assert len(ids) == len(set(ids)) == 160


def test_queue_cap_never_exceeded_and_alert_written(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("DOWNCLUSTER_Q_DOWN_LOW_LEN", "3")
    monkeypatch.setenv("DOWNCLUSTER_DISPATCH_BATCH_SIZE", "1")
    load()
    register(tmp_path, "l", priority=5, dispatch_num=100)
    add_urls("l", [f"http://127.0.0.1:1/{i}" for i in range(10)])
    for _ in range(3):
        dispatch_once(cluster.redis)
        assert _queue_len(cluster.redis, "down_low") == 3
    assert sent("l") == 3
    alerts = CrawlerDispatchAlertLog.objects(type="queue_full")
    assert alerts.count() >= 1 and "7 of 10" in alerts.first().reason


def test_total_cap_and_dispatch_num(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("DOWNCLUSTER_MAX_TOTAL_DISPATCH_COUNT_ONCE", "25")
    monkeypatch.setenv("DOWNCLUSTER_DISPATCH_BATCH_SIZE", "10")
    load()
    register(tmp_path, "a", priority=0, dispatch_num=20)
    register(tmp_path, "b", priority=4, dispatch_num=20)
    add_urls("a", [f"http://127.0.0.1:1/a{i}" for i in range(50)])
    add_urls("b", [f"http://127.0.0.1:1/b{i}" for i in range(50)])
    report = dispatch_once(cluster.redis)
    assert report.total == 25
    assert sent("a") == 20 and sent("b") == 5  # priority first
    assert CrawlerDispatchAlertLog.objects(type="total_cap").count() == 1


def test_retryable_fail_redispatched_until_max_retry_times(cluster, tmp_path):
    import datetime as dt

    job = register(tmp_path, "r", priority=5, max_retry_times=2)
    add_urls("r", ["http://127.0.0.1:1/a", "http://127.0.0.1:1/b"])
    past = dt.datetime(2000, 1, 1)
    coll = CrawlerTask._get_collection()
    coll.update_one(
        {"uri": "http://127.0.0.1:1/a"}, {"$set": {"status": "FAIL", "download_times": 1, "retry_at": past}}
    )
    coll.update_one(
        {"uri": "http://127.0.0.1:1/b"}, {"$set": {"status": "FAIL", "download_times": 2, "retry_at": past}}
    )
    dispatch_once(cluster.redis)
    a = CrawlerTask.objects.get(uri="http://127.0.0.1:1/a")
    assert (
        a.status == "DISPATCH" and a.lease and a.queue == "down_low" and a.dispatched_at
    )  # a retry is marked
    assert CrawlerTask.objects.get(uri="http://127.0.0.1:1/b").status == "FAIL"  # 2 >= max_retry_times
    job.reload()
    assert job.status == "ON" and sent("r") == 1


def test_disabled_job_not_dispatched(cluster, tmp_path):
    register(tmp_path, "off")
    add_urls("off", ["http://127.0.0.1:1/x"])
    cli("job", "disable", "off")
    assert dispatch_once(cluster.redis).total == 0


def test_an_entry_of_a_job_disabled_after_dispatch_is_given_back(cluster, tmp_path):
    register(tmp_path, "late-off")
    add_urls("late-off", ["http://127.0.0.1:1/x"])
    assert dispatch_once(cluster.redis).total == 1
    cli("job", "disable", "late-off")
    burst_worker(cluster)
    task = CrawlerTask.objects.get(uri="http://127.0.0.1:1/x")
    assert (task.status, task.download_times) == ("LIVE", 0)
    assert task.failed_reason == "job disabled before download"
    assert task.retry_at is not None and sent("late-off") == 0


def test_dispatcher_lock_makes_second_run_exit_at_once(cluster, tmp_path):
    register(tmp_path, "j")
    add_urls("j", ["http://127.0.0.1:1/x"])
    cluster.redis.set(LOCK_KEY, "someone-else", ex=60)
    result = cli("dispatch")
    assert result.exit_code == 75 and "another dispatcher" in result.output
    assert sent("j") == 0
    cluster.redis.delete(LOCK_KEY)
    assert cli("dispatch").exit_code == 0 and sent("j") == 1


def test_concurrent_dispatchers_enqueue_each_task_once(cluster, tmp_path):
    register(tmp_path, "c", dispatch_num=500)
    add_urls("c", [f"http://127.0.0.1:1/{i}" for i in range(300)])
    for _ in range(5):
        barrier = threading.Barrier(2)
        results = []

        def go(barrier: threading.Barrier, results: list) -> None:
            barrier.wait()
            try:
                results.append(dispatch_once(cluster.redis).total)
            except DispatchLocked:
                results.append("locked")

        threads = [threading.Thread(target=go, args=(barrier, results)) for _ in range(2)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert len(results) == 2 and (results.count("locked") == 1 or "locked" not in results)
    ids = [i for doc in CrawlerLease._get_collection().find({}, {"ids": 1}) for i in doc["ids"]]
    assert len(ids) == len(set(ids)) == 300
    assert _queue_len(cluster.redis, "down_low") == 6  # 300 / 50, no duplicate entry


def test_host_targeted_tasks_go_to_host_queue(cluster, tmp_path):
    register(tmp_path, "hj", priority=2, host="alpha")
    register(tmp_path, "free", priority=2)
    add_urls("hj", ["http://127.0.0.1:1/h"])
    cli("task", "add", "free", "-", "--host", "beta", input="http://127.0.0.1:1/f\n")
    add_urls("free", ["http://127.0.0.1:1/g"])
    report = dispatch_once(cluster.redis)
    assert dict(report.tasks) == {"down_mid@alpha": 1, "down_mid@beta": 1, "down_mid": 1}


def test_stats_and_export_commands_run(cluster, tmp_path):
    register(tmp_path, "st")
    add_urls("st", ["http://127.0.0.1:1/x"])
    out = cli("stats", "--json").output
    assert '"LIVE": 1' in out and "down_low" in out
    assert "last hour" in cli("stats").output
    assert cli("data", "export", "st", "--format", "csv").output.startswith("task_id,url")


def test_cancel_and_requeue(cluster, tmp_path):
    register(tmp_path, "cr")
    add_urls("cr", [f"http://127.0.0.1:1/{i}" for i in range(4)])
    coll = CrawlerTask._get_collection()
    coll.update_one({"uri": "http://127.0.0.1:1/0"}, {"$set": {"status": "FAIL", "download_times": 5}})
    coll.update_one({"uri": "http://127.0.0.1:1/1"}, {"$set": {"status": "DEAD", "recoveries": 3}})
    assert "requeued 2 tasks" in cli("task", "requeue", "cr").output
    assert statuses("cr") == {"LIVE": 4}
    assert CrawlerTask.objects.get(uri="http://127.0.0.1:1/0").download_times == 0
    assert dispatch_once(cluster.redis).total == 4  # two fresh, two requeued (due at once)
    assert statuses("cr") == {"LIVE": 2, "DISPATCH": 2} and sent("cr") == 4
    assert "cancelled 4 tasks" in cli("task", "cancel", "cr").output
    assert statuses("cr") == {"CANCEL": 4}
    assert cli("task", "cancel", "cr", "--status", "SUCCESS").exit_code == 2


def test_scheduler_installs_cron_and_dispatches(cluster, tmp_path):
    from rq_scheduler import Scheduler

    from master.dispatch.schedule import JOB_ID, QUEUE

    register(tmp_path, "sch")
    add_urls("sch", ["http://127.0.0.1:1/x"])
    result = cli("scheduler", "--burst", "--cron", "* * * * *")
    assert result.exit_code == 0, result.output
    assert JOB_ID in Scheduler(queue_name=QUEUE, connection=cluster.redis)
    # the first cron run is in the future; run the scheduled function as rq would
    from master.dispatch.schedule import scheduled_dispatch
    assert scheduled_dispatch() == "dispatched 1 tasks"
    assert sent("sch") == 1


def test_dispatch_loop_tops_up_with_one_lock(cluster, tmp_path):
    register(tmp_path, "lp", dispatch_num=10)
    add_urls("lp", [f"http://127.0.0.1:1/{i}" for i in range(25)])
    result = cli("dispatch", "--loop", "--interval", "0", "--max-runs", "3")
    assert result.exit_code == 0 and result.output.count("dispatched 10 tasks") == 2
    assert sent("lp") == 25
    assert not cluster.redis.exists(LOCK_KEY)


@pytest.mark.slow
def test_scheduler_in_the_foreground_dispatches_when_due(cluster, tmp_path):
    """Issue 13, item 10: the foreground scheduler runs the dispatcher at its cron time."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from master.dispatch.schedule import JOB_ID

    register(tmp_path, "fg")
    add_urls("fg", ["http://127.0.0.1:1/x"])
    env = {**os.environ, **cluster.env}
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "downcluster"),
            "scheduler",
            "--cron",
            "* * * * *",
            "--interval",
            "0.5",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while (
            cluster.redis.zscore("rq:scheduler:scheduled_jobs", JOB_ID) is None
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        cluster.redis.zadd("rq:scheduler:scheduled_jobs", {JOB_ID: int(time.time()) - 1})  # due now
        while sent("fg") == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sent("fg") == 1
        assert proc.poll() is None  # still running in the foreground, for the next cron time
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out[-2000:]
    assert "Timeout reading from socket" not in out and "signal only works in main thread" not in out


def test_migrate_numbers_old_tasks_and_frees_old_entries(cluster, tmp_path):
    """Tasks of an earlier version (no seq; DISPATCH under a lease with no document) are all
    sent by the next dispatches after ``downcluster migrate``; a second run changes nothing."""
    import datetime as dt

    from bson import ObjectId

    job = register(tmp_path, "old")
    past = dt.datetime(2020, 1, 1)
    CrawlerTask._get_collection().insert_many(
        [
            {
                "job": job.id,
                "uri": f"http://127.0.0.1:1/{i}",
                "status": "LIVE",
                "download_times": 0,
                "recoveries": 0,
            }
            for i in range(5)
        ]
        + [
            {
                "job": job.id,
                "uri": f"http://127.0.0.1:1/d{i}",
                "status": "DISPATCH",
                "lease": "gone",
                "queue": "down_low",
                "dispatched_at": past,
                "download_times": 0,
                "recoveries": 0,
                "_id": ObjectId(),
            }
            for i in range(3)
        ]
    )
    assert dispatch_once(cluster.redis).total == 0  # unnumbered: invisible to this version
    out = cli("migrate").output
    assert "numbered 8 tasks" in out and "sent 3 tasks" in out
    assert dispatch_once(cluster.redis).total == 8
    assert "numbered 0 tasks" in cli("migrate").output
