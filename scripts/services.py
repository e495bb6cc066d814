"""Real services on free loopback ports for tests, the demo and the benchmark (never mocks).

``RedisServer`` runs redis-server; ``MongoServer`` runs SecantusDB, a MongoDB-wire-compatible
server, because no mongod can be installed on these machines.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pymongo
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(check, what: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if time.monotonic() > end:
            raise RuntimeError(f"{what} did not start within {timeout:.0f}s")
        time.sleep(0.05)


class _Server:
    proc: subprocess.Popen | None = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


class RedisServer(_Server):
    """A private redis-server (no persistence) on a free port."""

    def __init__(self, port: int | None = None) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server not found: install it (apt-get install -y redis-server)")
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="dc-redis-")
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        _wait(lambda: client.ping(), "redis-server", 20)


class MongoServer(_Server):
    """SecantusDB on a free port; ``storage=":memory:"`` loses its data when stopped."""

    def __init__(self, storage: str = ":memory:", port: int | None = None) -> None:
        self.port = port or free_port()
        self.storage = storage
        self.log = os.path.join(tempfile.mkdtemp(prefix="dc-mongo-"), "secantus.log")

    def uri(self, db: str) -> str:
        return f"mongodb://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "secantus", "--port", str(self.port), "--storage-path", self.storage,
                 "--standalone", "--log-level", "WARNING"], stdout=log, stderr=log)
        client = pymongo.MongoClient(port=self.port, serverSelectionTimeoutMS=500)
        try:
            _wait(lambda: self.proc.poll() is None and client.admin.command("ping"), "SecantusDB", 60)
        finally:
            client.close()


def env_for(redis_url: str, mongo_uri: str, mongo_log_uri: str, **extra) -> dict[str, str]:
    """The DOWNCLUSTER_* environment of a cluster on these services."""
    env = {"DOWNCLUSTER_REDIS_URL": redis_url, "DOWNCLUSTER_MONGO_URI": mongo_uri,
           "DOWNCLUSTER_MONGO_LOG_URI": mongo_log_uri}
    env.update({f"DOWNCLUSTER_{k}": str(v) for k, v in extra.items()})
    return env
