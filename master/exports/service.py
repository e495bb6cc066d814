"""The export center: request (checked, de-duplicated, queued on ``down_export``), show, list,
link, cancel; and ``tend``, run by every dispatcher: recover exports whose worker died (the
defender's rules), send again those whose entry was lost or whose retry is due, expire old
files, deliver due notifications.

Who may see what: an export belongs to the token that requested it, by the token's id
(``owner``), never by its name: a new token given a revoked one's name owns nothing of it. An
analyst sees its own exports and those of the jobs it is granted (``downcluster token grant``), an
admin all; to anyone else an export does not exist (404).

De-duplication: the MD5 of the canonical (job, format, template, filter) finds an earlier export of
the same owner that is PENDING, RUNNING, or SUCCESS and younger than EXPORT_DEDUP_WINDOW; that one
is returned (``deduplicated``) and the new request's callback and mails join it. Requests of two
tokens never join: each gets an export of its own, so a callback or mail is only ever sent a link to
an export its requester owns.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from bson import ObjectId
from redis import Redis

from common.config import settings
from common.errors import Conflict, Forbidden, NotFound, ValidationError
from common.exports.events import publish
from common.exports.tabular import check_fits
from common.exports.templates import parse_template
from common.notify import check_callback, check_mail, deliver_due
from common.queue.names import EXPORT_QUEUE
from common.queue.rqbridge import entry_exists, export_entry_id, push_export, rq_queue
from common.signing import export_url
from common.store import exports, projects
from common.store.clock import iso, store_now, utcnow
from common.store.control import Token
from common.store.control_models import ADMIN
from common.store.data import drop_export_file
from common.store.models import EXPORT_FORMATS, EXPORT_RUNNING, PENDING, SUCCESS
from common.store.records import ExportFilter, ExportRecord
from master import access
from master.views import object_id


@dataclass
class Requested:
    export: ExportRecord
    deduplicated: bool


RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)$")


DATE = re.compile(r"^\d{4}-\d\d-\d\d$")


def parse_time(value: Any, what: str, plain_date: bool = False) -> datetime | None:
    """An RFC 3339 date-time (``2026-11-01T00:00:00Z``; the API's ``format: date-time``) as naive
    UTC; with ``plain_date`` (the command line's options) a date alone too: its midnight UTC. A
    time already read (``datetime``) is returned as it is."""
    if value is None or isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not (RFC3339.match(value) or plain_date and DATE.match(value)):
        raise ValidationError(f"{what}: {str(value)[:40]!r} is not an RFC 3339 date-time "
                              f"(like 2026-11-01T00:00:00Z{' or 2026-11-01' if plain_date else ''})")
    text = (value + "T00:00:00Z" if DATE.match(value) else value).upper().replace("Z", "+00:00")
    if text[17:19] == "60":  # a leap second: the last instant of its minute
        text = text[:17] + "59.999999" + text[19:].lstrip(".0123456789")
    try:
        stamp = datetime.fromisoformat(text)
    except ValueError:
        raise ValidationError(f"{what}: {value[:40]!r} is not a date-time") from None
    if stamp.tzinfo is not None:
        stamp = stamp.astimezone(timezone.utc).replace(tzinfo=None)
    return stamp


def check_filter(raw: Any) -> ExportFilter:
    """{"status": [HTTP status codes], "since", "until", "versions"} (a request's, checked) -> the
    filter (codes as ints, naive UTC; ``versions`` "latest" by default): the one place one is made."""
    raw = raw or {}
    if not isinstance(raw, dict) or set(raw) - {"status", "since", "until", "versions"}:
        raise ValidationError("filter takes only status, since, until and versions")
    if raw.get("versions") not in (None, "latest", "all"):
        raise ValidationError('filter.versions must be "latest" or "all"')
    codes = []
    for code in raw.get("status") or []:
        text = str(code) if isinstance(code, (int, str)) and not isinstance(code, bool) else ""
        if not text.isdigit() or not 100 <= int(text) <= 599:
            raise ValidationError(f"filter.status: {str(code)[:20]!r} is not an HTTP status code")
        codes.append(int(text))
    since, until = (parse_time(raw.get(key), f"filter.{key}") or None for key in ("since", "until"))
    if since and until and since >= until:
        raise ValidationError("filter: since must be before until")
    return ExportFilter(tuple(sorted(set(codes))), since, until, raw.get("versions") == "all")


def digest(job: str, fmt: str, template_canonical: dict, flt: ExportFilter) -> str:
    canonical = json.dumps(
        {
            "job": job,
            "format": fmt,
            "template": template_canonical,
            "filter": {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in flt.to_doc().items()},
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.md5(canonical.encode()).hexdigest()


@dataclass
class Checked:
    """An export request checked (what a synchronous download writes at once)."""
    job: Any
    format: str
    template: Any
    filter: ExportFilter


def check(job_name: Any, fmt: Any, template: Any = "", flt: Any = None,
          token: Token | None = None) -> Checked:
    """The request checked, for ``token`` (None: the command line): a job of a project it does not
    hold does not exist."""
    if not isinstance(job_name, str):
        raise ValidationError("job must be a string")
    job = access.job(job_name, token)
    if fmt not in EXPORT_FORMATS:
        raise ValidationError(f"format must be one of {', '.join(EXPORT_FORMATS)}, got {str(fmt)[:20]!r}")
    if template is not None and not isinstance(template, str):
        raise ValidationError("template must be TOML or JSON text")
    if fmt == "warc" and template:
        raise ValidationError("a WARC export takes no template: it carries every stored page whole")
    parsed = parse_template(template)
    check_fits(parsed, fmt)
    return Checked(job, fmt, parsed, check_filter(flt))


_sync_slots: list[threading.BoundedSemaphore] = []
_slots_lock = threading.Lock()


def sync_slots() -> threading.BoundedSemaphore:
    """The synchronous downloads this process writes at once (EXPORT_SYNC_SLOTS), shared by the
    export center's and the download center's synchronous routes."""
    with _slots_lock:
        if not _sync_slots:
            _sync_slots.append(threading.BoundedSemaphore(settings.EXPORT_SYNC_SLOTS))
        return _sync_slots[0]


def check_exec_time(value: Any) -> int | None:
    if value is None:
        return None
    limit = settings.EXPORT_MAX_EXEC_TIME_LIMIT
    if isinstance(value, bool) or not isinstance(value, int) or not 10 <= value <= limit:
        raise ValidationError(f"max_exec_time must be whole seconds from 10 to {limit}")
    return value


def request(
    redis: Redis,
    job_name: Any,
    fmt: Any,
    template: Any = "",
    flt: Any = None,
    callback_url: Any = None,
    mails: Any = (),
    requested_by: str = "",
    max_exec_time: Any = None,
    owner: Any = None,
    token: Token | None = None,
) -> Requested:
    """Check and queue an export for ``owner`` (a token's id; None: the command line), or return
    the identical one of the same owner already underway or fresh. With ``token`` (the API), it
    is the requester: its name, id and projects are used."""
    if token is not None:
        requested_by, owner = token.name, token.id
    checked = check(job_name, fmt, template, flt, token)
    job, parsed, cleaned = checked.job, checked.template, checked.filter
    max_exec_time = check_exec_time(max_exec_time)
    callbacks = [check_callback(callback_url)] if callback_url else []
    if isinstance(mails, str) or not isinstance(mails, (list, tuple)) or len(mails) > 20:
        raise ValidationError("mails must be a list of at most 20 addresses")
    mails = [check_mail(m) for m in mails]
    key = digest(job.name, fmt, parsed.canonical(), cleaned)
    with redis.lock(f"downcluster:export:dedup:{key}", timeout=30, blocking_timeout=30):
        now = utcnow()
        earlier = exports.earlier(key, now, timedelta(seconds=settings.EXPORT_DEDUP_WINDOW), owner)
        if earlier is not None:
            _join(earlier, callbacks, mails)
            return Requested(earlier, True)
        export = exports.add(ExportRecord(
            id=ObjectId(), job=job.id, job_name=job.name, format=fmt, template=template or "",
            filter=cleaned.to_doc(), digest=key, callback_urls=callbacks, mails=mails,
            requested_by=requested_by, owner=owner, project=access.project_of(job), created_at=now,
            retry_at=now, max_exec_time=max_exec_time))
    push(redis, export)
    return Requested(export, False)


def _join(export: ExportRecord, callbacks: list[str], mails: list[str]) -> None:
    """Add a de-duplicated request's targets; if the export already ended, tell them now."""
    if not callbacks and not mails:
        return
    exports.join(export.id, callbacks, mails)
    if export.state == SUCCESS:
        from common.exports.events import announce

        announce(export, callbacks, mails)


def push(redis: Redis, export: ExportRecord) -> None:
    """Queue an export's entry on down_export (a real rq job: a plain `rq worker down_export` runs it)."""
    push_export(redis, EXPORT_QUEUE, str(export.id),
                (export.max_exec_time or settings.EXPORT_MAX_EXEC_TIME) + 300)
    exports.mark_queued(export.id, utcnow())


def submit(redis: Redis, export: ExportRecord, dedup: bool = False) -> ExportRecord:
    """Store a new export (of a job, or a download task of the center) and queue it; with
    ``dedup``, the newest one of the same owner and digest underway, or done within
    EXPORT_DEDUP_WINDOW, is answered instead and nothing is stored."""
    if dedup:
        window = timedelta(seconds=settings.EXPORT_DEDUP_WINDOW)
        same = exports.earlier(export.digest, utcnow(), window, export.owner)
        if same is not None:
            return same
    exports.add(export)
    push(redis, export)
    return export


def delete(redis: Redis, export: ExportRecord) -> None:
    """Remove an export for good: stopped if underway (its entry taken off the queue; a running
    worker stops at its next progress write), its document and its file removed, listeners told."""
    if export.state in (PENDING, EXPORT_RUNNING):
        exports.cancel(export.id, utcnow())
        rq_queue(EXPORT_QUEUE, redis).remove(export_entry_id(export.id))
    exports.remove(export.id)
    drop_export_file(export.file_id)
    publish(export.id)


def owns(token: Token, export: ExportRecord) -> bool:
    """Whether ``token`` requested ``export`` (by id; an export stored before owners counts by
    name, if it is not older than the token: see ``common.store.exports.Viewer``)."""
    if export.owner is not None:
        return bool(export.owner == token.id)
    since = token.add_datetime
    made = export.created_at
    return export.requested_by == token.name and (since is None or (made is not None and made >= since))


def may_see(token: Token | None, export: ExportRecord) -> bool:
    """None is the operator at the command line, who sees everything; a user or analyst sees the
    exports of its projects that it requested or whose job it was granted, and every download task
    of the general download center of a project it holds: the systems sharing a project share its
    tasks, on every door (/v1, the task's file and link, its WebSocket)."""
    if token is None or token.role == ADMIN:
        return True
    if not access.holds(token, export.project):
        return False
    return export.center is not None or owns(token, export) or export.job_name in token.jobs


def get(export_id: Any, token: Token | None = None) -> ExportRecord:
    try:
        export = exports.get(object_id(export_id))
    except ValidationError:  # not an id: no such export
        export = None
    if export is None or not may_see(token, export):
        raise NotFound(f"no export {str(export_id)[:40]!r}")
    return export


def describe(export: ExportRecord, ttl: int | None = None) -> dict:
    return {
        "id": str(export.id),
        "job": export.job_name,
        "format": export.format,
        "state": export.state,
        "rows_done": export.rows_done,
        "rows_total": export.rows_total,
        "bytes": export.bytes,
        "attempts": export.attempts,
        "error": export.error,
        "url": export_url(str(export.id), ttl) if export.state == SUCCESS else None,
        "requested_by": export.requested_by,
        "project": export.project,
        "max_exec_time": export.max_exec_time or settings.EXPORT_MAX_EXEC_TIME,
        "created_at": iso(export.created_at),
        "finished_at": iso(export.finished_at),
        "expires_at": iso(export.expires_at),
    }


def listing(job_name: str | None = None, limit: int = 50, token: Token | None = None) -> list[ExportRecord]:
    viewer = None
    if token is not None and token.role != ADMIN:
        viewer = exports.Viewer(token.id, token.name, token.add_datetime, list(token.jobs),
                                list(token.projects), projects.default_id())
    return exports.listing(job_name, limit, viewer)


def check_ttl(ttl: Any) -> int:
    limit = settings.EXPORT_URL_MAX_TTL
    if ttl is None:
        return settings.EXPORT_URL_TTL
    if isinstance(ttl, bool) or not isinstance(ttl, int) or not 1 <= ttl <= limit:
        raise ValidationError(f"ttl must be whole seconds from 1 to {limit} (EXPORT_URL_MAX_TTL)")
    return ttl


def link(export_id: Any, ttl: int | None = None, token: Token | None = None) -> tuple[str, datetime]:
    """A signed link to a finished export's file and when it ends (``ttl`` seconds, default
    EXPORT_URL_TTL, at most EXPORT_URL_MAX_TTL)."""
    export = get(export_id, token)
    seconds = check_ttl(ttl)
    if export.state != SUCCESS:
        raise Conflict(f"export {export_id} is {export.state}: only a SUCCESS export has a file")
    return export_url(str(export.id), seconds), utcnow() + timedelta(seconds=seconds)


def cancel(redis: Redis, export_id: Any, token: Token | None = None) -> ExportRecord:
    """PENDING or RUNNING -> CANCEL (a running worker sees it at its next progress write, stops
    and removes its partial file)."""
    export = get(export_id, token)
    if not exports.cancel(export.id, utcnow()):
        raise Conflict(
            f"export {export_id} is {export.state}: only PENDING or RUNNING exports can be cancelled"
        )
    rq_queue(EXPORT_QUEUE, redis).remove(export_entry_id(export.id))
    publish(export.id)
    return exports.get(export.id) or export


def retry(redis: Redis, export_id: Any, token: Token | None = None) -> ExportRecord:
    """A FAIL export back to PENDING by hand, its attempts counted afresh, and queued again."""
    export = get(export_id, token)
    if token is not None and token.role != ADMIN and not owns(token, export):
        raise Forbidden("only the export's requester or an admin may retry it")
    if not exports.retry(export.id, utcnow()):
        raise Conflict(f"export {export_id} is {export.state}: only a FAIL export can be retried")
    export = exports.get(export.id) or export
    push(redis, export)
    publish(export.id)
    return export


# --- tending (every dispatcher run) ------------------------------------------------------

@dataclass
class TendReport:
    recovered: int = 0
    overran: int = 0
    sent: int = 0
    expired: int = 0
    notified: int = 0


def _stopped(export: ExportRecord, final: bool) -> None:
    """An attempt was taken from its worker: remove its file, tell listeners (and, if it is
    final, the export's callbacks and mails)."""
    drop_export_file(export.file_id)
    publish(export.id)
    if final:
        from common.exports.events import announce

        announce(exports.get(export.id))


def tend(redis: Redis) -> TendReport:
    """Recover, resend, expire, notify, in that order. An error stops the rest and raises; the
    dispatcher runs this as a chore (master/maintenance.py), which logs it and goes on."""
    report = TendReport()
    now = store_now()  # the clock the exporter stamps beat_at with
    for stopped, final in exports.recover_dead(now):
        report.recovered += 1
        _stopped(stopped, final)
    # over its time limit: stopped and retried even if its worker still beats (it finds the
    # export no longer its own at its next progress write and stops); a recovery, as a death
    for stopped, final in exports.stop_overrun(now, settings.EXPORT_MAX_EXEC_TIME):
        report.overran += 1
        _stopped(stopped, final)
    for due in exports.due(now):
        if due.queued_at and entry_exists(redis, export_entry_id(due.id)):
            continue  # its entry waits in the queue
        export = exports.get(due.id)
        if export is not None:  # not removed since
            push(redis, export)
            report.sent += 1
    for expired in exports.expire(now, timedelta(seconds=settings.EXPORT_TTL)):
        drop_export_file(expired.file_id)
        report.expired += 1
        publish(expired.id)
    report.notified = deliver_due()
    return report

