"""A worker that comes back from a pause or a partition never writes what a reader sees: four
cases on real processes and services, 300 tasks each. Worker A is frozen (SIGSTOP of its process
group) or cut off by a relay (tests/relay.py) for longer than HEARTBEAT_TTL while its entries
run; the defender gives its leases back and worker B finishes every task; then A comes back.
Each case ends with every task SUCCESS, exactly one data document per task (the one its task
names), byte-exact, and the caps held."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from rq import Queue

import sample_site
from common.queue.names import QUEUE_NAMES, cap
from common.store import orphans
from common.store.clock import utcnow
from common.store.data import data_rows
from common.store.models import CrawlerDownloadData, CrawlerLease, CrawlerTask, Job
from common.store.records import ExportFilter
from master.dispatch.dispatcher import dispatch_once
from tests.helpers import (
    FAST_RECOVERY,
    add_urls,
    heartbeats_stale,
    register,
    statuses,
    wait_for,
    with_settings,
)
from tests.relay import Relay

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
N = 300
FAST = {  # on top of the fast_recovery fixture's
    "DOWNCLUSTER_HOST_CONCURRENCY": "0",
    "DOWNCLUSTER_COALESCE_WINDOW": "0",
    "DOWNCLUSTER_RETRY_BACKOFF_BASE": "0.01",
    "DOWNCLUSTER_MONGO_TIMEOUT": "2",
}


@pytest.fixture
def fast(fast_recovery, monkeypatch):
    return with_settings(fast_recovery, monkeypatch, FAST)


def worker(env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "downcluster"), "worker", "--no-exports", *args],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def urls(site: str, name: str) -> list[str]:
    return [f"{site}/hold/1500?{name}={i}" for i in range(N)]


def start_job(fast, tmp_path, name: str) -> None:
    register(tmp_path, name, dispatch_num=N)
    add_urls(name, urls(fast.site, name))
    assert dispatch_once(fast.redis).total == N


def running_of(worker_name: str) -> int:
    return CrawlerLease.objects(state="RUNNING", worker=worker_name).count()


def recover_and_finish(fast) -> None:
    """A's leases have no heartbeat: the defender gives them back; B drains everything."""
    ttl = float(FAST_RECOVERY["DOWNCLUSTER_HEARTBEAT_TTL"])
    wait_for(lambda: heartbeats_stale(ttl), 60, "A's leases to outlive HEARTBEAT_TTL")
    assert dispatch_once(fast.redis).recovered > 0
    b = worker(fast.env, "--burst", "--name", "b")
    for _ in range(6):
        try:
            b.wait(timeout=120)
        finally:
            if b.poll() is None:
                b.kill()
        if not {"LIVE", "DISPATCH", "FAIL"} & set(statuses_all()):
            return
        wait_for(lambda: heartbeats_stale(ttl), 60, "B's leases to outlive HEARTBEAT_TTL")
        dispatch_once(fast.redis)
        b = worker(fast.env, "--burst")
    raise AssertionError(f"B did not finish: {statuses_all()}")


def statuses_all() -> dict:
    out: dict[str, int] = {}
    for t in CrawlerTask.objects.only("status"):
        out[t.status] = out.get(t.status, 0) + 1
    return out


