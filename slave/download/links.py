"""Links found on a downloaded page: parsed from HTML (the built-in and browser engines) or
returned by a python downloader, resolved, canonicalised and capped.

Bounded whatever the page: only its first MAX_PARSE_BYTES are parsed, for at most PARSE_SECONDS
of CPU (the standard library's ``html.parser``, which never raises on broken HTML; its times on
the largest pages: docs/crawling.md), at most twice the cap of candidate strings are kept while
parsing, and only the cap's worth are resolved. What was left is counted in ``Found`` so the
caller can log it. Scope is not judged here: ``common.scope`` does.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import urljoin

from common.errors import ValidationError
from common.jobsettings import MAX_URL_LENGTH, Follow
from common.urls import canonical
from slave.download.engines.base import Download

MAX_PARSE_BYTES = 4 * 1024 * 1024  # a longer page is parsed for links up to here only
PARSE_SECONDS = 2.0                # and for at most this much of its thread's CPU time
CLOCK_EVERY = 256                  # the parser's callbacks between two readings of that clock
LINK_ATTRS = {"a": "href", "area": "href", "frame": "src", "iframe": "src", "link": "href", "base": "href"}
LINK_RELS = {"next", "canonical"}  # the <link rel=...> that name a page to fetch


@dataclass
class Found:
    """The links of one page: canonical http(s) URLs, unique, in page order, at most the cap."""

    urls: list[str] = field(default_factory=list)
    excess: int = 0          # links past the cap, counted unread (duplicates and other schemes among them)
    skipped: int = 0         # not URLs we fetch: javascript:, mailto:, data: ..., too long, malformed
    truncated: bool = False  # the page was longer than MAX_PARSE_BYTES: links past that were not read


class _OutOfTime(Exception):
    """The page took its PARSE_SECONDS: the links read so far are kept."""


class _Parser(HTMLParser):
    """Collects the raw link strings of a page (at most ``room``) and its first ``<base href>``;
    every callback counts, and every CLOCK_EVERY-th reads the thread's CPU clock (the parser calls
    back at least once per tag or run of text, so no page parses long between two readings)."""

    def __init__(self, room: int) -> None:
        super().__init__(convert_charrefs=True)
        self.room, self.over, self.too_long, self.calls = room, 0, 0, 0
        self.raw: list[str] = []
        self.base: str | None = None
        self.end = time.thread_time() + PARSE_SECONDS

    def _tick(self) -> None:
        self.calls += 1
        if self.calls % CLOCK_EVERY == 0 and time.thread_time() > self.end:
            raise _OutOfTime

    def handle_endtag(self, tag: str) -> None:
        self._tick()

    def handle_data(self, data: str) -> None:
        self._tick()

    def handle_comment(self, data: str) -> None:
        self._tick()

    def handle_decl(self, decl: str) -> None:
        self._tick()

    def handle_pi(self, data: str) -> None:
        self._tick()

    def unknown_decl(self, data: str) -> None:
        self._tick()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tick()
        name = LINK_ATTRS.get(tag)
        if name is None:
            return
        value = next((v for k, v in attrs if k == name and v), None)
        if value is None:
            return
        if tag == "base":
            if self.base is None:
                self.base = value.strip()
            return
        if tag == "link":
            rel = next((v for k, v in attrs if k == "rel" and v), "")
            if not LINK_RELS & set(rel.lower().split()):
                return
        if len(value) > MAX_URL_LENGTH * 2:  # cannot shrink below the cap: never copied
            self.too_long += 1
        elif len(self.raw) < self.room:
            self.raw.append(value)
        else:
            self.over += 1


def parse_html(body: bytes, page_url: str, encoding: str | None, cap: int) -> Found:
    """The links of an HTML page fetched from ``page_url`` (after redirects): ``a``/``area``
    href, ``frame``/``iframe`` src, ``link rel=next|canonical``; relative ones against the first
    ``<base href>``; at most ``cap`` taken."""
    try:
        text = body[:MAX_PARSE_BYTES].decode(encoding or "utf-8", "replace")
    except LookupError:  # an encoding Python does not know
        text = body[:MAX_PARSE_BYTES].decode("utf-8", "replace")
    parser, truncated = _Parser(room=2 * cap), len(body) > MAX_PARSE_BYTES
    try:
        parser.feed(text)  # in one piece: fed in parts, an unclosed comment is searched again each time
        parser.close()
    except _OutOfTime:
        truncated = True
    base = page_url
    if parser.base:
        try:
            base = urljoin(page_url, parser.base)
        except ValueError:
            pass
    found = resolve(parser.raw, base, cap)
    found.excess += parser.over
    found.skipped += parser.too_long
    found.truncated = truncated
    return found


def resolve(raw: list[str], base: str, cap: int) -> Found:
    """``raw`` link strings resolved against ``base`` and canonicalised; the first ``cap`` unique
    ones taken (``base`` itself left out), the rest counted unread."""
    found, seen = Found(), set()
    try:
        seen.add(canonical(base, MAX_URL_LENGTH))
    except ValidationError:
        pass
    for at, value in enumerate(raw):
        if len(found.urls) >= cap:  # the rest counted unread
            found.excess += len(raw) - at
            break
        try:
            url = canonical(urljoin(base, value.strip()), MAX_URL_LENGTH)
        except (ValidationError, ValueError):
            found.skipped += 1
            continue
        if url not in seen:
            seen.add(url)
            found.urls.append(url)
    return found


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
