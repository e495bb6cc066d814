"""Sitemaps: urlsets, indexes, gzip, lastmod, robots.txt's Sitemap: lines; bounded against bombs,
entities, oversized and malformed files, each refused with one line."""
from __future__ import annotations

import gzip
import zlib
from datetime import datetime, timezone

import pytest

from slave.download import sitemaps
from slave.download.sitemaps import SitemapError, lastmod, parse, robots_sitemaps

SITEMAP = "https://example.com/sitemap.xml"
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def urlset(*entries: str, ns: str = NS) -> bytes:
    return f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset {ns}>{"".join(entries)}</urlset>'.encode()


def url(loc: str, mod: str = "") -> str:
    return f"<url><loc>{loc}</loc>{f'<lastmod>{mod}</lastmod>' if mod else ''}<priority>0.5</priority></url>"


def test_a_urlset_with_lastmod():
    got = parse(urlset(url("https://example.com/b?z=1&amp;a=2#f", "2024-05-17T10:00:00+02:00"),
                       url(" /rel ", "2024"), url("https://example.com/c", "not a date")), SITEMAP)
    assert got.root == "urlset" and got.excess == 0 and got.skipped == 0
    assert [(e.url, e.lastmod) for e in got.entries] == [
        ("https://example.com/b?a=2&z=1", datetime(2024, 5, 17, 8, tzinfo=timezone.utc)),
        ("https://example.com/rel", datetime(2024, 1, 1, tzinfo=timezone.utc)),
        ("https://example.com/c", None)]


def test_an_index_names_more_sitemaps():
    body = (f'<sitemapindex {NS}><sitemap><loc>https://example.com/s1.xml.gz</loc>'
            '<lastmod>2024-05</lastmod></sitemap><sitemap><loc>https://example.com/s2.xml</loc></sitemap>'
            '</sitemapindex>').encode()
    got = parse(body, SITEMAP)
    assert got.root == "sitemapindex" and [e.url for e in got.entries] == [
        "https://example.com/s1.xml.gz", "https://example.com/s2.xml"]
    assert got.entries[0].lastmod == datetime(2024, 5, 1, tzinfo=timezone.utc)
    assert parse(body, SITEMAP, depth=sitemaps.MAX_INDEX_DEPTH - 1).root == "sitemapindex"
    with pytest.raises(SitemapError, match="nested more than"):
        parse(body, SITEMAP, depth=sitemaps.MAX_INDEX_DEPTH)
    assert parse(urlset(url("https://example.com/p")), SITEMAP, depth=9).entries  # a urlset at any depth


def test_without_a_namespace_and_with_other_elements():
    body = urlset("<url><loc>https://example.com/p</loc><image:image xmlns:image='x'>"
                  "<image:loc>https://example.com/img</image:loc></image:image>"
                  "<image:loc xmlns:image='x'>https://example.com/img2</image:loc></url>"
                  "<other><loc>https://example.com/no</loc></other>", ns="")
    assert [e.url for e in parse(body, SITEMAP).entries] == ["https://example.com/p"]
    other = urlset(url("https://example.com/p"), ns='xmlns="http://example.com/not-sitemaps"')
    with pytest.raises(SitemapError, match="root element <urlset>"):
        parse(other, SITEMAP)


def test_gzip_once_or_twice():
    body = urlset(url("https://example.com/p"))
    assert parse(gzip.compress(body), SITEMAP).entries[0].url == "https://example.com/p"
    assert parse(gzip.compress(gzip.compress(body)), SITEMAP).entries[0].url == "https://example.com/p"


@pytest.mark.parametrize("loc", ["javascript:alert(1)", "mailto:a@b", "ftp://example.com/x", "http://[::1",
                                 "https://example.com/" + "x" * 5000, ""])
def test_locs_we_do_not_fetch_are_skipped(loc):
    got = parse(urlset(url(loc), url("https://example.com/ok")), SITEMAP)
    assert [e.url for e in got.entries] == ["https://example.com/ok"] and got.skipped == 1


def test_entries_past_50000_are_counted_not_kept():
    body = urlset(*(f"<url><loc>/p{i}</loc></url>" for i in range(sitemaps.MAX_ENTRIES + 7)))
    got = parse(body, SITEMAP)
    assert len(got.entries) == sitemaps.MAX_ENTRIES and got.excess == 7
    assert got.entries[-1].url == f"https://example.com/p{sitemaps.MAX_ENTRIES - 1}"


