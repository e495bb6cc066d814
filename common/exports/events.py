"""What an export's changes tell the outside: every change of state or progress is published on
Redis (``downcluster:export:<id>``, read by the WebSocket route of any web process), and its end
sends a signed webhook to its callbacks and a mail to its addresses (queued as notifications,
delivered at once when possible, retried otherwise). Neither carries more than the export's link."""
from __future__ import annotations

import json
import logging
from typing import Sequence

from common.config import settings
from common.notify import deliver_due, queue_form, queue_mail, queue_webhook
from common.signing import center_download_url, center_task_id, export_url, php_query, wecar_token
from common.store import exports
from common.store.clock import iso
from common.store.models import SUCCESS
from common.store.records import ExportRecord

FINAL_STATES = ("SUCCESS", "FAIL", "CANCEL", "EXPIRED")
EVENT_FIELDS = ("state", "rows_done", "rows_total", "bytes", "attempts", "error", "finished_at")


def channel(export_id) -> str:
    return f"downcluster:export:{export_id}"


def snapshot(export: ExportRecord) -> dict:
    """The public part of an export that its events carry (no link: links are asked for)."""
    return {"id": str(export.id), **{k: iso(getattr(export, k)) for k in EVENT_FIELDS}}


def publish(export_id) -> None:
    """Publish the export's current state and progress to whoever listens. Never raises: an
    event lost is made good by the listener's own periodic reading."""
    from common.store.connection import redis_conn

    try:
        export = exports.event_doc(export_id, EVENT_FIELDS)
        if export is not None:
            redis_conn().publish(channel(export_id), json.dumps(snapshot(export)))
    except Exception as exc:
        logging.getLogger(__name__).debug("export %s: event not published: %s", export_id, type(exc).__name__)


def announce(export: ExportRecord | None, callbacks: list[str] | None = None,
             mails: list[str] | None = None) -> None:
    """Queue and try to deliver the end-of-export notifications (to ``callbacks``/``mails``, by
    default the export's own; none for an export removed meanwhile). Never raises."""
    if export is None:
        return
    try:
        ok = export.state == SUCCESS
        url = export_url(str(export.id), settings.EXPORT_NOTICE_URL_TTL) if ok else None
        event = "export.succeeded" if ok else "export.failed"
        payload = {"event": event, "id": str(export.id), "job": export.job_name, "state": export.state,
                   "rows": export.rows_done, "url": url}
        if export.center is not None:  # a download task of the center: its caller knows it by these
            payload |= {"task_id": str(export.id), "project_id": export.project,
                        "name": export.center.name}
        targets = export.callback_urls if callbacks is None else callbacks
        if export.center is not None and export.center.v1:
            _form_callbacks(export, targets, ok)
            targets = []
        for target in targets:
            queue_webhook(target, event, payload)
        subject = f"downcluster export {export.id} of {export.job_name}: {export.state}"
        lines = [f"Export {export.id} of job {export.job_name} ({export.format}) ended {export.state}.",
                 f"Rows: {export.rows_done}", f"Bytes: {export.bytes}"]
        lines.append(f"Download (signed link): {url}" if ok else f"Error: {export.error or '-'}")
        for address in export.mails if mails is None else mails:
            queue_mail(address, event, subject, "\n".join(lines) + "\n")
        deliver_due()
    except Exception as exc:  # notifications must never break the export's own outcome
        logging.getLogger(__name__).warning(
            "export %s: notifications not queued: %s", export.id, type(exc).__name__
        )


def _form_callbacks(export: ExportRecord, targets: Sequence[str], ok: bool) -> None:
    """A /v1 download task's callback as /v1 callers expect it: on success only, a form POST of the
    center's ``app_id``, ``data`` = JSON {task_id, download_url} and ``token`` (``wecar_token``
    under CENTER_APP_SECRET); ``download_url`` is a signed link that needs no token."""
    if not ok:
        return
    url = center_download_url(export.id, settings.EXPORT_NOTICE_URL_TTL)
    data = json.dumps({"task_id": center_task_id(export.id), "download_url": url}, separators=(",", ":"))
    form: dict = {"data": data}
    if settings.CENTER_APP_ID:
        form = {"app_id": settings.CENTER_APP_ID, "data": data}
        form["token"] = wecar_token(form, settings.CENTER_APP_SECRET)
    for target in targets:
        queue_form(target, "export.succeeded", php_query(form))
