"""Running queue entries: claim, download, store.

An entry (rq job ``dc-<lease>``) names a lease document listing its tasks. Running it:
  1. claim: compare-and-set the lease QUEUED -> RUNNING with this worker's id (a lease the
     defender already gave up on is skipped, so an entry is never run twice);
  2. load the job (cached a few seconds) and those of its tasks that still look as the
     dispatcher left them; a disabled job gives them back untouched;
  3. download them all at once on the event loop (built-in engine) or in a thread pool
     (requests engine, python and shell sandboxes), each under its limits;
  4. store outcomes as they complete, in bulk, whenever the buffered bodies pass
     STORE_FLUSH_BYTES and at the end (memory stays bounded whatever the bodies);
  5. delete the lease.
A heartbeat thread refreshes ``beat_at`` of every lease this process runs, in MongoDB, so the
defender can tell a dead worker from a slow one even across a Redis restart.

``Runner.serve`` runs many entries in one process (``downcluster worker``), taking the next
entry, in strict queue order, whenever fewer than WORKER_INFLIGHT downloads are in flight;
``run_one`` runs a single entry (the job function of a plain ``rq worker``).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from bson import ObjectId
from pymongo import ReturnDocument

from common.config import settings
from common.connections import connect_mongo, redis_conn
from common.errors import DownloadError
from common.models import (
    FRESH,
    LIVE,
    OFF,
    QUEUED,
    RUNNING,
    CrawlerDownload,
    CrawlerDownloadSetting,
    CrawlerDownloadType,
    CrawlerLease,
    CrawlerTask,
    Job,
    utcnow,
)
from common.queues import RQ_JOB_PREFIX, pop_first
from common.secrets import redact, remember
from common.sentry import capture
from slave import writer
from slave.engines import aio, http, sandbox
from slave.engines.base import Download, Limits

logger = logging.getLogger(__name__)

CONTEXT_TTL = 5.0  # seconds a job's settings are reused between entries


def new_worker_id() -> str:
    return f"{settings.HOSTNAME or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class JobContext:
    job_id: ObjectId
    name: str
    status: str
    download_id: ObjectId | None
    kind: str
    code: str
    engine: str
    max_retry_times: int
    settings: dict[str, Any]


_contexts: dict[ObjectId, tuple[float, JobContext | None]] = {}


def load_context(job_id: ObjectId) -> JobContext | None:
    """The job, its downloader and settings (None if the job is gone), cached CONTEXT_TTL s."""
    hit = _contexts.get(job_id)
    if hit and time.monotonic() - hit[0] < CONTEXT_TTL:
        return hit[1]
    job = Job._get_collection().find_one({"_id": job_id}, {"name": 1, "status": 1})
    ctx = None
    if job is not None:
        download = CrawlerDownload._get_collection().find_one({"job": job_id})
        conf = CrawlerDownloadSetting._get_collection().find_one({"job": job_id}) or {}
        conf = {k: conf[k] for k in ("dispatch_num", "max_retry_times", "proxy", "cookie", "headers",
                                     "download_engine", "download_js", "prior", "report_mails") if k in conf}
        remember(conf.get("proxy"), conf.get("cookie"))
        kind = "none"
        if download is not None and download.get("types"):
            t = CrawlerDownloadType._get_collection().find_one({"_id": download["types"]}, {"language": 1})
            kind = t["language"] if t else "none"
        ctx = JobContext(
            job_id=job_id, name=job["name"],
            status=OFF if download is not None and download.get("status") == OFF else job.get("status", OFF),
            download_id=download["_id"] if download else None, kind=kind,
            code=(download or {}).get("code", ""), engine=conf.get("download_engine") or "aiohttp",
            max_retry_times=conf.get("max_retry_times", settings.DEFAULT_MAX_RETRY_TIMES), settings=conf)
    _contexts[job_id] = (time.monotonic(), ctx)
    return ctx


def limits_from_settings() -> Limits:
    return Limits(
        timeout=float(settings.DOWNLOAD_TIMEOUT), maxsize=settings.DOWNLOAD_MAXSIZE,
        max_redirects=settings.DOWNLOAD_MAX_REDIRECTS, memory_mb=settings.SANDBOX_MEMORY_MB,
        cpu_seconds=settings.SANDBOX_CPU_SECONDS, max_processes=settings.SANDBOX_MAX_PROCESSES,
        max_open_files=settings.SANDBOX_MAX_OPEN_FILES, max_file_mb=settings.SANDBOX_MAX_FILE_MB,
        stderr_bytes=settings.SANDBOX_STDERR_BYTES,
    )


# --- the lease ----------------------------------------------------------------------------

def claim(lease_id: str, worker_id: str) -> dict | None:
    now = utcnow()
    return CrawlerLease._get_collection().find_one_and_update(
        {"_id": lease_id, "state": QUEUED},
        {"$set": {"state": RUNNING, "worker": worker_id, "hostname": settings.HOSTNAME,
                  "started_at": now, "beat_at": now}},
        return_document=ReturnDocument.AFTER)


def load_tasks(lease: dict) -> list[dict]:
    """The entry's tasks that still look as the dispatcher left them (``writer.guard``)."""
    docs = CrawlerTask._get_collection().find(
        {"_id": {"$in": lease["ids"]}}, {"uri": 1, "download_times": 1, "status": 1, "retry_at": 1, "lease": 1})
    want = writer.guard(lease["_id"], lease["kind"])
    return [d for d in docs if all(d.get(k) == v for k, v in want.items())]


