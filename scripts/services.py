"""Real services on free loopback ports for tests, the demo and the benchmark (never mocks).

``RedisServer`` runs redis-server; ``MongoServer`` runs SecantusDB, a MongoDB-wire-compatible
server, because no mongod can be installed on these machines. Measured here: redis-server
answers PING ~20 ms after launch, SecantusDB answers ``ping`` ~1.6 s after launch.
"""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pymongo
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# An in-memory store keeps every document in WiredTiger's cache and fails writes with WT_CACHE_FULL
# beyond it: the test session writes hundreds of MiB of bodies (1 G, the default, filled under load).
MEMORY_CACHE = "3G"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    """A child process with a log file in its own temp dir; start/stop/restart, context manager."""

    proc: subprocess.Popen | None = None
    name = "server"

    def __init__(self, port: int | None) -> None:
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix=f"dc-{self.name}-")
        self.log = os.path.join(self.dir, f"{self.name}.log")

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)  # the log and redis' --dir; never a caller's storage

    def _launch(self, argv: list[str], ready, timeout: float) -> None:
        """Run ``argv`` and poll ``ready()`` until it is truthy; fail fast (with the log) if the
        child exits."""
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                break
            try:
                if ready():
                    return
            except Exception:
                pass
            if time.monotonic() > end:
                break
            time.sleep(0.02)
        if self.proc.poll() is not None:
            why = f"exited with code {self.proc.returncode}"
        else:
            why = f"not ready in {timeout:.0f}s"
        self.stop()
        with open(self.log, "rb") as log:
            tail = log.read()[-2000:].decode(errors="replace")
        raise RuntimeError(f"{self.name} on port {self.port} did not start ({why}); log {self.log}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port."""
        self.stop()
        self.start()


class RedisServer(_Server):
    """A private redis-server (no persistence: a restart starts empty) on a free port, with a
    password of its own (``requirepass`` in its config file, never on its command line)."""

    name = "redis"

    def __init__(self, port: int | None = None, password: str | None = None, host: str = "127.0.0.1",
                 conf: str = "") -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server not found on PATH: install it (apt-get install -y redis-server)")
        super().__init__(port)
        self.host, self.conf = host, conf  # conf: more lines of its config file (secrets stay off argv)
        self.password = secrets.token_urlsafe(18) if password is None else password
        self.url = self.url_at(self.port)

    def url_at(self, port: int) -> str:
        """The URL of this server's database 0 through ``port`` (a relay's, say), with its password."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}{self.host}:{port}/0"

    def start(self) -> None:
        conf = os.path.join(self.dir, "redis.conf")
        with open(os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(f'port {self.port}\nbind {self.host}\nsave ""\nappendonly no\ndir {self.dir}\n')
            if self.password:
                f.write(f"requirepass {self.password}\n")
            f.write(self.conf)
        # no retries: redis-py 8 retries a timed-out PING for ~25 s by default
        client = redis.Redis(host=self.host, port=self.port, password=self.password or None, socket_timeout=1,
                             retry=Retry(NoBackoff(), 0))
        try:
            self._launch(["redis-server", conf], client.ping, 20)
        finally:
            client.close()


class MongoServer(_Server):
    """SecantusDB on a free port.

    ``storage=":memory:"`` (the default) loses all data when the server stops, so a
    ``stop()``/``start()`` pair gives an empty server; a directory path persists across them.
    With ``user`` and ``password`` (a directory storage only) the server requires SCRAM
    authentication: the user is created on a first start without it, then the server restarts
    with ``--auth``; ``uri()`` carries the credentials.
    """

    name = "secantus"

    def __init__(self, storage: str = ":memory:", port: int | None = None, user: str = "",
                 password: str = "", host: str = "127.0.0.1") -> None:
        super().__init__(port)
        self.host = host
        if user and storage == ":memory:":
            raise ValueError("a MongoServer with a user needs a storage directory "
                             "(the user must survive a restart)")
        self.storage, self.user, self.password = storage, user, password
        self._auth = False

    def uri(self, db: str) -> str:
        if self.user:
            return f"mongodb://{self.user}:{self.password}@{self.host}:{self.port}/{db}?authSource=admin"
        return f"mongodb://{self.host}:{self.port}/{db}"

    def start(self) -> None:
        if self.user and not self._auth:
            self._start()
            client = pymongo.MongoClient(host=self.host, port=self.port)
            try:
                client.admin.command("createUser", self.user, pwd=self.password,
                                     roles=[{"role": "root", "db": "admin"}])
            finally:
                client.close()
            self.stop()
            self._auth = True
        self._start()

    def _start(self) -> None:
        client = pymongo.MongoClient(host=self.host, port=self.port, serverSelectionTimeoutMS=500,
                                     connect=False)
        argv = [sys.executable, "-m", "secantus", "--host", self.host, "--port", str(self.port),
                "--storage-path", self.storage,
                "--standalone", "--log-level", "WARNING"] + (["--auth"] if self._auth else []) \
            + (["--cache-size", MEMORY_CACHE] if self.storage == ":memory:" else [])
        try:
            self._launch(argv, lambda: client.admin.command("ping"), 60)  # ping needs no authentication
        finally:
            client.close()


def env_for(redis_url: str, mongo_uri: str, mongo_log_uri: str, **extra) -> dict[str, str]:
    """The DOWNCLUSTER_* environment of a cluster on these services; ``extra`` adds DOWNCLUSTER_<NAME>."""
    env = {"DOWNCLUSTER_REDIS_URL": redis_url, "DOWNCLUSTER_MONGO_URI": mongo_uri,
           "DOWNCLUSTER_MONGO_LOG_URI": mongo_log_uri}
    env.update({f"DOWNCLUSTER_{k}": str(v) for k, v in extra.items()})
    return env
