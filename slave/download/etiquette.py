"""Crawl etiquette of one worker's event loop, cluster-wide through Redis:

- per-host slots and delays (common.sitelimits), handed back when a page would wait longer than
  HOST_WAIT_MAX (the task goes back, due after the wait, no attempt). A slot is a lease in Redis
  that a thread of its own (``Keeper``: Redis only, never held up by MongoDB) renews every
  HOST_SLOT_TTL / 4 for as long as it is held. The worker trusts a slot only up to its local
  deadline: the moment its last confirmed renewal (or its taking) was sent, plus its lease,
  minus SLOT_MARGIN, on this machine's monotonic clock. Redis cannot expire it before then, so a
  download still running at that deadline (Redis unreachable, or the slot found gone) is stopped
  there (``guard``) and its task handed back: no other worker can hold the slot meanwhile;
- robots.txt: fetched once per host for the whole cluster (a Redis lock), cached in Redis for
  ROBOTS_TTL, parsed with Protego, matched against DOWNLOAD_USER_AGENT; a 4xx allows all, a 5xx
  or an unreachable host closes it for ROBOTS_RETRY; Crawl-delay raises the host's delay;
- coalescing: identical requests within COALESCE_WINDOW are downloaded once; the
  first is the leader (``run:<task>``), the others wait and then copy its stored data
  (``done:<task>:<data id>``, published by the writer once the data is stored). A failed
  download is not shared: its key is removed and a waiter becomes the next leader. An entry
  asks to lead all its requests in one call when it starts, and the writer publishes a whole
  batch in one call: a page that nobody else asked for costs no Redis command of its own.

Nothing here blocks the event loop: Redis is used through redis.asyncio; the keeper thread
renews held slots and leaderships with its own client.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from redis import asyncio as aioredis

from common.config import settings
from common.errors import AddressRefused
from common.sitelimits import ACQUIRE, ACQUIRE_MANY, PAUSE_HOST, RELEASE_MANY, RENEW, host_of, keys
from common.store.connection import REDIS_OPTIONS, SENTINEL_SCHEME, redis_client

if TYPE_CHECKING:
    from protego import Protego  # imported when a robots.txt is parsed

logger = logging.getLogger(__name__)
ROBOTS_PREFIX = "downcluster:robots:"
COALESCE_PREFIX = "downcluster:co:"
ROBOTS_MAX_BYTES = 512 * 1024
LOCAL_ROBOTS_S = 300  # a parsed robots.txt is re-read from Redis after this
LINGER = 0.25  # seconds an idle slot stays with this worker for its next page of the host
GATHER = 0.001  # seconds the loop's Redis commands are gathered into one pipeline
SANDBOXED = ("python", "shell")  # downloaders in a process of their own, stopped only by their time limit


def slot_margin(ttl: float) -> float:
    """Seconds before a slot's lease can end in Redis at which the worker stops trusting it: far
    more than stopping a download takes, and than clock rates differ over one lease."""
    return min(5.0, max(0.5, ttl / 10))


def long_lease() -> float:
    """The lease of a slot for a sandboxed downloader, which the loop cannot stop mid-way: its
    whole time limit (it is killed at the slot's local deadline), the usual lease beyond."""
    return settings.DOWNLOAD_TIMEOUT + settings.HOST_SLOT_TTL


# KEYS: key. ARGV: expected value, then "" to delete or a new value and its ttl ms.
CAS = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1
"""


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


@dataclass
class Handback(Exception):
    """The page cannot be fetched now (busy or closed host): give the task back, due in ``after`` s."""

    after: float
    reason: str


class SlotLost(Handback):
    """The download's slot may no longer be this worker's: stopped, its task handed back."""


def normalise(url: str, p=None) -> str:
    """Scheme and host lower-case, default port and fragment dropped (``p``: urlsplit(url))."""
    p = p or urlsplit(url)
    scheme, host = p.scheme.lower(), host_of(url, p)
    default = ":443" if scheme == "https" else ":80"
    if host.endswith(default):
        host = host[:-len(default)]
    userinfo, at, _ = p.netloc.rpartition("@")
    return f"{scheme}://{userinfo}{at}{host}{p.path or '/'}{'?' + p.query if p.query else ''}"


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


def _ignored(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class Etiquette:
    def __init__(self) -> None:
        # a bounded pool that waits for a free connection (every download in flight may ask at once)
        if settings.REDIS_URL.startswith(SENTINEL_SCHEME):
            # the master Sentinel names, found again after a failover
            self.redis = redis_client(asynchronous=True)
        else:
            pool = aioredis.BlockingConnectionPool.from_url(settings.REDIS_URL, max_connections=64,
                                                            timeout=60, **REDIS_OPTIONS)
            self.redis = aioredis.Redis(connection_pool=pool)
        self.batch = Batcher(self.redis)
        self.held: dict[str, str] = {}       # slot token -> its host's slot set (renewed by the keeper)
        self.until: dict[str, float] = {}    # slot token -> its local deadline (time.monotonic())
        self._guarded: dict[str, tuple] = {}  # slot token -> (its download, how to stop it)
        self.keeper: Keeper | None = None
        self._freed: dict[str, asyncio.Event] = {}  # host -> set when this loop releases one of its slots
        self._spare: dict[str, dict[str, float]] = {}  # host -> idle slots held (token -> given back after)
        self._pooled: set[str] = set()              # tokens that go back to _spare when released
        self._freeing: list[str] = []               # tokens to give back with the next Redis call
        # given back or let go of while Redis was away: (slot set, token, when), (key, "run:<task>", when)
        self._unreleased: deque = deque(maxlen=100_000)
        self._unled: deque = deque(maxlen=100_000)
        self._sweeping = False
        self._uid, self._seq = uuid.uuid4().hex[:12], 0
        self.leading: dict[str, str] = {}    # coalescing key -> "run:<task>" (renewed by the keeper)
        # origin -> (monotonic time it is read from Redis again, closed until (epoch s) | rules | None)
        self._robots: dict[str, tuple[float, float | Protego | None]] = {}
        self._robots_loading: dict[tuple[str, int], asyncio.Future] = {}

    def start(self) -> None:
        """Start renewing (from the running event loop)."""
        self.keeper = Keeper(self, asyncio.get_running_loop())
        self.keeper.start()

    async def close(self) -> None:
        """Give back every slot still held (idle ones kept for a next page above all: a burst
        worker or an rq job ending must not leave them to expire) and close the client."""
        self._spare.clear()
        try:
            await self._give_back(list(self.held))
        finally:
            if self.keeper is not None:
                self.keeper.halt.set()
            await self.redis.aclose()

    # --- per-host slots ---------------------------------------------------------------------

    @staticmethod
    def limits(ctx) -> tuple[int, float]:
        """(concurrency, delay) for a job's requests: the stricter of the job's and the cluster's."""
        conc, own = settings.HOST_CONCURRENCY, int(ctx.settings.get("host_concurrency") or 0)
        if own and (conc == 0 or own < conc):
            conc = own
        return conc, max(float(settings.HOST_DELAY), float(ctx.settings.get("host_delay") or 0.0))

    @staticmethod
    def pooled(conc: int, delay: float) -> bool:
        """At the cluster's own limit and no delay (the common case) slots are kept a moment
        and taken for a whole entry at once; a stricter job limit or a delay asks per request."""
        return delay <= 0 and conc == settings.HOST_CONCURRENCY > 0

    def _token(self) -> str:
        self._seq += 1
        return f"{self._uid}:{self._seq}"

    def _keep(self, host: str, token: str) -> None:
        """An idle slot, kept for this loop's next page of ``host`` for LINGER seconds (given
        back by the sweep that follows, at most LINGER / 2 later)."""
        self._spare.setdefault(host, {})[token] = time.monotonic() + LINGER
        if not self._sweeping:
            self._sweeping = True
            asyncio.get_running_loop().call_later(LINGER, self._sweep)

    def _sweep(self) -> None:
        now, idle = time.monotonic(), []
        for host, spare in list(self._spare.items()):
            expired = [t for t, until in spare.items() if until <= now]
            for token in expired:
                del spare[token]
            if not spare:
                del self._spare[host]
            idle += expired
        if idle:
            asyncio.ensure_future(self._give_back(idle))
        self._sweeping = bool(self._spare)
        if self._sweeping:
            asyncio.get_running_loop().call_later(LINGER / 2, self._sweep)

    async def reserve(self, wanted: dict[str, int]) -> None:
        """Slots for an entry's pages (host -> pages), taken in one call when the entry starts
        and kept as spares its pages take (those not taken in LINGER go back); hosts without a
        free slot are left to each page's own call."""
        wanted = {h: n - len(self._spare.get(h, ())) for h, n in wanted.items()}  # spares serve first
        hosts = [h for h, n in wanted.items() if n > 0]
        if not hosts:
            return
        prefix = self._token()
        names = [k for h in hosts for k in keys(h)[0:3:2]]
        sent = time.monotonic()
        got = await self.batch.eval(ACQUIRE_MANY, names,
                                    [settings.HOST_CONCURRENCY, settings.HOST_SLOT_TTL * 1000, prefix,
                                     *(wanted[h] for h in hosts)])
        until = sent + settings.HOST_SLOT_TTL - slot_margin(settings.HOST_SLOT_TTL)
        for i, (host, n) in enumerate(zip(hosts, got), 1):
            for j in range(1, int(n) + 1):
                token = f"{prefix}:{i}:{j}"
                self.held[token], self.until[token] = keys(host)[0], until
                self._pooled.add(token)
                self._keep(host, token)

    async def slot(self, host: str, conc: int, delay: float, lease: float | None = None) -> str:
        """Take a slot of ``host`` (a token to release), waiting up to HOST_WAIT_MAX; Handback beyond.
        ``lease``: seconds the slot is taken for (default HOST_SLOT_TTL; see ``long_lease``).

        Pooled limits (see ``pooled``): a spare slot of this loop is taken without a Redis call;
        it counts in Redis all along, so the cluster-wide limit holds."""
        if conc <= 0 and delay <= 0:
            return ""  # no limits: no Redis round trip
        lease = lease or settings.HOST_SLOT_TTL
        pooled = self.pooled(conc, delay) and lease == settings.HOST_SLOT_TTL
        token, names = self._token(), keys(host)
        start, backoff = time.monotonic(), 0.02
        while True:
            spare = self._spare.get(host) if pooled else None
            while spare:
                got_spare = spare.popitem()[0]
                if self.until.get(got_spare, 0.0) > time.monotonic():
                    return got_spare
                self._free(got_spare)  # not renewed in time: not trusted any more
            # taken before asking: a release meanwhile sets it
            freed = self._freed.setdefault(host, asyncio.Event())
            sent = time.monotonic()
            args = [token, conc, int(delay * 1000), int(lease * 1000)]
            got = int(await self.batch.eval(ACQUIRE, names, args))
            if got == 0:
                self.held[token] = names[0]
                self.until[token] = sent + lease - slot_margin(settings.HOST_SLOT_TTL)
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

    def release(self, token: str, host: str = "") -> None:
        if token in self._pooled and token in self.held:
            self._keep(host, token)
        else:
            self._free(token)
        freed = self._freed.pop(host, None)
        if freed is not None:  # after the slot is free (here or in Redis): the woken waiters find it
            freed.set()

    def _free(self, token: str) -> None:
        """Give a slot back with the loop's next Redis call (one call for all given back then)."""
        if token not in self.held:
            return
        if not self._freeing:
            asyncio.get_running_loop().call_later(GATHER, self._flush_freeing)
        self._freeing.append(token)

    def _flush_freeing(self) -> None:
        tokens, self._freeing = self._freeing, []
        asyncio.ensure_future(self._give_back(tokens))

    async def _give_back(self, tokens: list[str]) -> None:
        pairs = [(self.held.pop(t), t) for t in tokens if t in self.held]
        for _, token in pairs:
            self._pooled.discard(token)
            self.until.pop(token, None)
        if pairs:
            try:
                await self.batch.eval(RELEASE_MANY, [k for k, _ in pairs], [t for _, t in pairs])
            except Exception as exc:  # Redis away: the keeper gives them back once it answers again
                logger.debug("slots not released: %s", type(exc).__name__)
                self._unreleased.extend((key, token, time.monotonic()) for key, token in pairs)

    async def pause(self, host: str, seconds: float) -> None:
        """A server said Retry-After: no request to ``host`` from any job until then."""
        try:
            await self.batch.eval(PAUSE_HOST, [keys(host)[2]], [seconds])
        except Exception as exc:
            logger.debug("pause not written: %s", type(exc).__name__)

    def left(self, token: str) -> float:
        """Seconds this worker may still trust ``token``'s slot (any thread)."""
        return self.until.get(token, float("inf") if not token else 0.0) - time.monotonic()

    async def guard(self, token: str, host: str, work, stop=None):
        """``work``'s result, if it ends while ``token``'s slot is surely this worker's; else it is
        cancelled at the slot's local deadline (or once Redis says the slot is gone), ``stop`` is
        called (for work running in a thread) and SlotLost raised."""
        if not token:
            return await work
        task = asyncio.ensure_future(work)
        self._guarded[token] = (task, stop)
        try:
            while not task.done():
                left = self.left(token)
                if left <= 0:
                    self._stop(token)
                    break
                await asyncio.wait({task}, timeout=left)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            self._guarded.pop(token, None)
        if self.left(token) > 0 and not task.cancelled():
            return task.result()
        await asyncio.wait({task}, timeout=slot_margin(settings.HOST_SLOT_TTL) / 2)  # its sockets closed
        task.add_done_callback(_ignored)  # the slot's loss is what is reported
        raise SlotLost(1.0, f"slot of host {host} not renewed in time "
                            "(Redis unreachable or the slot lost): handed back")

    def _stop(self, token: str) -> None:
        guarded = self._guarded.get(token)
        if guarded is None:
            return
        task, stop = guarded
        if stop is not None:
            stop()
        task.cancel()

    def _renewed(self, sent: float, tokens: list[str], kept: list) -> None:
        """On the loop: the keeper's renewal sent at ``sent`` (monotonic) kept these slots, or found
        them gone."""
        until = sent + settings.HOST_SLOT_TTL - slot_margin(settings.HOST_SLOT_TTL)
        for token, ok in zip(tokens, kept):
            if token not in self.until:
                continue  # given back meanwhile
            if ok:
                self.until[token] = max(self.until[token], until)
            else:
                logger.warning("host slot %s was gone from Redis: its download is stopped", token)
                self.until[token] = 0.0
                self._stop(token)

    def renew(self, redis, loop) -> None:
        """From the keeper thread: give back slots that Redis missed, keep held slots and
        leaderships alive."""
        self._release_missed(redis)
        held, leading = list(self.held.items()), list(self.leading.items())
        if held:
            sent = time.monotonic()
            kept = redis.eval(RENEW, len(held), *(k for _, k in held), settings.HOST_SLOT_TTL * 1000,
                              *(t for t, _ in held))
            loop.call_soon_threadsafe(self._renewed, sent, [t for t, _ in held], kept)
        if leading:
            renewed = redis.eval(RENEW_LEADS, len(leading), *(k for k, _ in leading),
                                 settings.HOST_SLOT_TTL * 1000, *(v for _, v in leading))
            for (key, _), still in zip(leading, renewed):
                if not still:  # published (done) or given up: no longer ours to keep alive
                    self.leading.pop(key, None)

    def _release_missed(self, redis) -> None:
        """Slots given back and leads let go of while Redis was away: after a Sentinel failover
        the new master has them (replicated), and every worker would wait HOST_SLOT_TTL for them."""
        slots, leads = _drain(self._unreleased), _drain(self._unled)
        try:
            if slots:
                redis.eval(RELEASE_MANY, len(slots), *(k for k, _, _ in slots), *(t for _, t, _ in slots))
                slots = []
            with redis.pipeline(transaction=False) as pipe:
                for key, value, _ in leads:
                    pipe.eval(CAS, 1, key, value, "")
                pipe.execute()
        except Exception:
            self._unreleased.extendleft(reversed(slots))
            self._unled.extendleft(reversed(leads))
            raise

    # --- robots.txt -------------------------------------------------------------------------

    async def robots_delay(self, url: str, host: str, scheme: str, session) -> float:
        """Crawl-delay of ``url``'s ``host`` (name:port); raises Handback when the host is closed,
        PermissionError when robots.txt disallows ``url`` and AddressRefused when ``session``
        may not reach the host."""
        origin = f"{scheme}://{host}"
        hit = self._robots.get(origin)
        if hit is None or hit[0] <= time.monotonic():
            # one load per origin and session (the session says which addresses it may reach)
            load_key = (origin, id(session))
            loading = self._robots_loading.get(load_key)
            if loading is None:
                loading = self._robots_loading[load_key] = asyncio.ensure_future(
                    self._load_robots(origin, scheme, session))
                loading.add_done_callback(lambda _: self._robots_loading.pop(load_key, None))
            hit = self._robots[origin] = await asyncio.shield(loading)
        rules = hit[1]
        if isinstance(rules, float):  # closed until then (epoch seconds)
            raise Handback(max(rules - time.time(), 1.0), f"robots.txt of {origin} unavailable: host closed")
        if rules is None:
            return 0.0
        if not rules.can_fetch(url, settings.DOWNLOAD_USER_AGENT):
            raise PermissionError("robots.txt disallows")
        return float(rules.crawl_delay(settings.DOWNLOAD_USER_AGENT) or 0.0)

    async def _load_robots(self, origin: str, scheme: str,
                           session) -> tuple[float, float | Protego | None]:
        key = ROBOTS_PREFIX + origin
        raw = await self.redis.get(key)
        if raw is None:
            if await self.redis.set(key + ":lock", "1", nx=True, px=20_000):
                try:  # another worker may have stored it between our read and our lock
                    raw = await self.redis.get(key) or await self._fetch_robots(origin, scheme, session, key)
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
            closed_until = float(entry["closed_until"])
            return min(local_until, time.monotonic() + max(closed_until - time.time(), 0)), closed_until
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
        except AddressRefused:  # the page is refused too; the host is not closed for others
            raise
        except Exception as exc:  # unreachable: the host is closed for a while
            logger.info("robots.txt of %s unreachable: %s", origin, type(exc).__name__)
        if 200 <= status < 500:
            entry, ttl = {"status": status, "text": text}, settings.ROBOTS_TTL
        else:
            ttl = settings.ROBOTS_RETRY
            entry = {"status": status, "closed_until": time.time() + ttl}
        raw = json.dumps(entry).encode()
        await self.redis.set(key, raw, ex=max(1, int(ttl)))
        return raw

    # --- coalescing -------------------------------------------------------------------------

    @staticmethod
    def coalesce_keys(urls: list[str], ctx, shape: dict) -> list[str]:
        """The coalescing key of each URL requested as ``ctx`` and ``shape`` (its request-shaping
        settings: engine, proxy, cookie, headers, user agent) say."""
        shaped = json.dumps([ctx.engine, shape.get("proxy", ""), shape.get("cookie", ""),
                             sorted((shape.get("headers") or {}).items()), shape.get("user_agent", ""),
                             bool(shape.get("allow_private"))])
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


def _drain(missed: deque) -> list:
    """What ``missed`` holds of the last HOST_SLOT_TTL (older entries have expired in Redis)."""
    out, since = [], time.monotonic() - settings.HOST_SLOT_TTL
    while missed:
        out.append(missed.popleft())
    return [m for m in out if m[2] > since]


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
                logger.warning("host slots not renewed: %s", type(exc).__name__)
        self.redis.close()
