"""How the built-in engines name a failure without fetching anything: HTTP statuses and
Retry-After, exceptions (TLS, redirects, refused, DNS, timeouts), the encoding of a body, and
the redirect path and body limit both engines share."""
from __future__ import annotations

import socket
import ssl
import time
from email.utils import formatdate

import pytest
import requests
from requests.structures import CaseInsensitiveDict

from common.errors import AddressRefused, DownloadError
from slave.download.engines import http as engine
from slave.download.engines import rules


def test_encoding_unit_cases():
    from slave.download.engines.charset import body_encoding

    assert body_encoding({"Content-Type": "text/html"}, b"<p>plain ascii</p>") == "utf-8"
    assert (
        body_encoding({"content-type": "text/plain; charset=UTF-16"}, "hi".encode("utf-16-be")) == "utf-16-be"
    )
    assert body_encoding({"Content-Type": "application/octet-stream"}, bytes(range(256))) is None
    assert body_encoding({}, b"\xff\xfeh\x00i\x00") == "utf-16-le"
    assert body_encoding({"Content-Type": "application/json"}, '{"a": "é"}'.encode()) == "utf-8"


def test_classify_status():
    assert rules.classify_status(200, None) is None and rules.classify_status(304, None) is None
    for code in (408, 429, 500, 502):
        assert rules.classify_status(code, None).retryable
    for code in (400, 403, 404, 410):
        assert not rules.classify_status(code, "5").retryable
    assert rules.classify_status(429, "99999").retry_after == 600
    assert rules.classify_status(503, "soon").retry_after is None
    assert rules.classify_status(503, "Wed, 21 Oct 2015 07:28:00 GMT").retry_after == 0
    future = rules.classify_status(503, formatdate(time.time() + 120, usegmt=True)).retry_after
    assert 60 < future <= 120  # counted from now, with slack for a loaded machine


def test_classify_exception():
    cert = ssl.SSLCertVerificationError(1, "certificate verify failed")
    cert.verify_message = "self-signed certificate"
    tls = engine.classify_exception(requests.exceptions.SSLError(cert))
    assert not tls.retryable and tls.reason == "TLS certificate error: self-signed certificate"
    assert not engine.classify_exception(requests.exceptions.TooManyRedirects("x")).retryable
    assert not engine.classify_exception(requests.exceptions.InvalidURL("bad")).retryable
    assert not engine.classify_exception(requests.exceptions.InvalidSchema("ftp")).retryable
    refused = engine.classify_exception(requests.exceptions.ConnectionError(ConnectionRefusedError(111, "x")))
    assert refused.retryable and refused.reason == "connection refused"
    dns = engine.classify_exception(requests.exceptions.ConnectionError(socket.gaierror(-2, "Name unknown")))
    assert dns.retryable and dns.reason.startswith("DNS lookup failed")
    assert engine.classify_exception(requests.exceptions.ReadTimeout("x")).retryable
    assert "\n" not in engine.classify_exception(RuntimeError("a\nb")).reason


def test_the_redirect_path_checks_every_hop():
    sent = CaseInsensitiveDict({"Cookie": "c=1", "X-Api-Key": "k", "Accept": "*/*"})
    path = rules.Redirects("http://example.com/a", sent, 2, allow_private=False)
    assert path.url() == "http://example.com/a"
    assert rules.Redirects.location(302, {"Location": "/b"}) == "/b"
    assert rules.Redirects.location(200, {"Location": "/b"}) is None
    path.follow("/b")  # same site: the credentials stay
    assert path.url() == "http://example.com/b" and sent["Cookie"] == "c=1"
    path.follow("https://other.example/c")  # another site: they are dropped
    assert path.url() == "https://other.example/c" and set(sent) == {"Accept"}
    with pytest.raises(DownloadError, match="too many redirects"):
        path.follow("/d")
    with pytest.raises(DownloadError, match="unsupported scheme 'file'"):
        rules.Redirects("http://example.com/", {}, 5, False).follow("file:///etc/passwd")
    with pytest.raises(DownloadError, match="invalid URL"):
        rules.Redirects("ftp://example.com/", {}, 5, False)
    to_loopback = rules.Redirects("http://example.com/", {}, 5, False)
    to_loopback.follow("http://127.0.0.1/")
    with pytest.raises(AddressRefused):  # judged before a byte of its request goes out
        to_loopback.url()


def test_the_body_limit_counts_declared_and_streamed_bytes():
    with pytest.raises(DownloadError, match="body larger than 4 bytes"):
        rules.Body(4, {"Content-Length": "5"})
    body = rules.Body(4, {})
    body.add(b"ab")
    body.add(b"cd")
    assert body.take() == b"abcd"
    with pytest.raises(DownloadError, match="body larger than 4 bytes"):
        body.add(b"e")
