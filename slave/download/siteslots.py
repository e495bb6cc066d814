"""Per-site slots and delays of one worker's event loop, cluster-wide through Redis
(``common/sitelimits.py`` holds the keys and the scripts).

A page waits for a slot of its site up to HOST_WAIT_MAX and is handed back beyond (the task goes
back, due after the wait, no attempt). A slot is a lease in Redis that the etiquette's keeper
thread (Redis only, never held up by MongoDB) renews every HOST_SLOT_TTL / 4 for as long as it is
held. The worker trusts a slot only up to its local deadline: the moment its last confirmed
renewal (or its taking) was sent, plus its lease, minus ``slot_margin``, on this machine's
monotonic clock. Redis cannot expire it before then, so a download still running at that
deadline (Redis unreachable, or the slot found gone) is stopped there (``guard``) and its task
handed back: no other worker can hold the slot meanwhile.

Words: a *site* is a URL's host and port (``common.sitelimits.site_of``), a *worker host* a
machine running workers (``common.config.worker_host``). Names that are interfaces keep the
older "host" for a site: the settings HOST_CONCURRENCY, HOST_DELAY, HOST_SLOT_TTL, HOST_WAIT_MAX
and a job's stored ``host_concurrency`` and ``host_delay`` (``crawler_download_setting``).
"""
from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass

from common.config import settings
from common.sitelimits import ACQUIRE, ACQUIRE_MANY, PAUSE_SITE, RELEASE_MANY, RENEW, keys
from slave.download.redisbatch import GATHER, Batcher, drain, missed

logger = logging.getLogger(__name__)
LINGER = 0.25  # seconds an idle slot stays with this worker for its next page of the site


def slot_margin(ttl: float) -> float:
    """Seconds before a slot's lease can end in Redis at which the worker stops trusting it: far
    more than stopping a download takes, and than clock rates differ over one lease."""
    return min(5.0, max(0.5, ttl / 10))


def long_lease() -> float:
    """The lease of a slot for a sandboxed downloader, which the loop cannot stop mid-way: its
    whole time limit (it is killed at the slot's local deadline), the usual lease beyond."""
    return settings.DOWNLOAD_TIMEOUT + settings.HOST_SLOT_TTL


@dataclass
class Handback(Exception):
    """The page cannot be fetched now (busy or closed site): give the task back, due in ``after`` s."""

    after: float
    reason: str


class SlotLost(Handback):
    """The download's slot may no longer be this worker's: stopped, its task handed back."""