def test_a_gzip_bomb_stops_at_the_size_cap(monkeypatch):
    monkeypatch.setattr(sitemaps, "MAX_BYTES", 4 * 1024 * 1024)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = b'<urlset><url><loc>https://example.com/</loc></url><!--'
    bomb = comp.compress(head) + b"".join(comp.compress(b" " * 1024 * 1024) for _ in range(64)) + comp.flush()
    assert len(bomb) < 200_000
    with pytest.raises(SitemapError, match="larger than 4 MB"):
        parse(bomb, SITEMAP)
    with pytest.raises(SitemapError, match="larger than 4 MB"):
        parse(gzip.compress(bomb), SITEMAP)  # the bomb inside a gzip layer


def test_a_plain_body_over_the_cap(monkeypatch):
    monkeypatch.setattr(sitemaps, "MAX_BYTES", 1000)
    with pytest.raises(SitemapError, match="larger than"):
        parse(urlset(*(url(f"https://example.com/{i}") for i in range(100))), SITEMAP)


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<urlset><url><loc>https://example.com/&lol3;</loc></url></urlset>"""
EXTERNAL = b"""<?xml version="1.0"?><!DOCTYPE u [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<urlset><url><loc>https://example.com/&xxe;</loc></url></urlset>"""
PARAMETER = b"""<?xml version="1.0"?><!DOCTYPE u [<!ENTITY % p SYSTEM "http://127.0.0.1:1/x.dtd"> %p;]>
<urlset/>"""
DTD_ONLY = b'<?xml version="1.0"?><!DOCTYPE urlset SYSTEM "http://127.0.0.1:1/s.dtd"><urlset/>'


@pytest.mark.parametrize("body", [BILLION_LAUGHS, EXTERNAL, PARAMETER, DTD_ONLY])
def test_document_type_declarations_are_refused_so_no_entity_is_expanded_or_fetched(body):
    with pytest.raises(SitemapError, match="document type declaration"):
        parse(body, SITEMAP)


def test_an_undeclared_entity_is_malformed():
    with pytest.raises(SitemapError, match="not well-formed XML.*undefined entity"):
        parse(urlset(url("https://example.com/&nope;")), SITEMAP)


@pytest.mark.parametrize("body,why", [
    (b"", "not well-formed"), (b"<urlset><url><loc>x</loc></url>", "not well-formed"),
    (b"\x00\x01\x02", "not well-formed"), (b"<html><body>hello</body></html>", "root element <html>"),
    (gzip.compress(b"x" * 100, mtime=0)[:10] + b"\xff" * 50, "gzip is corrupt"),
    (gzip.compress(b"<urlset>", mtime=0)[:-12], "gzip is truncated"),
    (b"<urlset>" + b"<a>" * 100_000, "not well-formed"), (b"<rss><channel/></rss>", "root element <rss>"),
])
def test_malformed_sitemaps_are_one_line_errors(body, why):
    with pytest.raises(SitemapError, match=why) as caught:
        parse(body, SITEMAP)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text,when", [
    ("2024", datetime(2024, 1, 1)), ("2024-05", datetime(2024, 5, 1)), ("2024-05-17", datetime(2024, 5, 17)),
    ("2024-05-17T10:30Z", datetime(2024, 5, 17, 10, 30)), ("2024-05-17T10:30:15.5-01:00",
                                                          datetime(2024, 5, 17, 11, 30, 15, 500000)),
    ("2024-13-01", None), ("yesterday", None), ("", None), (None, None), ("2" * 100, None),
])
def test_lastmod_w3c_datetimes(text, when):
    assert lastmod(text) == (when.replace(tzinfo=timezone.utc) if when else None)


def test_robots_sitemap_lines():
    text = ("User-agent: *\nDisallow: /private\nSitemap: https://example.com/s.xml\nsitemap: /rel.xml.gz\n"
            "Sitemap: javascript:alert(1)\nSitemap: https://example.com/s.xml\n")
    assert robots_sitemaps(text, "https://example.com/robots.txt") == [
        "https://example.com/s.xml", "https://example.com/rel.xml.gz"]
    many = "".join(f"Sitemap: https://example.com/{i}.xml\n" for i in range(1000))
    assert len(robots_sitemaps(many, "https://example.com/robots.txt")) == sitemaps.MAX_ROBOTS_SITEMAPS
    assert robots_sitemaps("\x00garbage\nSitemap:\n", "https://example.com/robots.txt") == []
