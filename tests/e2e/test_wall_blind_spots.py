"""Issue 38: where the wall had blind spots. Each test is an attack the previous code let through.

Real processes and services throughout: the session's redis-server and SecantusDB, sites and a
forward proxy served by the test, headless Chromium in its box, a Redis listening on
world-writable unix sockets, a Redis master behind a Sentinel, a route for NAT64 addresses on a
dummy interface made (and removed) by the test.
"""
from __future__ import annotations

import http.server
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis as redis_lib

from common import netguard
from common.config import load
from common.errors import AddressRefused, DownloadError
from services import RedisServer, free_port
from slave.download.engines import chromium, wall
from slave.download.engines import http as requests_engine
from slave.download.engines.base import Limits
from slave.download.engines.sandbox import run_python
from tests.e2e.test_browser_engine import _Loop
from tests.integration.test_download_engines import _AioEngine

pytestmark = pytest.mark.skipif(wall.check() is not None, reason=f"no sandbox here: {wall.check()}")
needs_chromium = pytest.mark.skipif(chromium.chromium_path() is None, reason="chromium is not installed")

LIMITS = Limits(timeout=30, maxsize=1024 * 1024, max_processes=32)
COOKIE, API_KEY, BEARER = "sid=c00kie-s3cret", "k3y-s3cret", "Bearer t0ken-s3cret"
SECRETS = ("c00kie-s3cret", "k3y-s3cret", "t0ken-s3cret")


