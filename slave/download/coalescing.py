"""Coalescing of identical requests, cluster-wide through Redis: identical requests within
COALESCE_WINDOW are downloaded once. The first is the leader (``run:<task>``), the others wait
and then copy its stored data (``done:<task>:<data id>``, published by the writer once the data
is stored). A failed download is not shared: its key is removed and a waiter becomes the next
leader. An entry asks to lead all its requests in one call when it starts, and the writer
publishes a whole batch in one call: a page that nobody else asked for costs no Redis command of
its own. The etiquette's keeper thread keeps the leaderships alive while their downloads run."""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from urllib.parse import urlsplit

from common.config import settings
from common.sitelimits import site_of
from slave.download.redisbatch import CAS, Batcher, drain, missed

logger = logging.getLogger(__name__)
COALESCE_PREFIX = "downcluster:co:"

# KEYS: coalescing keys. ARGV: ttl ms, then one "run:<task>" per key. Per key: 1 (led by the
# caller now, or still: a task handed back while Redis was away comes back to its own lead) or
# the value found (another task's "run:..." or "done:...").
LEAD_MANY = """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('SET', key, ARGV[i + 1], 'NX', 'PX', ARGV[1]) then out[i] = 1
  elseif redis.call('GET', key) == ARGV[i + 1] then redis.call('PEXPIRE', key, ARGV[1]); out[i] = 1
  else out[i] = redis.call('GET', key) or 0 end
end
return out
"""

# KEYS: coalescing keys. ARGV: window ms, then per key the value expected and the one to set.
PUBLISH_MANY = """
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[2 * i] then redis.call('SET', key, ARGV[2 * i + 1], 'PX', ARGV[1]) end
end
return #KEYS
"""

# KEYS: coalescing keys. ARGV: ttl ms, then the value each should still hold. Per key 1 (renewed) or 0.
RENEW_LEADS = """
local out = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    out[i] = redis.call('PEXPIRE', key, ARGV[1])
  else
    out[i] = 0
  end
end
return out
"""


def normalise(url: str, p=None) -> str:
    """Scheme and site lower-case, default port and fragment dropped (``p``: urlsplit(url))."""
    p = p or urlsplit(url)
    scheme, site = p.scheme.lower(), site_of(url, p)
    default = ":443" if scheme == "https" else ":80"
    if site.endswith(default):
        site = site[:-len(default)]
    userinfo, at, _ = p.netloc.rpartition("@")
    return f"{scheme}://{userinfo}{at}{site}{p.path or '/'}{'?' + p.query if p.query else ''}"


