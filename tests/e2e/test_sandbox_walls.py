"""Issue 27: a hostile job's downloader tries every way out of its box, and none works.

Real processes and services throughout: the session's redis-server and SecantusDB, a "web" on
the port WEB_BIND names, a second host in a network namespace (198.18.0.0/24, no route out)
holding the cluster's Redis, a SOCKS5 proxy, rq's own enqueue for a planted pickle entry.
Each test checks the attempt failed, the cluster is unchanged and nothing is left running,
and that the downloads a job is meant to make still work.
"""
from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis as redis_lib

from common.config import load
from common.errors import DownloadError
from slave.download.engines import wall
from slave.download.engines.base import Limits
from slave.download.engines.sandbox import run_python, run_shell
from tests.boxes import boxed_processes, eventually_no_boxed_processes

pytestmark = pytest.mark.skipif(wall.check() is not None, reason=f"no sandbox here: {wall.check()}")

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
LIMITS = Limits(timeout=30, maxsize=1024 * 1024, max_processes=32)

# One python downloader that tries each (host, port) it is given with a raw socket, then talks
# RESP (Redis) or an HTTP GET (metrics) through whatever opened; the body reports each outcome.
PROBE = '''
import socket
def attempt(host, port, payload):
    try:
        s = socket.create_connection((host, port), timeout=5)
    except OSError as exc:
        return "refused" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__
    try:
        s.sendall(payload)
        return "OPEN " + s.recv(200).decode("latin-1")
    except OSError as exc:
        return "OPEN " + type(exc).__name__
    finally:
        s.close()
def download(task):
    out = {}
    for name, (host, port, payload) in task["settings"]["targets"].items():
        out[name] = attempt(host, port, payload.encode())
    return {"status_code": 200, "body": __import__("json").dumps(out)}
'''
REDIS_WRITE = "*3\r\n$3\r\nSET\r\n$5\r\npwned\r\n$1\r\n1\r\n"
HTTP_GET = "GET /metrics HTTP/1.0\r\n\r\n"
MONGO_HELLO = "\x00"  # any bytes: what matters is whether the connection opens


def _probe(targets: dict, allow_private: bool) -> dict:
    task = {"url": "http://x/", "settings": {"targets": targets, "allow_private": allow_private}}
    return json.loads(run_python(PROBE, task, LIMITS).body)


class _Web:
    """A stand-in for ``downcluster web`` on WEB_BIND (or any small site): counts the requests
    that reach it; ``page`` is the HTML it serves at ``/page``."""

    def __init__(self, page: str = "") -> None:
        self.hits = 0
        self.paths: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.hits += 1
                outer.paths.append(self.path)
                html = self.path == "/page"
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if html else "text/plain")
                self.end_headers()
                self.wfile.write(outer.page.encode() if html else b"downcluster_queue_depth 1\n")

            def log_message(self, *args):
                pass

        self.page = page
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def walled(cluster, monkeypatch):
    """The cluster's settings with a web listening on WEB_BIND."""
    web = _Web()
    monkeypatch.setenv("DOWNCLUSTER_WEB_BIND", f"127.0.0.1:{web.port}")
    load()
    yield cluster, web
    web.close()


def _service_targets(cluster, web) -> dict:
    mongo = cluster.mongo_server.port
    return {"redis": ["127.0.0.1", cluster.redis_server.port, REDIS_WRITE],
            "mongodb": ["127.0.0.1", mongo, MONGO_HELLO],
            "web": ["127.0.0.1", web.port, HTTP_GET],
            # the same services through another address of this host (a service bound to all of them)
            "redis_v6": ["::1", cluster.redis_server.port, REDIS_WRITE],
            "redis_other_loopback": ["127.0.0.2", cluster.redis_server.port, REDIS_WRITE]}


@pytest.mark.parametrize("allow_private", [False, True])
def test_python_reaches_no_cluster_service_on_this_host(walled, allow_private):
    cluster, web = walled
    keys = cluster.redis.dbsize()
    got = _probe(_service_targets(cluster, web), allow_private)
    assert set(got.values()) == {"refused"}, got
    assert cluster.redis.dbsize() == keys and cluster.redis.get("pwned") is None and web.hits == 0


