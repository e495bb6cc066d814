"""Links found on a page: which tags, base href, schemes skipped, canonical as w3lib makes them,
and bounded on hostile pages (100,000 links, broken HTML, a page that parses slowly)."""
from __future__ import annotations

import pytest
from w3lib.url import canonicalize_url

from common.jobsettings import MAX_LINKS_PER_PAGE, MAX_URL_LENGTH, Follow
from slave.download import links
from slave.download.engines.base import Download
from slave.download.links import media_type, of_download, parse_html

PAGE = "https://example.com/dir/page.html"


def _urls(html: str, page: str = PAGE, cap: int = 1000) -> list[str]:
    return parse_html(html.encode(), page, "utf-8", cap).urls


def test_the_tags_that_name_pages_and_only_those():
    html = """<html><head>
      <link rel="stylesheet" href="/style.css"><link rel="next" href="/p2"><link rel="Canonical" href="/c">
      <link rel="icon alternate" href="/icon.png"></head><body>
      <a href="a.html">a</a><a name="no-href">x</a><area href="/map"><frame src="/f">
      <iframe src="/i"></iframe>
      <img src="/img.png"><script src="/s.js"></script><form action="/form"></form><a href="">empty</a>
      </body></html>"""
    assert _urls(html) == [f"https://example.com/{p}" for p in ("p2", "c", "dir/a.html", "map", "f", "i")]


def test_base_href_is_honoured_wherever_it_is_and_only_the_first():
    html = ('<a href="x">x</a><base href="https://other.org/b/"><base href="https://third.org/">'
            '<a href="../y">')
    assert _urls(html) == ["https://other.org/b/x", "https://other.org/y"]
    assert _urls('<base href="/root/"><a href="z">') == ["https://example.com/root/z"]


def test_fragments_dropped_duplicates_once_the_page_itself_left_out():
    html = '<a href="#top"><a href="page.html#a"><a href="/q#1">q</a><a href="/q#2"><a href="/q">'
    assert _urls(html) == ["https://example.com/q"]


@pytest.mark.parametrize("href", [
    "javascript:alert(1)", " JavaScript:void(0)", "mailto:a@b.c", "data:text/html,<a href=x>", "file:///etc/passwd",
    "ftp://example.com/f", "tel:+123", "http://", "http://[::1", "http://example.com:99999/",
])
def test_other_schemes_and_malformed_urls_are_skipped_and_counted(href):
    found = parse_html(f'<a href="{href}">x</a><a href="/ok">'.encode(), PAGE, "utf-8", 10)
    assert found.urls == ["https://example.com/ok"] and found.skipped == 1


def test_urls_are_canonical_as_w3lib_makes_them():
    hrefs = ["/a/../b?z=1&a=2", "HTTP://EXAMPLE.com/%7euser", "/ä ö?q=ü", "https://bücher.de/x?b&a=1"]
    found = _urls("".join(f'<a href="{h}">' for h in hrefs))
    from urllib.parse import urljoin
    assert found == [canonicalize_url(urljoin(PAGE, h)) for h in hrefs]
    assert found[0] == "https://example.com/b?a=2&z=1" and found[3].startswith("https://xn--bcher-kva.de/")


def test_entities_and_whitespace_in_hrefs():
    assert _urls('<a href="  /x?a=1&amp;b=2\n">') == ["https://example.com/x?a=1&b=2"]


def test_a_page_of_100000_links_takes_the_cap_and_counts_the_rest():
    html = "<html><body>" + "".join(f'<a href="/p/{i}">{i}</a>' for i in range(100_000))
    found = parse_html(html.encode(), PAGE, "utf-8", 500)
    assert found.urls == [f"https://example.com/p/{i}" for i in range(500)]
    assert found.excess == 99_500 and not found.truncated


def test_over_long_urls_are_skipped():
    long = "/" + "x" * MAX_URL_LENGTH
    huge = "/" + "y" * (10 * MAX_URL_LENGTH)
    found = parse_html(f'<a href="{long}"><a href="{huge}"><a href="/ok">'.encode(), PAGE, "utf-8", 10)
    assert found.urls == ["https://example.com/ok"] and found.skipped == 2


