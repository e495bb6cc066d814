"""The etiquette around an engine, as small steps in one order:

    robots.txt  ->  coalescing  ->  site slot  ->  engine

Each step reads the engine's traits (``common/engines.py``) and the job's settings and switches
itself off when they say so (``applies``), as Scrapy's middlewares do: ``RobotsStep`` for an
engine that does not obey robots.txt or a job with ``obey_robots = false``; ``CoalescingStep``
for an engine that does not coalesce or COALESCE_WINDOW 0; ``SiteSlotStep`` never, but a
sandboxed engine's slot is leased for its whole time limit and never pooled.

Invariants: a page reaches its engine only within a site slot of its site; a coalescing
follower never reaches it while its leader's download may still be published; a failure is
never shared (a failing leader lets a waiter lead). What leaves ``Pipeline.run`` is a Download
or a failure of ``failures.py`` (or ``Handback``: the page goes back, due later, no attempt);
an engine's bug becomes ``EngineCrashed``, failing the task, not the entry.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from urllib.parse import SplitResult, urlsplit

from bson import ObjectId

from common.config import settings
from common.errors import DownloadError
from common.scope import redirect_refusal
from common.secrets import redact
from common.sentry import capture
from common.sitelimits import site_of
from common.store import attempts
from common.store.clock import store_time
from common.store.records import LeaseTask
from slave.download.coalescing import Coalescing
from slave.download.engines import aio
from slave.download.engines.base import Download, Request
from slave.download.engines.failures import DownloaderFailed, EngineCrashed, HttpStatus, RobotsDisallowed
from slave.download.engines.http import Cut
from slave.download.engines.registry import Engines
from slave.download.engines.rules import too_big
from slave.download.etiquette import Etiquette
from slave.download.job import JobContext, limits_from_settings
from slave.download.robots import Robots
from slave.download.siteslots import SiteSlots, long_lease

logger = logging.getLogger(__name__)

Copied = tuple[Download, ObjectId, None]  # an identical request's stored download, its task


class RobotsStep:
    """robots.txt first, fetched on a client of its own; answers the site's crawl delay."""

    def __init__(self, robots: Robots) -> None:
        self.robots, self.client = robots, aio.Client()

    @staticmethod
    def applies(ctx: JobContext) -> bool:
        return ctx.traits.obeys_robots and ctx.settings.obey_robots is not False

    async def crawl_delay(self, ctx: JobContext, url: str, parts: SplitResult, site: str) -> float:
        """The site's crawl delay (0 when off); RobotsDisallowed when robots.txt refuses the URL."""
        if not self.applies(ctx):
            return 0.0
        try:
            session = self.client.session("", bool(ctx.settings.allow_private))
            return await self.robots.delay(url, site, parts.scheme, session)
        except PermissionError:
            raise RobotsDisallowed() from None

    async def close(self) -> None:
        await self.client.close()


def _stored_download(data_id: str) -> Download | None:
    """The download an identical request stored (to copy for a coalesced task), or None if gone."""
    found = attempts.stored_response(data_id)
    if found is None:
        return None
    doc, body = found
    return Download(status_code=int(doc.status_code or 0), headers=dict(doc.response_headers), body=body,
                    url=doc.url or "", remote_ip=doc.remote_ip or "",
                    request_headers=dict(doc.requests_headers), encoding=doc.encoding,
                    fetched_at=doc.fetched_at or doc.add_datetime)  # the leader's fetch: when it was fetched


class CoalescingStep:
    """Identical requests within COALESCE_WINDOW downloaded once: one task leads, the others copy
    its stored download (``plan`` per entry, ``follow`` per page)."""

    def __init__(self, coalescing: Coalescing) -> None:
        self.coalescing = coalescing

    @staticmethod
    def applies(ctx: JobContext) -> bool:
        return ctx.traits.coalesces and settings.COALESCE_WINDOW > 0

    def keys(self, ctx: JobContext, tasks: list[LeaseTask]) -> tuple[list[LeaseTask], list[str]]:
        """The tasks that may share a download (a revisit asks with its own validators) and their keys."""
        shared = [t for t in tasks if not t.prev] if self.applies(ctx) else []
        if not shared:
            return [], []
        shape = {"proxy": ctx.settings.proxy or "", "cookie": ctx.settings.cookie or "",
                 "headers": dict(ctx.settings.headers), "user_agent": settings.DOWNLOAD_USER_AGENT,
                 "allow_private": bool(ctx.settings.allow_private)}
        return shared, Coalescing.keys([t.uri for t in shared], ctx, shape)

    async def follow(self, key: str, value, task_id: str) -> Copied | None:
        """Another task leads this request: (its stored download, its task id, None) once it is
        published, or None when this task is to download it (the leader failed, or waited for
        longer than a download may take)."""
        deadline = time.monotonic() + settings.DOWNLOAD_TIMEOUT + 30
        found = Coalescing.done_of(value)
        while True:
            if found is None:
                found = await self.coalescing.lead_or_wait(key, task_id, deadline)
                if found is None:
                    return None
            copy = await asyncio.get_running_loop().run_in_executor(None, _stored_download, found[1])
            if copy is not None:
                return copy, ObjectId(found[0]), None
            await self.coalescing.forget(key, f"done:{found[0]}:{found[1]}")  # its data went away
            found = None

    async def give_up(self, lead: str | None) -> None:
        if lead:  # failures are not shared: a waiter leads next
            await self.coalescing.give_up_lead(lead)