def give_back(lease: dict, reason: str) -> int:
    """The job is off or gone: its tasks go back to the dispatcher untouched (no attempt)."""
    now = utcnow()
    return CrawlerTask._get_collection().update_many(
        {"_id": {"$in": lease["ids"]}, **writer.guard(lease["_id"], lease["kind"])},
        {"$set": {"status": LIVE, "retry_at": now, "failed_reason": reason, "last_update_datetime": now},
         "$unset": writer.UNSET_LEASE}).modified_count


def finish(lease_id: str, worker_id: str) -> None:
    CrawlerLease._get_collection().delete_one({"_id": lease_id, "worker": worker_id})


class Heartbeat(threading.Thread):
    """Refreshes ``beat_at`` of the leases this worker runs, every HEARTBEAT_INTERVAL."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.worker_id, self.halt = worker_id, threading.Event()

    def beat(self) -> None:
        try:
            CrawlerLease._get_collection().update_many(
                {"worker": self.worker_id, "state": RUNNING}, {"$set": {"beat_at": utcnow()}})
        except Exception as exc:  # MongoDB away: the writer retries; the defender may recover us
            logger.warning("heartbeat failed: %s", type(exc).__name__)

    def run(self) -> None:
        while not self.halt.wait(settings.HEARTBEAT_INTERVAL):
            self.beat()


# --- downloads ----------------------------------------------------------------------------

class Engines:
    """What one event loop downloads with."""

    def __init__(self) -> None:
        self.client = aio.Client()
        self.blocking = ThreadPoolExecutor(max_workers=settings.DOWNLOAD_CONCURRENCY, thread_name_prefix="download")
        self.limits = limits_from_settings()
        self._local = threading.local()

    def _requests(self, url: str, ctx: JobContext) -> Download:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = http.new_session()
        return http.fetch(url, limits=self.limits, proxy=ctx.settings.get("proxy", ""),
                          cookie=ctx.settings.get("cookie", ""), headers=ctx.settings.get("headers") or {},
                          session=session, user_agent=settings.DOWNLOAD_USER_AGENT)

    async def download(self, ctx: JobContext, task: dict) -> writer.Outcome:
        """Run the job's downloader on one task; every failure becomes an Outcome."""
        start = time.monotonic()
        url, limits = task["uri"], self.limits
        loop = asyncio.get_running_loop()
        result: Download | None = None
        error: DownloadError | None = None
        try:
            if ctx.kind == "python":
                payload = {"url": url, "task_id": str(task["_id"]), "job": ctx.name,
                           "attempt": task.get("download_times", 0) + 1, "settings": ctx.settings}
                result = await loop.run_in_executor(self.blocking, sandbox.run_python, ctx.code, payload, limits)
            elif ctx.kind == "shell":
                result = await loop.run_in_executor(self.blocking, sandbox.run_shell, ctx.code, url, limits)
            elif ctx.engine == "requests":
                result = await loop.run_in_executor(self.blocking, self._requests, url, ctx)
            else:
                result = await aio.fetch(url, limits=limits, client=self.client,
                                         proxy=ctx.settings.get("proxy", ""), cookie=ctx.settings.get("cookie", ""),
                                         headers=ctx.settings.get("headers") or {},
                                         user_agent=settings.DOWNLOAD_USER_AGENT)
            if len(result.body) > limits.maxsize:
                raise DownloadError(f"body larger than {limits.maxsize} bytes", retryable=False)
        except DownloadError as exc:
            result, error = None, exc
        except Exception as exc:  # an engine bug fails the task, not the entry
            logger.exception("downloader crashed on task %s of job %s", task["_id"], ctx.name)
            capture(exc)
            result, error = None, DownloadError(redact(f"{type(exc).__name__}: {exc}"), retryable=True)
        request_size = len(url) + (len(result.request_body) if result else 0)
        return writer.Outcome(task=task, download=result, error=error,
                              spend_us=int((time.monotonic() - start) * 1_000_000), request_size=request_size)

    async def close(self) -> None:
        await self.client.close()
        self.blocking.shutdown(wait=False, cancel_futures=True)


