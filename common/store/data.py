"""Stored data: ``crawler_download_data`` (a download's response; large bodies in the GridFS
bucket ``crawler_download_data_fs``) and export files (GridFS bucket ``export_fs``). Reading
bodies byte-exact, the export rows, and writing export files.

Indexes: ``(task, lease)`` finds the data of a task's settled lease; ``(job, _id)`` reads a job's
data in ``_id`` (time) order, window by window (``common.store.paging``).
Invariant: data is read through ``visible`` / ``shown``: only documents that their task names
(the fence, ``common/store/fence.py``); an export file without a files document is a dead
writer's and is removed by ``drop_export_file``."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import gridfs
from bson import ObjectId
from pymongo.database import Database

from common.store.fence import latest_only, visible
from common.store.models import CrawlerDownloadData, CrawlerTask
from common.store.paging import OutOfTime, scan
from common.store.records import DataDoc, ExportFilter

if TYPE_CHECKING:
    from common.exports.templates import Table, Template

Doc = dict[str, Any]  # a raw document or a query
Rows = Callable[["Table"], Iterator["ExportRow"]]  # an export's rows of one table
GRIDFS_BUCKET = "crawler_download_data_fs"
EXPORT_BUCKET = "export_fs"


def gridfs_of(database: Database[Doc]) -> gridfs.GridFS:
    return gridfs.GridFS(database, collection=GRIDFS_BUCKET)


class Upload:
    """A GridFS file written as it streams (the GridFS layout, readable by any GridFS reader):
    chunks go to MongoDB every 1 MiB, so at most that much waits in memory (pymongo's own GridIn
    keeps up to 48 MiB before its first insert). The files document is written by ``close``;
    chunks without one are what a dead writer leaves, removed by ``drop_export_file``."""

    CHUNK = 255 * 1024
    BATCH = 4

    def __init__(self, database: Database[Doc], bucket: str, file_id: ObjectId, filename: str,
                 metadata: Doc) -> None:
        self.files, self.chunks = database[bucket + ".files"], database[bucket + ".chunks"]
        self.file_id, self.filename, self.metadata = file_id, filename, metadata
        self.buffer, self.n, self.length = bytearray(), 0, 0
        self.pending: list[Doc] = []

    def write(self, data: bytes) -> None:
        self.buffer += data
        self.length += len(data)
        while len(self.buffer) >= self.CHUNK:
            self.pending.append(
                {"files_id": self.file_id, "n": self.n, "data": bytes(self.buffer[: self.CHUNK])}
            )
            del self.buffer[:self.CHUNK]
            self.n += 1
            if len(self.pending) >= self.BATCH:
                self._send()

    def _send(self) -> None:
        if self.pending:
            self.chunks.insert_many(self.pending, ordered=True)
            self.pending = []

    def close(self) -> None:
        from datetime import datetime, timezone

        if self.buffer:
            self.pending.append({"files_id": self.file_id, "n": self.n, "data": bytes(self.buffer)})
            self.buffer = bytearray()
        self._send()
        self.files.insert_one({"_id": self.file_id, "length": self.length, "chunkSize": self.CHUNK,
                               "uploadDate": datetime.now(timezone.utc), "filename": self.filename,
                               "metadata": self.metadata})


def export_upload(file_id: ObjectId, filename: str, metadata: Doc) -> Upload:
    """A new export file (bucket ``export_fs``), written as it streams."""
    return Upload(CrawlerDownloadData._get_collection().database, EXPORT_BUCKET, file_id, filename, metadata)


def documents(job_id: ObjectId, flt: ExportFilter,
              request_headers: bool = False) -> Iterator[tuple[DataDoc, bytes]]:
    """(document without its request — but its headers with ``request_headers`` —, body) of each
    of the job's shown data documents matching ``flt`` (see ``_data_filter``), oldest first."""
    coll = CrawlerDownloadData._get_collection()
    fs = gridfs_of(coll.database)
    unread = {"requests_body": 0} if request_headers else {"requests_body": 0, "requests_headers": 0}
    cursor = coll.find(_data_filter(job_id, flt), unread)
    cursor = cursor.sort("_id", 1).batch_size(200)
    for doc in _versions_kept(visible(cursor), flt):
        yield DataDoc.from_doc(doc), body_of(doc, fs)


def _versions_kept(docs: Iterable[Doc], flt: ExportFilter) -> Iterable[Doc]:
    """``docs`` as an export's filter asks: every version, else each page's latest."""
    return docs if flt.all_versions else latest_only(docs)


def versions_of(task_id: ObjectId) -> list[tuple[DataDoc, bool]]:
    """A task's stored versions, oldest first (without bodies), each with whether it is the
    latest: the documents it names as its latest (``data_lease``) or an earlier version
    (``history``); [] if it has none."""
    task = CrawlerTask._get_collection().find_one({"_id": task_id}, {"data_lease": 1, "history": 1})
    if not task or not task.get("data_lease"):
        return []
    leases = [*(task.get("history") or ()), task["data_lease"]]
    found = CrawlerDownloadData._get_collection().find(
        {"task": task_id, "lease": {"$in": leases}}, {"response_body": 0, "requests_body": 0})
    return [(DataDoc.from_doc(d), d["lease"] == task["data_lease"])
            for d in sorted(found, key=lambda d: d["_id"])]


