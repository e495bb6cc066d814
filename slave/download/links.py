"""Links found on a downloaded page: parsed from HTML (the built-in and browser engines) or
returned by a python downloader, resolved, canonicalised and capped.

The page is tokenized by libxml2's HTML parser (lxml, in C: an HTML5 tokenizer that never raises
on broken HTML and recovers as browsers do), which calls back only at start tags and builds no
tree (``_Collector``, lxml's parser target), so a page costs its tokenizing and one Python call a
tag. Bounded whatever the page: only its first MAX_PARSE_BYTES are parsed, fed in FEED_CHARS
pieces, and parsing stops once it has taken PARSE_SECONDS of its thread's CPU (read between
pieces and every CLOCK_EVERY start tags); at most twice the cap of candidate strings are kept
while parsing, and only the cap's worth are resolved. What was left is counted in ``Found`` so
the caller can log it. Scope is not judged here: ``common.scope`` does. Why libxml2 and not the
standard library's ``html.parser``: docs/crawling.md (a real page's links in a fifth of the CPU).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urljoin

from lxml import etree

from common.errors import ValidationError
from common.jobsettings import MAX_URL_LENGTH, Follow
from common.urls import canonical
from slave.download.engines.base import Download

MAX_PARSE_BYTES = 4 * 1024 * 1024  # a longer page is parsed for links up to here only
PARSE_SECONDS = 2.0                # and for at most this much of its thread's CPU time
FEED_CHARS = 64 * 1024             # the parser is fed this much text at a time (the clock read between)
CLOCK_EVERY = 256                  # start tags between two readings of that clock
LINK_ATTRS = {"a": "href", "area": "href", "frame": "src", "iframe": "src", "link": "href", "base": "href"}
LINK_RELS = {"next", "canonical"}  # the <link rel=...> that name a page to fetch
Memo = dict[str, "str | None"]    # ``resolve``'s memos


@dataclass
class Found:
    """The links of one page: canonical http(s) URLs, unique, in page order, at most the cap."""

    urls: list[str] = field(default_factory=list)
    excess: int = 0          # links past the cap, counted unread (duplicates and other schemes among them)
    skipped: int = 0         # not URLs we fetch: javascript:, mailto:, data: ..., too long, malformed
    truncated: bool = False  # the page was longer than MAX_PARSE_BYTES: links past that were not read


class _OutOfTime(Exception):
    """The page took its PARSE_SECONDS: the links read so far are kept."""


class _Collector:
    """lxml's parser target: collects the raw link strings of a page (at most ``room``) and its
    first ``<base href>``; every CLOCK_EVERY-th start tag reads the thread's CPU clock against
    ``until``. (lxml calls a target's ``start``, ``end``, ``data``, ``comment``... when it has
    them: this one has only ``start`` and ``close``.)"""

    def __init__(self, room: int, until: float) -> None:
        self.room, self.over, self.too_long, self.calls, self.until = room, 0, 0, 0, until
        self.raw: list[str] = []
        self.base: str | None = None

    def start(self, tag: str, attrib: dict[str, str]) -> None:
        self.calls += 1
        if self.calls % CLOCK_EVERY == 0 and time.thread_time() > self.until:
            raise _OutOfTime
        name = LINK_ATTRS.get(tag)
        if name is None:
            return
        value = attrib.get(name)
        if not value:
            return
        if tag == "base":
            if self.base is None:
                self.base = value.strip()
            return
        if tag == "link" and not LINK_RELS & set((attrib.get("rel") or "").lower().split()):
            return
        if len(value) > MAX_URL_LENGTH * 2:  # cannot shrink below the cap: never copied
            self.too_long += 1
        elif len(self.raw) < self.room:
            self.raw.append(value)
        else:
            self.over += 1

    def close(self) -> None:
        return None


def _collect(text: str, collector: _Collector) -> bool:
    """Feed ``text`` to an HTML parser calling ``collector``; whether it stopped at its CPU budget."""
    parser = etree.HTMLParser(target=collector, no_network=True, remove_comments=True, remove_pis=True)
    try:
        for at in range(0, len(text), FEED_CHARS):
            if time.thread_time() > collector.until:
                return True
            parser.feed(text[at:at + FEED_CHARS])
        parser.close()
    except _OutOfTime:
        return True
    except etree.LxmlError:  # (libxml2 recovers from any HTML; a page it gives up on keeps what was read)
        pass
    return False


def parse_html(body: bytes, page_url: str, encoding: str | None, cap: int) -> Found:
    """The links of an HTML page fetched from ``page_url`` (after redirects): ``a``/``area``
    href, ``frame``/``iframe`` src, ``link rel=next|canonical``; relative ones against the first
    ``<base href>``; at most ``cap`` taken."""
    try:
        text = body[:MAX_PARSE_BYTES].decode(encoding or "utf-8", "replace")
    except LookupError:  # an encoding Python does not know
        text = body[:MAX_PARSE_BYTES].decode("utf-8", "replace")
    collector = _Collector(2 * cap, time.thread_time() + PARSE_SECONDS)
    truncated = _collect(text, collector) or len(body) > MAX_PARSE_BYTES
    base = page_url
    if collector.base:
        try:
            base = urljoin(page_url, collector.base)
        except ValueError:
            pass
    found = resolve(collector.raw, base, cap)
    found.excess += collector.over
    found.skipped += collector.too_long
    found.truncated = truncated
    return found


def resolve(raw: list[str], base: str, cap: int) -> Found:
    """``raw`` link strings resolved against ``base`` and canonicalised; the first ``cap`` unique
    ones taken (``base`` itself left out), the rest counted unread. A page repeats its links
    (a menu, a table of contents, ``#section`` anchors): each string is joined once, and each
    joined URL canonicalised once without its fragment (which canonical forms drop)."""
    found, seen = Found(), set()
    try:
        seen.add(canonical(base, MAX_URL_LENGTH))
    except ValidationError:
        pass
    joined: Memo = {}  # a raw string: that URL against ``base`` (None: malformed)
    canon: Memo = {}   # a joined URL without its fragment: its canonical form, or None
    for at, value in enumerate(raw):
        if len(found.urls) >= cap:  # the rest counted unread
            found.excess += len(raw) - at
            break
        url = _canonical(value.strip(), base, joined, canon)
        if url is None:
            found.skipped += 1
        elif url not in seen:
            seen.add(url)
            found.urls.append(url)
    return found


def _canonical(value: str, base: str, joined: Memo, canon: Memo) -> str | None:
    """``canonical(urljoin(base, value))``, or None where that raises, through the two memos:
    the same as computing it each time (a URL over MAX_URL_LENGTH is refused before its fragment
    is dropped, as ``canonical`` refuses it)."""
    if value not in joined:
        try:
            joined[value] = urljoin(base, value)
        except ValueError:
            joined[value] = None
    full = joined[value]
    if full is None or len(full) > MAX_URL_LENGTH:
        return None
    bare = full.split("#", 1)[0]
    if bare not in canon:
        try:
            canon[bare] = canonical(bare, MAX_URL_LENGTH)
        except (ValidationError, ValueError):
            canon[bare] = None
    return canon[bare]


def media_type(headers: dict[str, str]) -> str:
    """The response's Content-Type without parameters, lower-cased ("" if none)."""
    value = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    return value.split(";", 1)[0].strip().lower()


def of_download(download: Download, page_url: str, follow: Follow, engine: bool = True) -> Found | None:
    """The links of a download for a job that follows links: of a built-in ``engine``'s page
    when it succeeded with a content type the job parses; of a python downloader, those it
    returned (``download.links``; its page is not parsed). None when there is nothing to read."""
    if not engine:
        if download.links is None:
            return None
        found = resolve(download.links, page_url, follow.links_per_page)
        found.excess += download.links_dropped
        return found
    if not 200 <= download.status_code < 300 or media_type(download.headers) not in follow.content_types:
        return None
    return parse_html(download.body, download.url or page_url, download.encoding, follow.links_per_page)
