"""``downcluster data export``: stream a job's stored data as CSV, JSON Lines or Excel.

Without a template, CSV and JSON Lines carry every document whole (JSON Lines keeps the body
byte-exact, base64); with a template, or as Excel, the file is what the export center writes
(``common/exports/tabular.py``) for the same template and filter.

Documents that their task names (``common.store.fence.visible``) are read in ``_id`` order with a
small cursor batch, one at a time, so memory stays bounded whatever the job's size. JSONL keeps
the body byte-exact (base64) next to a decoded text; CSV carries the decoded text, its cells
neutralised where a spreadsheet would run them (``common.exports.tabular.csv_cell``).
"""
from __future__ import annotations

import base64
import csv
import io
import json
from typing import IO, Iterator

from common.errors import ValidationError
from common.exports.tabular import WRITERS, csv_row
from common.store import jobs
from common.store.clock import iso
from common.store.data import documents, export_source, text_of
from common.store.records import NO_FILTER, DataDoc, ExportFilter

FIELDS = ("task_id", "url", "status_code", "encoding", "hostname", "remote_ip", "add_datetime", "version")


def data_meta(doc: DataDoc) -> dict:
    """A data document's fields as every whole-document export writes them (CSV's columns, the
    JSON Lines record's and the archive's): times as RFC 3339 with "Z"."""
    return {
        "task_id": str(doc.task),
        "url": doc.url,
        "status_code": doc.status_code,
        "encoding": doc.encoding,
        "hostname": doc.hostname,
        "remote_ip": doc.remote_ip,
        "add_datetime": iso(doc.add_datetime),
        "version": doc.version or 1,
    }


def data_record(doc: DataDoc, body: bytes) -> dict:
    """A data document whole, as one JSON Lines record: its fields, the response headers and the
    body byte-exact (base64) next to its decoded text."""
    return {**data_meta(doc), "response_headers": dict(doc.response_headers),
            "body_base64": base64.b64encode(body).decode("ascii"),
            "body_text": text_of(body, doc.encoding)}


def rows(job_name: str, flt: ExportFilter = NO_FILTER) -> Iterator[tuple[dict, bytes]]:
    """(``data_meta``, body) of each of the job's data documents the filter keeps, oldest first."""
    for doc, body in _documents(job_name, flt):
        yield data_meta(doc), body


def _documents(job_name: str, flt: ExportFilter) -> Iterator[tuple[DataDoc, bytes]]:
    yield from documents(jobs.named(job_name).id, flt)


def export(job_name: str, fmt: str, out: IO[bytes], template: str = "", flt: dict | None = None) -> int:
    """Write the job's data to the binary ``out``; return the number of documents written."""
    from master.exports.service import check

    checked = check(job_name, fmt, template, flt)
    if template or fmt in ("xlsx", "warc"):
        source = export_source(checked.job.id, checked.filter, checked.template, fmt)
        return WRITERS[fmt](checked.template, source, out)
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    try:
        return _whole_documents(job_name, fmt, checked.filter, text)
    finally:
        text.detach()


def _whole_documents(job_name: str, fmt: str, flt: ExportFilter, out: IO[str]) -> int:
    count = 0
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow([*FIELDS, "body"])
        for meta, body in rows(job_name, flt):
            writer.writerow(csv_row([*(meta[f] for f in FIELDS), text_of(body, meta["encoding"])]))
            count += 1
    elif fmt == "jsonl":
        for doc, body in _documents(job_name, flt):
            out.write(json.dumps(data_record(doc, body), ensure_ascii=False) + "\n")
            count += 1
    else:
        raise ValidationError(f"format must be csv, jsonl or xlsx, got {fmt!r}")
    return count