@pytest.mark.parametrize("allow_private", [False, True])
def test_shell_reaches_no_cluster_service_with_redis_cli_or_curl(walled, allow_private):
    cluster, web = walled
    port, mongo = cluster.redis_server.port, cluster.mongo_server.port
    code = (f"redis-cli -h 127.0.0.1 -p {port} SET pwned 1 2>&1; echo \"redis-cli=$?\"\n"
            f"printf 'SET pwned 1\\r\\nQUIT\\r\\n' | curl -sS -m 5 telnet://127.0.0.1:{port} 2>&1;"
            f" echo \"telnet=$?\"\n"
            f"curl -sS -m 5 http://127.0.0.1:{web.port}/metrics 2>&1; echo \"metrics=$?\"\n"
            f"curl -sS -m 5 telnet://127.0.0.1:{mongo} </dev/null 2>&1; echo \"mongo=$?\"\n")
    out = run_shell(code, "http://x/", LIMITS, allow_private=allow_private).body.decode()
    assert f"Could not connect to Redis at 127.0.0.1:{port}: Connection refused" in out, out
    for tool in ("redis-cli=1", "telnet=7", "metrics=7", "mongo=7"):  # curl's 7: could not connect
        assert tool in out, out
    assert "OK" not in out and "downcluster_queue_depth" not in out
    assert cluster.redis.get("pwned") is None and web.hits == 0


def test_the_worker_itself_still_reaches_what_the_sandbox_cannot(walled):
    cluster, web = walled
    assert cluster.redis.ping() and cluster.redis.set("mine", "1")
    assert urllib.request.urlopen(f"http://127.0.0.1:{web.port}/metrics", timeout=5).status == 200


def test_sandbox_deny_walls_off_what_the_operator_lists(walled, monkeypatch):
    cluster, web = walled
    internal = _Web()
    try:
        targets = {"internal": ["127.0.0.1", internal.port, HTTP_GET]}
        assert _probe(targets, allow_private=True)["internal"].startswith("OPEN HTTP/1.0 200")
        monkeypatch.setenv("DOWNCLUSTER_SANDBOX_DENY", f"127.0.0.1:{internal.port}")
        load()
        assert _probe(targets, allow_private=True) == {"internal": "refused"}
        assert internal.hits == 1
    finally:
        internal.close()


def test_loopback_and_link_local_are_refused_unless_the_job_allows_private(walled):
    cluster, _ = walled
    site_port = int(cluster.site.rsplit(":", 1)[1])
    targets = {"site": ["127.0.0.1", site_port, "GET /page/1 HTTP/1.0\r\n\r\n"],
               "metadata": ["169.254.169.254", 80, "GET / HTTP/1.0\r\n\r\n"]}
    assert _probe(targets, allow_private=False) == {"site": "refused", "metadata": "refused"}
    assert _probe(targets, allow_private=True)["site"].startswith("OPEN HTTP/1.1 200 OK")


def test_a_job_proxy_listed_in_sandbox_allow_carries_an_ordinary_jobs_downloads(walled, monkeypatch):
    """A job without allow_private reaches no loopback address itself, but its proxy (allowed
    by the operator) fetches for it: the shell downloader's curl honours ALL_PROXY."""
    from tests.integration.test_download_engines import _Socks5

    cluster, _ = walled
    proxy = _Socks5()
    monkeypatch.setenv("DOWNCLUSTER_SANDBOX_ALLOW", f"127.0.0.1:{proxy.port}")
    load()
    url = f"{cluster.site}/page/7"
    direct = 'curl -sS --noproxy "*" -m 5 "$1"'
    with pytest.raises(DownloadError) as refused:
        run_shell(direct, url, LIMITS)
    assert "Couldn't connect" in refused.value.reason or "Failed to connect" in refused.value.reason
    got = run_shell('curl -sS --fail -m 10 -H "Cookie: $DOWNLOAD_COOKIE" "$1"', url, LIMITS,
                    proxy=f"socks5h://127.0.0.1:{proxy.port}", cookie="sid=1")
    assert b"<title>page 7</title>" in got.body
    assert proxy.targets and proxy.targets[-1][1] == int(cluster.site.rsplit(":", 1)[1])


