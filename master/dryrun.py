"""A job's dry run on one URL, asked by a person (the API's ``dry_run_job``): the request goes to
Redis and its entry to ``down_super`` (the job's host's, or the foreign one, where its tasks go),
a worker runs it (``slave/worker/dryrun.py``) and the answer is read back from Redis
(``common/dryrun.py``). Nothing of it is stored in MongoDB."""
from __future__ import annotations

import threading
import uuid
from typing import Any

from redis import Redis

from common import dryrun
from common.config import settings
from common.errors import NotFound
from common.jobsettings import PRIOR_FOREIGN
from common.queue.names import QUEUE_NAMES, queue_name
from common.queue.rqbridge import push_dry_run
from common.store import jobs
from common.store.records import Job
from common.urls import check_url

WAIT_MAX = 60.0  # seconds a request may wait for the answer
# requests of this process waiting for an answer at once, at most: each holds one of the web's
# worker threads and a Redis connection while it waits; one more is answered at once (``queued``)
WAITERS_MAX = 8
_waiters = threading.BoundedSemaphore(WAITERS_MAX)


def _queue(job: Job) -> str:
    ctx = jobs.context(job.id)
    foreign = ctx is not None and ctx.settings.prior == PRIOR_FOREIGN
    return queue_name(QUEUE_NAMES[0], job.worker_host, foreign=foreign and not job.worker_host)


def start(redis: Redis, job: Job, url: str) -> str:
    """Queue a dry run of ``job`` on ``url`` (checked as intake checks a URL); its id."""
    url = check_url(url.strip(), settings.MAX_URL_LENGTH)
    ref = uuid.uuid4().hex
    dryrun.ask(redis, ref, str(job.id), url)
    timeout = int(settings.DOWNLOAD_TIMEOUT) + 60  # the engine's own limit stops it first
    push_dry_run(redis, _queue(job), ref, timeout, dryrun.TTL)
    return ref


def show(redis: Redis, job: Job, ref: str, wait: float) -> dict[str, Any]:
    """Dry run ``ref`` of ``job``: its result once a worker answered (waiting up to ``wait``
    seconds for it), else that it is queued. NotFound for an id of another job or expired."""
    asked = dryrun.asked(redis, ref) if len(ref) == 32 else None
    if asked is None or asked.get("job") != str(job.id):
        raise NotFound(f"no dry run {ref[:40]!r} of job {job.name} "
                       f"(they are kept {dryrun.TTL // 60} minutes)")
    wait = min(max(wait, 0.0), WAIT_MAX)
    if wait > 0 and _waiters.acquire(blocking=False):
        try:
            found = dryrun.wait(redis, ref, wait)
        finally:
            _waiters.release()
    else:
        found = dryrun.result(redis, ref)
    if found is None:
        return {"id": ref, "job": job.name, "url": asked["url"], "state": "queued"}
    return {"id": ref, "job": job.name, **found}
