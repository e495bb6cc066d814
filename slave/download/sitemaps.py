"""Sitemaps (sitemaps.org 0.9): the URLs and ``lastmod`` of a ``urlset``, the sitemaps of a
``sitemapindex``, gzip or not, and the ``Sitemap:`` lines of a robots.txt.

Hostile input costs bounded memory and time: the XML is parsed as it is decompressed (expat, in
pieces), at most MAX_BYTES of it (the protocol's 50 MB) and MAX_ENTRIES entries kept (its 50,000;
the rest counted); a document type declaration is refused outright, so there are no entities to
expand and no external ones to fetch (no XML bomb); an index deeper than MAX_INDEX_DEPTH is
refused. Anything malformed is a ``SitemapError`` with one line.
"""
from __future__ import annotations

import itertools
import re
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator
from urllib.parse import urljoin
from xml.parsers import expat

from common.errors import ValidationError
from common.jobsettings import MAX_URL_LENGTH
from common.urls import canonical

MAX_BYTES = 50 * 1024 * 1024  # a sitemap's XML, after decompression (the protocol's limit)
MAX_ENTRIES = 50_000          # entries kept from one sitemap (the protocol's limit)
MAX_INDEX_DEPTH = 3           # a sitemap named by the job is at depth 0; deeper indexes are refused
MAX_ROBOTS_SITEMAPS = 100     # Sitemap: lines taken from one robots.txt
MAX_ROBOTS_BYTES = 512 * 1024  # of a robots.txt read (as slave.download.robots reads it)
GZIP_MAGIC = b"\x1f\x8b"
PIECE = 64 * 1024             # bytes decompressed and parsed at a time
MAX_TEXT = 4 * MAX_URL_LENGTH  # characters kept of one <loc> or <lastmod>


@dataclass
class Read:
    """What a worker read in a sitemap task's body: its pages and the sitemaps it names."""
    depth: int                      # the sitemap task's: how many indexes led to it
    pages: list[str] = field(default_factory=list)
    sitemaps: list[str] = field(default_factory=list)
    lastmods: dict[str, datetime] = field(default_factory=dict)  # of entries that have one (asked for)
    excess: int = 0                 # entries beyond MAX_ENTRIES, not kept


class SitemapError(ValueError):
    """The body is not a sitemap we read (malformed, too large, nested too deep); final, not retried."""


@dataclass
class Entry:
    url: str                        # canonical (``common.urls.canonical``)
    lastmod: datetime | None = None  # aware, UTC; None if absent or unreadable


@dataclass
class Sitemap:
    root: str                       # its root element: "urlset" (pages) or "sitemapindex" (more sitemaps)
    entries: list[Entry] = field(default_factory=list)
    excess: int = 0                 # entries beyond MAX_ENTRIES, not kept
    skipped: int = 0                # <loc>s that are not http(s) URLs we fetch


ROOTS = {"urlset": "url", "sitemapindex": "sitemap"}
NAMESPACES = ("", "http://www.sitemaps.org/schemas/sitemap/0.9")  # none is read as the protocol's too


def parse(body: bytes, sitemap_url: str, depth: int = 0) -> Sitemap:
    """The sitemap in ``body`` (XML, or gzip of it) fetched from ``sitemap_url``; ``depth`` is how
    many indexes led here."""
    reader = _Reader(sitemap_url)
    parser = expat.ParserCreate(namespace_separator=" ")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = reader.doctype
    parser.EntityDeclHandler = reader.doctype
    parser.StartElementHandler = reader.start
    parser.EndElementHandler = reader.end
    parser.CharacterDataHandler = reader.text
    try:
        for piece in _xml(body):
            parser.Parse(piece, False)
        parser.Parse(b"", True)
    except expat.ExpatError as exc:
        raise SitemapError(f"sitemap is not well-formed XML: {expat.ErrorString(exc.code)} "
                           f"(line {exc.lineno})") from None
    if reader.result is None:
        raise SitemapError("sitemap is empty")
    if reader.result.root == "sitemapindex" and depth >= MAX_INDEX_DEPTH:
        raise SitemapError(f"sitemap index nested more than {MAX_INDEX_DEPTH} deep")
    return reader.result


def _xml(body: bytes) -> Iterator[bytes]:
    """The XML of ``body`` in pieces: as it is, or gunzipped (twice at most: a ``.xml.gz`` served
    with ``Content-Encoding: gzip`` that nobody decoded); SitemapError past MAX_BYTES."""
    if body[:2] != GZIP_MAGIC:
        pieces: Iterator[bytes] = (body[i:i + PIECE] for i in range(0, len(body), PIECE))
    else:
        pieces = _gunzip(body)
        first = next(pieces, b"")
        if first[:2] == GZIP_MAGIC:  # the inner file, at most MAX_BYTES (checked as it grows)
            pieces = _gunzip(b"".join([first, *pieces]))
            first = next(pieces, b"")
        pieces = itertools.chain([first], pieces)
    total = 0
    for piece in pieces:
        total += len(piece)
        if total > MAX_BYTES:
            raise SitemapError(f"sitemap larger than {MAX_BYTES // (1024 * 1024)} MB")
        yield piece


