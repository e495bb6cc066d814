"""Running queue entries: claim, download, store.

An entry (rq job ``dc-<lease>``) names a lease document listing its tasks. Running it:
  1. claim: compare-and-set the lease QUEUED -> RUNNING with this worker's id (a lease the
     defender already gave up on is skipped, so an entry is never run twice); the lease
     carries the tasks' ids and URLs, so no task is read;
  2. load the job (cached a few seconds); a disabled job gives the tasks back untouched;
  3. download them all at once on the event loop (aiohttp and browser engines) or in a
     thread pool (requests engine, python and shell sandboxes), each under its limits;
  4. hand each outcome, as it completes, to the process's one writer thread, which stores
     the outcomes of all running entries in bulk (at most WRITE_BATCH outcomes or
     STORE_FLUSH_BYTES of bodies a write); a body over 1 MiB holds one of
     WORKER_LARGE_BODIES slots until stored, so memory stays bounded whatever the bodies;
  5. the writer deletes the lease once every outcome is stored.
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
import queue
import signal
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bson import ObjectId
from pymongo import ReturnDocument

from common.config import settings
from common.connections import connect_mongo, redis_conn
from common.errors import DownloadError
from common.models import (
    CrawlerDownloadData,
    ENGINES,
    OFF,
    QUEUED,
    RUNNING,
    CrawlerDownload,
    CrawlerDownloadSetting,
    CrawlerDownloadType,
    CrawlerLease,
    Job,
    give_back,
    utcnow,
)
from common.queues import RQ_JOB_PREFIX, WORKER_KEY_PREFIX, pop_first
from common.secrets import redact, remember
from common.sentry import capture
from common.data import body_of, gridfs_of
from common.hostlimits import host_of
from slave import writer
from slave.engines import aio, browser, http, sandbox
from slave.etiquette import Etiquette, Handback
from slave.engines.base import Download, Limits

logger = logging.getLogger(__name__)

CONTEXT_TTL = 5.0   # seconds a job's settings are reused between entries
WRITE_BATCH = 256   # outcomes per bulk write at most
LINGER = 0.002      # seconds the writer waits for more outcomes before a write


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
                                     "download_engine", "download_js", "prior", "report_mails",
                                     "host_concurrency", "host_delay", "obey_robots") if k in conf}
        remember(conf.get("proxy"), conf.get("cookie"))
        kind = "none"
        if download is not None and download.get("types"):
            t = CrawlerDownloadType._get_collection().find_one({"_id": download["types"]}, {"language": 1})
            kind = t["language"] if t else "none"
        ctx = JobContext(
            job_id=job_id, name=job["name"],
            status=OFF if download is not None and download.get("status") == OFF else job.get("status", OFF),
            download_id=download["_id"] if download else None, kind=kind,
            code=(download or {}).get("code", ""), engine=conf.get("download_engine") or ENGINES[0],
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


def lease_tasks(lease: dict) -> list[dict]:
    """The entry's tasks as the dispatcher wrote them into the lease (no read of the tasks:
    one cancelled meanwhile is downloaded, but the guarded settle stores nothing for it)."""
    return [{"_id": i, "uri": u, "download_times": n} for i, u, n in zip(lease["ids"], lease["uris"], lease["attempts"])]


def finish(lease_id: str, worker_id: str) -> None:
    CrawlerLease._get_collection().delete_one({"_id": lease_id, "worker": worker_id})


class Heartbeat(threading.Thread):
    """Refreshes ``beat_at`` of the leases this worker is running, every HEARTBEAT_INTERVAL
    (an entry given up on drops out of ``active`` and stops beating, so the defender takes it),
    and announces the worker in Redis (``downcluster:worker:<id>``, for stats)."""

    def __init__(self, runner: "Runner") -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.runner, self.halt = runner, threading.Event()

    def beat(self) -> None:
        try:
            self.runner.engines.etiquette.renew(redis_conn())
        except Exception as exc:  # Redis away: slots expire, other workers take them
            logger.warning("host slots not renewed: %s", type(exc).__name__)
        active = list(self.runner.active)
        try:
            if active:
                CrawlerLease._get_collection().update_many(
                    {"_id": {"$in": active}, "worker": self.runner.worker_id, "state": RUNNING},
                    {"$set": {"beat_at": utcnow()}})
        except Exception as exc:  # MongoDB away: the writer retries; the defender may recover us
            logger.warning("heartbeat failed: %s", type(exc).__name__)

    def announce(self) -> None:
        try:
            key = WORKER_KEY_PREFIX + self.runner.worker_id
            pipe = redis_conn().pipeline(transaction=False)
            pipe.hset(key, mapping={"host": settings.HOSTNAME, "inflight": self.runner.inflight,
                                    "peak_inflight": self.runner.peak_inflight, "entries": self.runner.entries_done})
            pipe.expire(key, max(settings.HEARTBEAT_TTL, 3 * settings.HEARTBEAT_INTERVAL))
            pipe.execute()
        except Exception as exc:  # Redis away: only stats miss us
            logger.debug("worker announcement failed: %s", type(exc).__name__)

    def run(self) -> None:
        last = time.monotonic()
        self.beat()
        self.announce()
        while not self.halt.wait(min(1.0, settings.HEARTBEAT_INTERVAL)):
            if time.monotonic() - last >= settings.HEARTBEAT_INTERVAL:
                last = time.monotonic()
                self.beat()
            self.announce()


# --- downloads ----------------------------------------------------------------------------

def _request_shape(ctx: JobContext) -> dict:
    """The job's proxy, cookie, headers and our user agent: what every built-in engine sends."""
    return {"proxy": ctx.settings.get("proxy", ""), "cookie": ctx.settings.get("cookie", ""),
            "headers": ctx.settings.get("headers") or {}, "user_agent": settings.DOWNLOAD_USER_AGENT}


