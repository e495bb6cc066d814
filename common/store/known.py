"""The URLs a job is known to have, in Redis: intake's filter, asked before MongoDB.

A Redis set per job and generation (``downcluster:known:<job id>:<n>``, ``n`` read from
``downcluster:known:<job id>``) of 16-byte digests (BLAKE2b) of URLs the job has a task for.
Intake of found URLs (links, sitemap entries: a crawl's frontier) asks it first
(``Filter.read``): a URL in it is a duplicate without a read of MongoDB; the rest are read in
MongoDB as before (``tasks.known_uris``), and what MongoDB has, or intake has just stored, is
added (``Filter.remember``). It is a cache of MongoDB, never the source of truth:

* a URL is added only once its task is stored (never for a key whose task may not exist: such
  a key is taken over by a later intake, which a filter must not stop), so a URL in the filter
  is one the job has (a 128-bit digest: two URLs share one with odds of about n² / 2¹²⁹);
* a URL missing from it (Redis flushed or restarted, a job's tasks added before the filter) is
  read in MongoDB: the filter rebuilds itself from the reads it misses;
* retention, the only removal of a job's tasks, moves the job to a new generation before and
  after it removes any (``forget``): an intake that read the generation before the second move
  adds to a set nobody reads again, one that read it after has read MongoDB after the removal;
* Redis away: ``read`` answers nothing and ``remember`` stores nothing (intake reads MongoDB, as
  without the filter); ``forget`` raises, so retention removes nothing it cannot tell the filter.

Memory: about 72 bytes a URL in Redis (a set of 16-byte strings: MEMORY USAGE of a set of
100,000, Redis 7.0), 72 MB for 1,000,000 found URLs.
"""
from __future__ import annotations

import logging
from hashlib import blake2b

from bson import ObjectId
from redis.exceptions import RedisError

from common.store.connection import as_text, redis_conn

logger = logging.getLogger(__name__)
PREFIX = "downcluster:known:"


def _key(job_id: ObjectId) -> str:
    return PREFIX + str(job_id)


def _digest(uri: str) -> bytes:
    return blake2b(uri.encode(), digest_size=16).digest()


# the generation, then which of the digests its set holds, in one round trip
_READ = """
local n = redis.call('GET', KEYS[1]) or '0'
return {n, redis.call('SMISMEMBER', KEYS[1] .. ':' .. n, unpack(ARGV))}
"""
_FORGET = """
local n = redis.call('INCR', KEYS[1])
redis.call('DEL', KEYS[1] .. ':' .. (n - 1))
return n
"""


class Filter:
    """The job's filter as one intake call sees it: the generation it read, and the URLs known.
    ``on`` False (``task add``, the API, generators: URLs given, not found) reads and keeps
    nothing: a job fed a hundred million URLs does not hold them in Redis too."""

    def __init__(self, job_id: ObjectId, on: bool = True) -> None:
        self.key, self.set, self.on = _key(job_id), "", on

    def read(self, uris: list[str]) -> set[str]:
        """The URLs among ``uris`` the filter knows the job has (none when Redis is away)."""
        if not uris or not self.on:
            return set()
        try:
            n, hits = redis_conn().eval(_READ, 1, self.key, *(_digest(u) for u in uris))
        except RedisError as exc:
            logger.debug("known-URL filter not read: %s", type(exc).__name__)
            return set()
        self.set = f"{self.key}:{as_text(n)}"
        return {u for u, hit in zip(uris, hits) if hit}

    def remember(self, uris: list[str]) -> None:
        """Add ``uris``, each of which has a task of the job in MongoDB (best effort)."""
        if not uris or not self.set:
            return
        try:
            redis_conn().sadd(self.set, *(_digest(u) for u in uris))
        except RedisError as exc:
            logger.debug("known-URL filter not written: %s", type(exc).__name__)


def forget(job_id: ObjectId) -> None:
    """Move the job's filter to a new generation, the old one dropped (before and after its tasks
    are removed); raises if Redis cannot be told."""
    redis_conn().eval(_FORGET, 1, _key(job_id))
