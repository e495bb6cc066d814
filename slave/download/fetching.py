"""Downloading one task: the job's engine within the cluster's etiquette (``pipeline.py``), then
what the page yields (a following job's links, a sitemap task's pages).

``Fetcher`` holds what one event loop downloads with: its engines (``engines/registry.py``), the
etiquette's Redis rooms (``etiquette.py``) and the pipeline between them. ``download`` answers a
``Fetched`` for every task, whatever happened: nothing it does can crash the worker. The worker
makes its ``Outcome`` of it (``slave/worker/outcome.py``); this package never imports the worker.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from common.errors import DownloadError
from common.secrets import redact
from common.store.records import LeaseTask
from slave.download import links, sitemaps
from slave.download.engines.base import Download
from slave.download.engines.failures import EtiquetteUnavailable, OutOfScope
from slave.download.engines.registry import Engines
from slave.download.etiquette import Etiquette
from slave.download.job import JobContext
from slave.download.pipeline import Pipeline
from slave.download.siteslots import Handback

logger = logging.getLogger(__name__)


@dataclass
class Fetched:
    """What became of one task's download: a ``download``, or an ``error``, or ``deferred`` (handed
    back: due again in this many seconds, no attempt counted)."""

    task: LeaseTask
    download: Download | None
    error: DownloadError | None
    spend_us: int
    request_size: int = 0
    deferred: float | None = None
    coalesce_key: str | None = None      # this download leads identical requests: publish it once stored
    coalesced_from: object = None        # the task whose stored download this one copied
    links: links.Found | None = None     # a following job's links found on the page
    sitemap: sitemaps.Read | None = None  # a sitemap task's pages and sitemaps


def _spent(start: float) -> int:
    return int((time.monotonic() - start) * 1_000_000)


def _etiquette_unavailable(task: LeaseTask, exc: Exception) -> Fetched:
    """The task is handed back (due again in 5 s, no attempt counted): the etiquette's checks failed."""
    logger.warning("task %s handed back: %s", task.id, redact(f"{type(exc).__name__}: {exc}"))
    return Fetched(task=task, download=None, deferred=5.0, spend_us=0, error=EtiquetteUnavailable(
        f"etiquette unavailable ({type(exc).__name__}): handed back"))


class Fetcher:
    """What one event loop downloads with."""

    def __init__(self) -> None:
        self.engines = Engines()
        self.etiquette = Etiquette()
        self.pipeline = Pipeline(self.etiquette, self.engines)

    async def prepare(self, ctx: JobContext, tasks: list[LeaseTask]) -> dict:
        """An entry's one call to Redis before its pages start (``Pipeline.prepare``)."""
        return await self.pipeline.prepare(ctx, tasks)

    async def download(self, ctx: JobContext, task: LeaseTask, plan=None) -> Fetched:
        """Run the job's engine on one task within the etiquette (coalescing as ``plan`` from
        ``prepare`` says); every failure becomes a Fetched."""
        start = time.monotonic()
        if isinstance(plan, Exception):  # Redis failed the entry's etiquette call
            return _etiquette_unavailable(task, plan)
        try:
            result, copied_from, lead = await self.pipeline.run(ctx, task, plan)
            error = None
        except Handback as back:
            return Fetched(task=task, download=None, error=DownloadError(back.reason), deferred=back.after,
                           spend_us=_spent(start))
        except DownloadError as exc:
            result, copied_from, lead, error = None, None, None, exc
            if isinstance(exc, OutOfScope):
                logger.info("job %s task %s: %s, not followed", ctx.name, task.id, redact(exc.reason)[:400])
        except Exception as exc:  # Redis (etiquette) failed: try again later
            return _etiquette_unavailable(task, exc)
        request_size = len(task.uri) + (len(result.request_body) if result else 0)
        carried = task.sitemap if ctx.sitemaps is not None else None  # (sitemap kind, depth), in the lease
        sitemap = None if carried is None else await self._sitemap(ctx, task, result, *carried)
        return Fetched(task=task, download=result, error=error, coalesce_key=lead, coalesced_from=copied_from,
                       spend_us=_spent(start), request_size=request_size, sitemap=sitemap,
                       links=None if sitemap is not None else await self._links(ctx, task, result))

    async def _sitemap(self, ctx: JobContext, task: LeaseTask, result: Download | None, sitemap_kind: str,
                       depth: int) -> sitemaps.Read:
        """A sitemap task's pages and sitemaps (in a thread: a sitemap takes a parse). A sitemap
        that is not one we read (malformed, a bomb, nested too deep), a failure or not a 2xx reads
        as empty, logged in one line: the task stays a success, its body stored."""
        if result is None or not 200 <= result.status_code < 300:
            return sitemaps.Read(depth)
        try:
            with_lastmod = bool(ctx.sitemaps and ctx.sitemaps.lastmod)
            read = await asyncio.get_running_loop().run_in_executor(
                None, sitemaps.read, result.body, task.uri, sitemap_kind, depth, with_lastmod)
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
            None, links.of_download, result, task.uri, ctx.follow, ctx.traits.builtin)
        if found is not None and (found.excess or found.truncated):
            logger.info("job %s task %s: %d links taken, %d over the cap%s", ctx.name, task.id,
                        len(found.urls), found.excess, ", page read in part" if found.truncated else "")
        return found

    async def close(self) -> None:
        try:
            await self.etiquette.close()
        finally:
            await self.pipeline.close()
            await self.engines.close()
