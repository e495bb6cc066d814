"""The records of the log database: what is appended and never changed (download, dispatch and
alert logs, rejected registrations, generator runs), each converted to and from its document
here, as ``common/store/records.py`` does for the rest (its ``Record``: see there).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bson import ObjectId

from common.store.records import Record, generated


@dataclass(frozen=True, slots=True)
class DownloadLog(Record):
    """One download attempt (``crawler_download_log``, log database)."""

    id: ObjectId
    job: ObjectId | None = None
    task: ObjectId | None = None
    lease: str | None = None
    status: str | None = None
    requests_size: int = 0
    response_size: int = 0
    failed_reason: str | None = None
    downloads_hostname: str | None = None
    spend_time: int = 0
    coalesced_from: ObjectId | None = None
    not_modified: str | None = None
    fetched_at: datetime | None = None
    add_datetime: datetime | None = None


@dataclass(frozen=True, slots=True)
class GeneratorRun(Record):
    """One generator run (``crawler_generator_log``, log database)."""

    id: ObjectId
    job: ObjectId | None = None
    run: str | None = None
    trigger: str | None = None
    status: str | None = None
    added: int = 0
    duplicate: int = 0
    rejected: int = 0
    lines: int = 0
    errors: Sequence[Mapping[str, Any]] = ()
    bytes: int = 0
    spend_time: int = 0
    hostname: str | None = None
    failed_reason: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    add_datetime: datetime | None = None

    def rejected_lines(self) -> list[tuple[int, str]]:
        """``errors`` as (line number, reason)."""
        return [(int(e.get("line", 0)), str(e.get("reason", ""))) for e in self.errors]


@dataclass(frozen=True, slots=True)
class DispatchLog(Record):
    """One queue entry a dispatcher run wrote, or failed to write (``crawler_dispatch_log``, log
    database): SUCCESS, or FAIL with ``reason``."""

    id: ObjectId
    job: ObjectId | None = None
    status: str | None = None
    queue: str | None = None
    lease: str | None = None
    count: int = 0
    reason: str | None = None
    hostname: str | None = None
    add_datetime: datetime | None = None


@dataclass(frozen=True, slots=True)
class AlertLog(Record):
    """An alert (``crawler_dispatch_alert_log``, log database): ``queue_full``, ``queue_stall``,
    ``generator_fail`` or ``unreadable_entry``, of a job (None: cluster-wide)."""

    id: ObjectId
    job: ObjectId | None = None
    type: str | None = None
    reason: str = ""
    content_bytes: int = 0
    hostname: str | None = None
    add_datetime: datetime | None = None


@dataclass(frozen=True, slots=True)
class RegistrationError(Record):
    """A rejected ``job register`` (``crawler_registration_error_log``, log database)."""

    id: ObjectId
    name: str | None = None
    manifest: str | None = None
    reason: str = ""
    hostname: str | None = None
    project: int | None = None
    actor: str | None = None
    add_datetime: datetime | None = None


generated()