@pytest.mark.parametrize("body", [
    b"<a href=/x", b"<a href='/x'>" + b"<" * 10_000, b"<!-- <a href=/c>", b"<<<>>><a href=\"/q\"",
    b"\xff\xfe\x00<a\x00 href=/z>", b"</a></a><a href=/y><div><table><tr><a href=/y2>",
    b"<![CDATA[<a href=/x>",
    b"<a href=http://[>", b"<base href='http://[::1'><a href=/x>", b"<script><a href=/s></script><a href=/t>",
    bytes(range(256)) * 100, b"<!DOCTYPE html [<!ENTITY x 'y'>]><a href=/e>",
])
def test_broken_html_never_raises(body):
    found = parse_html(body, PAGE, "utf-8", 10)
    assert all(u.startswith(("http://", "https://")) for u in found.urls)


def test_script_contents_are_not_links():
    assert _urls("<script>var s = '<a href=/s>';</script><a href=/t>") == ["https://example.com/t"]


def test_a_page_that_parses_slowly_stops_at_its_cpu_budget(monkeypatch):
    monkeypatch.setattr(links, "PARSE_SECONDS", 0.05)
    body = b'<a href="/first">' + b"<" * 3_000_000 + b'<a href="/last">'
    found = parse_html(body, PAGE, "utf-8", 10)
    assert found.truncated and found.urls == ["https://example.com/first"]


def test_a_long_page_is_read_up_to_max_parse_bytes(monkeypatch):
    monkeypatch.setattr(links, "MAX_PARSE_BYTES", 1000)
    body = b'<a href="/early">' + b" " * 2000 + b'<a href="/late">'
    found = parse_html(body, PAGE, "utf-8", 10)
    assert found.urls == ["https://example.com/early"] and found.truncated


@pytest.mark.parametrize("encoding,body", [
    ("cp1252", '<a href="/caf\xe9">'.encode("cp1252")),
    ("utf-8", '<a href="/café">'.encode()),
    ("no-such-codec", '<a href="/café">'.encode()),
])
def test_the_page_encoding_is_used(encoding, body):
    assert parse_html(body, PAGE, encoding, 10).urls == ["https://example.com/caf%C3%A9"]


def _download(body=b'<a href="/x">', ctype="text/html; charset=utf-8", status=200, **kw):
    return Download(status_code=status, headers={"content-TYPE": ctype}, body=body, url=kw.pop("url", PAGE),
                    **kw)


def test_of_download_reads_the_job_content_types_of_a_success_only():
    follow = Follow()
    assert of_download(_download(), PAGE, follow).urls == ["https://example.com/x"]
    assert of_download(_download(ctype="application/xhtml+xml"), PAGE, follow).urls == ["https://example.com/x"]
    assert of_download(_download(ctype="text/plain"), PAGE, follow) is None
    assert of_download(_download(status=404), PAGE, follow) is None
    assert of_download(_download(), PAGE, Follow(content_types=("application/xhtml+xml",))) is None
    assert media_type({"Content-Type": " Text/HTML ; charset=x"}) == "text/html" and media_type({}) == ""


def test_links_resolve_against_where_the_page_was_redirected():
    got = of_download(_download(url="https://moved.example.com/new/"), PAGE, Follow())
    assert got.urls == ["https://moved.example.com/x"]


def test_a_python_downloaders_links_are_resolved_capped_and_its_drops_counted():
    returned = ["/rel", "https://a.org/x#f", "mailto:x@y", "https://a.org/x", *[f"/n{i}" for i in range(10)]]
    got = of_download(_download(body=b"<a href=/not-parsed>", links=returned, links_dropped=990), PAGE,
                      Follow(links_per_page=3), engine=False)
    assert got.urls == ["https://example.com/rel", "https://a.org/x", "https://example.com/n0"]
    assert got.skipped == 1 and got.excess == 990 + 9
    assert of_download(_download(body=b"<a href=/not-parsed>"), PAGE, Follow(), engine=False) is None


