"""Priorities, the four rq queues, host queues and the worker's queue order."""
from __future__ import annotations

from common.config import settings

QUEUE_NAMES = ("down_super", "down_high", "down_mid", "down_low")
PRIORITIES = range(-1, 6)
LOCK_KEY = "downcluster:dispatch:lock"
RQ_JOB_PREFIX = "dc-"
EXPORT_QUEUE = "down_export"      # export entries (rq jobs "dcx-<export id>"), taken by every worker's export lane
EXPORT_ENTRY_PREFIX = "dcx-"
WORKER_KEY_PREFIX = "downcluster:worker:"  # + worker id: a hash each live worker refreshes (stats, console)


def queue_for_priority(priority: int) -> str:
    """-1 -> down_super, 0..1 -> down_high, 2..3 -> down_mid, 4..5 -> down_low."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be in -1..5, got {priority!r}")
    if priority == -1:
        return "down_super"
    return QUEUE_NAMES[1 + priority // 2]


FOREIGN = "#foreign"  # suffix of the queues of jobs with prior = 2 (hosts with an exit abroad)


def queue_name(base: str, host: str = "", foreign: bool = False) -> str:
    """The shared queue ``base``, host ``host``'s own queue of that level, or (``foreign``) the
    level's foreign queue, read only by ``downcluster worker --foreign``."""
    if host:
        return f"{base}@{host}"
    return base + FOREIGN if foreign else base


def base_of(name: str) -> str:
    return name.split("@", 1)[0].split("#", 1)[0]


def cap(name: str) -> int:
    """Cap on entries of a queue (a host queue has the cap of its level)."""
    return int(getattr(settings, "Q_" + base_of(name).upper() + "_LEN"))


def worker_queue_names(host: str = "", foreign: bool = False) -> list[str]:
    """Strict order for a worker: at each level its host queue, then (``foreign``) the foreign
    queue, then the shared one."""
    names: list[str] = []
    for base in QUEUE_NAMES:
        if host:
            names.append(queue_name(base, host))
        if foreign:
            names.append(queue_name(base, foreign=True))
        names.append(base)
    return names


def rq_job_id(lease: str) -> str:
    return RQ_JOB_PREFIX + lease


# --- atomic queue operations (Lua: one round trip, no interleaving) ------------------------

# Push an entry only while the caller still holds the dispatcher lock and the queue is below
# its cap: two dispatchers (say after a Redis restart dropped the lock) can never overfill it.
# KEYS: lock, queue list, job hash, rq's set of queues. ARGV: token, cap, at_front, job id,
# then the job hash's field/value pairs.
_PUSH = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('LLEN', KEYS[2]) >= tonumber(ARGV[2]) then return 0 end
for i = 5, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
redis.call('SADD', KEYS[4], KEYS[2])
if ARGV[3] == '1' then redis.call('LPUSH', KEYS[2], ARGV[4]) else redis.call('RPUSH', KEYS[2], ARGV[4]) end
return 1
"""

# The first entry of the first non-empty queue, in the order given (strict priority).
_POP = """
for i = 1, #KEYS do
  local v = redis.call('LPOP', KEYS[i])
  if v then return {KEYS[i], v} end
end
return false
"""

PUSHED, FULL, NOT_OWNER = 1, 0, -1
_scripts: dict = {}


def script(redis, source: str):
    """The Script object of ``source`` (made once; callers always pass their own client)."""
    if source not in _scripts:
        _scripts[source] = redis.register_script(source)
    return _scripts[source]


def push_entry(redis, queue_key: str, job_key: str, job_id: str, mapping: dict, cap_entries: int,
               token: bytes | str, at_front: bool = False, client=None) -> int:
    """PUSHED, FULL (queue at its cap) or NOT_OWNER (``token`` no longer holds the lock).
    ``mapping`` is the rq job hash; the entry pushed is ``job_id``. With ``client`` a pipeline,
    the answer comes from its ``execute()``."""
    if isinstance(token, bytes):
        token = token.decode()
    flat: list = []
    for k, v in mapping.items():
        flat += [k, v]
    args = [token, cap_entries, "1" if at_front else "0", job_id] + flat
    got = script(redis, _PUSH)(keys=[LOCK_KEY, queue_key, job_key, "rq:queues"], args=args, client=client or redis)
    return got if client is not None else int(got)


def pop_first(redis, queue_keys: list[str]):
    """(queue key, job id) of the head of the first non-empty queue, or None."""
    got = script(redis, _POP)(keys=queue_keys, args=[], client=redis)
    if not got:
        return None
    return got[0].decode(), got[1].decode()
