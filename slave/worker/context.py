"""What an entry needs to know of its job: the job, its downloader and settings (cached a few
seconds, so a busy worker reads them once per CONTEXT_TTL, not once per entry), and the limits
every download runs under."""
from __future__ import annotations

import time
from dataclasses import dataclass

from bson import ObjectId

from common.config import settings
from common.jobsettings import Follow, Sitemaps, check_follow, check_sitemaps
from common.secrets import remember, secret_header_values
from common.store import jobs
from common.store.records import JobSettings
from slave.download.engines.base import Limits

CONTEXT_TTL = 5.0   # seconds a job's settings are reused between entries


@dataclass
class JobContext:
    job_id: ObjectId
    name: str
    status: str
    download_id: ObjectId | None
    language: str  # the downloader type: python, shell or none (the built-in engine)
    code: str
    engine: str
    max_retry_times: int
    settings: JobSettings
    supported: bool = True  # its downloader type's is_support (an administrator may disable a language)
    follow: Follow | None = None  # the job's [follow]: its pages are read for links, the links followed
    sitemaps: Sitemaps | None = None  # the job's [sitemaps]: its sitemap tasks are read as sitemaps
    project: int | None = None  # its project: requests are coalesced only within one


_contexts: dict[ObjectId, tuple[float, JobContext | None]] = {}
MAX_CONTEXTS = 1024  # above it stale entries go: holds at most this or the jobs read in the last CONTEXT_TTL


def load_context(job_id: ObjectId) -> JobContext | None:
    """The job, its downloader and settings (None if the job is gone), cached CONTEXT_TTL s."""
    hit = _contexts.get(job_id)
    if hit and time.monotonic() - hit[0] < CONTEXT_TTL:
        return hit[1]
    job = jobs.context(job_id)
    ctx = None
    if job is not None:
        conf = job.settings.resolved(settings)  # every setting set: ``or 0`` only says so
        remember(conf.proxy, conf.cookie, *secret_header_values(dict(conf.headers)))
        ctx = JobContext(
            job_id=job_id, name=job.name, status=job.status, download_id=job.download_id,
            language=job.language, code=job.code, engine=conf.download_engine or "",
            max_retry_times=conf.max_retry_times or 0, settings=conf, supported=job.supported,
            follow=check_follow(dict(job.follow) if job.follow else None),
            sitemaps=check_sitemaps(dict(job.sitemaps) if job.sitemaps else None), project=job.project)
    at = time.monotonic()
    _contexts[job_id] = (at, ctx)
    if len(_contexts) > MAX_CONTEXTS:  # a cache: a dropped job is read again from MongoDB
        for key in [k for k, (t, _) in list(_contexts.items()) if at - t >= CONTEXT_TTL]:
            _contexts.pop(key, None)
    return ctx


def limits_from_settings() -> Limits:
    return Limits(
        timeout=float(settings.DOWNLOAD_TIMEOUT), maxsize=settings.DOWNLOAD_MAXSIZE,
        max_redirects=settings.DOWNLOAD_MAX_REDIRECTS, memory_mb=settings.SANDBOX_MEMORY_MB,
        cpu_seconds=settings.SANDBOX_CPU_SECONDS, max_processes=settings.SANDBOX_MAX_PROCESSES,
        max_open_files=settings.SANDBOX_MAX_OPEN_FILES, max_file_mb=settings.SANDBOX_MAX_FILE_MB,
        stderr_bytes=settings.SANDBOX_STDERR_BYTES,
    )
