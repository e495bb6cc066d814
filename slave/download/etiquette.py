"""Crawl etiquette of one worker's event loop, cluster-wide through Redis, in three rooms:

- ``siteslots.py``: per-site slots and delays (``common/sitelimits.py``), handed back when a page
  would wait longer than HOST_WAIT_MAX, each slot trusted only up to its local deadline;
- ``robots.py``: robots.txt, fetched once per site for the whole cluster and cached in Redis;
- ``coalescing.py``: identical requests within COALESCE_WINDOW downloaded once.

``Etiquette`` only composes them for the worker: one Redis client and command batcher for the
loop (``redisbatch.py``), and the keeper thread that renews held slots and leaderships.
Nothing here blocks the event loop: Redis is used through redis.asyncio; the keeper renews with
a client of its own.
"""
from __future__ import annotations

import asyncio
import logging
import threading

from redis import asyncio as aioredis

from common.config import settings
from common.store.connection import REDIS_OPTIONS, SENTINEL_SCHEME, redis_client
from slave.download.coalescing import Coalescing
from slave.download.redisbatch import Batcher
from slave.download.robots import Robots
from slave.download.siteslots import SiteSlots

logger = logging.getLogger(__name__)


class Etiquette:
    """The three rooms on one event loop: ``slots``, ``robots``, ``coalescing``."""

    def __init__(self) -> None:
        # a bounded pool that waits for a free connection (every download in flight may ask at once)
        if settings.REDIS_URL.startswith(SENTINEL_SCHEME):
            # the master Sentinel names, found again after a failover
            self.redis = redis_client(asynchronous=True)
        else:
            pool = aioredis.BlockingConnectionPool.from_url(settings.REDIS_URL, max_connections=64,
                                                            timeout=60, **REDIS_OPTIONS)
            self.redis = aioredis.Redis(connection_pool=pool)
        batch = Batcher(self.redis)
        self.slots = SiteSlots(batch)
        self.robots = Robots(self.redis)
        self.coalescing = Coalescing(batch)
        self.keeper: Keeper | None = None

    def start(self) -> None:
        """Start renewing (from the running event loop)."""
        self.keeper = Keeper(self, asyncio.get_running_loop())
        self.keeper.start()

    async def close(self) -> None:
        """Give back every slot still held and close the client."""
        try:
            await self.slots.close()
        finally:
            if self.keeper is not None:
                self.keeper.halt.set()
            await self.redis.aclose()

    def renew(self, redis, loop) -> None:
        """From the keeper thread: give back slots and leads that Redis missed, keep held slots
        and leaderships alive."""
        self.slots.release_missed(redis)
        self.coalescing.release_missed(redis)
        self.slots.renew(redis, loop)
        self.coalescing.renew(redis)


class Keeper(threading.Thread):
    """Renews an Etiquette's slots and leaderships every HOST_SLOT_TTL / 4, with a Redis client of
    its own whose commands time out within that: neither MongoDB nor a hung connection holds it up."""

    def __init__(self, etiquette: Etiquette, loop) -> None:
        super().__init__(daemon=True, name="slot-keeper")
        self.etiquette, self.loop, self.halt = etiquette, loop, threading.Event()
        self.every = settings.HOST_SLOT_TTL / 4
        self.redis = redis_client(socket_timeout=self.every, socket_connect_timeout=self.every)

    def run(self) -> None:
        while not self.halt.wait(self.every):
            try:
                self.etiquette.renew(self.redis, self.loop)
            except RuntimeError:  # the loop closed: the worker is ending
                return
            except Exception as exc:  # Redis away: the slots' local deadlines stop their downloads
                logger.warning("site slots not renewed: %s", type(exc).__name__)
        self.redis.close()
