"""Issue 28: a cluster across real hosts. Network namespaces made here: a bridge in a namespace of
its own, and one namespace for each machine joined to it by a veth pair — "master" (Redis with a
password, SecantusDB, `dispatch --loop`), "site" (the sample site on two addresses) and two worker
hosts, "alpha" and "beta", each with its own hostname and no DOWNCLUSTER_HOSTNAME (the worker names
itself after the machine). Addresses of 198.18.0.0/25 that exist only inside the namespaces, no
route out, nothing added to the machine's own network; every namespace (with its links) and every
process in them is removed afterwards.

The test itself runs in the master's namespace (its thread enters it: the services it starts, the
sockets it opens and the threads it makes are there), so it reads Redis and MongoDB as the master does.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pymongo
import pytest
import redis as redis_lib

from sample_site import TRAFFIC, start_site
from services import MongoServer, RedisServer, env_for
from tests.helpers import clock_skew, write_job

BIN = Path(sys.executable).parent
ADDRESSES = {"master": ("198.18.0.1",), "site": ("198.18.0.11", "198.18.0.12"),
             "alpha": ("198.18.0.21",), "beta": ("198.18.0.22",)}
WORKERS = ("alpha", "beta")
LIMIT = 2  # HOST_CONCURRENCY: requests in flight per site host, summed over every worker host
FAST = {"HEARTBEAT_INTERVAL": "1", "HEARTBEAT_TTL": "4", "ABSENCE_GRACE": "1", "HOST_CONCURRENCY": str(LIMIT),
        "HOST_SLOT_TTL": "3", "HOST_WAIT_MAX": "120", "COALESCE_WINDOW": "0", "MONGO_TIMEOUT": "3",
        "DISPATCH_BATCH_SIZE": "4", "DISPATCH_LOOP_INTERVAL": "0.2", "RETRY_BACKOFF_BASE": "0.2"}
CLONE_NEWNET = 0x40000000


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("unshare") is None:
        return "needs iproute2 (ip) and util-linux (unshare)"
    probe = f"dcmh-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None if made.returncode == 0 else f"ip netns does not work here: {made.stderr.strip()}"


WHY_NOT = _why_not()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET):
            raise OSError(ctypes.get_errno(), f"setns {path}")
    finally:
        os.close(fd)


@contextmanager
def inside(ns: str):
    """This thread in network namespace ``ns`` (and the sockets, threads and children it makes meanwhile)."""
    home_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    _setns(f"/run/netns/{ns}")
    try:
        yield
    finally:
        if ctypes.CDLL(None, use_errno=True).setns(home_fd, CLONE_NEWNET):
            raise OSError(ctypes.get_errno(), "setns back")
        os.close(home_fd)


def wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Net:
    """A bridge in namespace ``dcmh-TAG-net``; each machine a namespace with one veth into it."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.hub = f"dcmh-{self.tag}-net"
        self.ns = {name: f"dcmh-{self.tag}-{name}" for name in ADDRESSES}

    def up(self) -> None:
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for name, addresses in ADDRESSES.items():
            ns = self.ns[name]
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip(
                "-n",
                self.hub,
                "link",
                "add",
                f"to-{name}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _ip("-n", self.hub, "link", "set", f"to-{name}", "master", "br0", "up")
            for address in addresses:
                _ip("-n", ns, "addr", "add", f"{address}/25", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")  # no default route: nothing beyond 198.18.0.0/25

    def cut(self, name: str) -> None:
        _ip("-n", self.hub, "link", "set", f"to-{name}", "down")

    def heal(self, name: str) -> None:
        _ip("-n", self.hub, "link", "set", f"to-{name}", "up")

    def kill(self, name: str) -> None:
        """SIGKILL every process of a machine's namespace (never this one, whose thread may be inside)."""
        pids = _ip("netns", "pids", self.ns[name], check=False).stdout.split()
        for pid in map(int, pids):
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def down(self) -> None:
        for name in ADDRESSES:
            self.kill(name)
        for ns in (*self.ns.values(), self.hub):  # a namespace's links go with it
            _ip("netns", "del", ns, check=False)


class Cluster:
    def __init__(self, net: Net, tmp: Path) -> None:
        self.net, self.tmp = net, tmp
        self.procs: list[subprocess.Popen] = []
        self.sites: list = []
        self.redis_srv = RedisServer(host=ADDRESSES["master"][0])
        self.mongo = MongoServer(host=ADDRESSES["master"][0])

    def start(self) -> None:
        """Run from inside the master's namespace, but for the site, served from its own."""
        self.redis_srv.start()
        self.mongo.start()
        with inside(self.net.ns["site"]):
            first, _ = start_site(ADDRESSES["site"][0])
            port = first.server_address[1]
            self.sites = [first] + [start_site(a, port)[0] for a in ADDRESSES["site"][1:]]
        self.urls = [f"http://{a}:{port}" for a in ADDRESSES["site"]]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DOWNCLUSTER_")}
        self.env.update(env_for(self.redis_srv.url, self.mongo.uri("mh"), self.mongo.uri("mh_log"), **FAST))
        self.client = pymongo.MongoClient(self.mongo.uri("mh"))
        self.db, self.logs = self.client["mh"], self.client["mh_log"]["crawler_download_log"]
        self.redis = redis_lib.Redis.from_url(self.redis_srv.url, decode_responses=True)
        self.spawn("dispatch", [str(BIN / "downcluster"), "dispatch", "--loop"])

    def spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "ab")
        self.procs.append(
            subprocess.Popen(argv, env=self.env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        )

    def worker(self, host: str, prefix: tuple = ()) -> None:
        """``downcluster worker`` on ``host``: its namespace, its hostname, no HOSTNAME setting."""
        inner = " ".join([*prefix, str(BIN / "downcluster"), "worker", "--no-exports"])
        self.spawn(host, ["ip", "netns", "exec", self.net.ns[host], "unshare", "--uts", "sh", "-c",
                          f"hostname {host} && exec {inner}"])

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
        tasks, job = self.db["crawler_task"], self.job_id(name)
        return tasks.count_documents({"job": job}) == tasks.count_documents({"job": job, "status": "SUCCESS"})

    def visible(self, name: str) -> dict:
        """task id -> the hostname of the one data document it names (asserting there is one)."""
        out = {}
        for task in self.db["crawler_task"].find({"job": self.job_id(name)}, {"data_lease": 1}):
            docs = list(
                self.db["crawler_download_data"].find(
                    {"task": task["_id"], "lease": task["data_lease"]}, {"hostname": 1}
                )
            )
            assert len(docs) == 1, task
            out[task["_id"]] = docs[0]["hostname"]
        return out

    def twice(self, name: str) -> int:
        """Pages of job ``name`` downloaded more than once (successful downloads beyond one per task)."""
        job = self.job_id(name)
        return (self.logs.count_documents({"job": job, "status": "SUCCESS"})
                - self.db["crawler_task"].count_documents({"job": job}))

    def running(self, host: str) -> int:
        return self.db["crawler_lease"].count_documents({"state": "RUNNING", "hostname": host})

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for site in self.sites:
            site.shutdown()
        for client in (getattr(self, "client", None), getattr(self, "redis", None)):
            if client is not None:
                client.close()
        self.redis_srv.stop()
        self.mongo.stop()


@pytest.fixture
def multi(tmp_path):
    net = Net()
    cluster = Cluster(net, tmp_path)
    TRAFFIC.reset()
    try:
        net.up()
        with inside(net.ns["master"]):
            try:
                cluster.start()
                yield cluster
            finally:
                cluster.stop()
    finally:
        net.down()
    leftovers = _ip("netns", "list").stdout
    assert net.tag not in leftovers, leftovers


def test_host_queues_and_the_shared_limit_hold_across_hosts(multi):
    """Each host's job is downloaded by that host only, and both load the same two site hosts at once:
    the site never sees more than HOST_CONCURRENCY requests in flight per site host."""
    for host in WORKERS:
        multi.job(f"on-{host}", [f"{u}/linger/200?{host}{i}" for i in range(25) for u in multi.urls],
                  host=host, obey_robots=False)
    for host in WORKERS:
        multi.worker(host)
    wait_for(lambda: all(multi.done(f"on-{h}") for h in WORKERS), 180, "both jobs to finish")
    for host in WORKERS:
        assert set(multi.visible(f"on-{host}").values()) == {host}  # its own queue, under its machine name
    peaks = {site.split("//")[1]: TRAFFIC.peak.get(site.split("//")[1], 0) for site in multi.urls}
    assert all(0 < peak <= LIMIT for peak in peaks.values()), peaks
    twice = sum(multi.twice(f"on-{h}") for h in WORKERS)
    print(f"\nhost queues: 100 pages, each downloaded by its job's host; peak in flight per site host "
          f"{peaks} (limit {LIMIT}, shared by alpha and beta); pages downloaded twice: {twice}")


def test_a_host_lost_then_a_host_partitioned_lose_and_repeat_nothing(multi):
    pages = lambda tag: [f"{u}/linger/500?{tag}{i}" for i in range(30) for u in multi.urls]  # noqa: E731
    multi.job("lost", pages("lost"), obey_robots=False, host_concurrency=8)
    multi.worker("alpha")  # alone first: it holds entries when it is lost
    wait_for(lambda: multi.running("alpha") > 0, 60, "alpha at work")
    multi.worker("beta")
    multi.net.kill("alpha")  # every process of the host, at once
    killed = time.monotonic()
    wait_for(lambda: multi.running("alpha") == 0, 60, "alpha's leases to be given back")
    recovered = time.monotonic() - killed
    wait_for(lambda: multi.done("lost"), 240, "the lost host's tasks to be done by beta")
    assert len(multi.visible("lost")) == 60

    multi.net.kill("beta")  # alpha alone takes the next job's first entries
    multi.job("cut", pages("cut"), obey_robots=False, host_concurrency=8)
    multi.worker("alpha")
    wait_for(lambda: multi.running("alpha") > 0, 60, "alpha at work again")
    multi.worker("beta")
    multi.net.cut("alpha")
    cut = time.monotonic()
    wait_for(lambda: multi.running("alpha") == 0, 60, "the cut host's leases to be given back")
    given_back = time.monotonic() - cut
    multi.net.heal("alpha")
    wait_for(lambda: multi.done("cut"), 240, "the cut job to finish")
    assert len(multi.visible("cut")) == 60
    print(
        f"\nhost lost (SIGKILL): its leases given back {recovered:.1f} s after the kill (HEARTBEAT_TTL 4 s), "
        f"pages downloaded twice {multi.twice('lost')}; "
        f"host partitioned: leases given back {given_back:.1f} s "
        f"after the cut, healed, pages downloaded twice {multi.twice('cut')} (stale attempts, never visible)"
    )


@pytest.mark.parametrize("skew", [-120, 120])
def test_a_worker_whose_clock_is_off_keeps_its_leases(multi, skew):
    """alpha's clock is two minutes off, beta's is right. Leases are judged by the store's clock
    and rq's registries by Redis's (slave/worker/rqworker.py): the worker started second cleans rq's
    registries at its start while the first one's entries run, and none of them is taken as
    abandoned (behind: alpha's entries scored early; ahead: alpha judging beta's late ones)."""
    multi.job("skew", [f"{u}/linger/1500?{i}" for i in range(30) for u in multi.urls], obey_robots=False,
              host_concurrency=8)
    skewed = ("env", *(f"{k}={v}" for k, v in clock_skew(skew).items()))
    first, second = ("alpha", "beta") if skew < 0 else ("beta", "alpha")
    multi.worker(first, prefix=skewed if first == "alpha" else ())
    wait_for(lambda: multi.running(first) > 0, 60, f"{first}'s first entries")
    multi.worker(second, prefix=skewed if second == "alpha" else ())
    wait_for(lambda: multi.redis.keys(f"rq:worker:{second}.*"), 60, f"{second}'s birth")
    assert multi.running(first) > 0  # its maintenance at start meets the first one's running entries
    wait_for(lambda: multi.done("skew"), 240, "the job to finish")
    births = {}
    for key in multi.redis.keys("rq:worker:*"):  # rq:worker:<host>.<pid>.<tag>, stamped by the worker's clock
        if multi.redis.type(key) == "hash":
            births[key.split(":")[2].split(".")[0]] = multi.redis.hget(key, "birth")
    apart = _seconds(births["alpha"]) - _seconds(births["beta"])
    assert abs(apart - skew) < abs(skew) / 2, (
        births
    )  # the skew took: alpha stamps its own records two minutes off
    tasks = multi.db["crawler_task"]
    lost = tasks.count_documents({"job": multi.job_id("skew"), "recoveries": {"$gt": 0}})
    abandoned = sum(
        (multi.tmp / f"{host}.log").read_text().count("AbandonedJobError") for host in ("alpha", "beta")
    )
    by = multi.visible("skew").values()
    print(f"\nclock skew: alpha's clock {skew:+d} s (rq birth stamps {apart:+.0f} s apart); "
          f"alpha stored {sum(h == 'alpha' for h in by)}, beta {sum(h == 'beta' for h in by)}; "
          f"leases given back {lost}, rq entries taken as abandoned {abandoned}, "
          f"pages downloaded twice {multi.twice('skew')}")
    assert lost == 0 and abandoned == 0 and multi.twice("skew") == 0
    assert first in by


def _seconds(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
