"""How the built-in engine names a failure without fetching anything: HTTP statuses and
Retry-After, exceptions (TLS, redirects, refused, DNS, timeouts), and the encoding of a body."""
from __future__ import annotations

import socket
import ssl
import time
from email.utils import formatdate

import requests

from slave.download.engines import http as engine


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
    assert engine.classify_status(200, None) is None and engine.classify_status(304, None) is None
    for code in (408, 429, 500, 502):
        assert engine.classify_status(code, None).retryable
    for code in (400, 403, 404, 410):
        assert not engine.classify_status(code, "5").retryable
    assert engine.classify_status(429, "99999").retry_after == 600
    assert engine.classify_status(503, "soon").retry_after is None
    assert engine.classify_status(503, "Wed, 21 Oct 2015 07:28:00 GMT").retry_after == 0
    future = engine.classify_status(503, formatdate(time.time() + 120, usegmt=True)).retry_after
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
