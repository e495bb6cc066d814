"""Promises that hold across hosts, on real worker processes: the per-host limit measured at the
site when a worker loses Redis (or MongoDB) mid-download and when downloads outlast a slot's
lease; leases judged by one clock whatever a worker's clock says (tests/clockskew); a stopped
``dispatch --loop`` that never blocks its successor."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from common.config import load, settings
from common.store.log_models import CrawlerDownloadLog
from common.store.models import CrawlerLease, CrawlerTask
from master.dispatch.dispatcher import dispatch_once
from sample_site import TRAFFIC
from tests.helpers import FAST_RECOVERY, add_urls, clock_skew, register, statuses
from tests.relay import Relay

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
LIMITS = {"HOST_CONCURRENCY": "2", "HOST_SLOT_TTL": "3", "HOST_WAIT_MAX": "120", "HEARTBEAT_INTERVAL": "1",
          "COALESCE_WINDOW": "0", "MONGO_TIMEOUT": "2"}


@pytest.fixture
def hosts(cluster, monkeypatch):
    for key, value in LIMITS.items():
        monkeypatch.setenv(f"DOWNCLUSTER_{key}", value)
        cluster.env[f"DOWNCLUSTER_{key}"] = value
    load()
    load(flags=dict(settings.flags, DISPATCH_BATCH_SIZE=2))
    TRAFFIC.reset()
    procs: list[subprocess.Popen] = []
    cluster.procs = procs
    yield cluster
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def start(cluster, *args: str, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([str(BIN / "downcluster"), *args], env={**os.environ, **(env or cluster.env)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    cluster.procs.append(proc)
    return proc


def relayed(cluster, redis: Relay | None = None, mongo: Relay | None = None) -> dict:
    env = dict(cluster.env)
    if redis:
        env["DOWNCLUSTER_REDIS_URL"] = cluster.redis_server.url_at(redis.port)
    if mongo:
        env["DOWNCLUSTER_MONGO_URI"] = f"mongodb://127.0.0.1:{mongo.port}/dc_test"
        env["DOWNCLUSTER_MONGO_LOG_URI"] = f"mongodb://127.0.0.1:{mongo.port}/dc_test_log"
    return env


def site_host(cluster) -> str:
    return urlsplit(cluster.site).netloc


def lingers(cluster) -> int:
    return sum(n for path, n in TRAFFIC.hits.items() if path.startswith("/linger/"))


def test_a_worker_cut_off_from_redis_stops_its_downloads_before_its_slots_can_expire(hosts, tmp_path):
    """A holds both slots with pages that take a minute; Redis goes silent for A. A stops them
    (tasks handed back, no attempt) before the slots' leases can end, so B, which takes them as
    soon as Redis frees them, never makes a third or fourth request in flight at the site."""
    register(tmp_path, "j", dispatch_num=100, obey_robots=False)
    add_urls("j", [f"{hosts.site}/linger/60000?{i}" for i in range(8)])
    assert dispatch_once(hosts.redis).total == 8
    relay = Relay(hosts.redis_server.port)
    try:
        start(
            hosts, "worker", "--no-exports", "--max-jobs", "1", "--name", "a", env=relayed(hosts, redis=relay)
        )
        wait_for(lambda: TRAFFIC.active.get(site_host(hosts)) == 2, 60, "A's two downloads in flight")
        relay.partition()
        cut = time.monotonic()
        start(hosts, "worker", "--no-exports", "--name", "b")
        wait_for(lambda: TRAFFIC.hung_up.get(site_host(hosts)) == 2, 30, "A to stop its downloads")
        stopped = time.monotonic() - cut
        wait_for(lambda: lingers(hosts) >= 4, 60, "B's downloads on the freed slots")
        taken = time.monotonic() - cut
        assert TRAFFIC.peak[site_host(hosts)] == 2
        back = CrawlerTask.objects(failed_reason__contains="not renewed in time")
        wait_for(lambda: back.count() == 2, 60, "A to hand its tasks back")  # A's MongoDB still answers
        assert {t.status for t in back} == {"LIVE"} and {t.download_times for t in back} == {0}
    finally:
        relay.close()
    print(f"A stopped {stopped:.2f}s after the cut (slot lease 3 s); B took the slots {taken:.2f}s after it")


def test_slots_outlive_their_lease_while_renewed_even_with_mongodb_silent(hosts, tmp_path):
    """Downloads of 6 s on slots leased for 3 s, by a worker whose MongoDB stops answering: the
    slots are renewed by a thread of their own, so the downloads run to the end and B waits."""
    register(tmp_path, "j", dispatch_num=100, obey_robots=False)
    add_urls("j", [f"{hosts.site}/linger/6000?{i}" for i in range(4)])
    assert dispatch_once(hosts.redis).total == 4
    relay = Relay(hosts.mongo_server.port)
    try:
        start(
            hosts, "worker", "--no-exports", "--max-jobs", "1", "--name", "a", env=relayed(hosts, mongo=relay)
        )
        wait_for(lambda: TRAFFIC.active.get(site_host(hosts)) == 2, 60, "A's two downloads in flight")
        relay.partition()
        b = start(hosts, "worker", "--no-exports", "--burst", "--name", "b")
        assert b.wait(timeout=120) == 0, b.stderr.read().decode()[-2000:]
    finally:
        relay.close()
    assert lingers(hosts) == 4 and TRAFFIC.peak[site_host(hosts)] == 2
    assert not TRAFFIC.hung_up  # A's downloads ran their 6 s
    assert CrawlerDownloadLog.objects(status="SUCCESS").count() == 2  # B's two


@pytest.mark.parametrize("skew", [-30, -300, 300])
def test_a_worker_s_clock_changes_no_lease(hosts, tmp_path, skew):
    """A worker whose clock is minutes off (tests/clockskew) keeps its leases while healthy (the
    defender judges them all along), and when it is killed its leases are still recovered."""
    fast = {**hosts.env, **FAST_RECOVERY, "DOWNCLUSTER_HOST_CONCURRENCY": "0", **clock_skew(skew)}
    load(flags=dict(settings.flags, HEARTBEAT_TTL=3, ABSENCE_GRACE=0))
    register(tmp_path, "j", dispatch_num=100, obey_robots=False)
    add_urls("j", [f"{hosts.site}/hold/5000?{i}" for i in range(6)])
    assert dispatch_once(hosts.redis).total == 6
    w = start(hosts, "worker", "--no-exports", "--burst", env=fast)
    wait_for(lambda: CrawlerLease.objects(state="RUNNING").count() == 3, 60, "the skewed worker's leases")
    judged = 0
    while True:  # the defender judges all along: no lease of the healthy worker is taken
        assert dispatch_once(hosts.redis).recovered == 0
        judged += 1
        try:
            w.wait(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            pass
    assert w.returncode == 0, w.stderr.read().decode()[-2000:]
    assert judged > 1 and statuses("j") == {"SUCCESS": 6} and CrawlerDownloadLog.objects.count() == 6
    stamped = CrawlerDownloadLog.objects.first().id.generation_time.timestamp() - time.time()
    assert abs(stamped - skew) < 10  # the skew took: the worker's ObjectIds carry its clock

    add_urls("j", [f"{hosts.site}/hold/60000?dead{i}" for i in range(2)])
    assert dispatch_once(hosts.redis).total == 2
    w = start(hosts, "worker", "--no-exports", env=fast)
    wait_for(lambda: CrawlerLease.objects(state="RUNNING").count() == 1, 60, "the skewed worker's lease")
    os.killpg(w.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: dispatch_once(hosts.redis).recovered == 2, 30, "the killed worker's lease recovered")
    print(f"clock {skew}: healthy leases judged {judged} times, none taken; dead one recovered "
          f"{time.monotonic() - killed:.1f}s after the kill (HEARTBEAT_TTL 3 s)")


def _dispatcher(hosts, env: dict) -> subprocess.Popen:
    return start(hosts, "dispatch", "--loop", "--interval", "0.2", env=env)


def test_a_stopped_dispatch_loop_never_blocks_its_successor(hosts, tmp_path):
    """SIGTERM: the loop ends at once and frees its lock, and the standby takes over; SIGKILL: the
    next standby takes over once the dead holder's lock expires (DISPATCH_LOCK_TTL, 3 s here)."""
    from tests.helpers import sent

    env = {**hosts.env, "DOWNCLUSTER_DISPATCH_LOCK_TTL": "3"}
    register(tmp_path, "j", dispatch_num=100)
    add_urls("j", ["http://127.0.0.1:1/first"])
    first = _dispatcher(hosts, env)
    wait_for(lambda: sent("j") == 1, 60, "the first dispatcher's run")
    second = _dispatcher(hosts, env)  # finds the lock held: stands by
    os.killpg(first.pid, signal.SIGTERM)
    termed = time.monotonic()
    assert first.wait(timeout=30) == 0
    ended = time.monotonic() - termed
    add_urls("j", ["http://127.0.0.1:1/second"])
    wait_for(lambda: sent("j") == 2, 30, "the standby to take over after a SIGTERM")

    third = _dispatcher(hosts, env)
    os.killpg(second.pid, signal.SIGKILL)
    second.wait()
    killed = time.monotonic()
    add_urls("j", ["http://127.0.0.1:1/third"])
    wait_for(lambda: sent("j") == 3, 30, "the standby to take over from a killed dispatcher")
    print(f"SIGTERMed dispatcher ended in {ended:.2f}s; the successor of a SIGKILLed one dispatched "
          f"{time.monotonic() - killed:.1f}s after the kill")
    os.killpg(third.pid, signal.SIGTERM)
    assert third.wait(timeout=30) == 0
    assert not hosts.redis.exists("downcluster:dispatch:lock")