def latest_at(versions: list[tuple[DataDoc, bool]], at: datetime) -> DataDoc | None:
    """Of a task's ``versions`` (``versions_of``), the one that was its latest at time ``at``: the
    newest stored no later than ``at``; None if none was."""
    before = [d for d, _ in versions if d.add_datetime and d.add_datetime <= at]
    return before[-1] if before else None


def with_body(data_id: ObjectId) -> tuple[DataDoc, bytes] | None:
    """A data document (without its request body) and its response body; None if it is gone."""
    coll = CrawlerDownloadData._get_collection()
    doc = coll.find_one({"_id": data_id}, {"requests_body": 0})
    return (DataDoc.from_doc(doc), body_of(doc, gridfs_of(coll.database))) if doc else None


def drop_export_file(file_id: ObjectId | None) -> None:
    """Remove an export's file from GridFS, complete or partial (chunks without a files document
    are what an upload cut off leaves)."""
    if file_id is None:
        return
    db = CrawlerDownloadData._get_collection().database
    db[EXPORT_BUCKET + ".files"].delete_one({"_id": file_id})
    db[EXPORT_BUCKET + ".chunks"].delete_many({"files_id": file_id})


def _data_filter(job_id: ObjectId, flt: ExportFilter) -> Doc:
    """The MongoDB filter of an export's rows: the job's data documents, by HTTP status code
    and stored time (``flt`` was checked when the export was requested)."""
    query: dict[str, Any] = {"job": job_id}
    if flt.status:
        query["status_code"] = {"$in": list(flt.status)}
    if flt.since or flt.until:
        query["add_datetime"] = {**({"$gte": flt.since} if flt.since else {}),
                                 **({"$lt": flt.until} if flt.until else {})}
    return query


def text_of(body: bytes, encoding: str | None) -> str:
    try:
        return body.decode(encoding or "utf-8", errors="replace")
    except LookupError:  # an unknown charset name from the server
        return body.decode("utf-8", errors="replace")


def body_of(doc: Doc, fs: gridfs.GridFS) -> bytes:
    """A data document's response body, byte-exact, from the document or its GridFS file."""
    if doc.get("response_body_gridfs"):
        return bytes(fs.get(doc["response_body_gridfs"]).read())
    return bytes(doc.get("response_body") or b"")


def _restrict(query: Doc, status: tuple[int, ...]) -> Doc:
    """``query`` kept to the HTTP status codes ``status`` too (a table's own filter)."""
    if not status:
        return query
    codes = set(status)
    if "status_code" in query:
        codes &= set(query["status_code"]["$in"])
    return {**query, "status_code": {"$in": sorted(codes)}}


@dataclass(slots=True)
class ExportRow:
    """One data document as an export's writers read it: the export fields of
    ``common.exports.templates.FIELDS`` (and the page's ``version``), by name through ``get``, as
    the writers read any source's rows. The body's fields are set only when the export asks for
    one, the response headers only when it asks for them. Made once per row exported and never
    changed, but not frozen: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__`` (the costs: docs/layout.md)."""

    url: str | None
    status_code: int | None
    encoding: str | None
    remote_ip: str | None
    hostname: str | None
    task: str
    add_datetime: datetime | None
    version: int
    response_headers: Mapping[str, Any] | None = None
    response_size: int | None = None
    body_sha256: str | None = None
    body_text: str | None = None

    def get(self, name: str, default: Any = None) -> Any:
        """The field ``name`` (``default`` for a name the row does not have)."""
        return getattr(self, name) if name in _ROW_FIELDS else default


_ROW_FIELDS = frozenset(ExportRow.__dataclass_fields__)


def data_rows(job_id: ObjectId, flt: ExportFilter, status: tuple[int, ...] = (), needs_body: bool = False,
              needs_headers: bool = False, task_order: bool = False) -> Iterator[ExportRow]:
    """The export row of each of the job's data documents that ``flt`` keeps (and, when given, of
    the HTTP status codes ``status``: a table's own filter), one at a time (a small cursor batch;
    a GridFS body is read only when a body field is asked for): in the order they were stored,
    or with ``task_order`` in the order their URLs were added (what a printed sheet wants; it
    costs the store a sort: docs/exports.md)."""
    coll = CrawlerDownloadData._get_collection()
    fs = gridfs_of(coll.database)
    projection = {"requests_body": 0, "requests_headers": 0}
    if not needs_headers:
        projection["response_headers"] = 0
    if not needs_body:
        projection["response_body"] = 0
    order = [("task", 1), ("_id", 1)] if task_order else [("_id", 1)]
    query = _restrict(_data_filter(job_id, flt), status)
    cursor = coll.find(query, projection, allow_disk_use=task_order).sort(order)
    for doc in _versions_kept(visible(cursor.batch_size(100 if needs_body else 1000)), flt):
        body = body_of(doc, fs) if needs_body else None
        yield ExportRow(
            doc.get("url"), doc.get("status_code"), doc.get("encoding"), doc.get("remote_ip"),
            doc.get("hostname"), str(doc["task"]), doc.get("add_datetime"), doc.get("version") or 1,
            (doc.get("response_headers") or {}) if needs_headers else None,
            *((len(body), hashlib.sha256(body).hexdigest(), text_of(body, doc.get("encoding")))
              if body is not None else ()))


