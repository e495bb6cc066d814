"""Crawl etiquette of one worker's event loop, cluster-wide through Redis:

- per-host slots and delays (common.hostlimits), renewed while held, handed back when a page
  would wait longer than HOST_WAIT_MAX (the task goes back, due after the wait, no attempt);
- robots.txt: fetched once per host for the whole cluster (a Redis lock), cached in Redis for
  ROBOTS_TTL, parsed with Protego, matched against DOWNLOAD_USER_AGENT; a 4xx allows all, a 5xx
  or an unreachable host closes it for ROBOTS_RETRY; Crawl-delay raises the host's delay;
- coalescing (seed 002): identical requests within COALESCE_WINDOW are downloaded once; the
  first is the leader (``run:<task>``), the others wait and then copy its stored data
  (``done:<task>:<data id>``, published by the writer once the data is stored). A failed
  download is not shared: its key is removed and a waiter becomes the next leader.

Nothing here blocks the event loop: Redis is used through redis.asyncio; the heartbeat thread
renews held slots and leaderships with its own client.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from redis import asyncio as aioredis

from common.config import settings
from common.hostlimits import ACQUIRE, PAUSE_HOST, RENEW, keys

logger = logging.getLogger(__name__)
ROBOTS_PREFIX = "downcluster:robots:"
COALESCE_PREFIX = "downcluster:co:"
ROBOTS_MAX_BYTES = 512 * 1024
LOCAL_ROBOTS_S = 300  # a parsed robots.txt is re-read from Redis after this
LINGER = 0.25  # seconds an idle slot stays with this worker for its next page of the host
GATHER = 0.001  # seconds the loop's Redis commands are gathered into one pipeline

# KEYS: key. ARGV: expected value, then "" to delete or a new value and its ttl ms.
CAS = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
"""


RENEW_IF = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""


@dataclass
class Handback(Exception):
    """The page cannot be fetched now (busy or closed host): give the task back, due in ``after`` s."""

    after: float
    reason: str


def normalise(url: str, p=None) -> str:
    """Scheme and host lower-case, default port and fragment dropped (``p``: urlsplit(url))."""
    p = p or urlsplit(url)
    host = (p.hostname or "").lower()
    default = {"http": 80, "https": 443}.get(p.scheme.lower())
    netloc = host if p.port in (None, default) else f"{host}:{p.port}"
    if p.username:
        netloc = f"{p.username}{':' + p.password if p.password else ''}@{netloc}"
    return urlunsplit((p.scheme.lower(), netloc, p.path or "/", p.query, ""))


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
        from redis.exceptions import NoScriptError

        for _ in range(2):
            sha = self.shas.get(source)
            if sha is None:
                sha = self.shas[source] = await self.redis.script_load(source)
            try:
                return await self.call("EVALSHA", sha, len(keys_), *keys_, *args)
            except NoScriptError:  # Redis restarted: load it again
                self.shas.pop(source, None)
        raise RuntimeError("Redis keeps losing the etiquette scripts")


