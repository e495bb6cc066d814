"""``downcluster archive NAME --before DATE [-o FILE]``: save a job's old data and download logs
to a gzip-compressed JSON Lines file, then remove them from MongoDB. Its old data are the earlier
versions of its revisited pages: a page's latest version is never archived nor removed (it is
the page; it goes only with its task, by retention).

Each data line is what ``downcluster data export --format jsonl`` writes (``task_id``, ``url``,
``status_code``, ``encoding``, ``hostname``, ``remote_ip``, ``add_datetime``, ``body_base64``,
``body_text``) plus ``"kind": "data"``; each log line is the download log's fields plus
``"kind": "download_log"``; so any reader of ``data export`` reads the archive (through gzip).
Nothing is removed until the file is complete and closed: the ids written are kept in a temporary
file (bounded memory) and removed afterwards, each GridFS body with its document. A data
document no task names is not archived (the defender removes such orphans anyway).
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from dataclasses import dataclass
from datetime import datetime

from bson import ObjectId

from common.errors import ValidationError
from common.store import retention as store
from common.store.models import id_at, job_named
from common.store.pages import SHOWN
from common.store.records import DataDoc
from master.exports.dump import data_record
from master.views import as_json

BATCH = 1000


@dataclass
class ArchiveReport:
    data: int = 0
    logs: int = 0
    bytes: int = 0


class _Ids:
    """ObjectIds kept in a temporary file, 12 bytes each, read back in batches."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()

    def add(self, oid: ObjectId) -> None:
        self.file.write(oid.binary)

    def batches(self):
        self.file.seek(0)
        while chunk := self.file.read(12 * BATCH):
            yield [ObjectId(chunk[i:i + 12]) for i in range(0, len(chunk), 12)]

    def close(self) -> None:
        self.file.close()


def archive(job_name: str, before: datetime, path: str) -> ArchiveReport:
    """Write the job's earlier versions of pages and download logs stored before ``before`` (naive
    UTC) to ``path``, then remove them. An existing file is never overwritten."""
    job = job_named(job_name)
    if os.path.exists(path):
        raise ValidationError(f"{path} exists: archive to a new file")
    cutoff = id_at(before)
    report, data_ids, log_ids = ArchiveReport(), _Ids(), _Ids()
    partial = path + ".partial"
    try:
        with open(partial, "xb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as out:
            for doc, body in store.old_data(job.id, cutoff):
                out.write(json.dumps(_data_record(doc, body), ensure_ascii=False).encode() + b"\n")
                data_ids.add(doc.id)
                report.data += 1
            for log in store.old_logs(job.id, cutoff):
                record = {"kind": "download_log", **as_json(log, SHOWN["download"], id_key="_id")}
                out.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
                log_ids.add(log.id)
                report.logs += 1
            out.flush()
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, path)  # complete: only now is anything removed
        report.bytes = os.path.getsize(path)
        for ids in data_ids.batches():
            store.remove_data(ids)
        for ids in log_ids.batches():
            store.remove_logs(ids)
    except OSError as exc:  # the file could not be written: nothing was removed
        if os.path.exists(partial):
            os.remove(partial)
        raise ValidationError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    finally:
        data_ids.close()
        log_ids.close()
    return report


def _data_record(doc: DataDoc, body: bytes) -> dict:
    """One data document as the archive's line: the record of ``data export --format jsonl``."""
    return {"kind": "data", **data_record(doc, body)}
