"""Cluster-wide per-site limits in Redis: concurrency, least delay between request starts, and
pauses a server asked for (429/503 with Retry-After). Shared by the worker, which takes and
gives back slots, and by ``stats``, which shows the sites throttled now.

A site is a URL's host and port (``site_of``); a worker host is a machine running workers. The
names that are interfaces keep "host" for a site: the settings HOST_CONCURRENCY, HOST_DELAY,
HOST_SLOT_TTL, HOST_WAIT_MAX, a job's stored ``host_concurrency`` and ``host_delay``, the Redis
keys (``PREFIX``: workers of two versions share them during an upgrade), the ``host`` of a
``throttled`` row and ``throttled_hosts`` in ``stats``, the API and the metrics.

A slot is an expiring lease: a member of the site's sorted set scored with its expiry (Redis
server time, so every worker host of the cluster agrees); the worker holding it renews it while the
download runs, so a worker that dies frees its slots within HOST_SLOT_TTL. One Lua call decides
and takes a slot atomically. A lease is never shortened (a download that cannot be stopped from
the worker's loop holds a longer one), nor is the set's own expiry.
"""
from __future__ import annotations

from urllib.parse import urlsplit

PREFIX = "downcluster:host:"
SLOTS, NEXT, PAUSE, WAITED = ":slots", ":next", ":pause", ":waited"
WAITED_MS = 5000  # a site shows as throttled for this long after a request had to wait for it

# KEYS: slots, next, pause, waited. ARGV: token, concurrency (0 = no limit), delay ms, slot ttl ms.
# Returns 0 (taken), -1 (all slots busy), or the ms to wait (delay not yet over, or paused).
ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pause = tonumber(redis.call('GET', KEYS[3]) or '0')
if pause > now then return pause - now end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local limit = tonumber(ARGV[2])
if limit > 0 and redis.call('ZCARD', KEYS[1]) >= limit then
  redis.call('SET', KEYS[4], now, 'PX', %d)
  return -1
end
local delay = tonumber(ARGV[3])
if delay > 0 then
  local nxt = tonumber(redis.call('GET', KEYS[2]) or '0')
  if nxt > now then
    redis.call('SET', KEYS[4], now, 'PX', %d)
    return nxt - now
  end
  redis.call('SET', KEYS[2], now + delay, 'PX', delay + 1000)
end
local ttl = tonumber(ARGV[4])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl + 1000 then redis.call('PEXPIRE', KEYS[1], ttl + 1000) end
return 0
""" % (WAITED_MS, WAITED_MS)

# KEYS: per site its slots and pause keys. ARGV: concurrency, slot ttl ms, a token prefix, then per
# site the slots wanted. Takes what is free of each site (none while paused) as tokens
# "<prefix>:<site's position>:<1..n>"; returns the number taken per site.
ACQUIRE_MANY = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local conc, ttl, out = tonumber(ARGV[1]), tonumber(ARGV[2]), {}
for h = 1, #KEYS / 2 do
  local slots, got = KEYS[2 * h - 1], 0
  if tonumber(redis.call('GET', KEYS[2 * h]) or '0') <= now then
    redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
    got = math.max(0, math.min(conc - redis.call('ZCARD', slots), tonumber(ARGV[3 + h])))
    for i = 1, got do redis.call('ZADD', slots, now + ttl, ARGV[3] .. ':' .. h .. ':' .. i) end
    if got > 0 and redis.call('PTTL', slots) < ttl + 1000 then redis.call('PEXPIRE', slots, ttl + 1000) end
  end
  out[h] = got
end
return out
"""

# KEYS: slot sets; ARGV: one token per key. Gives those slots back.
RELEASE_MANY = """
for i = 1, #KEYS do redis.call('ZREM', KEYS[i], ARGV[i]) end
return #KEYS
"""

# KEYS: the slot sets; ARGV: ttl ms, then one token per key. Pushes the expiry of held slots to
# now + ttl at least; per key 1 (held until then), or 0 (gone or expired: lost, never revived).
RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, out = tonumber(ARGV[1]), {}
for i = 1, #KEYS do
  local ends = tonumber(redis.call('ZSCORE', KEYS[i], ARGV[i + 1]) or '0')
  if ends > now then
    if ends < now + ttl then redis.call('ZADD', KEYS[i], now + ttl, ARGV[i + 1]) end
    if redis.call('PTTL', KEYS[i]) < ttl + 1000 then redis.call('PEXPIRE', KEYS[i], ttl + 1000) end
    out[i] = 1
  else
    redis.call('ZREM', KEYS[i], ARGV[i + 1])
    out[i] = 0
  end
end
return out
"""

# KEYS: pause. ARGV: seconds. Pause a site until now + seconds (never shortening a longer pause).
PAUSE_SITE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local untill = now + math.floor(tonumber(ARGV[1]) * 1000)
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if untill > cur then redis.call('SET', KEYS[1], untill, 'PX', untill - now + 1000) end
return untill
"""


def site_of(url: str, parts=None) -> str:
    """The site a limit applies to: lower-case name and port (``example.com:443``, ``[::1]:80``);
    ``parts``: ``urlsplit(url)`` when the caller has it."""
    parts = parts or urlsplit(url)
    site = parts.netloc.rpartition("@")[2].lower().rstrip(":")
    if site.endswith("]") or ":" not in site:
        return f"{site}:{443 if parts.scheme.lower() == 'https' else 80}"
    return site


def keys(site: str) -> list[str]:
    return [PREFIX + site + SLOTS, PREFIX + site + NEXT, PREFIX + site + PAUSE, PREFIX + site + WAITED]


def throttled(redis) -> list[dict]:
    """Sites throttled now (each row's ``host``: the site): paused by a server (for how long), or
    where a request had to wait for a slot or the delay within the last few seconds; with their
    downloads in flight."""
    import time

    now_ms = int(time.time() * 1000)
    out: dict[str, dict] = {}
    for kind in (PAUSE, WAITED):
        for key in redis.scan_iter(PREFIX + "*" + kind, count=1000):
            site = key.decode()[len(PREFIX):-len(kind)]
            row = out.setdefault(site, {"host": site, "paused_s": None})
            if kind == PAUSE:
                until = int(redis.get(key) or 0)
                row["paused_s"] = round((until - now_ms) / 1000, 1) if until > now_ms else None
    for site, row in out.items():
        row["in_flight"] = redis.zcount(PREFIX + site + SLOTS, now_ms, "+inf")
    return [out[s] for s in sorted(out)]
