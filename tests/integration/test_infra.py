"""The test infrastructure itself: the sample site, the real services and the ``cluster`` fixture."""
from __future__ import annotations

import http.client
import json
import socket
import time
import zlib
from urllib.parse import urlsplit

import pytest
from mongoengine.errors import NotUniqueError

from common.config import load, settings
from common.store.log_models import CrawlerDispatchAlertLog
from common.store.models import Job
from sample_site import INVALID_UTF8_BODY, PDF_BODY, SHIFT_JIS_BODY, bytes_body, page_body


def get(base: str, path: str, headers: dict | None = None, read: bool = True):
    """One GET with http.client (no redirects followed, no decoding); returns (response, body)."""
    conn = http.client.HTTPConnection(urlsplit(base).netloc, timeout=10)
    conn.request("GET", path, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read() if read else b""
    if read:
        conn.close()
    return resp, body


def test_page_and_bytes_are_byte_exact(site):
    resp, body = get(site, "/page/42")
    assert resp.status == 200 and body == page_body(42) and b"42" in body
    assert resp.getheader("Content-Type") == "text/html; charset=utf-8"
    assert 1500 < len(body) < 3000
    resp, body = get(site, "/bytes/100000")
    assert body == bytes_body(100000) and resp.getheader("Content-Length") == "100000"


@pytest.mark.parametrize("path, status, body, ctype", [
    ("/shift_jis", 200, SHIFT_JIS_BODY, "text/html; charset=shift_jis"),
    ("/invalid-utf8", 200, INVALID_UTF8_BODY, None),
    ("/pdf", 200, PDF_BODY, "application/pdf"),
    ("/status/418", 418, None, None),
    ("/redirect/0", 200, b"done", None),
    ("/nope", 404, None, None),
    ("/page/not-a-number", 404, None, None),
])
def test_simple_routes(site, path, status, body, ctype):
    resp, got = get(site, path)
    assert resp.status == status
    if body is not None:
        assert got == body
    if ctype is not None:
        assert resp.getheader("Content-Type") == ctype


def test_redirects_retry_after_flaky_and_headers(site):
    assert get(site, "/redirect/3")[0].getheader("Location") == "/redirect/2"
    assert get(site, "/redirect-loop")[0].getheader("Location") == "/redirect-loop"
    assert get(site, "/redirect-file")[0].getheader("Location") == "file:///etc/passwd"
    assert get(site, "/redirect-to?url=http://x.test/a")[0].getheader("Location") == "http://x.test/a"
    resp, _ = get(site, "/retry-after/7")
    assert resp.status == 503 and resp.getheader("Retry-After") == "7"
    key = f"infra-{time.monotonic_ns()}"
    assert [get(site, f"/flaky/{key}/2")[0].status for _ in range(3)] == [500, 500, 200]
    assert get(site, f"/flaky/{key}/2")[1] == f"ok {key}".encode()
    echoed = json.loads(get(site, "/headers", {"Cookie": "a=1", "X-Test": "yes"})[1])
    assert echoed["Cookie"] == "a=1" and echoed["X-Test"] == "yes"


def test_stream_is_chunked_and_a_client_may_leave_mid_stream(site):
    resp, body = get(site, "/stream/200000")
    assert resp.getheader("Transfer-Encoding") == "chunked" and resp.getheader("Content-Length") is None
    assert len(body) == 200000
    resp, _ = get(site, "/stream/2000000000", read=False)  # 2 GB, generated on the fly
    assert len(resp.read(1 << 20)) == 1 << 20
    resp.close()
    assert get(site, "/page/1")[1] == page_body(1)  # the site is still fine


def test_gzip_bomb_headers_and_prefix(site):
    t0 = time.monotonic()
    resp, body = get(site, "/gzip-bomb")
    assert time.monotonic() - t0 < 30  # built lazily, but in seconds (a loaded machine is slower)
    assert resp.getheader("Content-Encoding") == "gzip"
    assert int(resp.getheader("Content-Length")) == len(body) < 2 * 1024 * 1024
    first = zlib.decompressobj(31).decompress(body, 16 * 1024 * 1024)
    assert len(first) == 16 * 1024 * 1024 and not first.strip(b"\0")
    assert int.from_bytes(body[-4:], "little") == 1 << 30  # gzip ISIZE: the inflated length


def test_reset_closes_without_a_response(site):
    url = urlsplit(site)
    with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
        sock.sendall(b"GET /reset HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = sock.recv(1024)
        except ConnectionResetError:
            data = b""
    assert data == b""


def test_hang_sends_headers_then_nothing(site):
    conn = http.client.HTTPConnection(urlsplit(site).netloc, timeout=1)
    conn.request("GET", "/hang")
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(TimeoutError):
        resp.read()
    conn.close()


_written: list[str] = []


def test_isolation_write(cluster):
    """Writes to Redis and both databases; the next test must not see any of it."""
    cluster.redis.set("infra:leftover", "1")
    Job(name="infra-leftover").save()
    CrawlerDispatchAlertLog(reason="leftover", hostname="h").save()
    assert Job.objects.count() == 1 and CrawlerDispatchAlertLog.objects.count() == 1
    _written.append("done")


def test_isolation_clean_with_indexes(cluster):
    assert _written, "runs after test_isolation_write"
    assert cluster.redis.get("infra:leftover") is None and cluster.redis.dbsize() == 0
    assert Job.objects.count() == 0 and CrawlerDispatchAlertLog.objects.count() == 0
    Job(name="unique").save()
    with pytest.raises(NotUniqueError):  # indexes were re-created after the databases were dropped
        Job(name="unique").save()


def test_cluster_env_and_settings(cluster, monkeypatch):
    assert settings.HOSTNAME == "testhost"
    assert settings.REDIS_URL == cluster.redis_server.url == cluster.env["DOWNCLUSTER_REDIS_URL"]
    assert settings.MONGO_URI.endswith("/dc_test") and settings.MONGO_LOG_URI.endswith("/dc_test_log")
    assert cluster.redis.ping() and cluster.site.startswith("http://127.0.0.1:")
    monkeypatch.setenv("DOWNCLUSTER_Q_DOWN_LOW_LEN", "50")
    load()
    assert settings.Q_DOWN_LOW_LEN == 50 and isinstance(settings.Q_DOWN_LOW_LEN, int)


def test_settings_restored_after_a_test(cluster):
    assert settings.Q_DOWN_LOW_LEN == 1000


def test_redis_restart_keeps_the_port(cluster):
    url = cluster.redis_server.url
    cluster.redis.set("k", "v")
    cluster.redis_server.restart()
    assert cluster.redis_server.url == url
    assert cluster.redis.get("k") is None  # no persistence
