"""A job's dry run on one URL (``common/dryrun.py``), run by a worker: the job's engine pipeline
(robots.txt, the site's slot, the engine: its sandbox, the private-reach rule, the time and size
limits) on the URL, as for a task of the job, but under an id no task has, without coalescing,
and with nothing written to the store: no data, no log, no settle, no lease. The result (status,
headers, the body's text cut to ``BODY_CHARS``, or the failure in one line) goes to Redis.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from bson import ObjectId

from common import dryrun
from common.errors import DownloadError
from common.secrets import redact
from common.store.connection import connect_mongo, redis_conn
from common.store.records import LeaseTask
from slave.download.engines.base import Download
from slave.download.engines.charset import body_encoding
from slave.download.fetching import Fetcher
from slave.download.siteslots import Handback
from slave.worker import context

logger = logging.getLogger(__name__)


def _line(text: str) -> str:
    """A failure as one line (secrets masked)."""
    return " ".join(redact(text).split())[:1000]


def _shown(got: Download) -> dict[str, Any]:
    encoding = got.encoding or body_encoding(got.headers, got.body) or "utf-8"
    try:
        text = got.body[:dryrun.BODY_CHARS * 4].decode(encoding, "replace")
    except LookupError:
        text = got.body[:dryrun.BODY_CHARS * 4].decode("utf-8", "replace")
    return {"status_code": got.status_code, "url": got.url,
            "headers": {k: redact(str(v))[:dryrun.HEADER_CHARS] for k, v in got.headers.items()},
            "size": len(got.body), "encoding": encoding, "body": text[:dryrun.BODY_CHARS],
            "truncated": len(text) > dryrun.BODY_CHARS or len(got.body) > dryrun.BODY_CHARS * 4}


async def perform(fetcher: Fetcher, ref: str) -> dict[str, Any]:
    """Run dry run ``ref`` with ``fetcher`` and store its result; the result (``{}`` when its
    request expired before a worker took it)."""
    loop = asyncio.get_running_loop()
    redis = redis_conn()
    asked = await loop.run_in_executor(None, dryrun.asked, redis, ref)
    if asked is None:
        logger.info("dry run %s expired before it ran", ref)
        return {}
    out: dict[str, Any] = {"url": asked["url"], "state": "done"}
    started = time.monotonic()
    ctx = await loop.run_in_executor(None, context.fresh_context, ObjectId(asked["job"]))
    if ctx is None:
        out.update(error="the job was removed")
    else:
        task = LeaseTask(id=ObjectId(), uri=asked["url"])  # an id no task has: nothing of a task is touched
        try:
            got = (await fetcher.pipeline.run(ctx, task, None))[0]
            try:
                out["response"] = _shown(got)
            finally:
                if got.release:
                    got.release()  # type: ignore[operator]
        except Handback as back:
            out["error"] = _line(f"not fetched now: {back.reason}")
        except DownloadError as exc:
            out["error"] = _line(exc.reason)
        except Exception as exc:  # Redis (etiquette) away, say: the dry run says so
            out["error"] = _line(f"{type(exc).__name__}: {exc}")
    out["spend_time"] = int((time.monotonic() - started) * 1e6)
    await loop.run_in_executor(None, dryrun.answer, redis, ref, out)
    logger.info("dry run %s of %s: %s", ref, asked["url"][:200], out.get("error") or "fetched")
    return out


def run(ref: str) -> dict[str, Any]:
    """A plain rq worker's dry run: a fetcher of its own in a fresh event loop."""
    connect_mongo()

    async def main() -> dict[str, Any]:
        fetcher = Fetcher()
        try:
            return await perform(fetcher, ref)
        finally:
            await fetcher.close()

    return asyncio.run(main())
