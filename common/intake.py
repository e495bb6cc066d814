"""Task intake: one URL a line into the job's tasks (status LIVE), in bulk.

Each chunk is numbered from the job's counter: reserve ``seq`` numbers (listed in the job's
reservations while the insert runs, so the dispatcher's cursor cannot pass them), insert,
then drop the reservation (``common.store.tasks``). Duplicates of a (job, url) already stored
are skipped; bad lines are reported with their line number and skipped.

The one intake of the cluster: ``downcluster task add``, the API and generator runs on workers
(``slave/generate.py``) all come through ``add_tasks``; a generator's dry run asks ``preview``,
which says what ``add_tasks`` would do and stores nothing. ``master/intake.py`` re-exports it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator
from urllib.parse import urlsplit

from common.config import settings
from common.errors import ValidationError
from common.store.models import job_named, utcnow
from common.store.tasks import commit, insert_numbered, known_uris, reserve
from common.urls import check_url

CHUNK = 1000
MAX_ERRORS = 1000  # rejected lines reported one by one; the count goes on
HOST_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass
class IntakeReport:
    added: int = 0
    duplicate: int = 0
    rejected: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)


def _reject(report: IntakeReport, number: int, reason: str) -> None:
    report.rejected += 1
    if len(report.errors) < MAX_ERRORS:
        report.errors.append((number, reason))


def parse_entries(lines: Iterable[str], report: IntakeReport, max_length: int,
                  schemes: Iterable[str] | None = None, hosts: bool = False) -> Iterator[tuple[str, str]]:
    """Yield (url, host) of the valid lines; record rejected ones (line number, reason). With
    ``schemes``, only URLs of those schemes pass; with ``hosts``, a line may be ``URL<TAB>HOST``
    (a generator's (url, host) pairs: HOST's workers take the task). Blank and # lines are skipped."""
    allowed = {s.lower() for s in schemes} if schemes is not None else None
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\r\n")
        host = ""
        if hosts and "\t" in text:
            text, _, host = text.partition("\t")
            host = host.strip()
            if host and not HOST_RE.match(host):
                _reject(report, number, f"host must be a host name, got {host[:60]!r}")
                continue
        url = text.strip()
        if not url or url.startswith("#"):
            continue
        try:
            url = check_url(url, max_length)
        except ValidationError as exc:
            _reject(report, number, str(exc))
            continue
        if allowed is not None and urlsplit(url).scheme.lower() not in allowed:
            _reject(report, number, f"scheme {urlsplit(url).scheme.lower()!r} is not one the generator may "
                                    f"emit ({', '.join(sorted(allowed))})")
            continue
        yield url, host


def add_tasks(
    job_name: str,
    lines: Iterable[str],
    host: str = "",
    progress: Callable[[int], None] | None = None,
    schemes: Iterable[str] | None = None,
    hosts: bool = False,
) -> IntakeReport:
    """Add the URLs of ``lines`` to job ``job_name`` (``host``: for every task, unless ``hosts``
    lets a line name its own; ``schemes``: the only schemes accepted)."""
    job = job_named(job_name)
    report = IntakeReport()
    seen: set[str] = set()
    chunk: list[tuple[str, str]] = []  # (URL, its host or "")

    def flush() -> None:
        if not chunk:
            return
        known = known_uris(job.id, [url for url, _ in chunk])
        fresh = [(url, host) for url, host in chunk if url not in known]
        report.duplicate += len(chunk) - len(fresh)
        if fresh:
            first = reserve(job.id, len(fresh))
            try:
                added, dupes = insert_numbered(job.id, fresh, first, now)
            finally:
                commit(job.id, first, len(fresh))
            report.added += added
            report.duplicate += dupes
        if progress:
            progress(len(chunk))
        chunk.clear()

    now = utcnow()
    for url, own in parse_entries(lines, report, settings.MAX_URL_LENGTH, schemes, hosts):
        if url in seen:
            report.duplicate += 1
            continue
        seen.add(url)
        chunk.append((url, own or host))
        if len(chunk) >= CHUNK:
            flush()
    flush()
    return report



def preview(job_name: str, lines: Iterable[str], schemes: Iterable[str] | None = None, hosts: bool = False,
            first: int = 20) -> tuple[IntakeReport, list[tuple[str, str]]]:
    """What ``add_tasks`` would do with ``lines`` (counts, rejected line numbers), and the first
    ``first`` URLs it would add; nothing is stored."""
    job = job_named(job_name)
    report = IntakeReport()
    seen: set[str] = set()
    shown: list[tuple[str, str]] = []
    chunk: list[tuple[str, str]] = []

    def flush() -> None:
        known = known_uris(job.id, [u for u, _ in chunk])
        for url, own in chunk:
            if url in known:
                report.duplicate += 1
                continue
            report.added += 1
            if len(shown) < first:
                shown.append((url, own))
        chunk.clear()

    for url, own in parse_entries(lines, report, settings.MAX_URL_LENGTH, schemes, hosts):
        if url in seen:
            report.duplicate += 1
            continue
        seen.add(url)
        chunk.append((url, own))
        if len(chunk) >= CHUNK:
            flush()
    flush()
    return report, shown