def stop(proc: subprocess.Popen) -> str:
    """SIGTERM: A finishes (and tries to store) what it was running, then exits."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
    return err.decode(errors="replace")


def check(fast, name: str) -> dict:
    """Every task SUCCESS with exactly one data document, the one it names, byte-exact; readers
    show one row per task; caps held. Returns figures for the log."""
    for q in QUEUE_NAMES:
        assert Queue(q, connection=fast.redis).count <= cap(q)
    job = Job.objects.get(name=name)
    assert statuses(name) == {"SUCCESS": N}
    rows = list(data_rows(job.id, ExportFilter(), needs_body=True))
    assert len(rows) == N and len({r.task for r in rows}) == N
    raw = CrawlerDownloadData._get_collection().count_documents({"job": job.id})
    orphans.sweep_orphans(now=utcnow() + timedelta(seconds=5), grace=1)  # the defender's share, past grace
    coll = CrawlerDownloadData._get_collection()
    for t in CrawlerTask.objects(job=job):
        docs = list(coll.find({"task": t.id}))
        assert len(docs) == 1 and docs[0]["lease"] == t.data_lease, t.uri
        assert bytes(docs[0]["response_body"]) == f"held /hold/1500?{t.uri.split('?', 1)[1]}".encode()
    return {"data_before_sweep": raw, "data_after_sweep": coll.count_documents({"job": job.id})}


def test_pause_then_resume(fast, tmp_path):
    start_job(fast, tmp_path, "p1")
    a = worker(fast.env, "--name", "a")
    try:
        wait_for(lambda: running_of("a") >= 2, 60, "A running entries")
        os.killpg(a.pid, signal.SIGSTOP)
        recover_and_finish(fast)
    finally:
        os.killpg(a.pid, signal.SIGCONT)
        stop(a)
    print("p1", check(fast, "p1"))


def test_partition_then_heal(fast, tmp_path):
    start_job(fast, tmp_path, "p2")
    rr, mr = Relay(fast.redis_server.port), Relay(fast.mongo_server.port)
    env = {**fast.env, "DOWNCLUSTER_REDIS_URL": fast.redis_server.url_at(rr.port),
           "DOWNCLUSTER_MONGO_URI": f"mongodb://127.0.0.1:{mr.port}/dc_test",
           "DOWNCLUSTER_MONGO_LOG_URI": f"mongodb://127.0.0.1:{mr.port}/dc_test_log"}
    a = worker(env, "--name", "a")
    try:
        wait_for(lambda: running_of("a") >= 2, 60, "A running entries")
        rr.partition()
        mr.partition()
        recover_and_finish(fast)
        rr.heal()
        mr.heal()
    finally:
        stop(a)
        rr.close()
        mr.close()
    print("p2", check(fast, "p2"))


def test_partition_on_the_data_insert_with_old_connections_resuming_late(fast, tmp_path):
    start_job(fast, tmp_path, "p3")
    rr, mr = Relay(fast.redis_server.port), Relay(fast.mongo_server.port)
    env = {**fast.env, "DOWNCLUSTER_REDIS_URL": fast.redis_server.url_at(rr.port),
           "DOWNCLUSTER_MONGO_URI": f"mongodb://127.0.0.1:{mr.port}/dc_test",
           "DOWNCLUSTER_MONGO_LOG_URI": f"mongodb://127.0.0.1:{mr.port}/dc_test_log"}
    mr.partition_on(
        b"\x02insert\x00", b"crawler_download_data"
    )  # A's first data insert is held: the cut lands on it
    env["DOWNCLUSTER_MONGO_SOCKET_TIMEOUT"] = "2"  # A gives up on it and sends it again on a new connection
    a = worker(env, "--name", "a")
    try:
        wait_for(mr.tripped.is_set, 60, "A's data insert")
        rr.partition()
        recover_and_finish(fast)
        rr.heal(old_after=12.0)
        mr.heal(
            old_after=12.0
        )  # new connections at once; the held insert arrives 12 s later, after the retry
        wait_for(mr.delivered_late.is_set, 30, "the held insert to arrive")
    finally:
        stop(a)
        rr.close()
        mr.close()
    print("p3", check(fast, "p3"))


def test_pause_that_ends_in_a_busy_cluster(fast, tmp_path):
    """A comes back to new work whose pages are handed back (robots.txt answering 503): its
    stale successes and those hand-backs share the writer's batches."""
    start_job(fast, tmp_path, "p4")
    busy, busy_base = sample_site.start_site()
    sample_site.ROBOTS[busy.server_address[1]] = (503, "down")
    a = worker(fast.env, "--name", "a")
    try:
        wait_for(lambda: running_of("a") >= 2, 60, "A running entries")
        os.killpg(a.pid, signal.SIGSTOP)
        recover_and_finish(fast)
        register(tmp_path, "busy", dispatch_num=N)
        add_urls("busy", [f"{busy_base}/page/{i}" for i in range(100)])
        assert dispatch_once(fast.redis).total == 100
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    try:
        wait_for(
            lambda: (
                CrawlerTask.objects(
                    job=Job.objects.get(name="busy").id, failed_reason__contains="robots"
                ).count()
                >= 50
            ),
            60,
            "A handing back the busy pages",
        )
    finally:
        stop(a)
        busy.shutdown()
    print("p4", check(fast, "p4"))
    busy_job = Job.objects.get(name="busy")
    assert CrawlerDownloadData.objects(job=busy_job).count() == 0
    assert set(statuses("busy")) <= {"LIVE"}
