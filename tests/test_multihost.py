"""Issue 28: a cluster across real hosts. A master (Redis with a password, SecantusDB, `dispatch
--loop`) and two worker hosts, `alpha` and `beta`, each in a network namespace of its own with its
own hostname (no DOWNCLUSTER_HOSTNAME: the worker names itself after the machine), joined by a
bridge; a site on two addresses. Addresses of 198.18.0.0/25 that exist only here, no route out;
every namespace, link and process is removed afterwards."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pymongo
import pytest

from sample_site import TRAFFIC, start_site
from services import MongoServer, RedisServer, env_for
from tests.helpers import write_job

BIN = Path(sys.executable).parent
MASTER, SITES = "198.18.0.1", ("198.18.0.11", "198.18.0.12")
HOSTS = {"alpha": "198.18.0.21", "beta": "198.18.0.22"}
FAST = {"HEARTBEAT_INTERVAL": "1", "HEARTBEAT_TTL": "4", "ABSENCE_GRACE": "1", "HOST_CONCURRENCY": "2",
        "HOST_SLOT_TTL": "3", "HOST_WAIT_MAX": "120", "COALESCE_WINDOW": "0", "MONGO_TIMEOUT": "3",
        "DISPATCH_BATCH_SIZE": "4", "DISPATCH_LOOP_INTERVAL": "0.2", "RETRY_BACKOFF_BASE": "0.2"}


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"ip netns does not work here: {probe.stderr.strip()}"


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))]


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Net:
    """The bridge (the master's and the sites' addresses) and one namespace per worker host."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:5]
        self.bridge = f"dcb{self.tag}"
        self.ns = {name: f"dcmh-{self.tag}-{name}" for name in HOSTS}
        self.links = {name: f"dc{self.tag}{name[0]}" for name in HOSTS}

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        for address in (MASTER, *SITES):
            _ip("addr", "add", f"{address}/25", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for name, address in HOSTS.items():
            ns, link = self.ns[name], self.links[name]
            _ip("netns", "add", ns)
            _ip("link", "add", link, "type", "veth", "peer", "name", link + "p")
            _ip("link", "set", link + "p", "netns", ns)
            _ip("link", "set", link, "master", self.bridge)
            _ip("link", "set", link, "up")
            for cmd in (["addr", "add", f"{address}/25", "dev", link + "p"],
                        ["link", "set", link + "p", "up"], ["link", "set", "lo", "up"]):
                _ip("netns", "exec", ns, "ip", *cmd)

    def cut(self, name: str) -> None:
        _ip("link", "set", self.links[name], "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self.links[name], "up")

    def down(self) -> None:
        for ns in self.ns.values():
            _ip("netns", "del", ns, check=False)
        for link in self.links.values():
            _ip("link", "del", link, check=False)
        _ip("link", "del", self.bridge, check=False)


class Cluster:
    def __init__(self, net: Net, tmp: Path) -> None:
        self.net, self.tmp = net, tmp
        self.redis = RedisServer(host=MASTER)
        self.mongo = MongoServer(host=MASTER)
        self.procs: dict[str, subprocess.Popen] = {}
        self.sites: list = []

    def start(self) -> None:
        self.redis.start()
        self.mongo.start()
        first, base = start_site(SITES[0])
        port = first.server_address[1]
        self.sites = [first, start_site(SITES[1], port)[0]]
        self.urls = [f"http://{s}:{port}" for s in SITES]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DOWNCLUSTER_")}
        self.env.update(env_for(self.redis.url, self.mongo.uri("mh"), self.mongo.uri("mh_log"), **FAST))
        self.db = pymongo.MongoClient(self.mongo.uri("mh"))["mh"]
        self.spawn("dispatch", [str(BIN / "downcluster"), "dispatch", "--loop"])

    def spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, env=env or self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def worker(self, host: str, prefix: tuple = ()) -> subprocess.Popen:
        """``downcluster worker`` on ``host``: its namespace, its hostname, no HOSTNAME setting."""
        inner = " ".join([*prefix, str(BIN / "downcluster"), "worker", "--no-exports"])
        return self.spawn(host, ["ip", "netns", "exec", self.net.ns[host], "unshare", "--uts", "sh", "-c",
                                 f"hostname {host} && exec {inner}"])

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def cli(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run([str(BIN / "downcluster"), *args], env=self.env, input=stdin,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        return done.stdout

    def job(self, name: str, urls: list[str], **kw) -> None:
        self.cli("job", "register", str(write_job(self.tmp, name, **kw)))
        self.cli("task", "add", name, "-", stdin="\n".join(urls) + "\n")

    def job_id(self, name: str):
        return self.db["job"].find_one({"name": name})["_id"]

    def done(self, name: str) -> bool:
        tasks = self.db["crawler_task"]
        job = self.job_id(name)
        return tasks.count_documents({"job": job}) == tasks.count_documents({"job": job, "status": "SUCCESS"})

    def visible(self, name: str) -> dict:
        """task id -> the hostname of the one data document it names (asserting there is one)."""
        out = {}
        for task in self.db["crawler_task"].find({"job": self.job_id(name)}, {"data_lease": 1}):
            docs = list(self.db["crawler_download_data"].find({"task": task["_id"], "lease": task["data_lease"]},
                                                             {"hostname": 1}))
            assert len(docs) == 1, task
            out[task["_id"]] = docs[0]["hostname"]
        return out

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        for site in self.sites:
            site.shutdown()
        self.redis.stop()
        self.mongo.stop()


@pytest.fixture
def multi(tmp_path):
    net = Net()
    cluster = Cluster(net, tmp_path)
    TRAFFIC.reset()
    try:
        net.up()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        net.down()
    leftovers = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert net.tag not in leftovers


def test_host_queues_and_the_shared_limit_hold_across_hosts(multi):
    site_a, site_b = multi.urls
    multi.job("pinned", [f"{site_a}/page/{i}" for i in range(20)], host="alpha")
    multi.job("shared", [f"{u}/linger/200?{i}" for i in range(20) for u in (site_a, site_b)],
              obey_robots=False)
    multi.worker("alpha")
    multi.worker("beta")
    wait_for(lambda: multi.done("pinned") and multi.done("shared"), 180, "both jobs to finish")
    assert set(multi.visible("pinned").values()) == {"alpha"}  # alpha's own queue, under its machine name
    assert set(multi.visible("shared").values()) == {"alpha", "beta"}
    peaks = {host: TRAFFIC.peak.get(host, 0) for host in (u.split("//")[1] for u in multi.urls)}
    assert all(0 < p <= 2 for p in peaks.values()), peaks  # HOST_CONCURRENCY 2, summed over both hosts
    print(f"peak in flight per site host: {peaks}")


def test_a_host_lost_then_a_host_partitioned_lose_and_repeat_nothing(multi):
    site_a, site_b = multi.urls
    urls = [f"{u}/linger/500?{i}" for i in range(30) for u in (site_a, site_b)]
    multi.job("lost", urls, obey_robots=False, host_concurrency=8)
    multi.worker("alpha")
    multi.worker("beta")
    leases = multi.db["crawler_lease"]
    wait_for(lambda: leases.count_documents({"state": "RUNNING", "hostname": "alpha"}) > 0, 60, "alpha at work")
    multi.kill("alpha")
    killed = time.monotonic()
    wait_for(lambda: leases.count_documents({"hostname": "alpha", "state": "RUNNING"}) == 0, 60,
             "alpha's leases to be given back")
    recovered = time.monotonic() - killed
    wait_for(lambda: multi.done("lost"), 240, "the lost host's tasks to be done by beta")
    assert len(multi.visible("lost")) == len(urls)

    multi.kill("beta")  # alpha alone takes the next job's first entries
    multi.job("cut", [f"{u}/linger/500?cut{i}" for i in range(30) for u in (site_a, site_b)],
              obey_robots=False, host_concurrency=8)
    multi.worker("alpha")
    wait_for(lambda: leases.count_documents({"state": "RUNNING", "hostname": "alpha"}) > 0, 60, "alpha at work")
    multi.worker("beta")
    multi.net.cut("alpha")
    wait_for(lambda: leases.count_documents({"hostname": "alpha", "state": "RUNNING"}) == 0, 60,
             "the cut host's leases to be given back")
    multi.net.heal("alpha")
    wait_for(lambda: multi.done("cut"), 240, "the cut job to finish")
    assert len(multi.visible("cut")) == 60
    logs = pymongo.MongoClient(multi.mongo.uri("mh_log"))["mh_log"]["crawler_download_log"]
    twice = logs.count_documents({"status": "SUCCESS"}) - 2 * len(urls)
    print(f"host lost: leases given back {recovered:.1f} s after the kill (HEARTBEAT_TTL 4 s); "
          f"pages downloaded twice over both cases: {twice} (stale attempts, never visible)")


def test_a_worker_whose_clock_is_off_keeps_its_leases(multi):
    if not shutil.which("faketime"):
        pytest.skip("faketime not installed (Debian package faketime)")
    site_a, site_b = multi.urls
    multi.job("skew", [f"{u}/linger/400?{i}" for i in range(20) for u in (site_a, site_b)], obey_robots=False,
              host_concurrency=8)
    multi.worker("alpha", prefix=("env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "faketime", "-f", "-30s"))
    wait_for(lambda: multi.done("skew"), 240, "the skewed worker to finish")
    tasks = multi.db["crawler_task"]
    assert tasks.count_documents({"job": multi.job_id("skew"), "recoveries": {"$gt": 0}}) == 0
    assert set(multi.visible("skew").values()) == {"alpha"}
