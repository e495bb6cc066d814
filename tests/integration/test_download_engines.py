"""The three downloader engines against real local servers and real sandbox processes (no mocks):
the built-in requests engine (slave.download.engines.http) and the python/shell sandbox."""
from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tracemalloc
import zlib
from urllib.parse import quote

import pytest
import requests

from common.errors import DownloadError
from common.store.data import text_of
from sample_site import (
    CHARSET_ROUTES,
    CHARSET_TEXT,
    INVALID_UTF8_BODY,
    LATIN1_BODY,
    PDF_BODY,
    SHIFT_JIS_BODY,
    page_body,
)
from slave.download.engines import aio
from slave.download.engines import http as engine
from slave.download.engines.base import Limits
from slave.download.engines.sandbox import run_python, run_shell
from tests.boxes import boxed_processes, eventually_no_boxed_processes

MiB = 1024 * 1024


# --- a second local server for misbehaviour the sample site does not offer ---------------------

def _gzip_bomb_parts() -> tuple[bytes, bytes]:
    """A gzip stream start and a block that may be repeated: each block inflates to 1 MiB."""
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = comp.compress(b"\0" * MiB) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(b"\0" * MiB) + comp.flush(zlib.Z_FULL_FLUSH)
    return head, block


def _handle(conn: socket.socket, bomb: tuple[bytes, bytes]) -> None:
    try:
        conn.settimeout(30)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        request_line, _, rest = data.partition(b"\r\n")
        target = request_line.split()[1].decode()
        path = target.split("?")[0]
        if target.startswith("http://"):  # we were used as a forward proxy: echo what we got
            lines = rest.split(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
            seen = dict(line.split(": ", 1) for line in lines if line)
            body = json.dumps({"target": target, "headers": seen}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n%s" % (len(body), body))
        elif path == "/bomb":  # 1 GiB of zeros, about 1 MB on the wire
            head, block = bomb
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n\r\n" + head)
            for _ in range(1023):
                conn.sendall(block)
        elif path == "/huge-length":  # announces 10 GB, then sends nothing
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10000000000\r\n\r\n")
            time.sleep(30)
        elif path == "/header-trickle":  # slowloris on the status line and headers
            for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 1000:
                conn.sendall(bytes([byte]))
                time.sleep(0.2)
        elif path == "/redirect-with-endless-body":  # a redirect whose body never ends
            conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /done\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:
                conn.sendall(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
        elif path == "/done":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\ndone")
        else:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    except OSError:
        pass
    finally:
        conn.close()


@pytest.fixture(scope="module")
def trap():
    """Base URL of a raw-socket server with hostile routes (one thread per connection)."""
    bomb = _gzip_bomb_parts()
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_handle, args=(conn, bomb), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    listener.close()


@pytest.fixture(scope="module")
def session():
    s = engine.new_session()
    yield s
    s.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, session=None, **kwargs):
    """engine.fetch with the Limits fields among ``kwargs`` gathered into a Limits (the sample
    site is on loopback: allowed unless the test says otherwise)."""
    kwargs.setdefault("allow_private", True)
    limits = Limits(**{k: kwargs.pop(k) for k in ("timeout", "maxsize", "max_redirects") if k in kwargs})
    return engine.fetch(url, limits=limits, session=session, **kwargs)


class _AioEngine:
    """The aiohttp engine driven from synchronous tests: one event loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = aio.Client()

    def __call__(self, url: str, **kwargs):
        kwargs.setdefault("allow_private", True)
        limits = Limits(**{k: kwargs.pop(k) for k in ("timeout", "maxsize", "max_redirects") if k in kwargs})
        coro = aio.fetch(url, limits=limits, client=self.client, **kwargs)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(120)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture(scope="module")
def aio_engine():
    e = _AioEngine()
    yield e
    e.close()


@pytest.fixture(params=["requests", "aiohttp"])
def get(request, session, aio_engine):
    """The built-in engine under test: ``get(url, timeout=, maxsize=, max_redirects=, cookie=,
    headers=, proxy=)``; every limit test runs on both engines."""
    if request.param == "aiohttp":
        return aio_engine
    return lambda url, **kw: _get(url, session, **kw)


def _fail(fn, *args, **kwargs) -> tuple[DownloadError, float]:
    start = time.monotonic()
    with pytest.raises(DownloadError) as info:
        fn(*args, **kwargs)
    return info.value, time.monotonic() - start


# --- built-in engine: success and byte-exactness ------------------------------------------------

def test_page_is_byte_exact_with_metadata(site, get):
    got = get(f"{site}/page/7", timeout=10, cookie="sid=abc123",
                       headers={"X-Job": "news", "Authorization": "Bearer tok", "Accept-Language": "zh"})
    assert got.status_code == 200 and got.body == page_body(7)
    assert got.encoding == "utf-8" and got.remote_ip == "127.0.0.1"
    assert got.url == f"{site}/page/7" and got.headers["Content-Type"].startswith("text/html")
    # a job's own headers are secrets unless they are standard ones that carry none
    assert got.request_headers["User-Agent"] == "downcluster/1.0"
    assert got.request_headers["Accept-Language"] == "zh"
    assert got.request_headers["Cookie"] == "***" and got.request_headers["Authorization"] == "***"
    assert got.request_headers["X-Job"] == "***"


def test_fetch_without_a_session_and_binary_body(site):
    got = engine.fetch(f"{site}/bytes/300000", limits=Limits(timeout=10), allow_private=True)
    assert len(got.body) == 300000 and got.encoding is None


@pytest.mark.parametrize("path, body, encoding", [
    ("shift_jis", SHIFT_JIS_BODY, "cp932"),  # WHATWG's Shift_JIS is windows-31j
    ("invalid-utf8", INVALID_UTF8_BODY, "utf-8"),
    ("wrong-charset", LATIN1_BODY, "utf-8"),
    ("pdf", PDF_BODY, None),
])
def test_odd_encodings_are_stored_byte_exact(site, get, path, body, encoding):
    got = get(f"{site}/{path}", timeout=10)
    assert got.body == body and got.encoding == encoding


@pytest.mark.parametrize("name, encoding, text", [
    ("meta-utf-8", "utf-8", CHARSET_TEXT["utf-8"]),          # nginx: text/html without a charset
    ("meta-shift_jis", "cp932", CHARSET_TEXT["shift_jis"]),
    ("meta-windows-1251", "cp1251", CHARSET_TEXT["windows-1251"]),
    ("equiv-windows-1251", "cp1251", CHARSET_TEXT["windows-1251"]),
    ("bom", "utf-8", CHARSET_TEXT["utf-8"]),                 # the BOM wins over the header's iso-8859-1
    ("xml", "cp932", "日本語"),                                # the XML declaration
    ("css", "utf-8", "«Grüße»"),                              # detected
    ("css-charset", "cp1251", "Привет"),                      # @charset
    ("png", None, None),                                      # not text
])
def test_the_stored_encoding_is_what_a_browser_would_use(site, get, name, encoding, text):
    ctype, body = CHARSET_ROUTES[name]
    got = get(f"{site}/charset/{name}", timeout=10)
    assert got.body == body and got.encoding == encoding
    if text is not None:
        assert text in text_of(got.body, got.encoding)


def test_the_sandbox_engines_store_the_encoding_a_browser_would_use(site):
    code = ("import urllib.request\n"
            "def download(task):\n"
            "    with urllib.request.urlopen(task['url']) as r:\n"
            "        return {'status_code': r.status, 'headers': dict(r.headers), 'body': r.read()}\n")
    got = run_python(
        code,
        {
            "url": f"{site}/charset/meta-windows-1251",
            "task_id": "t",
            "job": "j",
            "attempt": 1,
            "settings": {"allow_private": True},
        },
        Limits(timeout=30),
    )
    assert got.encoding == "cp1251" and CHARSET_TEXT["windows-1251"] in text_of(got.body, got.encoding)
    shell = run_shell(
        'curl -s "$1"', f"{site}/charset/meta-shift_jis", Limits(timeout=30), allow_private=True
    )
    assert shell.encoding == "cp932", (
        shell.encoding
    )  # no headers from a shell downloader: the document decides


def test_sixteen_concurrent_fetches_share_one_session(site, session):
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda n: engine.fetch(f"{site}/page/{n}", limits=Limits(timeout=10),
                                                       session=session, allow_private=True), range(48)))
    assert [r.body for r in results] == [page_body(n) for n in range(48)]


# --- built-in engine: classification ------------------------------------------------------------

def test_404_is_not_retryable(site, get):
    err, _ = _fail(get, f"{site}/status/404", timeout=10)
    assert err.reason == "HTTP 404" and not err.retryable


def test_503_with_retry_after_is_retryable(site, get):
    err, _ = _fail(get, f"{site}/retry-after/120", timeout=10)
    assert err.reason == "HTTP 503" and err.retryable and err.retry_after == 120


def test_connection_reset_is_retryable(site, get):
    err, _ = _fail(get, f"{site}/reset", timeout=10)
    closed = "connection error: RemoteDisconnected: Remote end closed connection without response"
    assert err.retryable and err.reason in ("connection reset", closed)


def test_connection_refused_is_retryable(get):
    err, _ = _fail(get, f"http://127.0.0.1:{_free_port()}/", timeout=10)
    assert err.retryable and err.reason == "connection refused"


def test_tls_certificate_error_is_not_retryable(tmp_path, get):
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=localhost"],
                   check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            with context.wrap_socket(conn, server_side=True):
                pass
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        err, _ = _fail(get, f"https://localhost:{listener.getsockname()[1]}/", timeout=10)
    finally:
        listener.close()
    assert not err.retryable and err.reason.startswith("TLS certificate error")


@pytest.mark.parametrize("url", ["ftp://example.com/x", "file:///etc/passwd", "http://", "not a url"])
def test_invalid_urls_are_not_retryable(url, get):
    err, _ = _fail(get, url, timeout=10)
    assert not err.retryable and err.reason.startswith("invalid URL")


def test_header_injection_is_refused_without_echoing_the_value(site, get):
    err, _ = _fail(get, f"{site}/headers", timeout=10,
                   cookie="sid=s3cret\r\nX-Injected: 1")
    assert not err.retryable and err.reason.startswith("invalid request") and "s3cret" not in err.reason


# --- built-in engine: deadline and size -----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("where", ["body", "headers", "hang"])
def test_slow_servers_end_at_the_deadline(site, trap, get, where):
    url = {"body": f"{site}/slow", "headers": f"{trap}/header-trickle", "hang": f"{site}/hang"}[where]
    err, took = _fail(get, url, timeout=2)
    assert err.reason == "timeout after 2.0s" and err.retryable
    assert took < 12  # the 2 s deadline, with slack for a loaded machine; unbounded these take minutes


@pytest.mark.slow
def test_deadline_holds_with_a_plain_requests_session(site):
    with requests.Session() as plain:
        err, took = _fail(engine.fetch, f"{site}/slow", limits=Limits(timeout=2), session=plain,
                          allow_private=True)
    assert err.reason == "timeout after 2.0s" and took < 12  # the site trickles for 600 s


def test_gzip_bomb_stops_near_maxsize_with_bounded_memory(trap, get):
    tracemalloc.start()
    try:
        err, took = _fail(get, f"{trap}/bomb", timeout=10, maxsize=MiB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert err.reason == f"body larger than {MiB} bytes" and not err.retryable
    assert took < 8 and peak < 8 * MiB  # stopped at the size, well before the 10 s deadline


def test_content_length_too_big_fails_at_once(trap, get):
    err, took = _fail(get, f"{trap}/huge-length", timeout=20, maxsize=MiB)
    assert err.reason == f"body larger than {MiB} bytes" and not err.retryable
    assert took < 15  # at once: the trap sends no body for 30 s, the deadline is 20 s


def test_streamed_body_over_maxsize_fails(site, get):
    err, _ = _fail(get, f"{site}/stream/{3 * MiB}", timeout=10, maxsize=MiB)
    assert err.reason == f"body larger than {MiB} bytes"
    assert get(f"{site}/stream/{MiB}", timeout=10, maxsize=MiB).body == b"x" * MiB


# --- built-in engine: redirects ---------------------------------------------------------------------

def test_redirects_are_followed_up_to_the_limit(site, get):
    got = get(f"{site}/redirect/3", timeout=10, max_redirects=3)
    assert got.body == b"done" and got.url == f"{site}/redirect/0"
    err, _ = _fail(get, f"{site}/redirect/3", timeout=10, max_redirects=2)
    assert err.reason == "too many redirects (more than 2)" and not err.retryable


def test_redirect_loop_is_too_many_redirects(site, get):
    err, _ = _fail(get, f"{site}/redirect-loop", timeout=10)
    assert err.reason.startswith("too many redirects") and not err.retryable


def test_redirect_to_file_scheme_fails(site, get):
    err, _ = _fail(get, f"{site}/redirect-file", timeout=10)
    assert err.reason == "redirect to unsupported scheme 'file'" and not err.retryable


def test_redirect_body_is_not_read(trap, get):
    got = get(f"{trap}/redirect-with-endless-body", timeout=5, maxsize=MiB)
    assert got.body == b"done"


def test_cookie_and_authorization_stay_on_their_host(site, get):
    secret = {"cookie": "sid=s3cret-cookie", "headers": {"Authorization": "Bearer s3cret-token"}}
    same = get(f"{site}/redirect-to?url=/headers", timeout=10, **secret)
    seen = json.loads(same.body)
    assert seen["Cookie"] == "sid=s3cret-cookie" and seen["Authorization"] == "Bearer s3cret-token"
    other = site.replace("127.0.0.1", "localhost") + "/headers"
    cross = get(f"{site}/redirect-to?url={quote(other, safe='')}", timeout=10, **secret)
    seen = json.loads(cross.body)
    assert "Cookie" not in seen and "Authorization" not in seen and cross.url == other
    assert "Cookie" not in cross.request_headers


def test_proxy_is_used_and_its_credentials_never_leak(trap, get):
    proxy = trap.replace("http://", "http://user:pr0xy-pass@")
    got = get("http://example.invalid/path", timeout=10, proxy=proxy)
    seen = json.loads(got.body)
    assert seen["target"] == "http://example.invalid/path"
    assert seen["headers"]["Proxy-Authorization"].startswith("Basic")
    dead = f"http://user:pr0xy-pass@127.0.0.1:{_free_port()}"
    err, _ = _fail(get, "http://example.invalid/", timeout=10,
                   proxy=dead, cookie="sid=c00kie-value")
    assert err.retryable and "pr0xy-pass" not in err.reason and "c00kie" not in err.reason


# --- python sandbox ------------------------------------------------------------------------------------

PY_LIMITS = Limits(timeout=10, maxsize=MiB, memory_mb=1024, max_processes=16)


def test_python_success_is_byte_exact():
    code = (
        "def download(task):\n"
        "    body = b'\\x00\\xff\\r\\n' + bytes(range(256)) + task['url'].encode()\n"
        "    return {'status_code': 201,\n"
        "            'headers': {'Content-Type': 'text/plain; charset=latin-1', 'X-N': 3},\n"
        "            'body': body, 'remote_ip': '10.0.0.1', 'request_headers': {'A': 'b'},\n"
        "            'request_body': 'q=1'}\n"
    )
    task = {"url": "http://example.com/é", "task_id": "t1", "job": "j", "attempt": 1, "settings": {}}
    got = run_python(code, task, PY_LIMITS)
    assert got.body == b"\x00\xff\r\n" + bytes(range(256)) + "http://example.com/é".encode()
    assert got.status_code == 201
    assert got.headers == {"Content-Type": "text/plain; charset=latin-1", "X-N": "3"}
    assert got.url == task["url"] and got.remote_ip == "10.0.0.1" and got.request_body == b"q=1"
    assert (
        got.request_headers == {"A": "b"} and got.encoding == "cp1252"
    )  # WHATWG: the label latin-1 means windows-1252


def test_python_str_body_is_utf8_and_prints_do_not_corrupt_it():
    code = (
        "import os, subprocess, sys\n"
        "print('top-level noise')\n"
        "def download(task):\n"
        "    print('noise ' * 10000)\n"
        "    sys.stdout.write('more')\n"
        "    os.write(1, b'raw fd noise')\n"
        "    subprocess.run(['echo', 'child noise'])\n"
        "    return {'status_code': 200, 'headers': {}, 'body': 'héllo'}\n"
    )
    assert run_python(code, {"url": "u"}, PY_LIMITS).body == "héllo".encode()


def test_python_exception_is_a_retryable_failure():
    code = "def download(task):\n    raise ValueError('boom\\nsecond line')\n"
    err, _ = _fail(run_python, code, {}, PY_LIMITS)
    assert err.reason == "ValueError: boom second line" and err.retryable


@pytest.mark.parametrize("code, reason", [
    ("def download(task)\n    pass\n", "downloader error: SyntaxError: expected ':' (<downloader>, line 1)"),
    ("def fetch(task):\n    pass\n", "downloader error: no download(task) function"),
    ("import no_such_module_xyz\n",
     "downloader error: ModuleNotFoundError: No module named 'no_such_module_xyz'"),
    ("def download(task):\n    return [200]\n", "downloader error: download() must return a dict, got list"),
    ("def download(task):\n    return {'status_code': '200', 'headers': {}, 'body': b''}\n",
     "downloader error: status_code must be an int from 100 to 999, got '200'"),
    ("def download(task):\n    return {'status_code': 200, 'headers': [], 'body': b''}\n",
     "downloader error: headers must be a dict, got list"),
    ("def download(task):\n    return {'status_code': 200, 'headers': {}, 'body': 5}\n",
     "downloader error: body must be bytes or str, got int"),
    ("def download(task):\n    return {'status_code': 200, 'headers': {}}\n",
     "downloader error: result has no body"),
])
def test_unusable_downloaders_are_not_retryable(code, reason):
    err, _ = _fail(run_python, code, {"url": "u"}, PY_LIMITS)
    assert err.reason == reason and not err.retryable


def test_python_body_over_maxsize_fails():
    code = "def download(task):\n    return {'status_code': 200, 'headers': {}, 'body': b'x' * 2 ** 21}\n"
    err, _ = _fail(run_python, code, {}, PY_LIMITS)
    assert err.reason == f"body larger than {MiB} bytes" and not err.retryable


def test_python_memory_limit():
    err, took = _fail(run_python, "def download(task):\n    x = bytearray(4 * 1024 ** 3)\n", {},
                      Limits(timeout=10, memory_mb=512))
    assert err.reason == "MemoryError" and err.retryable and took < 8  # before the 10 s deadline


@pytest.mark.slow
def test_python_hang_times_out():
    code = "import time\ndef download(task):\n    time.sleep(1000)\n"
    err, took = _fail(run_python, code, {}, Limits(timeout=2))
    assert err.reason == "timed out after 2s" and err.retryable and took < 12  # not the 1000 s it sleeps


def test_python_environment_has_no_secrets(monkeypatch):
    monkeypatch.setenv("DOWNCLUSTER_REDIS_URL", "redis://:hunter2@10.0.0.5:6379/0")
    monkeypatch.setenv("DOWNCLUSTER_SENTRY_DSN", "https://key@sentry.example/1")
    code = ("import json, os\n"
            "def download(task):\n"
            "    return {'status_code': 200, 'headers': {}, 'body': json.dumps(dict(os.environ))}\n")
    env = json.loads(run_python(code, {}, PY_LIMITS).body)
    assert set(env) == {"PATH", "LANG", "HOME", "TMPDIR", "PYTHONDONTWRITEBYTECODE"}
    assert not any(k.startswith("DOWNCLUSTER") for k in env) and "hunter2" not in json.dumps(env)
    assert env["PATH"] == "/usr/bin:/bin" and env["HOME"] == env["TMPDIR"] == "/tmp"  # the box's own /tmp


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox changes uid only when the worker is root")
def test_python_downloader_reads_neither_the_workers_environment_nor_its_files(tmp_path, monkeypatch):
    monkeypatch.setenv("DOWNCLUSTER_MONGO_URI", "mongodb://admin:s3cret@db/x")
    secret = tmp_path / "deploy.env"
    secret.write_text("DOWNCLUSTER_SENTRY_DSN=https://key@sentry/1\n")
    secret.chmod(0o600)
    code = (
        "import os\n"
        "def probe(path):\n"
        "    try:\n"
        "        open(path, 'rb').read()\n"
        "        return 'read'\n"
        "    except OSError as exc:\n"
        "        return type(exc).__name__\n"
        "def download(task):\n"
        "    s = task['settings']\n"
        "    body = ' '.join([probe(f\"/proc/{s['pid']}/environ\"), probe(s['path']), str(os.getuid())])\n"
        "    return {'status_code': 200, 'headers': {}, 'body': body}\n"
    )
    got = run_python(code, {"settings": {"pid": os.getpid(), "path": str(secret)}}, PY_LIMITS).body.decode()
    env_probe, file_probe, uid = got.split()
    # the worker's /proc entry is not even visible (pid namespace), nor is the host's /tmp
    assert env_probe == file_probe == "FileNotFoundError" and int(uid) != 0


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["python", "shell"])
def test_a_hung_downloader_dies_with_its_worker(mode):
    """Kill the worker (here a process running the sandbox) and its hung downloader, with the
    children it started in new sessions, is gone within seconds."""
    call = (
        'run_python(\'import os, time\\ndef download(task):\\n    os.system("setsid sleep 120 &")\\n'
        "    time.sleep(120)\\n', {}, Limits(timeout=120))"
        if mode == "python"
        else "run_shell('setsid sleep 120 & sleep 120', 'http://x/', Limits(timeout=120))"
    )
    worker = subprocess.Popen([sys.executable, "-c",
                               "from slave.download.engines.sandbox import run_python, run_shell\n"
                               "from slave.download.engines.base import Limits\n" + call],
                              cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    try:
        deadline = time.monotonic() + 20
        while (
            len(boxed_processes(worker.pid)) < 3 and time.monotonic() < deadline
        ):  # supervisor, downloader, sleeps
            time.sleep(0.05)
        assert len(boxed_processes(worker.pid)) >= 3
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert eventually_no_boxed_processes(owner=worker.pid) == set(), "the downloader outlived its worker"
    finally:
        worker.kill()


# --- shell sandbox -----------------------------------------------------------------------------------------

SH_LIMITS = Limits(timeout=10, maxsize=MiB, max_processes=16)


def test_shell_success_is_byte_exact():
    got = run_shell("printf 'a\\000b\\377\\r\\n'; printf '%s' \"$1\"", "http://x/é", SH_LIMITS)
    assert got.status_code == 200 and got.headers == {}
    assert got.body == b"a\x00b\xff\r\n" + "http://x/é".encode()


def test_shell_failure_reason_is_the_stderr_tail():
    code = "echo first >&2; echo 'curl: (6) Could not resolve host' >&2; exit 3"
    err, _ = _fail(run_shell, code, "u", SH_LIMITS)
    assert err.reason == "exit status 3: curl: (6) Could not resolve host" and err.retryable


def test_shell_environment_has_no_secrets(monkeypatch):
    monkeypatch.setenv("DOWNCLUSTER_REDIS_URL", "redis://:hunter2@10.0.0.5:6379/0")
    got = run_shell("env", "http://x/", SH_LIMITS).body.decode()
    assert "DOWNCLUSTER" not in got and "hunter2" not in got and "DOWNLOAD_URL=http://x/" in got


def test_url_is_only_an_argument():
    url = "-n http://x/;touch /tmp/semi $(touch /tmp/dollar) `touch /tmp/tick`\ntouch /tmp/newline '\""
    got = run_shell('printf "%s|%s|" "$1" "$DOWNLOAD_URL"; ls -A /tmp', url, SH_LIMITS)
    assert (
        got.body == f"{url}|{url}|.downcluster\n".encode()
    )  # nothing ran: the box's /tmp holds only our script


@pytest.mark.slow
def test_shell_sleep_is_killed_with_its_grandchildren():
    before = boxed_processes()
    err, took = _fail(
        run_shell, "sh -c 'exec sleep 1000' & setsid sleep 1000 & sleep 1000", "u", Limits(timeout=2)
    )
    assert err.reason == "timed out after 2s" and err.retryable and took < 12  # not the 1000 s it sleeps
    assert eventually_no_boxed_processes(before) == set()


def test_background_child_does_not_delay_a_successful_script():
    before = boxed_processes()
    start = time.monotonic()
    code = "sleep 1000 >/dev/null 2>&1 & setsid sh -c 'sleep 1000 & sleep 1000' >/dev/null 2>&1 & printf done"
    assert run_shell(code, "u", Limits(timeout=30)).body == b"done"
    assert time.monotonic() - start < 25  # returned before the deadline: the children did not hold it
    assert eventually_no_boxed_processes(before) == set()


def test_gigabyte_of_output_is_cut_at_the_cap():
    err, took = _fail(run_shell, "head -c 1000000000 /dev/zero", "u", Limits(timeout=10, maxsize=MiB))
    assert err.reason == f"output larger than {MiB} bytes" and not err.retryable
    assert took < 8  # cut at the cap, well before the 10 s deadline


def test_cpu_limit_kills_a_busy_loop():
    err, took = _fail(run_shell, "while :; do :; done", "u", Limits(timeout=30, cpu_seconds=1))
    # one CPU second may take a few on a loaded machine: the reason, not the clock, says which limit
    assert err.reason == "killed by signal SIGXCPU (CPU limit)" and not err.retryable and took < 25


def test_classic_fork_bomb_is_rejected_quickly():
    err, took = _fail(run_shell, ":(){ :|:& };:", "u", Limits(timeout=30, max_processes=8))
    assert took < 25  # rejected by the process limit, not ended by the deadline


@pytest.mark.slow
def test_shell_fork_bomb_is_cleaned_up_by_the_deadline():
    before = boxed_processes()
    code = "b() { b | b & }; b; sleep 1000"
    err, took = _fail(run_shell, code, "u", Limits(timeout=2, max_processes=16))
    # killed at the deadline, or the shell itself stopped at the process limit first (a race)
    # (dash says "sh: 1: Cannot fork")
    assert err.reason == "timed out after 2s" or (err.reason.startswith("exit status 2: ")
                                                   and err.reason.endswith("Cannot fork"))
    assert took < 12  # the 2 s deadline, with slack for a loaded machine
    assert eventually_no_boxed_processes(before) == set()


@pytest.mark.slow
def test_python_fork_bomb_is_cleaned_up_by_the_deadline():
    before = boxed_processes()
    code = ("import os\n"
            "def download(task):\n"
            "    while True:\n"
            "        try:\n"
            "            os.fork()\n"
            "        except OSError:\n"
            "            pass\n")
    err, took = _fail(run_python, code, {}, Limits(timeout=2, max_processes=16))
    assert err.reason == "timed out after 2s"
    assert took < 12  # the 2 s deadline, with slack for a loaded machine
    assert eventually_no_boxed_processes(before) == set()


# --- SOCKS5 proxies (issue 13, item 11): a real SOCKS5 server on loopback -----------------------

class _Socks5:
    """A tiny SOCKS5 proxy (CONNECT, no-auth or username/password) that relays bytes and records
    who authenticated and where they went."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.users: list[str] = []
        self.targets: list[tuple[str, int]] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    @staticmethod
    def _recv(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def _handle(self, conn: socket.socket) -> None:
        try:
            _, n = self._recv(conn, 2)
            methods = self._recv(conn, n)
            if 2 in methods:
                conn.sendall(b"\x05\x02")
                _, ulen = self._recv(conn, 2)
                user = self._recv(conn, ulen).decode()
                plen = self._recv(conn, 1)[0]
                self._recv(conn, plen)
                self.users.append(user)
                conn.sendall(b"\x01\x00")
            else:
                conn.sendall(b"\x05\x00")
            _, cmd, _, atyp = self._recv(conn, 4)
            if atyp == 1:
                host = socket.inet_ntoa(self._recv(conn, 4))
            elif atyp == 3:
                host = self._recv(conn, self._recv(conn, 1)[0]).decode()
            else:
                host = socket.inet_ntop(socket.AF_INET6, self._recv(conn, 16))
            port = int.from_bytes(self._recv(conn, 2), "big")
            self.targets.append((host, port))
            upstream = socket.create_connection((host, port), timeout=10)
            conn.sendall(b"\x05\x00\x00\x01" + socket.inet_aton("127.0.0.1") + (0).to_bytes(2, "big"))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()
        except OSError:
            conn.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("scheme", ["socks5", "socks5h"])
def test_socks5_proxy_carries_the_download(site, get, scheme):
    proxy = _Socks5()
    try:
        got = get(f"{site}/page/3", timeout=10, proxy=f"{scheme}://sockuser:s0cks-pass@127.0.0.1:{proxy.port}")
        assert got.body == page_body(3) and proxy.users == ["sockuser"]
        assert proxy.targets and proxy.targets[0][1] == int(site.rsplit(":", 1)[1])
        dead = f"{scheme}://sockuser:s0cks-pass@127.0.0.1:{_free_port()}"
        err, _ = _fail(get, f"{site}/page/3", timeout=10, proxy=dead)
        assert err.retryable and "s0cks-pass" not in err.reason
    finally:
        proxy.close()