class SiteSlotStep:
    """The page waits for a slot of its site (or is handed back), is fetched while the slot is
    surely this worker's, and a site that asks for a pause (``HttpStatus.pauses_site``) gets it."""

    def __init__(self, slots: SiteSlots) -> None:
        self.slots = slots

    @staticmethod
    def pooled(ctx: JobContext) -> bool:
        return not ctx.traits.sandboxed and SiteSlots.pooled(*SiteSlots.limits(ctx))

    async def around(self, ctx: JobContext, site: str, crawl_delay: float, request: Request,
                     fetch: Callable[[Request], Awaitable[Download]]) -> Download:
        conc, delay = SiteSlots.limits(ctx)
        token = await self.slots.slot(site, conc, max(delay, crawl_delay),
                                      long_lease() if ctx.traits.sandboxed else None)
        try:
            request.slot_left, request.cut = partial(self.slots.left, token), Cut()
            return await self.slots.guard(token, site, fetch(request), request.cut)
        except HttpStatus as exc:
            if exc.pauses_site and exc.retry_after:
                await self.slots.pause(site, exc.retry_after)
            raise
        finally:
            self.slots.release(token, site)


class Pipeline:
    """The steps of one event loop around its engines."""

    def __init__(self, etiquette: Etiquette, engines: Engines) -> None:
        self.engines, self.limits = engines, limits_from_settings()
        self.robots = RobotsStep(etiquette.robots)
        self.coalescing = CoalescingStep(etiquette.coalescing)
        self.slots = SiteSlotStep(etiquette.slots)

    async def prepare(self, ctx: JobContext, tasks: list[LeaseTask]) -> dict:
        """What an entry asks of Redis once, before its pages start: the site slots its pages
        will take (pooled limits, see SiteSlots.pooled) and whether each task leads its request
        (coalescing). Returns task id -> (coalescing key, True when it leads else the value
        found); {} when the job does not coalesce; Redis failing: every task maps to the error
        and is handed back."""
        if not tasks:
            return {}
        wanted: dict[str, int] = {}
        if self.slots.pooled(ctx):
            for t in tasks:
                site = site_of(t.uri)
                wanted[site] = wanted.get(site, 0) + 1
        shared, keys_ = self.coalescing.keys(ctx, tasks)
        reserved, led = await asyncio.gather(
            self.slots.slots.reserve(wanted),
            self.coalescing.coalescing.lead_many(keys_, [str(t.id) for t in shared]),
            return_exceptions=True)
        if isinstance(reserved, Exception):  # each page asks for its own slot
            logger.debug("slots not reserved: %s", type(reserved).__name__)
        if isinstance(led, Exception):
            return {t.id: led for t in tasks}
        return {t.id: plan for t, plan in zip(shared, zip(keys_, led))}

    def request(self, ctx: JobContext, task: LeaseTask) -> Request:
        """The request an engine receives for ``task`` of ``ctx``'s job."""
        conf = ctx.settings
        scope = None  # a following job's page: a redirect leaving its scope is refused
        if ctx.follow is not None and task.sitemap is None:
            scope = partial(redirect_refusal, ctx.follow, task.uri)
        return Request(url=task.uri, task_id=str(task.id), attempt=task.attempts + 1, job=ctx.name,
                       limits=self.limits, proxy=conf.proxy or "", cookie=conf.cookie or "",
                       headers=dict(conf.headers), user_agent=settings.DOWNLOAD_USER_AGENT,
                       allow_private=bool(conf.allow_private), scope=scope, previous=task.prev or None,
                       code=ctx.code, job_settings=conf, js=conf.download_js or "")

    async def run(self, ctx: JobContext, task: LeaseTask, plan) -> tuple[Download, object, str | None]:
        """(download, task copied from, coalescing key led): the steps in their order."""
        if not ctx.supported:
            raise DownloaderFailed(f"downloader type {ctx.language} is disabled on this cluster "
                                   f"(`downcluster type enable {ctx.language}` allows it again)",
                                   retryable=False)
        url = task.uri
        parts = urlsplit(url)
        site = site_of(url, parts)
        lead = plan[0] if plan is not None and plan[1] is True else None
        try:
            crawl_delay = await self.robots.crawl_delay(ctx, url, parts, site)
            if plan is not None and lead is None:
                copied = await self.coalescing.follow(plan[0], plan[1], str(task.id))
                if copied is not None:
                    return copied
                lead = plan[0]  # the leader failed or took too long: this task downloads
            fetch = partial(self._engine, ctx, task)
            return await self.slots.around(ctx, site, crawl_delay, self.request(ctx, task), fetch), None, lead
        except BaseException:
            await self.coalescing.give_up(lead)
            raise

    async def _engine(self, ctx: JobContext, task: LeaseTask, request: Request) -> Download:
        """The job's engine on ``request``; its body checked against the limit, its time stamped."""
        started = store_time()  # the fetch's time (WARC-Date), on the clock its store stamp is on
        try:
            result = await self.engines[ctx.key].fetch(request)
            if len(result.body) > request.limits.maxsize:
                raise too_big(request.limits.maxsize)
            result.fetched_at = started
            return result
        except DownloadError:
            raise
        except Exception as exc:  # an engine bug fails the task, not the entry
            logger.exception("downloader crashed on task %s of job %s", task.id, ctx.name)
            capture(exc)
            raise EngineCrashed(redact(f"{type(exc).__name__}: {exc}"), retryable=True) from None

    async def close(self) -> None:
        await self.robots.close()