def _quiet(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is not None:  # Redis away: waiters time out and fetch
        logger.warning("coalesced download not published: %s", type(future.exception()).__name__)


class Etiquette:
    def __init__(self) -> None:
        # a bounded pool that waits for a free connection (every download in flight may ask at once)
        pool = aioredis.BlockingConnectionPool.from_url(settings.REDIS_URL, max_connections=64, timeout=60)
        self.redis = aioredis.Redis(connection_pool=pool)
        self.batch = Batcher(self.redis)
        self.held: dict[str, str] = {}       # slot token -> its host's slot set (renewed by the heartbeat)
        self._freed: dict[str, asyncio.Event] = {}  # host -> set when this loop releases one of its slots
        self._spare: dict[str, list[str]] = {}      # host -> slots held but idle, reused for a moment
        self._pooled: set[str] = set()              # tokens that go back to _spare when released
        self.leading: dict[str, str] = {}    # coalescing key -> "run:<task>" (renewed by the heartbeat)
        self._robots: dict[str, tuple[float, object]] = {}

    async def close(self) -> None:
        """Give back every slot still held (idle ones kept for a next page above all: a burst
        worker or an rq job ending must not leave them to expire) and close the client."""
        self._spare.clear()
        try:
            await asyncio.gather(*(self._give_back(token) for token in list(self.held)))
        finally:
            await self.redis.aclose()

    # --- per-host slots ---------------------------------------------------------------------

    @staticmethod
    def limits(ctx) -> tuple[int, float]:
        """(concurrency, delay) for a job's requests: the stricter of the job's and the cluster's."""
        conc, own = settings.HOST_CONCURRENCY, int(ctx.settings.get("host_concurrency") or 0)
        if own and (conc == 0 or own < conc):
            conc = own
        return conc, max(float(settings.HOST_DELAY), float(ctx.settings.get("host_delay") or 0.0))

    async def slot(self, host: str, conc: int, delay: float) -> str:
        """Take a slot of ``host`` (a token to release), waiting up to HOST_WAIT_MAX; Handback beyond.

        At the cluster's own limit and no delay (the common case) a slot this loop gives back is
        kept for LINGER seconds and reused by its next page of that host without a Redis call; it
        still counts in Redis all along, so the cluster-wide limit holds. A stricter job limit or
        a delay asks Redis for every request."""
        if conc <= 0 and delay <= 0:
            return ""  # no limits: no Redis round trip
        pooled = delay <= 0 and conc == settings.HOST_CONCURRENCY
        token, names = uuid.uuid4().hex, keys(host)
        start, backoff = time.monotonic(), 0.02
        while True:
            spare = self._spare.get(host) if pooled else None
            if spare:
                return spare.pop()
            freed = self._freed.setdefault(host, asyncio.Event())  # before asking: a release meanwhile sets it
            got = int(await self.batch.eval(ACQUIRE, names, [token, conc, int(delay * 1000),
                                                             settings.HOST_SLOT_TTL * 1000]))
            if got == 0:
                self.held[token] = names[0]
                if pooled:
                    self._pooled.add(token)
                return token
            wait = got / 1000 if got > 0 else backoff * (0.5 + random.random())
            backoff = min(backoff * 1.5, 0.25)
            if time.monotonic() - start + wait > settings.HOST_WAIT_MAX:
                raise Handback(max(wait, 1.0), f"host {host} busy: handed back")
            if got > 0:
                await asyncio.sleep(wait)  # a delay or a pause: nothing to be woken by
                continue
            try:  # a slot this loop gives back wakes its waiters at once; other workers' are polled
                await asyncio.wait_for(freed.wait(), wait)
            except asyncio.TimeoutError:
                pass

    async def release(self, token: str, host: str = "") -> None:
        if token in self._pooled and token in self.held:
            self._spare.setdefault(host, []).append(token)  # kept a moment for the next page of the host
            asyncio.get_running_loop().call_later(LINGER, self._drop_spare, host, token)
        else:
            await self._give_back(token)
        freed = self._freed.pop(host, None)
        if freed is not None:  # after the slot is free (here or in Redis): the woken waiters find it
            freed.set()

    def _drop_spare(self, host: str, token: str) -> None:
        spare = self._spare.get(host)
        if spare and token in spare:
            spare.remove(token)
            if not spare:
                del self._spare[host]
            asyncio.ensure_future(self._give_back(token))

    async def _give_back(self, token: str) -> None:
        key = self.held.pop(token, None)
        self._pooled.discard(token)
        if key:
            try:
                await self.batch.call("ZREM", key, token)
            except Exception as exc:  # Redis away: the slot expires by itself
                logger.debug("slot not released: %s", type(exc).__name__)

    async def pause(self, host: str, seconds: float) -> None:
        """A server said Retry-After: no request to ``host`` from any job until then."""
        try:
            await self.batch.eval(PAUSE_HOST, [keys(host)[2]], [seconds])
        except Exception as exc:
            logger.debug("pause not written: %s", type(exc).__name__)

    def renew(self, redis) -> None:
        """From the heartbeat thread: keep held slots and leaderships alive."""
        held, leading = list(self.held.items()), list(self.leading.items())
        if held:
            redis.eval(RENEW, len(held), *(k for _, k in held), settings.HOST_SLOT_TTL * 1000, *(t for t, _ in held))
        if leading:
            pipe = redis.pipeline(transaction=False)
            for key, mine in leading:
                pipe.eval(RENEW_IF, 1, key, mine, settings.HOST_SLOT_TTL * 1000)
            for (key, _), still in zip(leading, pipe.execute()):
                if not still:  # published (done) or given up: no longer ours to keep alive
                    self.leading.pop(key, None)

    # --- robots.txt -------------------------------------------------------------------------

    async def robots_delay(self, url: str, host: str, scheme: str, session) -> float:
        """Crawl-delay of ``url``'s ``host`` (name:port); raises Handback when the host is closed
        and PermissionError when robots.txt disallows ``url``."""
        origin = f"{scheme}://{host}"
        hit = self._robots.get(origin)
        if hit is None or hit[0] <= time.monotonic():
            hit = await self._load_robots(origin, scheme, session)
            self._robots[origin] = hit
        rules = hit[1]
        if isinstance(rules, float):  # closed until then (epoch seconds)
            raise Handback(max(rules - time.time(), 1.0), f"robots.txt of {origin} unavailable: host closed")
        if rules is None:
            return 0.0
        if not rules.can_fetch(url, settings.DOWNLOAD_USER_AGENT):
            raise PermissionError("robots.txt disallows")
        return float(rules.crawl_delay(settings.DOWNLOAD_USER_AGENT) or 0.0)

    async def _load_robots(self, origin: str, scheme: str, session) -> tuple[float, object]:
        key = ROBOTS_PREFIX + origin
        raw = await self.redis.get(key)
        if raw is None:
            if await self.redis.set(key + ":lock", "1", nx=True, px=20_000):
                try:
                    raw = await self._fetch_robots(origin, scheme, session, key)
                finally:
                    await self.redis.delete(key + ":lock")
            else:
                for _ in range(100):  # another worker is fetching it
                    await asyncio.sleep(0.2)
                    raw = await self.redis.get(key)
                    if raw is not None:
                        break
                else:
                    raw = await self._fetch_robots(origin, scheme, session, key)
        entry = json.loads(raw)
        local_until = time.monotonic() + LOCAL_ROBOTS_S
        if entry.get("closed_until"):
            return min(local_until, time.monotonic() + max(entry["closed_until"] - time.time(), 0)), float(entry["closed_until"])
        if not entry.get("text"):
            return local_until, None
        from protego import Protego

        return local_until, Protego.parse(entry["text"])

    async def _fetch_robots(self, origin: str, scheme: str, session, key: str) -> bytes:
        host_port = origin.split("://", 1)[1]
        host, _, port = host_port.rpartition(":")
        netloc = host if int(port) == (443 if scheme == "https" else 80) else host_port
        url = f"{scheme}://{netloc}/robots.txt"
        import aiohttp

        status, text = 0, ""
        try:
            async with session.get(url, headers={"User-Agent": settings.DOWNLOAD_USER_AGENT}, max_redirects=5,
                                   timeout=aiohttp.ClientTimeout(total=15)) as resp:
                status = resp.status
                body = await resp.content.read(ROBOTS_MAX_BYTES)
                text = body.decode("utf-8", errors="replace") if 200 <= status < 300 else ""
        except Exception as exc:  # unreachable: the host is closed for a while
            logger.info("robots.txt of %s unreachable: %s", origin, type(exc).__name__)
        if 200 <= status < 500:
            entry, ttl = {"status": status, "text": text}, settings.ROBOTS_TTL
        else:
            entry, ttl = {"status": status, "closed_until": time.time() + settings.ROBOTS_RETRY}, settings.ROBOTS_RETRY
        raw = json.dumps(entry).encode()
        await self.redis.set(key, raw, ex=max(1, int(ttl)))
        return raw

    # --- coalescing -------------------------------------------------------------------------

    @staticmethod
    def coalesce_key(url: str, ctx, shape: dict, parts=None) -> str:
        material = json.dumps([normalise(url, parts), ctx.engine, shape.get("proxy", ""), shape.get("cookie", ""),
                               sorted((shape.get("headers") or {}).items()), shape.get("user_agent", "")])
        return COALESCE_PREFIX + hashlib.sha256(material.encode()).hexdigest()[:40]

    async def try_lead(self, key: str, task_id: str) -> bool:
        """One attempt to lead identical requests (True: this task downloads)."""
        mine = f"run:{task_id}"
        if await self.batch.call("SET", key, mine, "NX", "PX", settings.HOST_SLOT_TTL * 1000):
            self.leading[key] = mine
            return True
        return False

    async def lead_or_wait(self, key: str, task_id: str, deadline: float) -> tuple[str, str] | None:
        """None: this task leads (downloads); else (leader task id, data id) to copy."""
        mine = f"run:{task_id}"
        while time.monotonic() < deadline:
            if await self.batch.call("SET", key, mine, "NX", "PX", settings.HOST_SLOT_TTL * 1000):
                self.leading[key] = mine
                return None
            value = await self.batch.call("GET", key)
            if value is not None and value.startswith(b"done:"):
                _, leader, data_id = value.decode().split(":", 2)
                return leader, data_id
            await asyncio.sleep(0.05 + random.random() * 0.05)
        return None  # waited long enough: download it ourselves

    async def give_up_lead(self, key: str) -> None:
        """The leader's download failed or will not be stored: let a waiter lead."""
        mine = self.leading.pop(key, None)
        if mine:
            await self.batch.eval(CAS, [key], [mine, ""])

    def publish_all(self, leaders: list[tuple[str, object, object]]) -> None:
        """On the loop, once the leaders' data is stored: their waiters may copy it now and for
        COALESCE_WINDOW seconds."""
        window = int(settings.COALESCE_WINDOW * 1000)
        for key, task_id, data_id in leaders:
            self.leading.pop(key, None)
            done = self.batch.eval(CAS, [key], [f"run:{task_id}", f"done:{task_id}:{data_id}", window])
            asyncio.ensure_future(done).add_done_callback(_quiet)

    async def forget(self, key: str, value: str) -> None:
        await self.batch.eval(CAS, [key], [value, ""])


