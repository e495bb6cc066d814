"""What a worker stores of its attempts: data documents (``crawler_download_data``, large bodies in
the GridFS bucket ``crawler_download_data_fs``) and download logs (``crawler_download_log``, log
database). Inserts only, and the read of a stored response a coalesced task copies; readers read
data through ``common.store.data`` and the settles are ``common.store.leases``.

Indexes (``models``): data (task, version) unique — one document per page version, the raw
collection holds no second one beside what readers show — finds an attempt's data (the fence:
task, then lease), (job, _id) a job's data by time; logs (task) a task's logs, (job, _id) a
job's logs by time.

Invariants: every document gets its ``_id`` from the writer (``data_doc``, ``log_doc``), so an
insert retried after a lost reply is refused as a duplicate and ignored: an attempt's data and
log are stored at most once, whatever the retries. A page version (a task's data, or one
``version`` of a revisited page) is held by one document: an insert that finds it held by
another attempt's document is refused (``insert_data`` says which); the attempt that holds the
task replaces that document (an orphan of a lost attempt, ``replace``), any other attempt loses
(its settle is refused by the guard). A GridFS body is written after its document, under the id
the document names, so a retry finds it there.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from bson import BSON, Binary, ObjectId
from bson.errors import InvalidDocument
from pymongo.collection import Collection
from pymongo.errors import BulkWriteError

from common.config import settings
from common.store.connection import collection
from common.store.data import body_of, gridfs_of
from common.store.log_models import CrawlerDownloadLog
from common.store.models import FAIL, SUCCESS, CrawlerDownloadData
from common.store.paging import Doc
from common.store.records import DataDoc, LeaseTask

DUPLICATE_KEY = 11000
MAX_BSON = 16 * 1024 * 1024


class Insert(NamedTuple):
    """A document made here for one insert (``data_doc``, ``log_doc``) and handed back to
    ``insert_data`` / ``insert_logs``: what the writer reads of it (its ``id``, the ``lease`` that
    stored it, the GridFS file its body goes to), and the document the insert sends, read here
    alone. Made once, never converted: a record made and turned into its document for the insert
    would cost the writer several µs more for every page it stores (docs/layout.md)."""

    id: ObjectId
    lease: str
    body_file: ObjectId | None
    doc: Doc


def data_doc(job_id: ObjectId, downloader_id: ObjectId | None, task: LeaseTask, lease: str, download: Any,
             now: datetime, version: int | None = None) -> Insert:
    """The data document of one successful download (``download``: status_code, headers, body,
    request_headers, request_body, encoding, remote_ip, fetched_at) of ``version`` of its page
    (revisits); a large body goes to GridFS (``body_file``: the file to write once the document
    is stored)."""
    d = download
    doc: Doc = {
        "_id": ObjectId(),  # made here: an insert retried after a lost reply is a duplicate, ignored
        "job": job_id, "downloader": downloader_id, "task": task.id, "lease": lease,
        "url": task.uri, "status_code": d.status_code,
        "requests_headers": d.request_headers, "response_headers": d.headers,
        "requests_body": Binary(d.request_body or b""), "encoding": d.encoding,
        "hostname": settings.HOSTNAME, "remote_ip": d.remote_ip, "add_datetime": now,
    }
    if version is not None:
        doc["version"] = version
    if getattr(d, "fetched_at", None) is not None:
        doc["fetched_at"] = d.fetched_at
    body_file = None
    if len(d.body) + len(d.request_body or b"") >= settings.GRIDFS_THRESHOLD:
        doc["response_body_gridfs"] = body_file = ObjectId()  # the file is written after this document
        doc["response_body"] = None
    else:
        doc["response_body"] = Binary(d.body)
    return Insert(doc["_id"], lease, body_file, doc)


def unstorable(made: Insert) -> str | None:
    """Why a document made here cannot be stored (None if it can): not BSON, or beyond MongoDB's
    16 MiB."""
    try:
        size = len(BSON.encode(made.doc))
    except (InvalidDocument, TypeError, ValueError, OverflowError) as exc:
        return f"response not storable: {type(exc).__name__}: {exc}"
    if size > MAX_BSON:
        return f"response not storable: document of {size} bytes exceeds MongoDB's 16 MiB limit"
    return None


def log_doc(job_id: ObjectId, task_id: ObjectId, lease: str, failed_reason: str | None, request_size: int,
            response_size: int, spend_us: int, coalesced_from: object, now: datetime,
            not_modified: str | None = None, fetched_at: datetime | None = None) -> Insert:
    """The download log of one attempt: SUCCESS, or FAIL with ``failed_reason``; ``not_modified``:
    a revisit that stored nothing ("HTTP 304" or "same content"), with ``fetched_at``, when its
    fetch began (a WARC revisit record's date: no data document holds it)."""
    made = ObjectId()
    return Insert(made, lease, None, {
        "_id": made, "job": job_id, "task": task_id, "lease": lease,
        "status": SUCCESS if failed_reason is None else FAIL,
        "requests_size": request_size, "response_size": response_size,
        "failed_reason": failed_reason[:10240] if failed_reason is not None else None,
        "downloads_hostname": settings.HOSTNAME, "spend_time": spend_us, "add_datetime": now,
        **({"coalesced_from": coalesced_from} if coalesced_from is not None else {}),
        **({"not_modified": not_modified, "fetched_at": fetched_at} if not_modified and fetched_at else
           {"not_modified": not_modified} if not_modified else {}),
    })


def _insert_ignoring_duplicates(coll: Collection[Doc], docs: list[Doc]) -> None:
    if not docs:
        return
    try:
        coll.insert_many(docs, ordered=False)
    except BulkWriteError as exc:
        if any(e["code"] != DUPLICATE_KEY for e in exc.details["writeErrors"]):
            raise


HOLDER_FIELDS = {"lease": 1, "response_body_gridfs": 1}


def _holder(coll: Collection[Doc], made: Insert) -> DataDoc | None:
    """The document holding ``made``'s page version (task, version), if any (its lease and body)."""
    return DataDoc.maybe(coll.find_one({"task": made.doc["task"], "version": made.doc.get("version")},
                                       HOLDER_FIELDS))


def insert_data(docs: list[Insert]) -> list[tuple[Insert, DataDoc | None]]:
    """Insert data documents (``data_doc``); those already stored (a retry) are ignored. Returns
    those refused because another document holds their page version, each with that document
    (None: it went meanwhile). Raises BulkWriteError or InvalidDocument / DocumentTooLarge when
    MongoDB refuses one for another reason."""
    coll = collection(CrawlerDownloadData)
    if not docs:
        return []
    try:
        coll.insert_many([made.doc for made in docs], ordered=False)
        return []
    except BulkWriteError as exc:
        errors = exc.details["writeErrors"]
        if any(e["code"] != DUPLICATE_KEY for e in errors):
            raise
    taken: list[tuple[Insert, DataDoc | None]] = []
    for e in errors:
        made = docs[e["index"]]
        held = _holder(coll, made)
        if held is None or held.id != made.id:  # (its own _id: a retried insert, stored)
            taken.append((made, held))
    return taken


def replace(held: DataDoc | None, made: Insert) -> tuple[bool, DataDoc | None]:
    """Put ``made`` in the place of ``held`` (the document that held its page version, an orphan:
    the caller's attempt holds the task, so no other attempt can settle it): its GridFS body,
    then it, go, and ``made`` is inserted. Returns (stored, the document now holding the version
    if another took it meanwhile)."""
    coll = collection(CrawlerDownloadData)
    if held is not None:
        if held.response_body_gridfs:
            gridfs_of(coll.database).delete(held.response_body_gridfs)
        coll.delete_one({"_id": held.id, "lease": held.lease})
    taken = insert_data([made])
    return (not taken), (taken[0][1] if taken else None)


def put_body(file_id: ObjectId, body: bytes, filename: str) -> None:
    """Write a GridFS body under the id its data document names (a retry finds it there)."""
    fs = gridfs_of(collection(CrawlerDownloadData).database)
    if fs.exists(file_id):
        return
    fs.put(body, _id=file_id, filename=filename)


def insert_logs(docs: list[Insert]) -> None:
    """Insert download logs (``log_doc``); those already stored (a retry) are ignored."""
    _insert_ignoring_duplicates(collection(CrawlerDownloadLog), [made.doc for made in docs])


def stored_response(data_id: str) -> tuple[DataDoc, bytes] | None:
    """A stored data document (for a coalesced task to copy) and its body, whether kept inline
    or in GridFS; None if it is gone."""
    coll = collection(CrawlerDownloadData)
    doc = coll.find_one({"_id": ObjectId(data_id)})
    if doc is None:
        return None
    return DataDoc.from_doc(doc), body_of(doc, gridfs_of(coll.database))


def stored_digest(task_id: ObjectId, lease: str) -> str | None:
    """SHA-256 of the body a task's data document of ``lease`` holds (a page stored before its
    job had revisits has no digest of its own), or None if it is gone."""
    import hashlib

    coll = collection(CrawlerDownloadData)
    doc = coll.find_one({"task": task_id, "lease": lease}, {"response_body": 1, "response_body_gridfs": 1})
    return hashlib.sha256(body_of(doc, gridfs_of(coll.database))).hexdigest() if doc else None
