"""The Redis side of the etiquette on one event loop: commands its downloads issue within
GATHER seconds go out as one pipeline, and what could not be given back while Redis was away
is kept for the keeper thread to give back once it answers again."""
from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque

from common.config import settings

GATHER = 0.001  # seconds the loop's Redis commands are gathered into one pipeline

# KEYS: key. ARGV: expected value, then "" to delete or a new value and its ttl ms.
CAS = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
"""


class Batcher:
    """Redis commands that the loop's downloads issue within GATHER seconds go out as one
    pipeline: one round trip and far less client CPU than a call (or a pipeline) each, for the
    price of a millisecond or two per page. Scripts run by EVALSHA, loaded once (again after a
    Redis restart)."""

    def __init__(self, redis) -> None:
        self.redis = redis
        self.pending: list = []
        self.scheduled = False
        self.shas: dict[str, str] = {}

    def call(self, *args) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((args, future))
        if not self.scheduled:
            self.scheduled = True
            loop.call_later(GATHER, self._start)
        return future

    def _start(self) -> None:
        self.scheduled = False
        batch, self.pending = self.pending, []
        asyncio.ensure_future(self._run(batch))

    async def _run(self, batch: list) -> None:
        try:
            pipe = self.redis.pipeline(transaction=False)
            for args, _ in batch:
                pipe.execute_command(*args)
            results = await pipe.execute(raise_on_error=False)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results):
            if not future.done():
                future.set_exception(result) if isinstance(result, Exception) else future.set_result(result)

    async def eval(self, source: str, keys_: list[str], args: list):
        """EVALSHA of ``source`` (its SHA1 computed here); a Redis that does not have the script
        yet (first use, or restarted) gets it by SCRIPT LOAD in the same pipeline as the rest."""
        from redis.exceptions import NoScriptError

        sha = self.shas.get(source)
        if sha is None:
            sha = self.shas[source] = hashlib.sha1(source.encode()).hexdigest()
        for _ in range(2):
            try:
                return await self.call("EVALSHA", sha, len(keys_), *keys_, *args)
            except NoScriptError:
                await self.call("SCRIPT", "LOAD", source)
        raise RuntimeError("Redis keeps losing the etiquette scripts")


def missed() -> deque:
    """What was given back or let go of while Redis was away: (key, value, when) entries."""
    return deque(maxlen=100_000)


def drain(entries: deque) -> list:
    """What ``entries`` holds of the last HOST_SLOT_TTL (older entries have expired in Redis)."""
    out, since = [], time.monotonic() - settings.HOST_SLOT_TTL
    while entries:
        out.append(entries.popleft())
    return [m for m in out if m[2] > since]
