"""Task intake: one URL a line into the job's tasks (status LIVE), in bulk.

Each chunk is numbered from the job's counter: reserve ``seq`` numbers (listed in the job's
reservations while the insert runs, so the dispatcher's cursor cannot pass them), insert,
then drop the reservation (``common.store.tasks``). Duplicates of a (job, url) already stored
are skipped; bad lines are reported with their line number and skipped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

from common.config import settings
from common.errors import ValidationError
from common.store.models import job_named, utcnow
from common.store.tasks import commit, insert_numbered, known_uris, new_task, reserve
from common.urls import check_url

CHUNK = 1000


@dataclass
class IntakeReport:
    added: int = 0
    duplicate: int = 0
    rejected: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)


def parse_lines(lines: Iterable[str], report: IntakeReport, max_length: int) -> Iterable[str]:
    """Yield valid URLs; record rejected ones (line number, reason). Blank and # lines are skipped."""
    for number, line in enumerate(lines, 1):
        url = line.rstrip("\r\n").strip()
        if not url or url.startswith("#"):
            continue
        try:
            yield check_url(url, max_length)
        except ValidationError as exc:
            report.rejected += 1
            report.errors.append((number, str(exc)))


def add_tasks(
    job_name: str,
    lines: Iterable[str],
    host: str = "",
    progress: Callable[[int], None] | None = None,
) -> IntakeReport:
    job = job_named(job_name)
    report = IntakeReport()
    seen: set[str] = set()
    chunk: list[dict] = []

    def flush() -> None:
        if not chunk:
            return
        known = known_uris(job.id, [d["uri"] for d in chunk])
        fresh = [d for d in chunk if d["uri"] not in known]
        report.duplicate += len(chunk) - len(fresh)
        if fresh:
            first = reserve(job.id, len(fresh))
            try:
                added, dupes = insert_numbered(job.id, fresh, first)
            finally:
                commit(job.id, first, len(fresh))
            report.added += added
            report.duplicate += dupes
        if progress:
            progress(len(chunk))
        chunk.clear()

    now = utcnow()
    for url in parse_lines(lines, report, settings.MAX_URL_LENGTH):
        if url in seen:
            report.duplicate += 1
            continue
        seen.add(url)
        chunk.append(new_task(job.id, url, host, now))
        if len(chunk) >= CHUNK:
            flush()
    flush()
    return report

