"""WARC 1.1 (ISO 28500:2017): the format web archives read (pywb, the Wayback Machine, warcio,
Heritrix and wget write it), one gzip member per record.

A job's stored pages become, in the order they were stored: a ``warcinfo`` record first; for each
download a ``request`` record and a ``response`` record, concurrent to each other
(``WARC-Concurrent-To``), with the page's URL, the time its fetch started (a document stored before
the store kept it: the time it was stored), the address it came from and the digests of the block
and the payload; for each revisit that stored nothing (see
docs/revisits.md) a ``revisit`` record that refers to the version it matched: the standard's
``server-not-modified`` profile for a 304, ``identical-payload-digest`` for the same body again
(dated when its download log was stored: the log keeps no fetch time).

What is stored is what is written: the body byte-exact as the store keeps it. The store keeps
bodies decoded (after ``Content-Encoding``), so the HTTP header section written with it has no
``Content-Encoding`` or ``Transfer-Encoding`` and a ``Content-Length`` of the body it carries; the
request's header section is the one stored, secrets masked (``***``). Record ids are derived from
the stored documents' ids, so the same page has the same record id in every export.
"""
from __future__ import annotations

import base64
import gzip
import hashlib
import heapq
import uuid
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from http import HTTPStatus
from typing import IO, Iterable, Iterator
from urllib.parse import urlsplit

from common.store import data, logs
from common.store.records import DataDoc, ExportFilter

__all__ = ["Capture", "Revisit", "WarcWriter", "CONTENT_TYPE"]

CONTENT_TYPE = "application/warc"
VERSION = b"WARC/1.1"
NOT_MODIFIED = "http://netpreserve.org/warc/1.1/revisit/server-not-modified"
IDENTICAL = "http://netpreserve.org/warc/1.1/revisit/identical-payload-digest"
# what no longer describes the body as stored (decoded, whole)
DROPPED = frozenset({"content-encoding", "transfer-encoding", "content-length"})


@dataclass
class Capture:
    """One stored download: its response and the request that fetched it."""
    key: str                    # the stored document's id: the records' ids derive from it
    url: str
    date: datetime              # naive UTC or aware
    status: int
    body: bytes
    response_headers: dict = field(default_factory=dict)
    request_headers: dict = field(default_factory=dict)
    ip: str = ""


@dataclass
class Revisit:
    """A visit that stored nothing: answered 304 (``not_modified``) or with the same body."""
    key: str                    # the download log's id
    date: datetime
    not_modified: bool          # True: HTTP 304; False: the same body again
    refers_to: Capture          # the version it matched (its body: for the digest only)


def record_id(key: str, warc_type: str) -> str:
    return f"<urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, f'downcluster:{key}:{warc_type}')}>"


def warc_date(at: datetime) -> str:
    """RFC 3339 UTC with microseconds, as WARC 1.1 allows."""
    if at.tzinfo is not None:
        at = at.astimezone(timezone.utc).replace(tzinfo=None)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def sha1(data: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(data).digest()).decode("ascii")


def _line(text: str) -> str:
    """A header value on one line (a stored value with CR or LF would end the header early)."""
    return " ".join(str(text).replace("\r", " ").replace("\n", " ").split())


def _headers(lines: Iterable[tuple[str, str]]) -> bytes:
    return b"".join(f"{_line(k)}: {_line(v)}\r\n".encode("utf-8", "replace") for k, v in lines)


def http_response(status: int, headers: dict, body: bytes) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    kept = [(k, v) for k, v in headers.items() if str(k).lower() not in DROPPED]
    head = f"HTTP/1.1 {status} {reason}".rstrip().encode() + b"\r\n"
    return head + _headers([*kept, ("Content-Length", str(len(body)))]) + b"\r\n" + body


def http_request(url: str, headers: dict) -> bytes:
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kept = [(k, v) for k, v in headers.items() if str(k).lower() != "host"]
    return (f"GET {target} HTTP/1.1\r\n".encode("utf-8", "replace")
            + _headers([("Host", parts.netloc.rsplit("@", 1)[-1]), *kept]) + b"\r\n")


