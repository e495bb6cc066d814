"""``downcluster archive NAME --before DATE [-o FILE] [--with-tasks]``: save a job's old data and
download logs to a gzip-compressed JSON Lines file, then remove them from MongoDB. Its old data are
the earlier versions of its revisited pages: a page's latest version is never archived nor removed
alone (it is the page). ``--with-tasks`` archives the pages too: the job's final tasks last changed
before DATE (as retention would remove them, ``common.store.retention.final_tasks``), each as a
``"kind": "task"`` line, with every version of its data they name, then removes them with their
data (``remove_tasks``: the data first, then the task, only if it is still final and unchanged),
so no task is left naming data that is gone.

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
from common.store import counts
from common.store import retention as store
from common.store.clock import id_at
from common.store.jobs import named as job_named
from common.store.pages import SHOWN
from common.store.records import DataDoc
from master.exports.dump import data_record
from master.views import as_json

BATCH = 1000


@dataclass
class ArchiveReport:
    data: int = 0
    logs: int = 0
    tasks: int = 0
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


def archive(job_name: str, before: datetime, path: str, with_tasks: bool = False) -> ArchiveReport:
    """Write the job's earlier versions of pages and download logs stored before ``before`` (naive
    UTC) to ``path`` (``with_tasks``: its final tasks changed before it, with their data, too),
    then remove them. An existing file is never overwritten."""
    job = job_named(job_name)
    if os.path.exists(path):
        raise ValidationError(f"{path} exists: archive to a new file")
    cutoff = id_at(before)
    report, data_ids, log_ids = ArchiveReport(), _Ids(), _Ids()
    finals: list[tuple[str, _Ids]] = []  # the tasks written, by final status
    partial = path + ".partial"
    try:
        with open(partial, "xb") as raw, gzip.GzipFile(fileobj=raw, mode="wb") as out:
            for doc, body in store.old_data(job.id, cutoff):
                out.write(json.dumps(_data_record(doc, body), ensure_ascii=False).encode() + b"\n")
                data_ids.add(doc.id)
                report.data += 1
            if with_tasks:
                _write_tasks(out, job.id, before, report, finals)
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
        for final, task_ids in finals:
            for ids in task_ids.batches():
                store.remove_tasks(job.id, final, before, ids)
    except OSError as exc:  # the file could not be written: nothing was removed
        if os.path.exists(partial):
            os.remove(partial)
        raise ValidationError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        if os.path.exists(partial):
            os.remove(partial)
        raise
    finally:
        for kept in (data_ids, log_ids, *(ids for _, ids in finals)):
            kept.close()
    return report


def _write_tasks(out, job_id: ObjectId, before: datetime, report: ArchiveReport,
                 written: list[tuple[str, _Ids]]) -> None:
    """Write the job's final tasks changed before ``before`` and every version of their data;
    the ids of the tasks written go to ``written``, by final status, to remove once the file is
    complete."""
    revisits = job_id in store.revisited()
    for final, tasks in store.final_tasks(job_id, before, counts.span(job_id), revisits):
        if not tasks:
            continue
        if not written or written[-1][0] != final:
            written.append((final, _Ids()))
        for task in tasks:
            record = {"kind": "task", **as_json(task, SHOWN["tasks"], id_key="task_id")}
            out.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
            written[-1][1].add(task.id)
        for data, body in store.data_of_tasks([t.id for t in tasks], id_at(before)):
            out.write(json.dumps(_data_record(data, body), ensure_ascii=False).encode() + b"\n")
            report.data += 1
        report.tasks += len(tasks)


def _data_record(doc: DataDoc, body: bytes) -> dict:
    """One data document as the archive's line: the record of ``data export --format jsonl``."""
    return {"kind": "data", **data_record(doc, body)}
