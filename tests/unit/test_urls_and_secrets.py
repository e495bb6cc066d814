"""URLs a task may hold, and secrets redacted from what is written or shown."""
from __future__ import annotations

import pytest

from common.errors import ValidationError
from common.secrets import redact, remember
from common.urls import check_url


@pytest.mark.parametrize("url", ["http://example.com/a;b", "https://例え.jp/パス", "http://h/$(x)`y`",
                                 "http://127.0.0.1:8080/-rf"])
def test_check_url_accepts(url):
    assert check_url(url) == url


@pytest.mark.parametrize(
    "url,why",
    [
        ("ftp://h/x", "scheme"),
        ("file:///etc/passwd", "scheme"),
        ("http://h/a\nb", "whitespace"),
        ("-rf", "scheme"),
        ("http:///x", "host"),
        ("http://h/" + "a" * 9000, "longer"),
        ("http://h:99999/", "malformed"),
    ],
)
def test_check_url_rejects(url, why):
    with pytest.raises(ValidationError, match=why):
        check_url(url)


def test_check_url_refuses_each_character_its_rule_names():
    """The ASCII URL's one search finds exactly the characters the per-character rule refuses
    (whitespace, controls, DEL), and non-ASCII whitespace is refused too."""
    for code in range(128):
        ch = chr(code)
        refused = ch.isspace() or code < 32 or code == 127
        url = f"http://h/a{ch}b"
        if refused:
            with pytest.raises(ValidationError, match="whitespace"):
                check_url(url)
        else:
            assert check_url(url) == url
    for ch in ("\u00a0", "\u2028", "\u3000", "\x85"):
        with pytest.raises(ValidationError, match="whitespace"):
            check_url(f"http://h/é{ch}")


def test_check_url_host_not_idna_encodable_every_time():
    for _ in range(2):  # the second answer comes from the per-host memory
        with pytest.raises(ValidationError, match="invalid host name"):
            check_url("http://" + "a" * 64 + ".example/")


def test_secrets_are_redacted():
    remember("s3cr3t-cookie")
    text = "fail via http://user:pw@proxy:3128 with Cookie: a=b and s3cr3t-cookie; Authorization: Bearer xyz"
    out = redact(text)
    assert "pw" not in out and "s3cr3t-cookie" not in out and "xyz" not in out and "a=b" not in out


def test_a_cookie_in_json_escaped_once_more_is_redacted_before_any_worker_remembered_it():
    # pymongo's command log at DEBUG writes a reply as JSON inside JSON: a job's settings read
    reply = r'{"reply": "{\"proxy\": \"http://a:p4ss@h:1\", \"cookie\": \"sid=never-remembered\", \"n\": 1}"}'
    out = redact(reply)
    assert "never-remembered" not in out and "p4ss" not in out and r'\"n\": 1' in out


def test_remembered_secrets_are_bounded_least_recently_remembered_first():
    from common import secrets

    remember("kept-secret")
    for i in range(secrets.MAX_KNOWN - 1):
        remember(f"filler-{i:05d}")
    remember("kept-secret")  # remembered again: the most recent
    remember("one-more-filler")
    assert len(secrets._known) == secrets.MAX_KNOWN
    assert "kept-secret" not in redact("x kept-secret y") and "filler-00000" in redact("filler-00000")
