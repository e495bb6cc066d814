"""Issue 28: Redis is no single point of loss. A master, a replica and a Sentinel (Debian's
redis-sentinel, passwords in config files only); the cluster reaches Redis through a
``redis+sentinel://`` URL; the master is SIGKILLed mid-run; every task ends SUCCESS with exactly
one data document it names, the dispatcher and the worker following the new master."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_lib

from common.store.log_models import CrawlerDownloadLog
from common.store.models import CrawlerDownloadData, CrawlerTask
from services import RedisServer, free_port
from tests.helpers import add_urls, register

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("redis-sentinel") is None,
                                 reason="redis-sentinel not installed (Debian package redis-sentinel)")]
BIN = Path(sys.executable).parent
SERVICE = "dcmaster"


def _conf(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def _wait(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _info(port: int, password: str) -> dict:
    try:
        return redis_lib.Redis(port=port, password=password, socket_timeout=1).info("replication")
    except redis_lib.RedisError:
        return {"role": "down"}


def _replicas_seen(port: int, password: str) -> list[str]:
    """The flags of each replica the Sentinel on ``port`` knows ("slave" when healthy)."""
    try:
        return [r["flags"] for r in redis_lib.Redis(port=port, password=password, socket_timeout=1,
                                                    decode_responses=True).sentinel_slaves(SERVICE)]
    except redis_lib.RedisError:
        return []


def test_killing_the_redis_master_mid_run_loses_and_repeats_nothing(cluster, tmp_path):
    password = secrets.token_urlsafe(18)
    master = RedisServer(password=password, conf=f"masterauth {password}\n")
    master.start()
    replica_port, sentinel_port = free_port(), free_port()
    procs: list[subprocess.Popen] = []
    cluster_procs: list[subprocess.Popen] = []
    try:
        replica = _conf(tmp_path / "replica.conf",
                        f'port {replica_port}\nbind 127.0.0.1\nsave ""\nappendonly no\ndir {tmp_path}\n'
                        f"requirepass {password}\nmasterauth {password}\nreplicaof 127.0.0.1 {master.port}\n")
        sentinel = _conf(tmp_path / "sentinel.conf",
                         f"port {sentinel_port}\nbind 127.0.0.1\ndir {tmp_path}\nrequirepass {password}\n"
                         f"sentinel monitor {SERVICE} 127.0.0.1 {master.port} 1\n"
                         f"sentinel auth-pass {SERVICE} {password}\n"
                         f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                         f"sentinel failover-timeout {SERVICE} 5000\n")
        procs.append(subprocess.Popen(["redis-server", str(replica)], stdout=subprocess.DEVNULL,
                                      start_new_session=True))
        _wait(
            lambda: _info(replica_port, password).get("master_link_status") == "up", 30, "the replica in sync"
        )
        # started after the replica is in sync, the Sentinel learns of it from its first INFO of the master
        # (else only at the next, 10 s later: a failover before that finds no replica to promote)
        procs.append(
            subprocess.Popen(
                ["redis-sentinel", str(sentinel)],
                stdout=open(tmp_path / "sentinel.log", "wb"),
                start_new_session=True,
            )
        )
        _wait(
            lambda: _replicas_seen(sentinel_port, password) == ["slave"],
            60,
            "the Sentinel to know the replica",
        )
        url = f"redis+sentinel://:{password}@127.0.0.1:{sentinel_port}/{SERVICE}/0"
        env = {
            **os.environ,
            **cluster.env,
            "DOWNCLUSTER_REDIS_URL": url,
            "DOWNCLUSTER_HEARTBEAT_INTERVAL": "1",
            "DOWNCLUSTER_ABSENCE_GRACE": "1",
            "DOWNCLUSTER_DISPATCH_BATCH_SIZE": "5",
            "DOWNCLUSTER_DISPATCH_LOOP_INTERVAL": "0.2",
            "DOWNCLUSTER_RETRY_BACKOFF_BASE": "0.2",
        }
        register(tmp_path, "ha", priority=3, obey_robots=False)
        count = 300
        add_urls("ha", [f"{cluster.site}/hold/20?{i}" for i in range(count)])
        for argv in (["dispatch", "--loop"], ["worker", "--no-exports"]):
            cluster_procs.append(subprocess.Popen(
                [str(BIN / "downcluster"), *argv], env=env, stdout=subprocess.DEVNULL,
                stderr=open(tmp_path / f"{argv[0]}.log", "wb"), start_new_session=True))
        procs.extend(cluster_procs)
        _wait(lambda: CrawlerTask.objects(status="SUCCESS").count() >= count // 4, 120, "a quarter done")
        killed = time.monotonic()
        at_kill = CrawlerTask.objects(status="SUCCESS").count()
        master.proc.send_signal(signal.SIGKILL)
        _wait(lambda: _info(replica_port, password)["role"] == "master", 60, "the replica promoted")
        promoted = time.monotonic() - killed
        _wait(lambda: CrawlerTask.objects(status="SUCCESS").count() == count, 300, "every task done")
        done = time.monotonic() - killed
        assert [p.poll() for p in cluster_procs] == [None, None]  # the same dispatcher and worker, following
        for task in CrawlerTask.objects.only("id", "data_lease"):
            assert CrawlerDownloadData.objects(task=task.id, lease=task.data_lease).count() == 1
        twice = CrawlerDownloadLog.objects(status="SUCCESS").count() - count
        print(f"Sentinel failover: master SIGKILLed with {at_kill}/{count} tasks SUCCESS; replica promoted "
              f"{promoted:.1f} s later; all {count} SUCCESS with one visible data document each {done:.1f} s "
              f"after the kill; pages downloaded twice (never visible): {twice}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # each started in a session of its own
            proc.wait()
        for (
            proc
        ) in cluster_procs:  # a SIGKILLed worker leaves its sandbox wall's table (the next worker sweeps it)
            subprocess.run(["nft", "delete", "table", "inet", f"downcluster_{proc.pid}"], capture_output=True)
        master.stop()