def _stored_download(data_id: str) -> Download | None:
    """The download an identical request stored (to copy for a coalesced task), or None if gone."""
    coll = CrawlerDownloadData._get_collection()
    doc = coll.find_one({"_id": ObjectId(data_id)})
    if doc is None:
        return None
    body = body_of(doc, gridfs_of(coll.database))
    return Download(status_code=doc["status_code"], headers=doc.get("response_headers") or {}, body=body,
                    url=doc.get("url") or "", remote_ip=doc.get("remote_ip") or "",
                    request_headers=doc.get("requests_headers") or {}, encoding=doc.get("encoding"))


def _etiquette_unavailable(task: dict, exc: Exception) -> writer.Outcome:
    """The task is handed back (due again in 5 s, no attempt counted): the etiquette's checks failed."""
    logger.warning("task %s handed back: %s", task["_id"], redact(f"{type(exc).__name__}: {exc}"))
    return writer.Outcome(task=task, download=None, deferred=5.0, spend_us=0,
                          error=DownloadError(f"etiquette unavailable ({type(exc).__name__}): handed back"))


class Engines:
    """What one event loop downloads with."""

    def __init__(self) -> None:
        self.client = aio.Client()
        self.large_gate = asyncio.Semaphore(settings.WORKER_LARGE_BODIES)
        self.browsers = browser.Pool(settings.BROWSER_POOL, settings.BROWSER_MAX_PAGES, settings.BROWSER_MEMORY_MB)
        self.blocking = ThreadPoolExecutor(max_workers=settings.DOWNLOAD_CONCURRENCY, thread_name_prefix="download")
        self.limits = limits_from_settings()
        self.etiquette = Etiquette()
        self._local = threading.local()

    def _requests(self, url: str, ctx: JobContext) -> Download:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = http.new_session()
        return http.fetch(url, limits=self.limits, session=session, **_request_shape(ctx))

    def coalescing(self, ctx: JobContext) -> bool:
        return ctx.kind == "none" and settings.COALESCE_WINDOW > 0 and ctx.engine != "browser"

    async def prepare(self, ctx: JobContext, tasks: list[dict]) -> dict:
        """What an entry asks of Redis once, before its pages start: the host slots its pages
        will take (pooled limits, see Etiquette.pooled) and whether each task leads its request
        (coalescing). Returns task id -> (coalescing key, True when it leads else the value
        found); {} when the job does not coalesce; Redis failing: every task maps to the error
        and is handed back."""
        if not tasks:
            return {}
        wanted: dict[str, int] = {}
        if Etiquette.pooled(*Etiquette.limits(ctx)):
            for t in tasks:
                host = host_of(t["uri"])
                wanted[host] = wanted.get(host, 0) + 1
        keys_ = []
        if self.coalescing(ctx):
            keys_ = Etiquette.coalesce_keys([t["uri"] for t in tasks], ctx, _request_shape(ctx))
        reserved, led = await asyncio.gather(self.etiquette.reserve(wanted),
                                             self.etiquette.lead_many(keys_, [str(t["_id"]) for t in tasks]),
                                             return_exceptions=True)
        if isinstance(reserved, Exception):  # each page asks for its own slot
            logger.debug("slots not reserved: %s", type(reserved).__name__)
        if isinstance(led, Exception):
            return {t["_id"]: led for t in tasks}
        return {t["_id"]: plan for t, plan in zip(tasks, zip(keys_, led))}

    async def download(self, ctx: JobContext, task: dict, plan=None) -> writer.Outcome:
        """Run the job's downloader on one task, within the cluster's etiquette (robots.txt,
        per-host slots, coalescing as ``plan`` from ``prepare`` says); every failure becomes an Outcome."""
        start = time.monotonic()
        url, lead = task["uri"], None
        if isinstance(plan, Exception):  # Redis failed the entry's etiquette call
            return _etiquette_unavailable(task, plan)
        try:
            result, copied_from, lead = await self._polite(ctx, task, plan)
            error = None
        except Handback as back:
            return writer.Outcome(task=task, download=None, error=DownloadError(back.reason), deferred=back.after,
                                  spend_us=int((time.monotonic() - start) * 1_000_000))
        except DownloadError as exc:
            result, copied_from, error = None, None, exc
        except Exception as exc:  # Redis (or the store) failed the etiquette's checks: try again later
            return _etiquette_unavailable(task, exc)
        request_size = len(url) + (len(result.request_body) if result else 0)
        return writer.Outcome(task=task, download=result, error=error, coalesce_key=lead, coalesced_from=copied_from,
                              spend_us=int((time.monotonic() - start) * 1_000_000), request_size=request_size)

    async def _polite(self, ctx: JobContext, task: dict, plan) -> tuple[Download, object, str | None]:
        """(download, task copied from, coalescing key led): robots.txt first (built-in engine,
        unless the job says obey_robots = false), then an identical request's stored download,
        else a host slot and the fetch."""
        url, builtin = task["uri"], ctx.kind == "none"
        parts = urlsplit(url)
        host, crawl_delay = host_of(url, parts), 0.0
        lead = plan[0] if plan is not None and plan[1] is True else None
        token = ""
        try:
            if builtin and ctx.settings.get("obey_robots") is not False:
                try:
                    crawl_delay = await self.etiquette.robots_delay(url, host, parts.scheme, self.client.session(""))
                except PermissionError:
                    raise DownloadError("robots.txt disallows", retryable=False) from None
            conc, delay = Etiquette.limits(ctx)
            if plan is not None and lead is None:
                copied = await self._follow(plan[0], plan[1], str(task["_id"]))
                if copied is not None:
                    return copied
                lead = plan[0]  # the leader failed or took too long: this task downloads
            token = await self.etiquette.slot(host, conc, max(delay, crawl_delay))
            return await self._fetch(ctx, task), None, lead
        except BaseException as exc:
            if lead:  # failures are not shared: a waiter leads next
                await self.etiquette.give_up_lead(lead)
            if isinstance(exc, DownloadError) and exc.retry_after and exc.reason.startswith(("HTTP 429", "HTTP 503")):
                await self.etiquette.pause(host, exc.retry_after)
            raise
        finally:
            if token:
                self.etiquette.release(token, host)

    async def _follow(self, key: str, value, task_id: str):
        """Another task leads this request: (its stored download, its task id, None) once it is
        published, or None when this task is to download it (the leader failed, or waited for
        longer than a download may take)."""
        deadline = time.monotonic() + settings.DOWNLOAD_TIMEOUT + 30
        found = Etiquette.done_of(value)
        while True:
            if found is None:
                found = await self.etiquette.lead_or_wait(key, task_id, deadline)
                if found is None:
                    return None
            copy = await asyncio.get_running_loop().run_in_executor(None, _stored_download, found[1])
            if copy is not None:
                return copy, ObjectId(found[0]), None
            await self.etiquette.forget(key, f"done:{found[0]}:{found[1]}")  # its data went away
            found = None

    async def _fetch(self, ctx: JobContext, task: dict) -> Download:
        url, limits = task["uri"], self.limits
        loop = asyncio.get_running_loop()
        try:
            if ctx.kind == "python":
                payload = {"url": url, "task_id": str(task["_id"]), "job": ctx.name,
                           "attempt": task.get("download_times", 0) + 1, "settings": ctx.settings}
                result = await loop.run_in_executor(self.blocking, sandbox.run_python, ctx.code, payload, limits)
            elif ctx.kind == "shell":
                result = await loop.run_in_executor(self.blocking, sandbox.run_shell, ctx.code, url, limits)
            elif ctx.engine == "requests":
                result = await loop.run_in_executor(self.blocking, self._requests, url, ctx)
            elif ctx.engine == "browser":
                result = await browser.fetch(url, limits=limits, pool=self.browsers, **_request_shape(ctx),
                                             js=ctx.settings.get("download_js") or "", idle_max=settings.BROWSER_IDLE_MAX)
            else:
                result = await aio.fetch(url, limits=limits, client=self.client, **_request_shape(ctx),
                                         large_gate=self.large_gate)
            if len(result.body) > limits.maxsize:
                raise DownloadError(f"body larger than {limits.maxsize} bytes", retryable=False)
            return result
        except DownloadError:
            raise
        except Exception as exc:  # an engine bug fails the task, not the entry
            logger.exception("downloader crashed on task %s of job %s", task["_id"], ctx.name)
            capture(exc)
            raise DownloadError(redact(f"{type(exc).__name__}: {exc}"), retryable=True) from None

    async def close(self) -> None:
        await self.etiquette.close()
        await self.client.close()
        await self.browsers.close()
        self.blocking.shutdown(wait=False, cancel_futures=True)