def test_the_sandbox_caps_a_downloaders_links_by_count_length_and_bytes():
    from slave.download.engines import sandbox_main as box

    assert (box.MAX_LINKS, box.MAX_LINK_LENGTH) == (MAX_LINKS_PER_PAGE, MAX_URL_LENGTH)  # stdlib-only copies
    kept, dropped = box._links(["https://a.org/%d" % i for i in range(1_000_000)])
    assert len(kept) == box.MAX_LINKS and dropped == 1_000_000 - box.MAX_LINKS
    kept, dropped = box._links(["https://a.org/" + "x" * 2000] * box.MAX_LINKS)  # ~2 KB each: bytes cap first
    assert len(kept) < box.MAX_LINKS and sum(len(u) + 4 for u in kept) <= box.MAX_LINK_BYTES
    assert dropped == box.MAX_LINKS - len(kept)
    assert box._links(["ok", 7, None, "y" * (box.MAX_LINK_LENGTH + 1)]) == (["ok"], 3)
    assert box._links(None) == ([], 0)
    with pytest.raises(box.DownloaderError, match="links must be a list"):
        box._links(x for x in "ab")
    header, _, _ = box.validate_result({"status_code": 200, "body": b"", "links": ["a"] * 3}, 10)
    assert header["links"] == ["a"] * 3 and header["links_dropped"] == 0
    assert "links" not in box.validate_result({"status_code": 200, "body": b""}, 10)[0]


@pytest.mark.parametrize("links,dropped,ok", [
    (None, 0, True), (["a"], 0, True), (["a"] * 10_001, 0, False), ([1], 0, False),
    (["x" * 2049], 0, False), (["a"], -1, False), (["a"], True, False), ("abc", 0, False),
])
def test_a_frame_the_downloader_wrote_itself_is_held_to_the_same_caps(links, dropped, ok):
    from slave.download.engines.sandbox import _is_links

    assert _is_links(links, dropped) is ok



def test_resolving_through_the_memos_is_resolving_each_string():
    """``resolve`` joins each distinct string once and canonicalises each joined URL once without its
    fragment: the same URLs, skips and excess as canonical(urljoin()) of every string in turn."""
    from urllib.parse import urljoin

    from common.errors import ValidationError
    from common.urls import canonical

    def reference(raw, base, cap):
        urls, skipped, seen = [], 0, {canonical(base, MAX_URL_LENGTH)}
        for at, value in enumerate(raw):
            if len(urls) >= cap:
                return urls, skipped, len(raw) - at
            try:
                url = canonical(urljoin(base, value.strip()), MAX_URL_LENGTH)
            except (ValidationError, ValueError):
                skipped += 1
                continue
            if url not in seen:
                seen.add(url)
                urls.append(url)
        return urls, skipped, 0

    near = MAX_URL_LENGTH - len("https://example.com/")
    tricky = ["#a", "#", "", "  /x#y ", "http://[::1#x", "javascript:a#b", "/a#b#c", "?q#z",
              "//other.org/p#q", "HTTP://EXAMPLE.com/%7euser#k", "/ä ö?q=ü#x", "mailto:a#b",
              "http://exa mple.com/#x",
              "/" + "x" * (near - 1), "/" + "x" * (near - 1) + "#over", "/" + "y" * (near - 5) + "#ok"]
    raw = [tricky[(i * 7) % len(tricky)] for i in range(200)]
    for cap in (100, 3):
        found = links.resolve(raw, PAGE, cap)
        assert (found.urls, found.skipped, found.excess) == reference(raw, PAGE, cap)


@pytest.mark.parametrize("body,last", [
    ("<div>" * 5000 + '<a href="/deep">', "/deep"),                          # no depth limit
    ("<table><tr><td>" * 2000 + '<a href="/t">', "/t"),
    ("<a " + " ".join(f'x{i}="{i}"' for i in range(20000)) + ' href="/m">', "/m"),
    ("x" * 3_000_000 + '<a href="/late">', "/late"),
    ('<svg><a href="/svg"></a></svg>', "/svg"),
])
def test_pathological_pages_still_give_their_links(body, last):
    assert _urls(body)[-1] == "https://example.com" + last


def test_raw_text_elements_hold_no_links_as_in_a_browser():
    """textarea, noframes (as script and style): their contents are text, as a browser reads them."""
    html = ('<textarea><a href="/ta"></textarea><frameset><frame src="/f"><noframes><a href="/nf"></noframes>'
            '<style>a{} <a href="/st"></style><a href="/after">')
    assert _urls(html) == ["https://example.com/f", "https://example.com/after"]