def _gunzip(data: bytes) -> Iterator[bytes]:
    """``data`` gunzipped, PIECE bytes at a time, never more than MAX_BYTES + PIECE in all."""
    inflater, total, at = zlib.decompressobj(16 + zlib.MAX_WBITS), 0, 0
    try:
        while not inflater.eof:
            if inflater.unconsumed_tail:
                piece = inflater.decompress(inflater.unconsumed_tail, PIECE)
            elif at < len(data):
                piece, at = inflater.decompress(data[at:at + PIECE], PIECE), at + PIECE
            else:
                raise SitemapError("sitemap gzip is truncated")
            total += len(piece)
            if total > MAX_BYTES:
                raise SitemapError(f"sitemap larger than {MAX_BYTES // (1024 * 1024)} MB")
            yield piece
    except zlib.error as exc:
        raise SitemapError(f"sitemap gzip is corrupt: {exc}") from None


class _Reader:
    """expat's callbacks: the root, then each entry's <loc> and <lastmod> (namespace ignored)."""

    def __init__(self, sitemap_url: str) -> None:
        self.base = sitemap_url
        self.result: Sitemap | None = None
        self.path: list[str] = []
        self.loc: str | None = None
        self.lastmod: str | None = None
        self.buffer: list[str] | None = None
        self.size = 0

    def doctype(self, *_) -> None:
        raise SitemapError("sitemap has a document type declaration (refused: entities)")

    def start(self, name: str, _attrs) -> None:
        space, _, local = name.rpartition(" ")
        if space not in NAMESPACES:  # an extension's element (image:loc, news:...): not ours
            local = "?" + local
        if self.result is None:
            if local not in ROOTS:
                raise SitemapError(f"not a sitemap: root element <{local.lstrip('?')[:40]}>")
            self.result = Sitemap(root=local)
        elif len(self.path) == 1 and local == ROOTS[self.result.root]:
            self.loc = self.lastmod = None
        elif len(self.path) == 2 and local in ("loc", "lastmod"):
            self.buffer, self.size = [], 0
        self.path.append(local)

    def text(self, data: str) -> None:
        if self.buffer is not None and self.size <= MAX_TEXT:
            self.buffer.append(data)
            self.size += len(data)

    def end(self, _name: str) -> None:
        local = self.path.pop()
        assert self.result is not None
        if self.buffer is not None and len(self.path) == 2:
            value = "".join(self.buffer).strip() if self.size <= MAX_TEXT else None
            if local == "loc":
                self.loc = value if value is not None else ""
            else:
                self.lastmod = value
            self.buffer = None
        elif len(self.path) == 1 and local == ROOTS[self.result.root] and self.loc is not None:
            self._entry(self.result)

    def _entry(self, result: Sitemap) -> None:
        if len(result.entries) >= MAX_ENTRIES:
            result.excess += 1
            return
        try:
            url = canonical(urljoin(self.base, self.loc or ""), MAX_URL_LENGTH) if self.loc else ""
        except (ValidationError, ValueError):
            url = ""
        if not url:
            result.skipped += 1
            return
        result.entries.append(Entry(url, lastmod(self.lastmod)))


W3C_DATE = re.compile(r"^(\d{4})(?:-(\d{2}))?$")


def lastmod(text: str | None) -> datetime | None:
    """A W3C datetime (``2024``, ``2024-05``, ``2024-05-17``, ``2024-05-17T10:00+02:00``, with
    seconds and fractions) as an aware UTC datetime; None if absent or unreadable."""
    if not text or len(text) > 64:
        return None
    try:
        short = W3C_DATE.match(text)
        if short:
            at = datetime(int(short[1]), int(short[2] or 1), 1)
        else:
            at = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        return at.replace(tzinfo=timezone.utc)
    return at.astimezone(timezone.utc)


def read(body: bytes, url: str, sitemap_kind: str, depth: int, with_lastmod: bool = False) -> Read:
    """The pages and sitemaps of a sitemap task's ``body`` fetched from ``url``: ``sitemap_kind`` "xml"
    (a urlset's pages, an index's sitemaps) or "robots" (its Sitemap: lines), and their
    ``lastmod`` if ``with_lastmod``; SitemapError."""
    if sitemap_kind == "robots":
        return Read(depth, sitemaps=robots_sitemaps(body[:MAX_ROBOTS_BYTES].decode("utf-8", "replace"), url))
    found = parse(body, url, depth)
    urls = [e.url for e in found.entries]
    stamps = {e.url: e.lastmod for e in found.entries if e.lastmod is not None} if with_lastmod else {}
    if found.root == "sitemapindex":
        return Read(depth, sitemaps=urls, lastmods=stamps, excess=found.excess)
    return Read(depth, pages=urls, lastmods=stamps, excess=found.excess)


def robots_sitemaps(text: str, robots_url: str) -> list[str]:
    """The ``Sitemap:`` URLs of a robots.txt (read with Protego, as ``slave.download.robots``
    reads it), canonical and http(s) only, the first MAX_ROBOTS_SITEMAPS."""
    from protego import Protego

    out: dict[str, None] = {}
    for raw in Protego.parse(text).sitemaps:
        try:
            out.setdefault(canonical(urljoin(robots_url, raw.strip()), MAX_URL_LENGTH))
        except (ValidationError, ValueError):
            continue
        if len(out) >= MAX_ROBOTS_SITEMAPS:
            break
    return list(out)
