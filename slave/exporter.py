"""Running an export on a worker: claim it, stream its rows into a GridFS file in ``export_fs``
(bounded memory: one row at a time; Excel through a constant-memory temp file), and settle it.

Like a download entry, an export attempt is held by one worker: its id and a heartbeat
(``beat_at``, refreshed by a thread while it runs) are in the export document; progress writes
check the export is still RUNNING and still ours, so a cancel or a recovery stops it and its
partial file is removed. The file id is written before the upload starts, so whatever a dead
worker left (chunks without a files document) is found and removed by the defender.

``downcluster worker`` runs ``down_export`` entries one at a time in a thread of their own
(``slave/worker/runner.py``): downloads keep their event loop and in-flight budget, exports their thread.
"""
from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from bson import ObjectId
from pymongo import ReturnDocument

from common.config import settings
from common.errors import ValidationError
from common.store.data import EXPORT_BUCKET, Upload, drop_export_file, export_source, export_total
from common.exports.events import announce, publish
from common.store.models import EXPORT_RUNNING, FAIL, PENDING, SUCCESS, CrawlerDownloadData, Export, Job, store_now, utcnow
from common.secrets import redact
from common.sentry import capture
from common.exports.tabular import CONTENT_TYPES, WRITERS, check_fits
from common.exports.templates import parse_template

logger = logging.getLogger(__name__)
PROGRESS_ROWS, PROGRESS_SECONDS = 1000, 2.0


class Stopped(Exception):
    """The export was cancelled or recovered while this worker ran it."""


class _Progress:
    def __init__(self, oid: ObjectId, worker_id: str) -> None:
        self.oid, self.worker_id = oid, worker_id
        self.coll = Export._get_collection()
        self.rows, self.last = 0, time.monotonic()

    def write(self) -> None:
        held = self.coll.update_one({"_id": self.oid, "state": EXPORT_RUNNING, "worker": self.worker_id},
                                    {"$set": {"rows_done": self.rows}})
        if not held.matched_count:
            raise Stopped()
        self.last = time.monotonic()
        publish(self.oid)

    def wrap(self, rows):
        for row in rows:
            yield row
            self.rows += 1
            if self.rows % PROGRESS_ROWS == 0 or time.monotonic() - self.last >= PROGRESS_SECONDS:
                self.write()


class _Beat(threading.Thread):
    """Refreshes the export's ``beat_at`` every HEARTBEAT_INTERVAL while it runs."""

    def __init__(self, oid: ObjectId, worker_id: str) -> None:
        super().__init__(daemon=True, name="export-beat")
        self.oid, self.worker_id, self.halt = oid, worker_id, threading.Event()

    def run(self) -> None:
        while not self.halt.wait(settings.HEARTBEAT_INTERVAL):
            try:
                Export._get_collection().update_one({"_id": self.oid, "state": EXPORT_RUNNING, "worker": self.worker_id},
                                                    {"$currentDate": {"beat_at": True}})
            except Exception as exc:  # MongoDB away: the defender may recover it; the export then stops
                logger.warning("export heartbeat failed: %s", type(exc).__name__)


def run_export(export_id: str, worker_id: str) -> str:
    """Run one attempt of an export; "success", "failed", "retry", "stopped" or "skipped"."""
    try:
        oid = ObjectId(export_id)
    except Exception:
        return "skipped"
    coll = Export._get_collection()
    now, file_id = store_now(), ObjectId()  # the store's clock, as the defender's judgement of beat_at
    limit = (coll.find_one({"_id": oid}, {"max_exec_time": 1}) or {}).get("max_exec_time") or settings.EXPORT_MAX_EXEC_TIME
    doc = coll.find_one_and_update(
        {"_id": oid, "state": PENDING},
        {"$set": {"state": EXPORT_RUNNING, "worker": worker_id, "started_at": now, "beat_at": now,
                  "deadline_at": now + timedelta(seconds=limit), "file_id": file_id, "rows_done": 0, "error": None},
         "$inc": {"attempts": 1}, "$unset": {"queued_at": 1}},
        return_document=ReturnDocument.AFTER)
    if doc is None:
        return "skipped"  # cancelled, already taken or finished
    publish(oid)
    beat = _Beat(oid, worker_id)
    beat.start()
    progress = _Progress(oid, worker_id)
    try:
        rows, size = _write(doc, file_id, progress, worker_id)
    except Stopped:
        drop_export_file(file_id)
        logger.info("export %s was cancelled or taken over: stopped", export_id)
        return "stopped"
    except Exception as exc:
        drop_export_file(file_id)
        return _failed(doc, worker_id, exc)
    finally:
        beat.halt.set()
    done = store_now()
    settled = coll.update_one(
        {"_id": oid, "state": EXPORT_RUNNING, "worker": worker_id},
        {"$set": {"state": SUCCESS, "rows_done": rows, "rows_total": rows, "bytes": size, "finished_at": done,
                  "expires_at": done + timedelta(seconds=settings.EXPORT_TTL), "beat_at": done}})
    if not settled.modified_count:  # cancelled or recovered at the last moment: the file is not ours to keep
        drop_export_file(file_id)
        return "stopped"
    publish(oid)
    announce(Export.objects.get(id=oid))
    return "success"


def _write(doc: dict, file_id: ObjectId, progress: _Progress, worker_id: str) -> tuple[int, int]:
    if not Job.objects(id=doc["job"]).only("id").first():
        raise RuntimeError(f"job {doc['job_name']} no longer exists")
    template = parse_template(doc.get("template"))
    check_fits(template, doc["format"])
    flt, data = doc.get("filter") or {}, CrawlerDownloadData._get_collection()
    Export._get_collection().update_one({"_id": doc["_id"], "worker": worker_id},
                                        {"$set": {"rows_total": export_total(doc["job"], flt, template)}})
    publish(doc["_id"])
    name = f"{doc['job_name']}-{doc['_id']}.{doc['format']}"
    upload = Upload(data.database, EXPORT_BUCKET, file_id, name, {"export": doc["_id"], "contentType": CONTENT_TYPES[doc["format"]]})
    rows_for = export_source(doc["job"], flt, template, doc["format"], progress.wrap)
    rows = WRITERS[doc["format"]](template, rows_for, upload)
    progress.write()  # last check: still ours, not cancelled
    upload.close()
    return rows, upload.length


def _failed(doc: dict, worker_id: str, exc: Exception) -> str:
    reason = redact(f"{type(exc).__name__}: {exc}").splitlines()[0][:500]
    final = doc["attempts"] >= settings.EXPORT_MAX_RETRIES or isinstance(exc, ValidationError)  # a template no longer valid
    now = utcnow()
    update = {"state": FAIL, "finished_at": now} if final else \
        {"state": PENDING, "retry_at": now + timedelta(seconds=settings.EXPORT_RETRY_DELAY)}
    coll = Export._get_collection()
    changed = coll.update_one({"_id": doc["_id"], "state": EXPORT_RUNNING, "worker": worker_id},
                              {"$set": {**update, "error": reason, "worker": None}})
    logger.warning("export %s attempt %s failed: %s", doc["_id"], doc["attempts"], reason)
    if not isinstance(exc, (RuntimeError, ValidationError)):
        capture(exc)
    if changed.modified_count:
        publish(doc["_id"])
    if final and changed.modified_count:
        announce(Export.objects.get(id=doc["_id"]))
    return "failed" if final else "retry"