def export_total(job_id: ObjectId, flt: ExportFilter, template: Template, upto: int | None = None) -> int:
    """Rows an export of ``template`` will read: each table's matching documents (a row-headed
    table at most the rows its headers hold). Counts documents an unfinished fence may still hide.
    ``upto``: stop counting there (a decision against a threshold costs no more than it, whatever
    the job's size)."""
    coll = CrawlerDownloadData._get_collection()
    base = _data_filter(job_id, flt)
    total = 0
    for table in template.tables:
        limits = [n for n in (sum(leaf.row_count for leaf in table.row_leaves) if table.row else None,
                              None if upto is None else upto - total) if n is not None]
        cap = min(limits) if limits else None
        if cap == 0:  # (a count's limit 0 means none)
            continue
        total += coll.count_documents(_restrict(base, table.status), **({"limit": cap} if cap else {}))
        if upto is not None and total >= upto:
            break
    return total


DECIDE_WITHIN = 0.4  # seconds a filtered export's rows may take to count; beyond, a worker runs it


def export_fits(job_id: ObjectId, flt: ExportFilter, template: Template, limit: int) -> bool:
    """Whether an export surely has at most ``limit`` rows, decided in well under a second
    whatever the job's size: its SUCCESS tasks (kept as tasks change, ``common.store.counts``) bound
    each table's rows; an unfiltered table holds all of them; only a filtered export of a large
    job counts its rows — up to ``limit`` + 1, for DECIDE_WITHIN at most (rows the store cannot
    count in that time are taken as too many: the export is sent to a worker)."""
    from common.store import counts

    succeeded = counts.of_jobs([job_id]).get(job_id, {}).get("SUCCESS", 0)
    if succeeded * len(template.tables) <= limit:
        return True
    if not flt.narrows and not any(
            t.status or t.row for t in template.tables):
        return False
    try:
        return _rows_upto(job_id, flt, template, limit + 1) <= limit
    except OutOfTime:
        return False


def _rows_upto(job_id: ObjectId, flt: ExportFilter, template: Template, upto: int) -> int:
    """The export's rows, counted up to ``upto``: the job's data read window by window by its
    (job, _id) index, each document checked here against the filter and each table's status codes
    (another predicate in the query would make the embedded store read every document of the job)."""
    from common.store import counts

    codes, since, until = set(flt.status), flt.since, flt.until
    caps = [sum(leaf.row_count for leaf in t.row_leaves) if t.row else None for t in template.tables]
    rows = [0] * len(template.tables)
    docs = scan(CrawlerDownloadData._get_collection(), {"job": job_id}, span=counts.span(job_id),
                within=DECIDE_WITHIN, projection={"status_code": 1, "add_datetime": 1})
    for doc in docs:
        code, at = doc.get("status_code"), doc.get("add_datetime")
        if (
            (codes and code not in codes)
            or (since and (at is None or at < since))
            or (until and (at is None or at >= until))
        ):
            continue
        for i, (table, cap) in enumerate(zip(template.tables, caps)):
            if (not table.status or code in table.status) and (cap is None or rows[i] < cap):
                rows[i] += 1
        if sum(rows) >= upto:
            break
    return sum(rows)


@dataclass(frozen=True)
class WholeDocuments:
    """An export's source that is not rows: the job's stored documents whole, read by the writer
    itself (a WARC file: ``common.exports.warc``), with the export's filter and progress hook."""
    job_id: ObjectId
    filter: ExportFilter
    wrap: Callable[[Iterator[Any]], Iterator[Any]]


def _unwrapped(rows: Iterator[Any]) -> Iterator[Any]:
    return rows


def export_source(job_id: ObjectId, flt: ExportFilter, template: Template, fmt: str,
                  wrap: Callable[[Iterator[Any]], Iterator[Any]] = _unwrapped) -> Rows | WholeDocuments:
    """The rows of each table of an export (what the writers call): the job's data kept by the
    export's filter and the table's own status codes, in task order for a spreadsheet; for a
    WARC file, the documents whole (``WholeDocuments``)."""
    if fmt == "warc":
        return WholeDocuments(job_id, flt, wrap)

    def rows_for(table: Table) -> Iterator[ExportRow]:
        return wrap(data_rows(job_id, flt, table.status, template.needs_body, template.needs_headers,
                              task_order=fmt == "xlsx"))

    return rows_for