class Site:
    """A small site on ``host`` that records every request (path and headers): ``/page`` is
    ``self.page``; ``/go?to=URL`` redirects there; anything else is a short text."""

    def __init__(self, host: str = "127.0.0.1", page: str = "") -> None:
        self.seen: list[tuple[str, dict]] = []
        self.page = page
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                if self.path.startswith("/go?to="):
                    self.send_response(302)
                    self.send_header("Location", self.path.split("=", 1)[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = (outer.page if self.path.endswith("/page") else "ok").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html" if self.path.endswith("/page") else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.base = f"http://{host}:{self.server.server_address[1]}"
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def headers_of(self, path: str) -> list[dict]:
        return [h for p, h in list(self.seen) if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _carries_no_secret(headers: dict) -> bool:
    text = json.dumps(headers)
    return not any(s in text for s in SECRETS)


@pytest.fixture
def two_sites():
    own, other = Site("127.0.0.1"), Site("127.0.0.2")
    yield own, other
    own.close()
    other.close()


@pytest.fixture(scope="module")
def chrome():
    if chromium.chromium_path() is None:
        pytest.skip("chromium is not installed")
    c = _Loop()
    yield c
    c.close()


@pytest.fixture(scope="module")
def aio_get():
    e = _AioEngine()
    yield e
    e.close()


# --- 1. the job's cookie and headers go to the task's site alone ------------------------------

@needs_chromium
def test_a_third_party_resource_of_a_rendered_page_sees_no_cookie_or_header(cluster, two_sites, chrome):
    own, other = two_sites
    own.page = (f'<html><body><img src="{other.base}/pixel"><img src="/own-pixel">'
                f'<script src="{other.base}/script.js"></script>the page</body></html>')
    got = chrome.fetch(f"{own.base}/page", cookie=COOKIE,
                       headers={"X-Api-Key": API_KEY, "Authorization": BEARER})
    assert b"the page" in got.body
    (page,) = own.headers_of("/page")
    assert page["cookie"] == COOKIE and page["x-api-key"] == API_KEY and page["authorization"] == BEARER
    assert own.headers_of("/own-pixel")[0].get("x-api-key") == API_KEY  # the site's own resources: yes
    assert own.headers_of("/own-pixel")[0].get("cookie") == COOKIE
    third = other.headers_of("/pixel") + other.headers_of("/script.js")
    assert len(third) == 2 and all(_carries_no_secret(h) for h in third), third
    assert got.request_headers["X-Api-Key"] == "***" and got.request_headers["Cookie"] == "***"


@pytest.mark.parametrize("engine", ["aiohttp", "requests", "browser"])
def test_a_cross_site_redirect_carries_no_cookie_or_custom_header(cluster, two_sites, engine, request):
    own, other = two_sites
    if engine == "browser" and chromium.chromium_path() is None:
        pytest.skip("chromium is not installed")
    kw = dict(cookie=COOKIE, headers={"X-Api-Key": API_KEY, "Authorization": BEARER}, allow_private=True)
    url = f"{own.base}/go?to={other.base}/landed"
    if engine == "aiohttp":
        request.getfixturevalue("aio_get")(url, timeout=20, **kw)
    elif engine == "requests":
        requests_engine.fetch(url, limits=Limits(timeout=20), **kw)
    else:
        request.getfixturevalue("chrome").fetch(url, **kw)
    assert own.headers_of(f"/go?to={other.base}/landed")[0]["x-api-key"] == API_KEY
    (landed,) = other.headers_of("/landed")
    assert _carries_no_secret(landed), landed


# --- 2. no DevTools endpoint to find ----------------------------------------------------------

SCAN = '''
import socket, urllib.request
def download(task):
    found, tried = [], []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or int(f[7]) < 1500000000:   # listening, and a sandbox uid's
                continue
            port = int(f[1].rsplit(":", 1)[1], 16)
            tried.append(port)
            for host in ("127.0.0.1", "[::1]"):
                try:
                    body = urllib.request.urlopen(f"http://{host}:{port}/json/version", timeout=3).read()
                    if b"webSocketDebuggerUrl" in body:
                        found.append(port)
                except Exception:
                    pass
    return {"status_code": 200, "body": __import__("json").dumps({"found": found, "tried": tried})}
'''


def _listening_uids() -> set[int]:
    uids = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":
                uids.add(int(fields[7]))
    return uids


@needs_chromium
def test_an_allow_private_downloader_finds_no_devtools_endpoint_of_a_running_browser(cluster, chrome):
    site = Site()
    site.page = "<html><body>open page</body></html>"
    try:
        assert b"open page" in chrome.fetch(f"{site.base}/page", allow_private=True).body  # a browser runs
        first = wall.block_of(os.getpid())  # this worker's uids: its sandboxes' and browsers'
        assert not set(range(first, first + wall.BLOCK)) & _listening_uids()  # they listen on nothing
        task = {"url": "http://x/", "settings": {"allow_private": True}}
        scan = json.loads(run_python(SCAN, task, LIMITS).body)
        assert scan["found"] == [], scan
    finally:
        site.close()


# --- 3. a page's WebSocket and fetch meet the wall of its job ---------------------------------

class ForwardProxy(Site):
    """A forward proxy that answers every absolute-URI GET itself with ``page``: stands in for
    the public internet, so a page can be loaded by a job without ``allow_private``."""


@needs_chromium
def test_a_page_of_an_ordinary_job_reaches_no_loopback_service_by_websocket_or_fetch(cluster, chrome,
                                                                                    monkeypatch):
    service = Site()  # an intranet service on this host (not one of the cluster's)
    proxy = ForwardProxy()
    at = f"127.0.0.1:{service.port}"
    js = (f"const ws = await new Promise(r => {{ try {{ const s = new WebSocket('ws://{at}/ws');"
          " s.onopen = () => r('open'); s.onerror = () => r('error'); } catch (e) { r('threw'); }"
          " setTimeout(() => r('timeout'), 5000); });"
          f" let f; try {{ await fetch('http://{at}/fetch', {{mode: 'no-cors'}}); f = 'reached'; }}"
          " catch (e) { f = 'blocked'; } return ws + ' ' + f;")
    proxy.page = "<html><body>a public page</body></html>"
    monkeypatch.setenv("DOWNCLUSTER_SANDBOX_ALLOW", f"127.0.0.1:{proxy.port}")  # the job's proxy
    load()
    try:
        got = chrome.fetch("http://public.example/page", allow_private=False,
                           proxy=f"http://127.0.0.1:{proxy.port}", js=js)
        assert proxy.seen and got.body in (b"error blocked", b"threw blocked"), got.body
        assert service.seen == []  # nothing reached the service: not the WebSocket, not the fetch
    finally:
        service.close()
        proxy.close()


# --- 4. unix sockets ----------------------------------------------------------------------

UNIX_PROBE = '''
import socket
def download(task):
    out = {}
    for name, address in task["settings"]["targets"].items():
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(3)
            s.connect(address.encode("latin-1") if address.startswith("\\0") else address)
            s.sendall(b"*3\\r\\n$3\\r\\nSET\\r\\n$5\\r\\npwned\\r\\n$1\\r\\n1\\r\\n")
            out[name] = "OPEN " + s.recv(100).decode("latin-1")
        except OSError as exc:
            out[name] = type(exc).__name__ + " " + str(exc.errno)
    return {"status_code": 200, "body": __import__("json").dumps(out)}
'''


@pytest.fixture
def unix_redis():
    """A Redis with no password listening only on world-writable unix sockets: one under /run,
    one elsewhere on the host's file system; and an abstract socket of the host."""
    tag = uuid.uuid4().hex[:10]
    dirs = [Path(f"/run/dctest-{tag}"), Path(f"/var/lib/dctest-{tag}")]
    servers = []
    try:
        for d in dirs:
            d.mkdir(mode=0o755)
            d.chmod(0o755)
            conf = d / "redis.conf"
            conf.write_text(f'port 0\nunixsocket {d}/redis.sock\nunixsocketperm 777\nsave ""\n'
                            f"appendonly no\ndir {d}\n")
            servers.append(subprocess.Popen(["redis-server", str(conf)], stdout=subprocess.DEVNULL,
                                            start_new_session=True))
        abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        abstract.bind(f"\0dctest-{tag}")
        abstract.listen(8)
        clients = []
        for d in dirs:
            client = redis_lib.Redis(unix_socket_path=str(d / "redis.sock"))
            end = time.monotonic() + 20
            while True:
                try:
                    client.ping()
                    break
                except redis_lib.ConnectionError:
                    assert time.monotonic() < end, "redis on a unix socket did not start"
                    time.sleep(0.05)
            clients.append(client)
        targets = {"run": f"{dirs[0]}/redis.sock", "var_lib": f"{dirs[1]}/redis.sock",
                   "abstract": f"\0dctest-{tag}"}
        yield targets, clients, abstract
        abstract.close()
    finally:
        for proc in servers:
            proc.kill()
            proc.wait()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("allow_private", [False, True])
def test_no_downloader_reaches_a_unix_socket_of_the_host(cluster, unix_redis, allow_private):
    targets, clients, abstract = unix_redis
    abstract.setblocking(False)
    task = {"url": "http://x/", "settings": {"targets": targets, "allow_private": allow_private}}
    got = json.loads(run_python(UNIX_PROBE, task, LIMITS).body)
    assert set(got) == set(targets) and not any(v.startswith("OPEN") for v in got.values()), got
    assert all(c.get("pwned") is None for c in clients)
    with pytest.raises(BlockingIOError):
        abstract.accept()  # nobody knocked
    from slave.download.engines.sandbox import run_shell

    shell = run_shell(f"redis-cli -s {targets['var_lib']} ping 2>&1; true", "http://x/", LIMITS)
    assert b"PONG" not in shell.body and b"Address family not supported" in shell.body
    assert run_shell("ls -A /run", "http://x/", LIMITS).body == b""  # the host's /run is not in the box


# --- 5. the master behind a Sentinel --------------------------------------------------------

@pytest.mark.skipif(shutil.which("redis-sentinel") is None, reason="redis-sentinel not installed")
def test_the_redis_master_behind_a_sentinel_is_walled_at_its_own_address(cluster, tmp_path, monkeypatch):
    password = secrets.token_urlsafe(18)
    master = RedisServer(password=password)
    master.start()
    sentinel_port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"port {sentinel_port}\nbind 127.0.0.1\ndir {tmp_path}\nrequirepass {password}\n"
                    f"sentinel monitor dcwall 127.0.0.1 {master.port} 1\n"
                    f"sentinel auth-pass dcwall {password}\n")
    conf.chmod(0o600)
    proc = subprocess.Popen(["redis-sentinel", str(conf)], stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        ask = redis_lib.Redis(port=sentinel_port, password=password, socket_timeout=1)
        end = time.monotonic() + 20
        while True:
            try:
                ask.ping()
                break
            except redis_lib.ConnectionError:
                assert time.monotonic() < end, "the Sentinel did not start"
                time.sleep(0.05)
        monkeypatch.setenv("DOWNCLUSTER_REDIS_URL", f"redis+sentinel://:{password}@127.0.0.1:{sentinel_port}/dcwall/0")
        load()
        assert (netguard.LOCAL, master.port) in netguard.cluster_endpoints()
        with pytest.raises(AddressRefused, match="is a service of this cluster"):
            netguard.judge("127.0.0.1", master.port, allow_private=True)
        task = {"url": "http://x/", "settings": {"allow_private": True, "targets": {
            "master": ["127.0.0.1", master.port, "*1\r\n$4\r\nPING\r\n"]}}}
        from tests.e2e.test_sandbox_walls import PROBE

        got = json.loads(run_python(PROBE, task, LIMITS).body)
        assert got == {"master": "refused"}
    finally:
        proc.kill()
        proc.wait()
        master.stop()


# --- 6. IPv4 inside IPv6, and proxies in any numeric form -----------------------------------

@pytest.mark.parametrize("address", ["64:ff9b::7f00:1", "64:ff9b:1:7f00:0:100::", "2002:7f00:1::1",
                                     "::7f00:1", "2001:0:4136:e378:8000:63bf:80ff:fffe"])
def test_an_ipv4_carrying_ipv6_url_is_judged_by_its_ipv4_address(cluster, aio_get, address):
    with pytest.raises(DownloadError, match=r"127\.0\.0\.1 is a loopback address"):
        aio_get(f"http://[{address}]:9/", timeout=5, allow_private=False)
    with pytest.raises(DownloadError, match=r"127\.0\.0\.1 is a loopback address"):
        requests_engine.fetch(f"http://[{address}]:9/", limits=Limits(timeout=5))
    redis_port = cluster.redis_server.port
    with pytest.raises(DownloadError, match="is a service of this cluster"):
        aio_get(f"http://[{address}]:{redis_port}/", timeout=5, allow_private=True)


@pytest.fixture
def nat64_route():
    """A route for the NAT64 and 6to4 prefixes into a veth pair that leads nowhere (its far end
    forwards nothing): on such a network a connection to them would leave the host."""
    name = f"dc64{uuid.uuid4().hex[:6]}"
    ip = ["ip"]
    subprocess.run(ip + ["link", "add", name, "type", "veth", "peer", "name", name + "p"], check=True)
    try:
        for end in (name, name + "p"):
            subprocess.run(ip + ["link", "set", end, "up"], check=True)
        subprocess.run(ip + ["-6", "addr", "add", "fd00:dc64::1/64", "dev", name, "nodad"], check=True)
        for prefix in ("64:ff9b::/96", "2002::/16"):
            subprocess.run(ip + ["-6", "route", "add", prefix, "dev", name], check=True)
        yield
    finally:
        subprocess.run(ip + ["link", "del", name], check=False)


def test_the_wall_refuses_ipv4_carried_in_ipv6(cluster, nat64_route):
    redis_port = cluster.redis_server.port
    from tests.e2e.test_sandbox_walls import PROBE

    def probe(targets, allow_private):
        task = {"url": "http://x/", "settings": {"targets": targets, "allow_private": allow_private}}
        return json.loads(run_python(PROBE.replace("timeout=5", "timeout=3"), task, LIMITS).body)

    ordinary = probe({"loopback": ["64:ff9b::7f00:1", 80, "x"], "private": ["64:ff9b::a00:1", 80, "x"],
                      "metadata": ["2002:a9fe:a9fe::1", 80, "x"]}, allow_private=False)
    assert ordinary == {"loopback": "refused", "private": "refused", "metadata": "refused"}
    private = probe({"redis": ["64:ff9b::7f00:1", redis_port, "x"]}, allow_private=True)
    assert private == {"redis": "refused"}
    # a global IPv4 address inside NAT64 is not refused: the SYN leaves (and goes nowhere here)
    assert probe({"public": ["64:ff9b::808:808", 80, "x"]}, allow_private=False) == {"public": "TimeoutError"}


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "[::ffff:127.0.0.1]"])
def test_a_proxy_at_a_cluster_service_is_refused_in_any_numeric_form(cluster, aio_get, host):
    proxy = f"socks5://{host}:{cluster.redis_server.port}"
    with pytest.raises(AddressRefused, match="is a service of this cluster"):
        netguard.judge_proxy(proxy, allow_private=True)
    with pytest.raises(DownloadError, match="is a service of this cluster"):
        aio_get("http://example.com/", timeout=5, proxy=proxy)


# --- 7. a service whose name moves -----------------------------------------------------------

@pytest.fixture
def hosts_entry():
    """A name of our own in /etc/hosts (restored afterwards): ``move(address)`` repoints it."""
    path, name = Path("/etc/hosts"), f"dc-moving-{uuid.uuid4().hex[:8]}.test"
    original = path.read_text()

    def move(address: str) -> None:
        path.write_text(original.rstrip("\n") + f"\n{address} {name}\n")

    try:
        yield name, move
    finally:
        path.write_text(original)


def test_a_service_whose_dns_moves_is_walled_at_its_new_address(cluster, hosts_entry, monkeypatch):
    name, move = hosts_entry
    move("198.18.0.5")
    monkeypatch.setenv("DOWNCLUSTER_PUBLIC_URL", f"https://{name}:8443")
    monkeypatch.setenv("DOWNCLUSTER_SERVICES_REFRESH", "0.2")
    load()
    wall.ensure()
    table = subprocess.run(["nft", "list", "table", "inet", f"{wall.TABLE_PREFIX}{os.getpid()}"],
                           capture_output=True, text=True, check=True).stdout
    assert "198.18.0.5 . 8443" in table
    move("198.18.0.6")  # a managed failover: the name now leads elsewhere
    end = time.monotonic() + 20
    while not any(str(a) == "198.18.0.6" for a, _ in netguard.cluster_endpoints()):
        assert time.monotonic() < end, "the new address was not seen"
        time.sleep(0.05)
    with pytest.raises(AddressRefused, match="is a service of this cluster"):
        netguard.judge("198.18.0.6", 8443, allow_private=True)
    wall.ensure()  # what every download does first: the table follows
    table = subprocess.run(["nft", "list", "table", "inet", f"{wall.TABLE_PREFIX}{os.getpid()}"],
                           capture_output=True, text=True, check=True).stdout
    assert "198.18.0.6 . 8443" in table