# --- one entry ----------------------------------------------------------------------------

class Runner:
    """Runs entries on one event loop; ``store`` is a small thread pool for MongoDB writes."""

    def __init__(self, worker_id: str | None = None) -> None:
        self.worker_id = worker_id or new_worker_id()
        self.engines = Engines()
        self.store_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="store")
        self.heartbeat = Heartbeat(self.worker_id)
        self.inflight = 0   # downloads of the entries running
        self.pending = 0    # entries taken from a queue whose tasks are not loaded yet
        self.entries_done = 0

    async def _db(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.store_pool, fn, *args)

    async def run_entry(self, lease_id: str, pending: bool = False) -> dict[str, int] | None:
        """Claim, download, store and finish one entry; None if it was not ours to run.
        ``pending``: the entry counts in ``self.pending`` until its tasks are loaded."""
        def loaded() -> None:
            nonlocal pending
            if pending:
                self.pending, pending = self.pending - 1, False

        try:
            lease = await self._db(claim, lease_id, self.worker_id)
        except BaseException:
            loaded()
            raise
        if lease is None:
            loaded()
            logger.info("entry %s was recovered or taken before it started: skipped", lease_id)
            return None
        counts = {"success": 0, "fail": 0}
        try:
            ctx = await self._db(load_context, lease["job"])
            if ctx is None or ctx.status == OFF:
                back = await self._db(give_back, lease, "job disabled before download")
                logger.info("job %s is off or gone: %s tasks given back", lease["job"], back)
                return counts
            tasks = await self._db(load_tasks, lease)
            self.inflight += len(tasks)
            loaded()
            try:
                counts = await self._download_and_store(ctx, lease, tasks)
            finally:
                self.inflight -= len(tasks)
            logger.debug("job %s entry %s: %s ok, %s failed", ctx.name, lease_id, counts["success"], counts["fail"])
            return counts
        finally:
            loaded()
            await self._db(finish, lease_id, self.worker_id)
            self.entries_done += 1

    async def _download_and_store(self, ctx: JobContext, lease: dict, tasks: list[dict]) -> dict[str, int]:
        counts = {"success": 0, "fail": 0}
        buf: list[writer.Outcome] = []
        size = 0

        async def flush() -> None:
            nonlocal buf, size
            part, buf, size = buf, [], 0
            got = await self._db(writer.store, ctx, lease["_id"], lease["kind"], part, utcnow())
            counts["success"] += got["success"]
            counts["fail"] += got["fail"]

        for next_done in asyncio.as_completed([self.engines.download(ctx, t) for t in tasks]):
            outcome = await next_done
            buf.append(outcome)
            size += len(outcome.download.body) if outcome.download else 0
            if size >= settings.STORE_FLUSH_BYTES:
                await flush()
        if buf:
            await flush()
        return counts

    # --- many entries: ``downcluster worker`` -------------------------------------------

    async def serve(self, queue_keys: list[str], burst: bool = False, max_jobs: int | None = None) -> None:
        redis = redis_conn()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, stop)
        running: set[asyncio.Task] = set()
        taken = 0
        target = settings.WORKER_INFLIGHT
        while not stop.is_set() and (max_jobs is None or taken < max_jobs):
            room = self.inflight + settings.DISPATCH_BATCH_SIZE * self.pending < target or not running
            got = None
            if room:
                try:
                    got = pop_first(redis, queue_keys) if running else \
                        await loop.run_in_executor(None, self._wait_for_entry, redis, queue_keys)
                except Exception as exc:  # Redis away: keep finishing what runs, try again
                    logger.warning("cannot read the queues: %s", type(exc).__name__)
                    await asyncio.sleep(1.0)
            if got:
                lease_id = self._lease_of(redis, got)
                if lease_id:
                    taken += 1
                    self.pending += 1
                    running.add(asyncio.create_task(self._guarded(redis, lease_id)))
                continue
            if not running:
                if burst:
                    break
                continue
            done, _ = await asyncio.wait(running, timeout=0.05 if room else None, return_when=asyncio.FIRST_COMPLETED)
            running -= done
        if running:
            await asyncio.wait(running)

    def _on_signal(self, stop: asyncio.Event) -> None:
        if stop.is_set():
            logger.warning("second signal: exiting now; the defender recovers unfinished entries")
            os._exit(1)
        logger.info("stopping after the running entries (signal again to exit at once)")
        stop.set()

    @staticmethod
    def _wait_for_entry(redis, queue_keys: list[str]):
        got = redis.blpop(queue_keys, timeout=1)
        if not got:
            return None
        return got[0].decode(), got[1].decode()

    @staticmethod
    def _lease_of(redis, got: tuple[str, str]) -> str | None:
        queue_key, job_id = got
        if not job_id.startswith(RQ_JOB_PREFIX):
            logger.warning("not a downcluster entry in %s: %s (left for a plain rq worker)", queue_key, job_id)
            redis.lpush(queue_key, job_id)
            return None
        redis.hset("rq:job:" + job_id, "status", "started")
        return job_id[len(RQ_JOB_PREFIX):]

    async def _guarded(self, redis, lease_id: str) -> None:
        try:
            await self.run_entry(lease_id, pending=True)
            redis.delete("rq:job:" + RQ_JOB_PREFIX + lease_id)
        except Exception as exc:  # MongoDB gone for good: the defender recovers the entry
            logger.error("entry %s failed: %s", lease_id, redact(f"{type(exc).__name__}: {exc}"))
            capture(exc)

    async def close(self) -> None:
        self.heartbeat.halt.set()
        await self.engines.close()
        self.store_pool.shutdown(wait=True)


def run_one(lease_id: str) -> dict[str, int] | None:
    """Run one entry to the end in a fresh event loop (a plain rq worker's job)."""
    connect_mongo()

    async def main():
        runner = Runner()
        runner.heartbeat.start()
        try:
            return await runner.run_entry(lease_id)
        finally:
            await runner.close()

    return asyncio.run(main())


def serve(queue_keys: list[str], burst: bool = False, max_jobs: int | None = None) -> None:
    connect_mongo()

    async def main():
        runner = Runner()
        runner.heartbeat.start()
        logger.info("worker %s on %s (up to %s downloads in flight)", runner.worker_id,
                    ", ".join(k.removeprefix("rq:queue:") for k in queue_keys), settings.WORKER_INFLIGHT)
        try:
            await runner.serve(queue_keys, burst=burst, max_jobs=max_jobs)
        finally:
            await runner.close()

    asyncio.run(main())
