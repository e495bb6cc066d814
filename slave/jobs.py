"""The rq job function: one queue entry = one batch of one job's tasks.

``run_batch(lease, job_id, expected)`` finds the tasks that hold ``lease``, runs the job's
downloader on each (concurrently, each under its limits), and stores the results. It is
importable by a plain ``rq worker``: connections come from the DOWNCLUSTER_* environment.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bson import ObjectId

from common.config import settings
from common.connections import connect_mongo, redis_conn
from common.errors import DownloadError
from common.models import (
    DISPATCH,
    LIVE,
    OFF,
    CrawlerDownload,
    CrawlerDownloadSetting,
    CrawlerTask,
    Job,
    lower_live_from,
    utcnow,
)
from common.queues import HEARTBEAT_PREFIX
from common.secrets import redact, remember
from common.sentry import capture
from slave import writer
from slave.engines import http, sandbox
from slave.engines.base import Download, Limits

logger = logging.getLogger(__name__)

CLAIM_WAIT = 10.0  # seconds to wait for the dispatcher to finish marking a fresh batch
_local = threading.local()


@dataclass
class JobContext:
    job_id: ObjectId
    name: str
    status: str
    download_id: ObjectId | None
    kind: str
    code: str
    max_retry_times: int
    settings: dict[str, Any]


def load_context(job_id: ObjectId) -> JobContext | None:
    job = Job.objects(id=job_id).first()
    if job is None:
        return None
    download = CrawlerDownload.objects(job=job).first()
    setting = CrawlerDownloadSetting.objects(job=job).first()
    conf = {}
    if setting is not None:
        conf = {k: setting[k] for k in ("dispatch_num", "max_retry_times", "proxy", "cookie", "headers",
                                        "download_engine", "download_js", "prior", "report_mails")}
    remember(conf.get("proxy"), conf.get("cookie"))
    status = job.status if download is None or download.status != OFF else OFF
    return JobContext(
        job_id=job.id, name=job.name, status=status,
        download_id=download.id if download else None,
        kind=download.types.language if download else "none",
        code=download.code if download else "",
        max_retry_times=conf.get("max_retry_times", settings.DEFAULT_MAX_RETRY_TIMES),
        settings=conf,
    )


def limits_from_settings() -> Limits:
    return Limits(
        timeout=float(settings.DOWNLOAD_TIMEOUT), maxsize=settings.DOWNLOAD_MAXSIZE,
        max_redirects=settings.DOWNLOAD_MAX_REDIRECTS, memory_mb=settings.SANDBOX_MEMORY_MB,
        cpu_seconds=settings.SANDBOX_CPU_SECONDS, max_processes=settings.SANDBOX_MAX_PROCESSES,
        max_open_files=settings.SANDBOX_MAX_OPEN_FILES, max_file_mb=settings.SANDBOX_MAX_FILE_MB,
        stderr_bytes=settings.SANDBOX_STDERR_BYTES,
    )


def _session():
    if getattr(_local, "session", None) is None:
        _local.session = http.new_session()
    return _local.session


def download_one(ctx: JobContext, task: dict, limits: Limits) -> writer.Outcome:
    """Run the job's downloader on one task; every failure becomes an Outcome, never an exception."""
    start = time.monotonic()
    url = task["uri"]
    result: Download | None = None
    error: DownloadError | None = None
    try:
        if ctx.kind == "python":
            payload = {"url": url, "task_id": str(task["_id"]), "job": ctx.name,
                       "attempt": task.get("download_times", 0) + 1, "settings": ctx.settings}
            result = sandbox.run_python(ctx.code, payload, limits)
        elif ctx.kind == "shell":
            result = sandbox.run_shell(ctx.code, url, limits)
        else:
            result = http.fetch(url, limits=limits, proxy=ctx.settings.get("proxy", ""),
                                cookie=ctx.settings.get("cookie", ""), headers=ctx.settings.get("headers") or {},
                                session=_session(), user_agent=settings.DOWNLOAD_USER_AGENT)
        if len(result.body) > limits.maxsize:
            raise DownloadError(f"body larger than {limits.maxsize} bytes", retryable=False)
    except DownloadError as exc:
        result, error = None, exc
    except Exception as exc:  # an engine bug must fail the task, not the batch
        logger.exception("downloader crashed on task %s of job %s", task["_id"], ctx.name)
        capture(exc)
        result, error = None, DownloadError(redact(f"{type(exc).__name__}: {exc}"), retryable=True)
    spend_us = int((time.monotonic() - start) * 1_000_000)
    request_size = len(url) + (len(result.request_body) if result else 0)
    return writer.Outcome(task=task, download=result, error=error, spend_us=spend_us, request_size=request_size)


