"""Task intake: one URL a line into the job's tasks (status LIVE), in bulk.

Each chunk is numbered from the job's counter: reserve ``seq`` numbers (listed in the job's
reservations while the insert runs, so the dispatcher's cursor cannot pass them), insert,
then drop the reservation (``common.store.tasks``). Duplicates of a (job, url) already stored
are skipped; bad lines are reported with their line number and skipped.

The one intake of the cluster: ``downcluster task add``, the API and generator runs on workers
(``slave/generate.py``) all come through ``add_tasks``; a generator's dry run asks ``preview``,
which says what ``add_tasks`` would do and stores nothing; the URLs a following job's worker
found on its pages come through ``add_found``, judged by ``common.scope``; a job with
``[sitemaps]`` gets its sitemaps as tasks (``add_sitemaps`` at registration, a robots.txt task per
site of its seeds with ``robots = true``), and what a worker read in them comes through
``add_from_sitemaps``. ``master/intake.py`` re-exports it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Callable, Iterable, Iterator, Mapping
from urllib.parse import urlsplit

from bson import ObjectId

from common.config import settings
from common.errors import ValidationError
from common.jobsettings import Follow, check_sitemaps
from common.scope import refusal
from common.store import counts
from common.store.clock import utcnow
from common.store.jobs import named as job_named
from common.store.known import Filter
from common.store.tasks import NewTask, commit, depths, due_by_lastmod, insert_numbered, known_uris, reserve
from common.urls import check_url

CHUNK = 1000
MAX_ROBOTS = 1000  # robots.txt tasks one add_tasks call adds (the sites of its first seeds)
MAX_ERRORS = 1000  # rejected lines reported one by one; the count goes on
HOST_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
# what a worker read in a sitemap task: (task id, its URL, its depth, pages, sitemaps, {URL: lastmod})
SitemapRead = tuple[ObjectId, str, int, list[str], list[str], dict[str, datetime]]


@dataclass
class IntakeReport:
    added: int = 0
    duplicate: int = 0
    rejected: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)
    refused: int = 0  # found URLs out of the job's scope or past its caps (``add_found``)
    due: int = 0      # stored pages made due by a newer sitemap lastmod (``add_from_sitemaps``)


def _reject(report: IntakeReport, number: int, reason: str) -> None:
    report.rejected += 1
    if len(report.errors) < MAX_ERRORS:
        report.errors.append((number, reason))


def parse_entries(lines: Iterable[str], report: IntakeReport, max_length: int,
                  schemes: Iterable[str] | None = None,
                  worker_hosts: bool = False) -> Iterator[tuple[str, str]]:
    """Yield (url, worker host) of the valid lines; record rejected ones (line number, reason). With
    ``schemes``, only URLs of those schemes pass; with ``worker_hosts``, a line may be
    ``URL<TAB>HOST`` (a generator's (url, host) pairs: HOST's workers take the task). Blank and #
    lines are skipped."""
    allowed = {s.lower() for s in schemes} if schemes is not None else None
    for number, line in enumerate(lines, 1):
        text = line.rstrip("\r\n")
        host = ""
        if worker_hosts and "\t" in text:
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
    worker_host: str = "",
    progress: Callable[[int], None] | None = None,
    schemes: Iterable[str] | None = None,
    worker_hosts: bool = False,
) -> IntakeReport:
    """Add the URLs of ``lines`` to job ``job_name`` (``worker_host``: for every task, unless ``worker_hosts``
    lets a line name its own; ``schemes``: the only schemes accepted)."""
    job = job_named(job_name)
    report = IntakeReport()
    seen: set[str] = set()
    chunk: list[NewTask] = []
    sitemaps = check_sitemaps(dict(job.sitemaps) if job.sitemaps else None)
    robots: dict[str, None] = {}  # the robots.txt of the seeds' sites, read for Sitemap: lines

    def flush() -> None:
        if not chunk:
            return
        _insert(job.id, chunk, report)
        if progress:
            progress(len(chunk))
        chunk.clear()

    for url, own in parse_entries(lines, report, settings.MAX_URL_LENGTH, schemes, worker_hosts):
        if url in seen:
            report.duplicate += 1
            continue
        seen.add(url)
        chunk.append(NewTask(url, own or worker_host))
        if sitemaps is not None and sitemaps.robots and len(robots) < MAX_ROBOTS:
            parts = urlsplit(url)
            robots.setdefault(f"{parts.scheme}://{parts.netloc}/robots.txt")
        if len(chunk) >= CHUNK:
            flush()
    flush()
    if robots:
        _insert(job.id, [NewTask(u, "", 0, None, "robots") for u in robots], IntakeReport())
    return report


def add_sitemaps(job_id: ObjectId, urls: Iterable[str]) -> IntakeReport:
    """Add the sitemaps ``urls`` (a job's ``[sitemaps] urls``, checked) as its sitemap tasks; one
    the job has is left as it is."""
    report = IntakeReport()
    _insert(job_id, [NewTask(u, "", 0, None, "xml") for u in dict.fromkeys(urls)], report)
    return report


def _insert(job_id: ObjectId, chunk: list[NewTask], report: IntakeReport, room: int | None = None,
            found: bool = False) -> int:
    """Store the tasks of ``chunk`` the job has no task for yet (the first ``room`` of them, if
    given; the rest refused), numbered; returns how many were added. ``found``: URLs found on
    pages or in sitemaps (a crawl's frontier), judged first by the job's filter in Redis."""
    fresh = _unknown(job_id, chunk, known := Filter(job_id, found))
    report.duplicate += len(chunk) - len(fresh)
    if room is not None and len(fresh) > room:
        report.refused += len(fresh) - room
        fresh = fresh[:max(room, 0)]
    if not fresh:
        return 0
    first = reserve(job_id, len(fresh))
    try:
        added, dupes = insert_numbered(job_id, fresh, first, utcnow())
    finally:
        commit(job_id, first, len(fresh))
    if added == len(fresh):  # each has its task now (with any refused, which is unknown: none)
        known.remember([t.uri for t in fresh])
    report.added += added
    report.duplicate += dupes
    return added


def _unknown(job_id: ObjectId, chunk: list[NewTask], known: Filter) -> list[NewTask]:
    """The tasks of ``chunk`` whose URL the job has no task for: those the filter in Redis knows
    are left out first (``common.store.known``), the rest read in MongoDB (the truth), and what
    MongoDB knows is added to the filter."""
    hits = known.read([t.uri for t in chunk])
    asked = [t.uri for t in chunk if t.uri not in hits]
    stored = known_uris(job_id, asked) if asked else set()
    known.remember(list(stored))
    return [t for t in chunk if t.uri not in hits and t.uri not in stored]


def _judged(url: str, seen: set[str], report: IntakeReport, follow: Follow | None, from_url: str,
            depth: int) -> str | None:
    """A URL found on a page or read in a sitemap, checked as any line (``check_url``), taken once
    per call (``seen``) and, for a following job, judged by its scope from ``from_url`` at
    ``depth``: the URL to add, or None (counted in ``report``). A URL refused from one page is
    judged again from the next that links to it (shallower, or from another site)."""
    try:
        url = check_url(url, settings.MAX_URL_LENGTH)
    except ValidationError:
        report.rejected += 1
        return None
    if url in seen:
        report.duplicate += 1
        return None
    if follow is not None and refusal(follow, from_url, url, depth):
        report.refused += 1  # (not seen: another page of the call may be shallower, or in scope)
        return None
    seen.add(url)
    return url


def add_found(job_id: ObjectId, follow: Follow, pages: list[tuple[ObjectId, str, list[str]]],
              carried: Mapping[ObjectId, int] | None = None) -> IntakeReport:
    """Add the URLs found on stored pages of a following job: ``pages`` are (task id, task URL,
    URLs found on its page); ``carried``: depths of those pages their entry's lease carried (the
    others are read from their tasks: one read). Each URL is checked as any line
    (``check_url``), judged against its page's task URL (``common.scope.refusal``) at the
    page's depth + 1, and added with that
    ``depth`` and its page as ``parent`` (the first page that found it, when several did),
    unless the job has it; past ``max_pages`` (the job's tasks, from its kept counts) the rest is
    refused. Several writers adding at once may each take the room they read: the job may pass
    ``max_pages`` by at most what they add together in one call."""
    report = IntakeReport()
    carried = carried or {}
    unknown = [task_id for task_id, _, urls in pages if urls and task_id not in carried]
    deep = {**carried, **(depths(unknown) if unknown else {})}
    room = follow.max_pages - sum(counts.of_jobs([job_id]).get(job_id, {}).values())
    seen: set[str] = set()
    chunk: list[NewTask] = []
    for task_id, page_url, urls in pages:
        depth = deep.get(task_id, 0) + 1
        for url in urls:
            if room <= 0:
                report.refused += 1
                continue
            taken = _judged(url, seen, report, follow, page_url, depth)
            if taken is None:
                continue
            chunk.append(NewTask(taken, "", depth, task_id))
            if len(chunk) >= CHUNK:
                room -= _insert(job_id, chunk, report, room, found=True)
                chunk.clear()
    if chunk and room > 0:
        _insert(job_id, chunk, report, room, found=True)
    return report


def add_from_sitemaps(job_id: ObjectId, follow: Follow | None, read: list[SitemapRead]) -> IntakeReport:
    """Add what a worker read in a job's sitemap tasks: ``read`` are (task id, its URL, its
    depth, page URLs, sitemap URLs, {URL: lastmod} to revisit by). Pages become tasks at depth
    0, sitemaps sitemap tasks one index deeper, both with the sitemap as ``parent``, each
    checked as any line (``check_url``) and, for a following job, judged by its scope against
    the sitemap's URL and kept within its ``max_pages`` (as ``add_found``). A stored page (or
    sitemap) whose lastmod is newer than its last visit is made due now."""
    report = IntakeReport()
    stamped: dict[str, datetime] = {}
    room = None
    if follow is not None:  # the job's tasks, from its kept counts
        room = follow.max_pages - sum(counts.of_jobs([job_id]).get(job_id, {}).values())
    seen: set[str] = set()
    chunk: list[NewTask] = []
    for task_id, sitemap_url, depth, pages, sitemaps, lastmods in read:
        for url, new in [*((u, NewTask(u, "", 0, task_id)) for u in pages),
                         *((u, NewTask(u, "", depth + 1, task_id, "xml")) for u in sitemaps)]:
            taken = _judged(url, seen, report, follow, sitemap_url, 0)
            if taken is None:
                continue
            if taken in lastmods:
                stamped[taken] = lastmods[taken].astimezone(timezone.utc).replace(tzinfo=None)
            chunk.append(replace(new, uri=taken))
            if len(chunk) >= CHUNK:
                added = _insert(job_id, chunk, report, None if room is None else max(room, 0), True)
                room = None if room is None else room - added
                chunk.clear()
    if chunk:
        _insert(job_id, chunk, report, None if room is None else max(room, 0), True)
    if stamped:
        report.due = due_by_lastmod(job_id, stamped)
    return report


def preview(job_name: str, lines: Iterable[str], schemes: Iterable[str] | None = None,
            worker_hosts: bool = False, first: int = 20) -> tuple[IntakeReport, list[tuple[str, str]]]:
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

    for url, own in parse_entries(lines, report, settings.MAX_URL_LENGTH, schemes, worker_hosts):
        if url in seen:
            report.duplicate += 1
            continue
        seen.add(url)
        chunk.append((url, own))
        if len(chunk) >= CHUNK:
            flush()
    flush()
    return report, shown
