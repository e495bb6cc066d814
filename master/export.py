"""``downcluster data export``: stream a job's stored data as CSV or JSON Lines.

Documents that their task names (``common.data.visible``) are read in ``_id`` order with a small cursor batch, one at a time, so memory stays
bounded whatever the job's size. JSONL keeps the body byte-exact (base64) next to a decoded
text; CSV carries the decoded text.
"""
from __future__ import annotations

import base64
import csv
import json
from typing import IO, Iterator


from common.data import body_of, gridfs_of, text_of, visible
from common.errors import ValidationError
from common.models import CrawlerDownloadData, job_named

FIELDS = ("task_id", "url", "status_code", "encoding", "hostname", "remote_ip", "add_datetime")


def rows(job_name: str) -> Iterator[tuple[dict, bytes]]:
    job = job_named(job_name)
    coll = CrawlerDownloadData._get_collection()
    fs = gridfs_of(coll.database)
    cursor = coll.find({"job": job.id}, {"requests_body": 0, "requests_headers": 0}).sort("_id", 1).batch_size(200)
    for doc in visible(cursor):
        body = body_of(doc, fs)
        meta = {
            "task_id": str(doc["task"]), "url": doc.get("url"), "status_code": doc.get("status_code"),
            "encoding": doc.get("encoding"), "hostname": doc.get("hostname"), "remote_ip": doc.get("remote_ip"),
            "add_datetime": doc["add_datetime"].isoformat() if doc.get("add_datetime") else None,
        }
        yield meta, body


def export(job_name: str, fmt: str, out: IO[str]) -> int:
    """Write the job's data to ``out``; return the number of documents written."""
    count = 0
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow([*FIELDS, "body"])
        for meta, body in rows(job_name):
            writer.writerow([*(meta[f] for f in FIELDS), text_of(body, meta["encoding"])])
            count += 1
    elif fmt == "jsonl":
        for meta, body in rows(job_name):
            record = {**meta, "body_base64": base64.b64encode(body).decode("ascii"),
                      "body_text": text_of(body, meta["encoding"])}
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    else:
        raise ValidationError(f"format must be csv or jsonl, got {fmt!r}")
    return count
