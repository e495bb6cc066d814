"""robots.txt of one worker's event loop, cluster-wide through Redis: fetched once per site for
the whole cluster (a Redis lock), cached in Redis for ROBOTS_TTL, parsed with Protego, matched
against DOWNLOAD_USER_AGENT; a 4xx allows all, a 5xx or an unreachable site closes it for
ROBOTS_RETRY; Crawl-delay raises the site's delay. Nothing here blocks the event loop."""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

from common.config import settings
from common.errors import AddressRefused
from slave.download.siteslots import Handback

if TYPE_CHECKING:
    from protego import Protego  # imported when a robots.txt is parsed

logger = logging.getLogger(__name__)
ROBOTS_PREFIX = "downcluster:robots:"
ROBOTS_MAX_BYTES = 512 * 1024
LOCAL_ROBOTS_S = 300  # a parsed robots.txt is re-read from Redis after this


class Robots:
    """The robots.txt rules of the sites one event loop fetches from (``redis``: its asyncio client)."""

    def __init__(self, redis) -> None:
        self.redis = redis
        # origin -> (monotonic time it is read from Redis again, closed until (epoch s) | rules | None)
        self._rules: dict[str, tuple[float, float | Protego | None]] = {}
        self._loading: dict[tuple[str, int], asyncio.Future] = {}

    async def delay(self, url: str, site: str, scheme: str, session) -> float:
        """Crawl-delay of ``url``'s ``site`` (name:port); raises Handback when the site is closed,
        PermissionError when robots.txt disallows ``url`` and AddressRefused when ``session``
        may not reach the site."""
        origin = f"{scheme}://{site}"
        hit = self._rules.get(origin)
        if hit is None or hit[0] <= time.monotonic():
            # one load per origin and session (the session says which addresses it may reach)
            load_key = (origin, id(session))
            loading = self._loading.get(load_key)
            if loading is None:
                loading = self._loading[load_key] = asyncio.ensure_future(self._load(origin, scheme, session))
                loading.add_done_callback(lambda _: self._loading.pop(load_key, None))
            hit = self._rules[origin] = await asyncio.shield(loading)
        rules = hit[1]
        if isinstance(rules, float):  # closed until then (epoch seconds)
            raise Handback(max(rules - time.time(), 1.0), f"robots.txt of {origin} unavailable: site closed")
        if rules is None:
            return 0.0
        if not rules.can_fetch(url, settings.DOWNLOAD_USER_AGENT):
            raise PermissionError("robots.txt disallows")
        return float(rules.crawl_delay(settings.DOWNLOAD_USER_AGENT) or 0.0)

    async def _load(self, origin: str, scheme: str, session) -> tuple[float, float | Protego | None]:
        key = ROBOTS_PREFIX + origin
        raw = await self.redis.get(key)
        if raw is None:
            if await self.redis.set(key + ":lock", "1", nx=True, px=20_000):
                try:  # another worker may have stored it between our read and our lock
                    raw = await self.redis.get(key) or await self._fetch(origin, scheme, session, key)
                finally:
                    await self.redis.delete(key + ":lock")
            else:
                for _ in range(100):  # another worker is fetching it
                    await asyncio.sleep(0.2)
                    raw = await self.redis.get(key)
                    if raw is not None:
                        break
                else:
                    raw = await self._fetch(origin, scheme, session, key)
        entry = json.loads(raw)
        local_until = time.monotonic() + LOCAL_ROBOTS_S
        if entry.get("closed_until"):
            closed_until = float(entry["closed_until"])
            return min(local_until, time.monotonic() + max(closed_until - time.time(), 0)), closed_until
        if not entry.get("text"):
            return local_until, None
        from protego import Protego

        return local_until, Protego.parse(entry["text"])

    async def _fetch(self, origin: str, scheme: str, session, key: str) -> bytes:
        site = origin.split("://", 1)[1]
        name, _, port = site.rpartition(":")
        netloc = name if int(port) == (443 if scheme == "https" else 80) else site
        url = f"{scheme}://{netloc}/robots.txt"
        import aiohttp

        status, text = 0, ""
        try:
            async with session.get(url, headers={"User-Agent": settings.DOWNLOAD_USER_AGENT}, max_redirects=5,
                                   timeout=aiohttp.ClientTimeout(total=15)) as resp:
                status = resp.status
                body = await resp.content.read(ROBOTS_MAX_BYTES)
                text = body.decode("utf-8", errors="replace") if 200 <= status < 300 else ""
        except AddressRefused:  # the page is refused too; the site is not closed for others
            raise
        except Exception as exc:  # unreachable: the site is closed for a while
            logger.info("robots.txt of %s unreachable: %s", origin, type(exc).__name__)
        if 200 <= status < 500:
            entry, ttl = {"status": status, "text": text}, settings.ROBOTS_TTL
        else:
            ttl = settings.ROBOTS_RETRY
            entry = {"status": status, "closed_until": time.time() + ttl}
        raw = json.dumps(entry).encode()
        await self.redis.set(key, raw, ex=max(1, int(ttl)))
        return raw
