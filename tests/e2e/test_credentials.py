"""Issue 27: a cluster whose Redis has a password and whose MongoDB requires SCRAM users works
end to end, and no password appears in any process's argv, any output, or a downloader's reach."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from services import MongoServer, RedisServer, env_for
from slave.download.engines import wall
from tests.helpers import write_job

BIN = Path(sys.executable).parent


class _ArgvWatch:
    """Reads every process's command line, again and again, while a cluster runs."""

    def __init__(self, needles: list[str]) -> None:
        self.needles = [n.encode() for n in needles]
        self.found: list[bytes] = []
        self.looks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        argv = Path(f"/proc/{entry}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if any(n in argv for n in self.needles):
                        self.found.append(argv)
            self.looks += 1
            self._stop.wait(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow
@pytest.mark.skipif(wall.check() is not None, reason="the python job needs the sandbox")
def test_a_cluster_with_passwords_works_and_never_shows_them(site, tmp_path):
    redis_pw, mongo_pw = secrets.token_urlsafe(12), secrets.token_urlsafe(12)
    with RedisServer(password=redis_pw) as redis_srv, \
            MongoServer(storage=str(tmp_path / "db"), user="dc", password=mongo_pw) as mongo:
        env = {**os.environ, **env_for(redis_srv.url, mongo.uri("creds"), mongo.uri("creds_log"),
                                       HOSTNAME="credhost")}
        probe = ("import json, os, socket\n"
                 "def download(task):\n"
                 "    try:\n"
                 f"        socket.create_connection(('127.0.0.1', {mongo.port}), timeout=5)\n"
                 "        mongo = 'open'\n"
                 "    except OSError as exc:\n"
                 "        mongo = type(exc).__name__\n"
                 "    env = json.dumps(dict(os.environ))\n"
                 "    return {'status_code': 200, 'body': json.dumps({'mongo': mongo, 'env': env})}\n")
        builtin = write_job(tmp_path, "plain", priority=5, allow_private=True)
        python = write_job(tmp_path, "probe", priority=0, kind="python", code=probe, allow_private=True)
        outputs = []

        def run(*args: str, stdin: str | None = None) -> str:
            done = subprocess.run([str(BIN / "downcluster"), *args], env=env, input=stdin,
                                  capture_output=True, text=True, timeout=180)
            outputs.append(done.stdout + done.stderr)
            assert done.returncode == 0, (args, done.stderr[-2000:])
            return done.stdout

        with _ArgvWatch([redis_pw, mongo_pw]) as watch:
            run("job", "register", str(builtin))
            run("job", "register", str(python))
            run("task", "add", "plain", "-", stdin="".join(f"{site}/page/{i}\n" for i in range(20)))
            run("task", "add", "probe", "-", stdin=f"{site}/page/1\n")
            run("dispatch")
            run("worker", "--burst")
            stats = run("stats", "--json")
            exported = run("data", "export", "probe", "--format", "jsonl")
        assert watch.looks > 10 and watch.found == []
        counts = {row["job"]: row for row in json.loads(stats)["jobs"]}
        assert counts["plain"]["SUCCESS"] == 20 and counts["probe"]["SUCCESS"] == 1, stats
        assert '"mongo": "ConnectionRefusedError"' in _body_text(exported)
        for text in outputs:
            assert redis_pw not in text and mongo_pw not in text
        assert redis_pw not in exported and mongo_pw not in exported
        assert "DOWNCLUSTER" not in _body_text(exported)

        wrong = {**env, "DOWNCLUSTER_MONGO_URI": mongo.uri("creds").replace(mongo_pw, "not-the-password")}
        done = subprocess.run([str(BIN / "downcluster"), "job", "list"], env=wrong, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1 and "not-the-password" not in done.stdout + done.stderr
        assert done.stderr.strip() == f"error: MongoDB refused the credentials at 127.0.0.1:{mongo.port}"
        wrong = {**env, "DOWNCLUSTER_REDIS_URL": redis_srv.url.replace(redis_pw, "not-the-password")}
        done = subprocess.run([str(BIN / "downcluster"), "stats"], env=wrong, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1 and "not-the-password" not in done.stdout + done.stderr
        assert done.stderr.strip() == f"error: Redis refused the credentials at 127.0.0.1:{redis_srv.port}"


def _body_text(jsonl: str) -> str:
    """The stored bodies of an export (``body_base64``), decoded."""
    import base64
    import json

    return "\n".join(base64.b64decode(json.loads(line)["body_base64"]).decode() for line in jsonl.splitlines()
                     if line.strip())
