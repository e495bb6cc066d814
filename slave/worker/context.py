"""What an entry needs to know of its job: the job, its downloader and settings (cached a few
seconds, so a busy worker reads them once per CONTEXT_TTL, not once per entry)."""
from __future__ import annotations

import time

from bson import ObjectId

from common.config import settings
from common.jobsettings import check_follow, check_sitemaps
from common.secrets import remember, secret_header_values
from common.store import jobs
from slave.download.job import JobContext

CONTEXT_TTL = 5.0   # seconds a job's settings are reused between entries


_contexts: dict[ObjectId, tuple[float, JobContext | None]] = {}
MAX_CONTEXTS = 1024  # above it stale entries go: holds at most this or the jobs read in the last CONTEXT_TTL


def fresh_context(job_id: ObjectId) -> JobContext | None:
    """The job as it is stored now (a dry run right after a change of its settings sees it)."""
    _contexts.pop(job_id, None)
    return load_context(job_id)


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