def _ignored(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


class SiteSlots:
    """The site slots one event loop holds: taken (``reserve``, ``slot``), trusted up to their
    local deadline (``left``, ``guard``), given back (``release``, ``close``); ``renew`` and
    ``release_missed`` are the keeper thread's."""

    def __init__(self, batch: Batcher) -> None:
        self.batch = batch
        self.held: dict[str, str] = {}       # slot token -> its site's slot set (renewed by the keeper)
        self.until: dict[str, float] = {}    # slot token -> its local deadline (time.monotonic())
        self._guarded: dict[str, tuple] = {}  # slot token -> (its download, how to stop it)
        self._freed: dict[str, asyncio.Event] = {}  # site -> set when this loop releases one of its slots
        self._spare: dict[str, dict[str, float]] = {}  # site -> idle slots held (token -> given back after)
        self._pooled: set[str] = set()              # tokens that go back to _spare when released
        self._freeing: list[str] = []               # tokens to give back with the next Redis call
        self._unreleased = missed()  # (slot set, token, when): given back while Redis was away
        self._sweeping = False
        self._uid, self._seq = uuid.uuid4().hex[:12], 0

    @staticmethod
    def limits(ctx) -> tuple[int, float]:
        """(concurrency, delay) for a job's requests: the stricter of the job's and the cluster's."""
        conc, own = settings.HOST_CONCURRENCY, int(ctx.settings.host_concurrency or 0)
        if own and (conc == 0 or own < conc):
            conc = own
        return conc, max(float(settings.HOST_DELAY), float(ctx.settings.host_delay or 0.0))

    @staticmethod
    def pooled(conc: int, delay: float) -> bool:
        """At the cluster's own limit and no delay (the common case) slots are kept a moment
        and taken for a whole entry at once; a stricter job limit or a delay asks per request."""
        return delay <= 0 and conc == settings.HOST_CONCURRENCY > 0

    def _token(self) -> str:
        self._seq += 1
        return f"{self._uid}:{self._seq}"

    def _keep(self, site: str, token: str) -> None:
        """An idle slot, kept for this loop's next page of ``site`` for LINGER seconds (given
        back by the sweep that follows, at most LINGER / 2 later)."""
        self._spare.setdefault(site, {})[token] = time.monotonic() + LINGER
        if not self._sweeping:
            self._sweeping = True
            asyncio.get_running_loop().call_later(LINGER, self._sweep)

    def _sweep(self) -> None:
        now, idle = time.monotonic(), []
        for site, spare in list(self._spare.items()):
            expired = [t for t, until in spare.items() if until <= now]
            for token in expired:
                del spare[token]
            if not spare:
                del self._spare[site]
            idle += expired
        if idle:
            asyncio.ensure_future(self._give_back(idle))
        self._sweeping = bool(self._spare)
        if self._sweeping:
            asyncio.get_running_loop().call_later(LINGER / 2, self._sweep)

    async def reserve(self, wanted: dict[str, int]) -> None:
        """Slots for an entry's pages (site -> pages), taken in one call when the entry starts
        and kept as spares its pages take (those not taken in LINGER go back); sites without a
        free slot are left to each page's own call."""
        wanted = {s: n - len(self._spare.get(s, ())) for s, n in wanted.items()}  # spares serve first
        sites = [s for s, n in wanted.items() if n > 0]
        if not sites:
            return
        prefix = self._token()
        names = [k for s in sites for k in keys(s)[0:3:2]]
        sent = time.monotonic()
        got = await self.batch.eval(ACQUIRE_MANY, names,
                                    [settings.HOST_CONCURRENCY, settings.HOST_SLOT_TTL * 1000, prefix,
                                     *(wanted[s] for s in sites)])
        until = sent + settings.HOST_SLOT_TTL - slot_margin(settings.HOST_SLOT_TTL)
        for i, (site, n) in enumerate(zip(sites, got), 1):
            for j in range(1, int(n) + 1):
                token = f"{prefix}:{i}:{j}"
                self.held[token], self.until[token] = keys(site)[0], until
                self._pooled.add(token)
                self._keep(site, token)

    def _spare_of(self, site: str) -> str:
        """A spare slot of ``site`` this loop still trusts, or "" (those it does not are freed)."""
        spare = self._spare.get(site)
        while spare:
            token = spare.popitem()[0]
            if self.until.get(token, 0.0) > time.monotonic():
                return token
            self._free(token)  # not renewed in time: not trusted any more
        return ""

    async def slot(self, site: str, conc: int, delay: float, lease: float | None = None) -> str:
        """Take a slot of ``site`` (a token to release), waiting up to HOST_WAIT_MAX; Handback beyond.
        ``lease``: seconds the slot is taken for (default HOST_SLOT_TTL; see ``long_lease``).

        Pooled limits (see ``pooled``): a spare slot of this loop is taken without a Redis call;
        it counts in Redis all along, so the cluster-wide limit holds."""
        if conc <= 0 and delay <= 0:
            return ""  # no limits: no Redis round trip
        lease = lease or settings.HOST_SLOT_TTL
        pooled = self.pooled(conc, delay) and lease == settings.HOST_SLOT_TTL
        token, names = self._token(), keys(site)
        start, backoff = time.monotonic(), 0.02
        while True:
            spare = self._spare_of(site) if pooled else ""
            if spare:
                return spare
            # taken before asking: a release meanwhile sets it
            freed = self._freed.setdefault(site, asyncio.Event())
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
                raise Handback(max(wait, 1.0), f"site {site} busy: handed back")
            if got > 0:
                await asyncio.sleep(wait)  # a delay or a pause: nothing to be woken by
                continue
            try:  # a slot this loop gives back wakes its waiters at once; other workers' are polled
                await asyncio.wait_for(freed.wait(), wait)
            except asyncio.TimeoutError:
                pass

    def release(self, token: str, site: str = "") -> None:
        if token in self._pooled and token in self.held:
            self._keep(site, token)
        else:
            self._free(token)
        freed = self._freed.pop(site, None)
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

    async def close(self) -> None:
        """Give back every slot still held (idle ones kept for a next page above all: a burst
        worker or an rq job ending must not leave them to expire)."""
        self._spare.clear()
        await self._give_back(list(self.held))

    async def pause(self, site: str, seconds: float) -> None:
        """A server said Retry-After: no request to ``site`` from any job until then."""
        try:
            await self.batch.eval(PAUSE_SITE, [keys(site)[2]], [seconds])
        except Exception as exc:
            logger.debug("pause not written: %s", type(exc).__name__)

    def left(self, token: str) -> float:
        """Seconds this worker may still trust ``token``'s slot (any thread)."""
        return self.until.get(token, float("inf") if not token else 0.0) - time.monotonic()

    async def guard(self, token: str, site: str, work, stop=None):
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
        raise SlotLost(1.0, f"slot of site {site} not renewed in time "
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
                logger.warning("site slot %s was gone from Redis: its download is stopped", token)
                self.until[token] = 0.0
                self._stop(token)

    def renew(self, redis, loop) -> None:
        """From the keeper thread: keep the held slots alive (their local deadlines moved on the loop)."""
        held = list(self.held.items())
        if held:
            sent = time.monotonic()
            kept = redis.eval(RENEW, len(held), *(k for _, k in held), settings.HOST_SLOT_TTL * 1000,
                              *(t for t, _ in held))
            loop.call_soon_threadsafe(self._renewed, sent, [t for t, _ in held], kept)

    def release_missed(self, redis) -> None:
        """From the keeper thread: slots given back while Redis was away (after a Sentinel
        failover the new master has them, replicated, and every worker would wait HOST_SLOT_TTL)."""
        slots = drain(self._unreleased)
        if not slots:
            return
        try:
            redis.eval(RELEASE_MANY, len(slots), *(k for k, _, _ in slots), *(t for _, t, _ in slots))
        except Exception:
            self._unreleased.extendleft(reversed(slots))
            raise
