"""Downloading: run a job's downloader on one task, within the cluster's etiquette.

``Engines`` holds what one event loop downloads with (the aiohttp client, a browser pool, a
thread pool for the requests engine and the python/shell sandboxes) and the etiquette (robots.txt,
per-site slots, coalescing of identical requests: ``slave/download/etiquette.py`` and its rooms).
Every failure of a download becomes an ``Outcome``; nothing it does can crash the worker.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from urllib.parse import urlsplit

from bson import ObjectId

from common import revisit
from common.config import settings
from common.errors import DownloadError
from common.scope import redirect_refusal
from common.secrets import redact
from common.sentry import capture
from common.sitelimits import site_of
from common.store import attempts
from common.store.models import store_time
from common.store.records import LeaseTask, Prev
from slave.download import links, sitemaps
from slave.download.coalescing import Coalescing
from slave.download.engines import aio, browser, chromium, http, sandbox
from slave.download.engines.base import Download
from slave.download.engines.rules import OUT_OF_SCOPE, Scope, too_big
from slave.download.etiquette import Etiquette
from slave.download.siteslots import SANDBOXED, Handback, SiteSlots, long_lease
from slave.worker.context import JobContext, limits_from_settings
from slave.worker.outcome import Outcome

logger = logging.getLogger(__name__)



def _request_shape(ctx: JobContext) -> dict:
    """The job's proxy, cookie, headers, our user agent and the addresses it may reach: what
    every built-in engine is given."""
    conf = ctx.settings
    return {"proxy": conf.proxy or "", "cookie": conf.cookie or "", "headers": dict(conf.headers),
            "user_agent": settings.DOWNLOAD_USER_AGENT, "allow_private": bool(conf.allow_private)}


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


def _scope(ctx: JobContext, task: LeaseTask) -> Scope | None:
    """For a page of a job that follows links: why a redirect of it leaves the job's scope (judged
    as a link found on it would be), or None; a sitemap task or a job that does not follow: None."""
    follow = ctx.follow
    if follow is None or task.sitemap is not None:
        return None
    return partial(redirect_refusal, follow, task.uri)


def _previous(prev: Prev | None) -> dict | None:
    """What a python downloader is told of the page's latest version (None on a first visit):
    it may send the validators itself and return ``{"status_code": 304}`` when nothing changed."""
    if not prev:
        return None
    return {"etag": prev.etag, "last_modified": prev.last_modified, "sha256": prev.digest,
            "version": prev.versions, "headers": revisit.validators(prev)}


def _etiquette_unavailable(task: LeaseTask, exc: Exception) -> Outcome:
    """The task is handed back (due again in 5 s, no attempt counted): the etiquette's checks failed."""
    logger.warning("task %s handed back: %s", task.id, redact(f"{type(exc).__name__}: {exc}"))
    return Outcome(task=task, download=None, deferred=5.0, spend_us=0,
                          error=DownloadError(f"etiquette unavailable ({type(exc).__name__}): handed back"))