def claim(lease: str, expected: int) -> list[dict]:
    """The tasks holding ``lease``; waits briefly for a dispatcher still marking them."""
    coll = CrawlerTask._get_collection()
    deadline = time.monotonic() + CLAIM_WAIT
    while True:
        tasks = list(coll.find({"lease": lease, "status": DISPATCH}, {"uri": 1, "download_times": 1, "job": 1}))
        if len(tasks) >= expected or time.monotonic() > deadline:
            return tasks
        time.sleep(0.05)


class Heartbeat:
    """Tells the defender this batch is alive while it runs."""

    def __init__(self, lease: str) -> None:
        self.key, self.stop_event = HEARTBEAT_PREFIX + lease, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="heartbeat")

    def _beat(self) -> None:
        try:
            redis_conn().set(self.key, settings.HOSTNAME, ex=settings.HEARTBEAT_TTL)
        except Exception as exc:  # Redis away: the defender may recover us; the writer copes
            logger.warning("heartbeat for %s failed: %s", self.key, exc)

    def _run(self) -> None:
        while not self.stop_event.wait(settings.HEARTBEAT_INTERVAL):
            self._beat()

    def __enter__(self) -> "Heartbeat":
        self._beat()
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        try:
            redis_conn().delete(self.key)
        except Exception:
            pass


def _release(lease: str, reason: str) -> int:
    """Give a batch's tasks back to the dispatcher untouched (job disabled or gone)."""
    return CrawlerTask._get_collection().update_many(
        {"lease": lease, "status": DISPATCH},
        {"$set": {"status": LIVE, "failed_reason": reason, "last_update_datetime": utcnow()},
         "$unset": writer.UNSET_LEASE},
    ).modified_count


def run_batch(lease: str, job_id: str, expected: int = 0) -> dict[str, int]:
    """Entry point for rq. Returns counts for the rq result (kept 0 s by default)."""
    connect_mongo()
    with Heartbeat(lease):
        try:
            return _run_batch(lease, ObjectId(job_id), expected)
        except Exception as exc:
            capture(exc)
            raise


def _run_batch(lease: str, job_id: ObjectId, expected: int) -> dict[str, int]:
    tasks = claim(lease, expected)
    if not tasks:
        return {"success": 0, "fail": 0}
    ctx = load_context(job_id)
    if ctx is None or ctx.status == OFF:
        released = _release(lease, "job disabled before download")
        lower_live_from(job_id, min(t["_id"] for t in tasks))
        logger.info("job %s is off or gone: %s tasks back to LIVE", job_id, released)
        return {"success": 0, "fail": 0}
    limits = limits_from_settings()
    workers = max(1, min(settings.DOWNLOAD_CONCURRENCY, len(tasks)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="download") as pool:
        outcomes = list(pool.map(lambda t: download_one(ctx, t, limits), tasks))
    counts = writer.store(ctx, lease, outcomes, utcnow())
    logger.info("job %s batch %s: %s ok, %s failed", ctx.name, lease, counts["success"], counts["fail"])
    return counts