# --- a second host: the cluster's Redis elsewhere --------------------------------------------

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def remote_redis(cluster, monkeypatch, tmp_path):
    """A host 198.18.0.202 in a network namespace of its own (joined to this one by a veth pair,
    no route out) running the cluster's Redis and an ordinary web page on port 8000."""
    if shutil.which("ip") is None or shutil.which("redis-server") is None:
        pytest.skip("needs iproute2 and redis-server")
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"dcwall-{tag}", f"dcw{tag}a", f"dcw{tag}b"
    procs: list[subprocess.Popen] = []
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", "198.18.0.201/30", "dev", here)
        _ip("link", "set", here, "up")
        for cmd in (["addr", "add", "198.18.0.202/30", "dev", there], ["link", "set", there, "up"],
                    ["link", "set", "lo", "up"]):
            _ip("netns", "exec", ns, "ip", *cmd)
        (tmp_path / "index.html").write_text("an ordinary page\n")
        (tmp_path / "redis.conf").write_text("bind 198.18.0.202\nport 6379\nsave \"\"\nappendonly no\n"
                                             "requirepass remote-secret-pw\n")
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, "redis-server",
                                       str(tmp_path / "redis.conf")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", "8000",
                                       "--bind", "198.18.0.202", "--directory", str(tmp_path)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        url = "redis://:remote-secret-pw@198.18.0.202:6379/0"
        client = redis_lib.Redis.from_url(url, socket_timeout=2)
        deadline = time.monotonic() + 30
        while True:  # both services answer the worker (root) before the test begins
            try:
                client.ping()
                urllib.request.urlopen("http://198.18.0.202:8000/index.html", timeout=2).read()
                break
            except (redis_lib.RedisError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        monkeypatch.setenv("DOWNCLUSTER_REDIS_URL", url)
        load()
        yield client
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", here, check=False)


@pytest.mark.parametrize("allow_private", [False, True])
def test_the_cluster_redis_on_another_host_is_out_of_reach(remote_redis, allow_private):
    targets = {"redis": ["198.18.0.202", 6379, "AUTH remote-secret-pw\r\nSET pwned 1\r\n"],
               "page": ["198.18.0.202", 8000, "GET /index.html HTTP/1.0\r\n\r\n"]}
    got = _probe(targets, allow_private)
    # 198.18.0.0/15 is not a global address: only an intranet job reaches its page, none its Redis
    assert got["redis"] == "refused", got
    assert got["page"].startswith("OPEN HTTP/1.0 200" if allow_private else "refused"), got
    shell = run_shell("redis-cli -h 198.18.0.202 -a remote-secret-pw --no-auth-warning SET pwned 1 2>&1;"
                      "curl -sS -m 5 http://198.18.0.202:8000/index.html 2>&1; exit 0", "http://x/", LIMITS,
                      allow_private=allow_private).body.decode()
    assert "Connection refused" in shell and "OK" not in shell
    assert ("an ordinary page" in shell) == allow_private, shell
    assert remote_redis.get("pwned") is None and remote_redis.ping()  # the worker's own way in works


# --- processes and files -----------------------------------------------------------------------

def test_setsid_and_double_forked_children_end_with_their_task():
    before = boxed_processes()
    code = ("import os, time\n"
            "def download(task):\n"
            "    if os.fork() == 0:\n"
            "        os.setsid()\n"
            "        if os.fork() == 0:\n"
            "            time.sleep(600)\n"
            "        os._exit(0)\n"
            "    os.system('setsid sh -c \"sleep 600 &\" >/dev/null 2>&1;"
            " nohup sleep 600 >/dev/null 2>&1 &')\n"
            "    time.sleep(0.3)\n"
            "    return {'status_code': 200, 'body': 'done'}\n")
    assert run_python(code, {"url": "u"}, LIMITS).body == b"done"
    assert eventually_no_boxed_processes(before) == set()


@pytest.mark.parametrize("mode", ["python", "shell"])
def test_killing_the_sandbox_supervisor_takes_everything_with_it(mode):
    before = boxed_processes()
    call = {"python": lambda: run_python("import os, time\ndef download(task):\n"
                                         "    os.system('setsid sleep 600 &')\n    time.sleep(600)\n",
                                         {"url": "u"}, Limits(timeout=60)),
            "shell": lambda: run_shell("setsid sleep 600 & sleep 600", "u", Limits(timeout=60))}[mode]
    result: list = []
    runner = threading.Thread(target=lambda: result.append(_outcome(call)))
    runner.start()
    deadline = time.monotonic() + 20
    supervisor = None
    while supervisor is None and time.monotonic() < deadline:
        for pid in boxed_processes() - before:
            try:
                parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if b"sandbox_main.py" in cmdline and parent not in boxed_processes():
                supervisor = pid  # its parent is the box's init (root); its child is the downloader
        time.sleep(0.05)
    assert supervisor is not None
    while len(boxed_processes() - before) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(supervisor, signal.SIGKILL)
    runner.join(timeout=30)
    assert not runner.is_alive() and isinstance(result[0], DownloadError)
    assert "SIGKILL" in result[0].reason
    assert eventually_no_boxed_processes(before) == set()


def _outcome(call):
    try:
        return call()
    except DownloadError as exc:
        return exc


def test_temp_files_stay_in_the_box_and_go_with_it():
    name = f"dc-left-{uuid.uuid4().hex}"
    code = ("import os\n"
            "def download(task):\n"
            "    seen = []\n"
            f"    for d in ('/tmp', '/var/tmp', '/dev/shm'):\n"
            f"        seen += [n for n in os.listdir(d) if n.startswith('dc-left-')]\n"
            f"        open(os.path.join(d, '{name}'), 'w').write('x' * 1000)\n"
            "    try:\n"
            "        open('/dev/shm/big', 'wb').write(b'x' * (3 * 1024 * 1024))\n"
            "        big = 'written'\n"
            "    except OSError as exc:\n"
            "        big = type(exc).__name__\n"
            "    return {'status_code': 200, 'body': repr((seen, big))}\n")
    limits = Limits(timeout=30, maxsize=1024 * 1024, max_file_mb=2)
    first = run_python(code, {"url": "u"}, limits).body.decode()
    second = run_python(code, {"url": "u"}, limits).body.decode()
    assert first == second == "([], 'OSError')"  # the second box saw nothing of the first; /dev/shm is capped
    for where in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not os.path.exists(os.path.join(where, name))


def test_the_sentry_dsn_reaches_no_downloader(tmp_path):
    """With Sentry on and a transaction running (what makes sentry-sdk pass trace headers to
    every child it sees started), the downloader's environment holds no part of the DSN."""
    script = ("import json, sentry_sdk\n"
              "from common.sentry import init_sentry\n"
              "from slave.download.engines.base import Limits\n"
              "from slave.download.engines.sandbox import run_python\n"
              "init_sentry('https://publickey0123456789@127.0.0.1:9/1', traces_sample_rate=1.0)\n"
              "code = 'import json, os\\ndef download(task):\\n    return {\"status_code\": 200, "
              "\"body\": json.dumps(dict(os.environ))}\\n'\n"
              "with sentry_sdk.start_transaction(name='t'):\n"
              "    print(run_python(code, {'url': 'u'}, Limits(timeout=30)).body.decode())\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    env = json.loads(done.stdout.strip().splitlines()[-1])
    assert "publickey0123456789" not in json.dumps(env) and not any(k.startswith("SUBPROCESS_") for k in env)


# --- a planted pickle entry in Redis ------------------------------------------------------------

class _Mark:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def test_a_planted_pickle_entry_runs_nowhere(cluster, tmp_path):
    """Someone who could write Redis plants rq entries whose data and meta are pickles that
    leave a mark when loaded; worker, dispatcher, stats and /metrics all meet them."""
    from rq import Queue
    from rq.registry import FailedJobRegistry

    from master import tokens
    from tests.helpers import add_urls, register, statuses
    from tests.web_helpers import WebServer

    mark = tmp_path / "mark"
    register(tmp_path, "ok", priority=5)
    add_urls("ok", [f"{cluster.site}/page/{i}" for i in range(3)])
    for entry in ("dc-planted", "planted", "dcx-planted"):
        queue = "down_export" if entry.startswith("dcx") else "down_low"
        Queue(queue, connection=cluster.redis).enqueue_call(
            "os.system", args=(f"touch {mark}",), job_id=entry, meta={"m": _Mark(str(mark))}, at_front=True)
    env = {**os.environ, **cluster.env}
    for args in (["dispatch"], ["stats"], ["stats", "--json"], ["worker", "--burst"]):
        done = subprocess.run([str(BIN / "downcluster"), *args], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        assert not mark.exists(), args
    assert "refused an entry in down_low, not run" in done.stderr
    with WebServer(cluster.env) as web:
        assert web.call("GET", "/metrics", None).status_code == 200
        assert web.call("GET", "/api/v1/overview", tokens.create("ops", "admin")).status_code == 200
    assert not mark.exists()
    assert statuses("ok") == {"SUCCESS": 3}
    failed = FailedJobRegistry("down_low", connection=cluster.redis).get_job_ids()
    assert {"dc-planted", "planted"} <= set(failed)


def test_a_page_in_the_browser_engine_reaches_no_cluster_service(walled):
    """The browser engine runs as a sandbox uid too: a page's resources load from an ordinary
    site on this host but not from the web on WEB_BIND. (``download_js`` runs after the load,
    when the engine lets no request out at all.)"""
    from slave.download.engines import chromium

    if chromium.chromium_path() is None:
        pytest.skip("chromium is not installed (make test installs it as root)")
    from tests.e2e.test_browser_engine import _Loop

    cluster, web = walled
    site = _Web()
    site.page = (f'<html><body><img src="http://127.0.0.1:{web.port}/metrics">'
                 f'<img src="http://127.0.0.1:{site.port}/pixel">hostile page</body></html>')
    chrome = _Loop()
    try:
        got = chrome.fetch(f"http://127.0.0.1:{site.port}/page")
    finally:
        chrome.close()
        site.close()
    assert b"hostile page" in got.body
    assert {"/page", "/pixel"} <= set(site.paths) and web.hits == 0  # the pixel came; nothing reached the web


def test_a_python_job_that_asked_for_private_reach_without_a_grant_opens_no_loopback_socket(cluster,
                                                                                             tmp_path):
    """The attacker's way in before private reach was granted: a user's python job with
    ``allow_private`` set by that user opened raw TCP to the worker's loopback and read the
    answer. Stored so (no grant), its box runs as an ordinary uid; granted, the same code
    reaches the service."""
    from common.store.models import CrawlerDownloadData, CrawlerDownloadSetting, Job
    from master.dispatch.dispatcher import dispatch_once
    from tests.helpers import add_urls, burst_worker, register

    port = int(cluster.site.rsplit(":", 1)[1])  # a loopback service that is not the cluster's
    target = f'{{"site": ["127.0.0.1", {port}, "GET / HTTP/1.0\\r\\n\\r\\n"]}}'
    code = PROBE.replace('task["settings"]["targets"]', target)
    register(tmp_path, "probe", kind="python", code=code, max_retry_times=1)
    setting = CrawlerDownloadSetting.objects(job=Job.objects.get(name="probe"))
    outcomes = []
    for grant in (None, "admin"):
        setting.update_one(set__allow_private=True, set__private_grant=grant)
        CrawlerDownloadData.objects.delete()
        add_urls("probe", [f"http://public.example/{grant}"])
        assert dispatch_once(cluster.redis).total == 1
        burst_worker(cluster, "--no-exports")
        stored = CrawlerDownloadData.objects.get()
        outcomes.append(json.loads(bytes(stored.response_body))["site"])
    assert outcomes[0] == "refused" and outcomes[1].startswith("OPEN HTTP/")
    eventually_no_boxed_processes()
