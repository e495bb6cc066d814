"""What an export's end tells the outside: a signed webhook to its callbacks and a mail to its
addresses (queued as notifications, delivered at once when possible, retried otherwise)."""
from __future__ import annotations

from common.models import SUCCESS, Export
from common.notify import deliver_due, queue_mail, queue_webhook
from common.signing import export_url


def announce(export: Export, callbacks: list[str] | None = None, mails: list[str] | None = None) -> None:
    """Queue and try to deliver the end-of-export notifications (to ``callbacks``/``mails``, by
    default the export's own). Never raises."""
    import logging

    try:
        ok = export.state == SUCCESS
        url = export_url(str(export.id)) if ok else None
        event = "export.succeeded" if ok else "export.failed"
        payload = {"event": event, "id": str(export.id), "job": export.job_name, "state": export.state,
                   "rows": export.rows_done, "url": url}
        for target in export.callback_urls if callbacks is None else callbacks:
            queue_webhook(target, event, payload)
        subject = f"downcluster export {export.id} of {export.job_name}: {export.state}"
        lines = [f"Export {export.id} of job {export.job_name} ({export.format}) ended {export.state}.",
                 f"Rows: {export.rows_done}", f"Bytes: {export.bytes}"]
        lines.append(f"Download (signed link): {url}" if ok else f"Error: {export.error or '-'}")
        for address in export.mails if mails is None else mails:
            queue_mail(address, event, subject, "\n".join(lines) + "\n")
        deliver_due()
    except Exception as exc:  # notifications must never break the export's own outcome
        logging.getLogger(__name__).warning("export %s: notifications not queued: %s", export.id, type(exc).__name__)