class Engines:
    """What one event loop downloads with."""

    def __init__(self) -> None:
        self.client = aio.Client()
        self.large_gate = asyncio.Semaphore(settings.WORKER_LARGE_BODIES)
        self.browsers = chromium.Pool(
            settings.BROWSER_POOL, settings.BROWSER_MAX_PAGES, settings.BROWSER_MEMORY_MB
        )
        self.blocking = ThreadPoolExecutor(
            max_workers=settings.DOWNLOAD_CONCURRENCY, thread_name_prefix="download"
        )
        self.limits = limits_from_settings()
        self.etiquette = Etiquette()
        self._local = threading.local()

    def _requests(self, url: str, shape: dict, cut: http.Cut | None, scope: Scope | None = None) -> Download:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = http.new_session()
        return http.fetch(url, limits=self.limits, session=session, cut=cut, scope=scope, **shape)

    def _sandboxed(self, token: str, run) -> Download:
        """In a download thread: ``run(limits)``, a python or shell downloader, its time limit cut
        to what is left of its slot (it is killed then: the loop cannot stop it earlier)."""
        left = self.etiquette.slots.left(token)
        return run(replace(self.limits, timeout=max(0.0, min(self.limits.timeout, left))))

    def coalescing(self, ctx: JobContext) -> bool:
        return ctx.language == "none" and settings.COALESCE_WINDOW > 0 and ctx.engine != "browser"

    async def prepare(self, ctx: JobContext, tasks: list[LeaseTask]) -> dict:
        """What an entry asks of Redis once, before its pages start: the site slots its pages
        will take (pooled limits, see SiteSlots.pooled) and whether each task leads its request
        (coalescing). Returns task id -> (coalescing key, True when it leads else the value
        found); {} when the job does not coalesce; Redis failing: every task maps to the error
        and is handed back."""
        if not tasks:
            return {}
        wanted: dict[str, int] = {}
        if ctx.language not in SANDBOXED and SiteSlots.pooled(*SiteSlots.limits(ctx)):
            for t in tasks:
                site = site_of(t.uri)
                wanted[site] = wanted.get(site, 0) + 1
        keys_: list = []
        shared = [t for t in tasks if not t.prev]  # a revisit asks with its own validators
        if self.coalescing(ctx) and shared:
            keys_ = Coalescing.keys([t.uri for t in shared], ctx, _request_shape(ctx))
        task_ids = [str(t.id) for t in shared]
        reserved, led = await asyncio.gather(self.etiquette.slots.reserve(wanted),
                                             self.etiquette.coalescing.lead_many(keys_, task_ids),
                                             return_exceptions=True)
        if isinstance(reserved, Exception):  # each page asks for its own slot
            logger.debug("slots not reserved: %s", type(reserved).__name__)
        if isinstance(led, Exception):
            return {t.id: led for t in tasks}
        return {t.id: plan for t, plan in zip(shared, zip(keys_, led))}

    async def download(self, ctx: JobContext, task: LeaseTask, plan=None) -> Outcome:
        """Run the job's downloader on one task, within the cluster's etiquette (robots.txt,
        per-site slots, coalescing as ``plan`` from ``prepare`` says); every failure becomes an Outcome."""
        start = time.monotonic()
        url, lead = task.uri, None
        if isinstance(plan, Exception):  # Redis failed the entry's etiquette call
            return _etiquette_unavailable(task, plan)
        try:
            kind = task.sitemap if ctx.sitemaps is not None else None  # carried in the lease
            result, copied_from, lead = await self._polite(ctx, task, plan)
            error = None
        except Handback as back:
            return Outcome(task=task, download=None, error=DownloadError(back.reason), deferred=back.after,
                                  spend_us=int((time.monotonic() - start) * 1_000_000))
        except DownloadError as exc:
            result, copied_from, error = None, None, exc
            if exc.reason.startswith(OUT_OF_SCOPE):
                logger.info("job %s task %s: %s, not followed", ctx.name, task.id, redact(exc.reason)[:400])
        except Exception as exc:  # Redis (etiquette) failed: try again later
            return _etiquette_unavailable(task, exc)
        request_size = len(url) + (len(result.request_body) if result else 0)
        sitemap = None if kind is None else await self._sitemap(ctx, task, result, *kind)
        return Outcome(task=task, download=result, error=error, coalesce_key=lead, coalesced_from=copied_from,
                              spend_us=int((time.monotonic() - start) * 1_000_000), request_size=request_size,
                              links=None if sitemap is not None else await self._links(ctx, task, result),
                              sitemap=sitemap)

    async def _sitemap(self, ctx: JobContext, task: LeaseTask, result: Download | None, kind: str,
                       depth: int) -> sitemaps.Read:
        """A sitemap task's pages and sitemaps (in a thread: a sitemap takes a parse). A sitemap
        that is not one we read (malformed, a bomb, nested too deep), a failure or not a 2xx reads
        as empty, logged in one line: the task stays a success, its body stored."""
        if result is None or not 200 <= result.status_code < 300:
            return sitemaps.Read(depth)
        try:
            with_lastmod = bool(ctx.sitemaps and ctx.sitemaps.lastmod)
            read = await asyncio.get_running_loop().run_in_executor(
                None, sitemaps.read, result.body, task.uri, kind, depth, with_lastmod)
        except sitemaps.SitemapError as exc:
            logger.warning("job %s task %s: sitemap %s not read: %s", ctx.name, task.id,
                           redact(task.uri)[:200], exc)
            return sitemaps.Read(depth)
        if read.excess:
            logger.info("job %s task %s: sitemap of more than %d entries, %d left out", ctx.name, task.id,
                        sitemaps.MAX_ENTRIES, read.excess)
        return read

    async def _links(self, ctx: JobContext, task: LeaseTask,
                     result: Download | None) -> links.Found | None:
        """A following job's links on this page (in a thread: a page takes a parse), the excess logged."""
        if ctx.follow is None or result is None:
            return None
        found = await asyncio.get_running_loop().run_in_executor(
            None, links.of_download, result, task.uri, ctx.follow, ctx.language == "none")
        if found is not None and (found.excess or found.truncated):
            logger.info("job %s task %s: %d links taken, %d over the cap%s", ctx.name, task.id,
                        len(found.urls), found.excess, ", page read in part" if found.truncated else "")
        return found

    async def _polite(self, ctx: JobContext, task: LeaseTask, plan) -> tuple[Download, object, str | None]:
        """(download, task copied from, coalescing key led): robots.txt first (built-in engine,
        unless the job says obey_robots = false), then an identical request's stored download,
        else a site slot and the fetch."""
        url, builtin = task.uri, ctx.language == "none"
        if not ctx.supported:
            raise DownloadError(f"downloader type {ctx.language} is disabled on this cluster "
                                f"(`downcluster type enable {ctx.language}` allows it again)",
                                retryable=False)
        parts = urlsplit(url)
        site, crawl_delay = site_of(url, parts), 0.0
        lead = plan[0] if plan is not None and plan[1] is True else None
        token = ""
        try:
            if builtin and ctx.settings.obey_robots is not False:
                try:
                    session = self.client.session("", bool(ctx.settings.allow_private))
                    crawl_delay = await self.etiquette.robots.delay(url, site, parts.scheme, session)
                except PermissionError:
                    raise DownloadError("robots.txt disallows", retryable=False) from None
            conc, delay = SiteSlots.limits(ctx)
            if plan is not None and lead is None:
                copied = await self._follow(plan[0], plan[1], str(task.id))
                if copied is not None:
                    return copied
                lead = plan[0]  # the leader failed or took too long: this task downloads
            token = await self.etiquette.slots.slot(site, conc, max(delay, crawl_delay),
                                                    long_lease() if ctx.language in SANDBOXED else None)
            cut = http.Cut()
            return (
                await self.etiquette.slots.guard(token, site, self._fetch(ctx, task, token, cut), cut),
                None,
                lead,
            )
        except BaseException as exc:
            if lead:  # failures are not shared: a waiter leads next
                await self.etiquette.coalescing.give_up_lead(lead)
            if (
                isinstance(exc, DownloadError)
                and exc.retry_after
                and exc.reason.startswith(("HTTP 429", "HTTP 503"))
            ):
                await self.etiquette.slots.pause(site, exc.retry_after)
            raise
        finally:
            if token:
                self.etiquette.slots.release(token, site)

    async def _follow(self, key: str, value, task_id: str):
        """Another task leads this request: (its stored download, its task id, None) once it is
        published, or None when this task is to download it (the leader failed, or waited for
        longer than a download may take)."""
        deadline = time.monotonic() + settings.DOWNLOAD_TIMEOUT + 30
        found = Coalescing.done_of(value)
        while True:
            if found is None:
                found = await self.etiquette.coalescing.lead_or_wait(key, task_id, deadline)
                if found is None:
                    return None
            copy = await asyncio.get_running_loop().run_in_executor(None, _stored_download, found[1])
            if copy is not None:
                return copy, ObjectId(found[0]), None
            await self.etiquette.coalescing.forget(key, f"done:{found[0]}:{found[1]}")  # its data went away
            found = None

    async def _fetch(
        self, ctx: JobContext, task: LeaseTask, token: str = "", cut: http.Cut | None = None
    ) -> Download:
        """The download itself, on ``token``'s slot (``cut`` stops a requests fetch from outside)."""
        url, limits = task.uri, self.limits
        loop = asyncio.get_running_loop()
        started = store_time()  # the fetch's time (WARC-Date), on the clock its store stamp is on
        shape, prev, scope = _request_shape(ctx), task.prev, _scope(ctx, task)
        if prev:  # a visit of a stored page: ask whether it changed (a 304 costs no body)
            shape["headers"] = {**shape["headers"], **revisit.validators(prev)}
        try:
            if ctx.language == "python":
                payload = {"url": url, "task_id": str(task.id), "job": ctx.name,
                           "attempt": task.attempts + 1, "settings": ctx.settings.by_name(),
                           "previous": _previous(prev)}
                result = await loop.run_in_executor(self.blocking, self._sandboxed, token,
                                                    partial(sandbox.run_python, ctx.code, payload))
            elif ctx.language == "shell":
                proxy, cookie = ctx.settings.proxy or "", ctx.settings.cookie or ""
                private = bool(ctx.settings.allow_private)
                result = await loop.run_in_executor(
                    self.blocking,
                    self._sandboxed,
                    token,
                    lambda lim: sandbox.run_shell(ctx.code, url, lim, proxy, cookie, private),
                )
            elif ctx.engine == "requests":
                result = await loop.run_in_executor(self.blocking, self._requests, url, shape, cut, scope)
            elif ctx.engine == "browser":
                result = await browser.fetch(
                    url,
                    limits=limits,
                    pool=self.browsers,
                    **_request_shape(ctx),  # a browser sends its own validators: digests tell a change
                    js=ctx.settings.download_js or "",
                    idle_max=settings.BROWSER_IDLE_MAX,
                    scope=scope,
                )
            else:
                result = await aio.fetch(url, limits=limits, client=self.client, **shape,
                                         large_gate=self.large_gate, scope=scope)
            if len(result.body) > limits.maxsize:
                raise too_big(limits.maxsize)
            result.fetched_at = started
            return result
        except DownloadError:
            raise
        except Exception as exc:  # an engine bug fails the task, not the entry
            logger.exception("downloader crashed on task %s of job %s", task.id, ctx.name)
            capture(exc)
            raise DownloadError(redact(f"{type(exc).__name__}: {exc}"), retryable=True) from None

    async def close(self) -> None:
        await self.etiquette.close()
        await self.client.close()
        await self.browsers.close()
        self.blocking.shutdown(wait=False, cancel_futures=True)