class Coalescing:
    """The requests one event loop leads or follows."""

    def __init__(self, batch: Batcher) -> None:
        self.batch = batch
        self.leading: dict[str, str] = {}    # coalescing key -> "run:<task>" (renewed by the keeper)
        self._unled = missed()  # (key, "run:<task>", when): let go of while Redis was away

    @staticmethod
    def keys(urls: list[str], ctx, shape: dict) -> list[str]:
        """The coalescing key of each URL requested as ``ctx`` and ``shape`` (its request-shaping
        settings: engine, proxy, cookie, headers, user agent) say, and as far as its redirects may
        go (a following job's scope: hosts and patterns); within the job's project only (a copy
        names the task it came from: another project's must never be named)."""
        follow = ctx.follow
        scope = None if follow is None else [follow.scope, [*follow.sites], [*follow.allow], [*follow.deny]]
        shaped = json.dumps([getattr(ctx, "project", None), ctx.engine, shape.get("proxy", ""),
                             shape.get("cookie", ""),
                             sorted((shape.get("headers") or {}).items()), shape.get("user_agent", ""),
                             bool(shape.get("allow_private")), *([scope] if scope is not None else [])])
        return [COALESCE_PREFIX + hashlib.sha256(f"{shaped}\n{normalise(url)}".encode()).hexdigest()[:40]
                for url in urls]

    async def lead_many(self, keys_: list[str], task_ids: list[str]) -> list:
        """Ask to lead each request (one call for an entry): per key True (this task leads and
        downloads) or the value another task left (``run:...`` or ``done:...``)."""
        if not keys_:
            return []
        mine = [f"run:{t}" for t in task_ids]
        got = await self.batch.eval(LEAD_MANY, keys_, [settings.HOST_SLOT_TTL * 1000, *mine])
        for key, value, led in zip(keys_, mine, got):
            if led == 1:
                self.leading[key] = value
        return [led == 1 or led for led in got]

    @staticmethod
    def done_of(value) -> tuple[str, str] | None:
        """(leader task id, data id) of a published download's value, else None."""
        if isinstance(value, bytes) and value.startswith(b"done:"):
            _, leader, data_id = value.decode().split(":", 2)
            return leader, data_id
        return None

    async def lead_or_wait(self, key: str, task_id: str, deadline: float) -> tuple[str, str] | None:
        """None: this task leads (downloads); else (leader task id, data id) to copy."""
        mine = f"run:{task_id}"
        while time.monotonic() < deadline:
            if await self.batch.call("SET", key, mine, "NX", "PX", settings.HOST_SLOT_TTL * 1000):
                self.leading[key] = mine
                return None
            found = self.done_of(await self.batch.call("GET", key))
            if found is not None:
                return found
            await asyncio.sleep(0.05 + random.random() * 0.05)
        return None  # waited long enough: download it ourselves

    async def give_up_lead(self, key: str) -> None:
        """The leader's download failed or will not be stored: let a waiter lead."""
        mine = self.leading.pop(key, None)
        if mine:
            try:
                await self.batch.eval(CAS, [key], [mine, ""])
            except Exception:
                self._unled.append((key, mine, time.monotonic()))
                raise

    def publish_all(self, leaders: list[tuple[str, object, object]]) -> None:
        """On the loop, once the leaders' data is stored: their waiters may copy it now and for
        COALESCE_WINDOW seconds (one call for a whole write batch)."""
        args: list[int | str] = [int(settings.COALESCE_WINDOW * 1000)]
        for key, task_id, data_id in leaders:
            self.leading.pop(key, None)
            args += [f"run:{task_id}", f"done:{task_id}:{data_id}"]
        done = asyncio.ensure_future(self.batch.eval(PUBLISH_MANY, [key for key, _, _ in leaders], args))
        done.add_done_callback(lambda future: self._published(future, leaders))

    def _published(self, future: asyncio.Future, leaders: list) -> None:
        if future.cancelled() or future.exception() is None:
            return
        logger.warning("coalesced download not published: %s", type(future.exception()).__name__)
        self._unled.extend((key, f"run:{task_id}", time.monotonic()) for key, task_id, _ in leaders)

    async def forget(self, key: str, value: str) -> None:
        await self.batch.eval(CAS, [key], [value, ""])

    def renew(self, redis) -> None:
        """From the keeper thread: keep the leaderships alive while their downloads run."""
        leading = list(self.leading.items())
        if not leading:
            return
        renewed = redis.eval(RENEW_LEADS, len(leading), *(k for k, _ in leading),
                             settings.HOST_SLOT_TTL * 1000, *(v for _, v in leading))
        for (key, _), still in zip(leading, renewed):
            if not still:  # published (done) or given up: no longer ours to keep alive
                self.leading.pop(key, None)

    def release_missed(self, redis) -> None:
        """From the keeper thread: leads let go of while Redis was away (so waiters need not
        wait HOST_SLOT_TTL for them)."""
        leads = drain(self._unled)
        if not leads:
            return
        try:
            with redis.pipeline(transaction=False) as pipe:
                for key, value, _ in leads:
                    pipe.eval(CAS, 1, key, value, "")
                pipe.execute()
        except Exception:
            self._unled.extendleft(reversed(leads))
            raise
