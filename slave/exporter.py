"""Running an export on a worker: claim it, stream its rows into a GridFS file in ``export_fs``
(bounded memory: one row at a time; Excel through a constant-memory temp file), and settle it.

Like a download entry, an export attempt is claimed work (``common.store.claims``): its
worker's id and a heartbeat (``beat_at``, refreshed by a ``claims.Beating`` thread while it
runs) are in the export document; progress writes
check the export is still RUNNING and still ours, so a cancel or a recovery stops it and its
partial file is removed. The file id is written before the upload starts, so whatever a dead
worker left (chunks without a files document) is found and removed by the defender.

``downcluster worker`` runs ``down_export`` entries one at a time in a thread of their own
(``slave/worker/runner.py``): downloads keep their event loop and in-flight budget, exports their thread.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import IO, cast

from bson import ObjectId

from common.config import settings
from common.errors import SourceFailed, ValidationError
from common.exports.events import announce, publish
from common.exports.tabular import CONTENT_TYPES, WRITERS, check_fits, file_name
from common.exports.templates import parse_template
from common.secrets import redact
from common.sentry import capture
from common.store import claims, exports, jobs
from common.store.clock import store_now, utcnow
from common.store.data import drop_export_file, export_source, export_total, export_upload
from common.store.records import ExportRecord

logger = logging.getLogger(__name__)
PROGRESS_ROWS, PROGRESS_SECONDS = 1000, 2.0


class Stopped(Exception):
    """The export was cancelled or recovered while this worker ran it."""


class _Progress:
    def __init__(self, oid: ObjectId, worker_id: str) -> None:
        self.oid, self.worker_id = oid, worker_id
        self.rows, self.last = 0, time.monotonic()

    def write(self) -> None:
        if not exports.progress(self.oid, self.worker_id, self.rows):
            raise Stopped()
        self.last = time.monotonic()
        publish(self.oid)

    def wrap(self, rows):
        for row in rows:
            yield row
            self.rows += 1
            if self.rows % PROGRESS_ROWS == 0 or time.monotonic() - self.last >= PROGRESS_SECONDS:
                self.write()


def run_export(export_id: str, worker_id: str) -> str:
    """Run one attempt of an export; "success", "failed", "retry", "stopped" or "skipped"."""
    try:
        oid = ObjectId(export_id)
    except Exception:
        return "skipped"
    now, file_id = store_now(), ObjectId()  # the store's clock, as the defender's judgement of beat_at
    doc = exports.claim(oid, worker_id, now, settings.EXPORT_MAX_EXEC_TIME, file_id)
    if doc is None:
        return "skipped"  # cancelled, already taken or finished
    publish(oid)
    progress = _Progress(oid, worker_id)
    try:
        with claims.Beating(exports.EXPORT, oid, worker_id, settings.HEARTBEAT_INTERVAL):
            rows, size = _write(doc, file_id, progress, worker_id)
    except Stopped:
        drop_export_file(file_id)
        logger.info("export %s was cancelled or taken over: stopped", export_id)
        return "stopped"
    except Exception as exc:
        drop_export_file(file_id)
        return _failed(doc, worker_id, exc)
    done = store_now()
    if not exports.settle(oid, worker_id, rows, size, done, timedelta(seconds=settings.EXPORT_TTL)):
        # cancelled or recovered at the last moment: the file is not ours to keep
        drop_export_file(file_id)
        return "stopped"
    publish(oid)
    announce(exports.get(oid))
    return "success"


def _write(export: ExportRecord, file_id: ObjectId, progress: _Progress, worker_id: str) -> tuple[int, int]:
    if export.center is not None:  # a download task: its rows come from its caller's source
        from slave.center import write_download_task

        rows, upload = write_download_task(export, file_id, progress.wrap, worker_id)
        progress.write()  # last check: still ours, not cancelled
        upload.close()
        return rows, upload.length
    if export.job is None or not jobs.exists(export.job):
        raise RuntimeError(f"job {export.job_name} no longer exists")
    template = parse_template(export.template)
    check_fits(template, export.format)
    flt = export.rows_filter()
    exports.set_total(export.id, worker_id, export_total(export.job, flt, template))
    publish(export.id)
    name = file_name(f"{export.job_name}-{export.id}", export.format)
    upload = export_upload(file_id, name, {"export": export.id, "contentType": CONTENT_TYPES[export.format]})
    rows_for = export_source(export.job, flt, template, export.format, progress.wrap)
    # the writers only call write(): the upload is file enough for them
    rows = WRITERS[export.format](template, rows_for, cast(IO[bytes], upload))
    progress.write()  # last check: still ours, not cancelled
    upload.close()
    return rows, upload.length


def _failed(export: ExportRecord, worker_id: str, exc: Exception) -> str:
    reason = redact(f"{type(exc).__name__}: {exc}").splitlines()[0][:500]
    final = export.attempts >= settings.EXPORT_MAX_RETRIES or isinstance(
        exc, (ValidationError, SourceFailed)
    )  # a template no longer valid; a source that broke its word through its tries
    delay = settings.EXPORT_RETRY_DELAY
    if isinstance(exc, SourceFailed) and export.center is not None and export.center.v1:
        # a /v1 download task whose source failed runs again, CENTER_RETRY_AFTER apart, as the
        # center its callers used before ran it (CENTER_TASK_RETRIES runs in all)
        final, delay = export.attempts >= settings.CENTER_TASK_RETRIES, settings.CENTER_RETRY_AFTER
    now = utcnow()
    changed = exports.fail(export.id, worker_id, reason, now, final, now + timedelta(seconds=delay))
    logger.warning("export %s attempt %s failed: %s", export.id, export.attempts, reason)
    if not isinstance(exc, (RuntimeError, ValidationError, SourceFailed)):
        capture(exc)
    if changed:
        publish(export.id)
    if final and changed:
        announce(exports.get(export.id))
    return "failed" if final else "retry"