# --- the writer -----------------------------------------------------------------------------

class Entry:
    """One running entry: its lease, job, tasks, and what the writer has stored of it."""

    def __init__(self, lease: dict, ctx: JobContext, tasks: list[dict], loop) -> None:
        self.lease_id, self.kind, self.ctx, self.total = lease["_id"], lease["kind"], ctx, len(tasks)
        self.written, self.counts = 0, {"success": 0, "fail": 0}  # and "handed_back" when some were
        self.etiquette = None  # set by the runner: publishes its coalesced leaders
        self.done = loop.create_future()
        self.loop = loop

    def _settle(self, result=None, error: BaseException | None = None) -> None:
        if self.done.done():
            return
        self.done.set_exception(error) if error else self.done.set_result(result)

    def resolve(self, error: BaseException | None = None) -> None:
        """From the writer thread: the entry is stored (or its store failed)."""
        self.loop.call_soon_threadsafe(self._settle, self.counts, error)


class Writer(threading.Thread):
    """The one thread of a worker process that writes to MongoDB what downloads produced:
    outcomes of all running entries are gathered into bulk writes (up to WRITE_BATCH, or
    STORE_FLUSH_BYTES of bodies), so the store sees few, large commands from one connection."""

    def __init__(self, worker_id: str) -> None:
        super().__init__(daemon=True, name="writer")
        self.worker_id = worker_id
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.submitted = self.written = 0

    def submit(self, entry: Entry, outcome: writer.Outcome | None) -> None:
        """Queue one outcome (None: the entry had no task left to download)."""
        self.submitted += 1
        self.q.put((entry, outcome))

    def backlog(self) -> int:
        """Outcomes waiting to be written (the worker takes no new entry while many wait)."""
        return self.submitted - self.written

    def stop(self) -> None:
        self.q.put(None)

    def run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            batch, size, end = [item], _size(item[1]), time.monotonic() + LINGER
            while len(batch) < WRITE_BATCH and size < settings.STORE_FLUSH_BYTES:
                try:
                    item = self.q.get(timeout=max(0.0, end - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self.q.put(None)
                    break
                batch.append(item)
                size += _size(item[1])
            # taken first: the write may turn an unstorable download into a failure and drop it
            slots = [(e.loop, o.download.release) for e, o in batch
                     if o is not None and o.download is not None and o.download.release]
            try:
                self._write(batch)
            finally:
                for _, outcome in batch:  # stored (or given up): the body goes now, whoever still holds the outcome
                    if outcome is not None:
                        outcome.download = None
                self.written += len(batch)
                for loop, release in slots:  # the bodies are stored (or given up): free their slots
                    loop.call_soon_threadsafe(release)

    def _publish(self, groups: dict) -> None:
        """Leaders of identical requests whose data is now stored: their waiters may copy it
        (handed to each entry's event loop, which sends it with its other Redis commands)."""
        for entry, outs in groups.items():
            leaders = [(o.coalesce_key, o.task["_id"], o.data_id) for o in outs
                       if o.coalesce_key and o.error is None and o.data_id is not None]
            if leaders and entry.etiquette is not None:
                entry.loop.call_soon_threadsafe(entry.etiquette.publish_all, leaders)

    def _write(self, batch: list) -> None:
        groups: dict[Entry, list[writer.Outcome]] = {}
        for entry, outcome in batch:
            groups.setdefault(entry, [])
            if outcome is not None:
                groups[entry].append(outcome)
        parts = [writer.Part(e.ctx, e.lease_id, e.kind, outs) for e, outs in groups.items() if outs]
        try:
            if parts:
                got = writer.store_many(parts, utcnow())
                for e, outs in groups.items():
                    e.written += len(outs)
                    for o in outs:
                        kind = "handed_back" if o.deferred is not None else "success" if o.error is None else "fail"
                        e.counts[kind] = e.counts.get(kind, 0) + 1
                self._publish(groups)
                logger.debug("stored %s ok / %s failed in one write", got["success"], got["fail"])
            finished = [e for e in groups if e.written >= e.total]
            if finished:
                writer.with_retries(lambda: CrawlerLease._get_collection().delete_many(
                    {"_id": {"$in": [e.lease_id for e in finished]}, "worker": self.worker_id}), "lease delete")
            for e in finished:
                e.resolve()
        except Exception as exc:  # MongoDB gone past the retries: these entries are given up
            for e in groups:
                e.resolve(exc)


def _size(outcome) -> int:
    return len(outcome.download.body) if outcome is not None and outcome.download is not None else 0


# --- one entry ----------------------------------------------------------------------------

class Runner:
    """Runs entries on one event loop; ``store`` is a small thread pool for MongoDB writes."""

    def __init__(self, worker_id: str | None = None) -> None:
        self.worker_id = worker_id or new_worker_id()
        self.engines = Engines()
        self.store_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
        self.writer = Writer(self.worker_id)
        self.heartbeat = Heartbeat(self)
        self.active: set[str] = set()  # leases being run (and beaten for)
        self.peak_inflight = 0
        self.inflight = 0   # downloads running
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
        self.active.add(lease_id)
        try:
            ctx = await self._db(load_context, lease["job"])
            if ctx is None or ctx.status == OFF:
                back = await self._db(give_back, lease["ids"], lease_id, lease["kind"],
                                      "job disabled before download", utcnow())
                logger.info("job %s is off or gone: %s tasks given back", lease["job"], back)
                await self._db(finish, lease_id, self.worker_id)
                return {"success": 0, "fail": 0}
            tasks = lease_tasks(lease)
            entry = Entry(lease, ctx, tasks, asyncio.get_running_loop())
            entry.etiquette = self.engines.etiquette
            self.inflight += len(tasks)
            self.peak_inflight = max(self.peak_inflight, self.inflight)
            loaded()
            left = len(tasks)
            try:
                if not tasks:
                    self.writer.submit(entry, None)
                plans = await self.engines.prepare(ctx, tasks)
                downloads = [self.engines.download(ctx, t, plans.get(t["_id"])) for t in tasks]
                for next_done in asyncio.as_completed(downloads):
                    outcome = await next_done
                    self.inflight, left = self.inflight - 1, left - 1
                    self.writer.submit(entry, outcome)
                counts = await entry.done
            finally:
                self.inflight -= left
            logger.debug("job %s entry %s: %s ok, %s failed", ctx.name, lease_id, counts["success"], counts["fail"])
            return counts
        finally:
            loaded()
            self.active.discard(lease_id)
            self.entries_done += 1

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
            room = (self.inflight + settings.DISPATCH_BATCH_SIZE * self.pending < target
                    and self.writer.backlog() < target * 4) or not running
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
        if not job_id.startswith(RQ_JOB_PREFIX):  # someone enqueued another function on our queues
            from rq.job import Job as RqJob
            from rq.registry import FailedJobRegistry

            why = "not a downcluster entry: requeue it for a plain `rq worker`"
            logger.warning("%s in %s: %s", why, queue_key, job_id)
            try:
                FailedJobRegistry(queue_key.removeprefix("rq:queue:"), connection=redis).add(
                    RqJob.fetch(job_id, connection=redis), ttl=-1, exc_string=why)
            except Exception as exc:  # the hash is gone: nothing left to keep
                logger.warning("could not keep %s in the failed registry: %s", job_id, type(exc).__name__)
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

    def start(self) -> None:
        self.writer.start()
        self.heartbeat.start()

    async def close(self) -> None:
        self.heartbeat.halt.set()
        self.writer.stop()
        await self.engines.close()
        self.store_pool.shutdown(wait=True)
        self.writer.join(timeout=60)
        try:
            redis_conn().delete(WORKER_KEY_PREFIX + self.worker_id)
        except Exception:
            pass


def run_one(lease_id: str) -> dict[str, int] | None:
    """Run one entry to the end in a fresh event loop (a plain rq worker's job)."""
    connect_mongo()

    async def main():
        runner = Runner()
        runner.start()
        try:
            return await runner.run_entry(lease_id)
        finally:
            await runner.close()

    return asyncio.run(main())


def serve(queue_keys: list[str], burst: bool = False, max_jobs: int | None = None, exports: bool = True) -> None:
    """``downcluster worker``: download entries on the event loop and, in a thread of their own,
    export entries from down_export (slave/exporter.py), so neither waits for the other."""
    from slave.exporter import ExportLane

    connect_mongo()

    async def main():
        runner = Runner()
        runner.start()
        lane = ExportLane(runner.worker_id) if exports else None
        if lane:
            lane.start()
        logger.info("worker %s on %s%s (up to %s downloads in flight)", runner.worker_id,
                    ", ".join(k.removeprefix("rq:queue:") for k in queue_keys), " and down_export" if lane else "",
                    settings.WORKER_INFLIGHT)
        try:
            await runner.serve(queue_keys, burst=burst, max_jobs=max_jobs)
        finally:
            if lane:
                await asyncio.get_running_loop().run_in_executor(None, lane.finish if burst else lane.stop)
            await runner.close()

    asyncio.run(main())