class WarcWriter:
    """Writes records to a binary stream, each its own gzip member (readers can seek to one)."""

    def __init__(self, out: IO[bytes], software: str = "downcluster") -> None:
        self.out, self.software, self.records = out, software, 0

    def _record(self, warc_type: str, rid: str, date: datetime, block: bytes, extra: list[tuple[str, str]],
                content_type: str) -> None:
        head = [("WARC-Type", warc_type), ("WARC-Record-ID", rid), ("WARC-Date", warc_date(date)), *extra,
                ("WARC-Block-Digest", sha1(block)), ("Content-Type", content_type),
                ("Content-Length", str(len(block)))]
        raw = VERSION + b"\r\n" + _headers(head) + b"\r\n" + block + b"\r\n\r\n"
        self.out.write(gzip.compress(raw, compresslevel=6))
        self.records += 1

    def warcinfo(self, date: datetime, filename: str, fields: dict) -> None:
        block = _headers([("software", self.software), ("format", "WARC File Format 1.1"),
                          ("conformsTo", "http://iipc.github.io/warc-specifications/specifications/"
                                         "warc-format/warc-1.1/"), *fields.items()])
        self._record("warcinfo", f"<urn:uuid:{uuid.uuid4()}>", date, block, [("WARC-Filename", filename)],
                     "application/warc-fields")

    def capture(self, c: Capture) -> None:
        response_id, request_id = record_id(c.key, "response"), record_id(c.key, "request")
        common = [("WARC-Target-URI", c.url)] + ([("WARC-IP-Address", c.ip)] if c.ip else [])
        self._record("request", request_id, c.date, http_request(c.url, c.request_headers),
                     [*common, ("WARC-Concurrent-To", response_id)], "application/http; msgtype=request")
        self._record("response", response_id, c.date, http_response(c.status, c.response_headers, c.body),
                     [*common, ("WARC-Concurrent-To", request_id), ("WARC-Payload-Digest", sha1(c.body))],
                     "application/http; msgtype=response")

    def revisit(self, r: Revisit) -> None:
        ref = r.refers_to
        if r.not_modified:
            block, profile = b"HTTP/1.1 304 Not Modified\r\n\r\n", NOT_MODIFIED
        else:  # the header section of the version it matched: the same payload follows it
            block = http_response(ref.status, ref.response_headers, ref.body)[: -len(ref.body) or None]
            profile = IDENTICAL
        self._record("revisit", record_id(r.key, "revisit"), r.date, block,
                     [("WARC-Target-URI", ref.url), ("WARC-Profile", profile),
                      ("WARC-Refers-To", record_id(ref.key, "response")),
                      ("WARC-Refers-To-Target-URI", ref.url), ("WARC-Refers-To-Date", warc_date(ref.date)),
                      ("WARC-Payload-Digest", sha1(ref.body))],
                     "application/http; msgtype=response")


# --- a job's stored pages as one WARC file -------------------------------------------------

def capture_of(doc: DataDoc, body: bytes) -> Capture:
    """A stored data document as a Capture."""
    date = doc.fetched_at or doc.add_datetime or doc.id.generation_time.replace(tzinfo=None)
    return Capture(key=str(doc.id), url=doc.url or "", date=date, status=int(doc.status_code or 200),
                   body=body, response_headers=dict(doc.response_headers),
                   request_headers=dict(doc.requests_headers), ip=doc.remote_ip or "")


def _revisits(job_id, flt: ExportFilter) -> Iterator[Revisit]:
    """The job's visits that stored nothing, each with the version it matched (the latest a page
    had when the visit was stored); one whose version is no longer kept is left out (nothing to
    refer to)."""
    task, versions, ref = None, [], None  # a page revisited again and again: its versions read once
    for log in logs.not_modified(job_id, flt.since, flt.until):
        if log.task is None:
            continue
        at = log.fetched_at or log.add_datetime or log.id.generation_time.replace(tzinfo=None)
        if log.task != task:
            task, versions, ref = log.task, data.versions_of(log.task), None
        matched = data.latest_at(versions, at)
        if matched is None:
            continue
        if ref is None or ref.key != str(matched.id):  # a newer version stored since the last visit
            found = data.with_body(matched.id)
            if found is None:
                continue
            ref = capture_of(*found)
        yield Revisit(key=str(log.id), date=at, not_modified=(log.not_modified or "").startswith("HTTP 304"),
                      refers_to=ref)


def write_job(job_id, job_name: str, flt: ExportFilter, out: IO[bytes], wrap=lambda items: items) -> int:
    """The job's stored downloads matching ``flt`` (every version stored; the
    revisits within its time window; a status filter keeps responses of those codes and drops the
    revisits unless 304 is among them) as WARC records to ``out``, in the order they happened.
    ``wrap`` sees each item (progress). How many downloads were written."""
    writer = WarcWriter(out)
    writer.warcinfo(datetime.now(timezone.utc), f"{job_name}.warc.gz",
                    {"description": f"downcluster job {job_name}", "isPartOf": job_name})
    every = replace(flt, all_versions=True)
    captures = (capture_of(doc, body) for doc, body in data.documents(job_id, every, request_headers=True))
    wanted = flt.status
    revisits: Iterable[Revisit] = _revisits(job_id, flt) if not wanted or 304 in wanted else ()
    n = 0
    items: Iterator[Capture | Revisit] = heapq.merge(captures, revisits, key=_when)
    for item in wrap(items):
        if isinstance(item, Capture):
            writer.capture(item)
        else:
            writer.revisit(item)
        n += 1
    return n


def _when(item: Capture | Revisit) -> datetime:
    at = item.date
    return at.astimezone(timezone.utc).replace(tzinfo=None) if at.tzinfo is not None else at
