"""The rq adapter: how downcluster's queue entries are rq jobs, and everything it does below
rq's public API, in one module. Matches rq 3.0.0 (``RQ_VERSION``); ``tests/test_rqbridge.py``
fails when rq changes a format relied on here.

Entries are real rq jobs: a download entry ``dc-<lease>`` calls ``slave.jobs.run_batch(lease)``,
an export entry ``dcx-<export id>`` calls ``slave.jobs.run_export(id)``, so a plain ``rq worker``
runs either, and rq's tools (``rq info``, rq-dashboard, ``Worker.all()``) read them.

Below rq's public API, and only here:
  * the capped push (Lua): rq has no conditional enqueue. The script writes the entry's job
    hash (``Job.to_dict()``, exactly what ``Queue.enqueue_job`` saves), adds the queue to rq's
    set of queues and pushes the id, but only while the dispatcher lock is the caller's and the
    list is below its cap: two dispatchers can never overfill a queue;
  * the strict-order pop (Lua): the head of the first non-empty list in one round trip (rq's
    ``Queue.dequeue_any`` without a timeout pops each list in turn); the job itself is then read
    with ``Job.fetch``;
  * rq's key names, read from rq's own classes (``Queue.redis_queue_namespace_prefix``,
    ``Job.key_for``, ``Queue.redis_queues_keys``), never spelled elsewhere.
"""
from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum

from redis import Redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job as RqJob
from rq.job import JobStatus

from common.queues import QUEUE_NAMES, base_of

RQ_VERSION = "3.0.0"

ENTRY_PREFIX = "dc-"          # + lease id: a download entry
EXPORT_ENTRY_PREFIX = "dcx-"  # + export id: an export entry (queue down_export)
DOWNLOAD_FUNCTION = "slave.jobs.run_batch"
EXPORT_FUNCTION = "slave.jobs.run_export"


# --- names ------------------------------------------------------------------------------

def queue_key(name: str) -> str:
    """The Redis list of rq queue ``name``."""
    return Queue.redis_queue_namespace_prefix + name


def queue_name_of(key: str) -> str:
    return key.removeprefix(Queue.redis_queue_namespace_prefix)


def entry_id(lease: str) -> str:
    return ENTRY_PREFIX + lease


def export_entry_id(export_id) -> str:
    return EXPORT_ENTRY_PREFIX + str(export_id)


def lease_of(entry: str) -> str | None:
    """The lease a download entry names, or None for any other rq job."""
    return entry[len(ENTRY_PREFIX):] if entry.startswith(ENTRY_PREFIX) else None


def export_of(entry: str) -> str | None:
    return entry[len(EXPORT_ENTRY_PREFIX):] if entry.startswith(EXPORT_ENTRY_PREFIX) else None


def our_queues(redis: Redis) -> list[str]:
    """Our download queues: the four shared ones and every host or foreign queue rq knows of."""
    return sorted({*QUEUE_NAMES, *(q.name for q in Queue.all(connection=redis) if base_of(q.name) in QUEUE_NAMES)})


# --- dispatch: the capped push ------------------------------------------------------------

def entry_mapping(queue: Queue, lease: str, timeout: int, failure_ttl: int, description: str,
                  enqueued_at: datetime) -> dict:
    """The rq job hash of a download entry, as ``Queue.enqueue_job`` would save it."""
    job = queue.create_job(DOWNLOAD_FUNCTION, args=(lease,), job_id=entry_id(lease), timeout=timeout, result_ttl=0,
                           failure_ttl=failure_ttl, description=description, status=JobStatus.QUEUED)
    job.origin = queue.name
    job.enqueued_at = enqueued_at.replace(tzinfo=timezone.utc) if enqueued_at.tzinfo is None else enqueued_at
    return {k: v.value if isinstance(v, Enum) else v for k, v in job.to_dict().items()}


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

# The first entry of the first non-empty list, in the order given (strict priority).
_POP = """
for i = 1, #KEYS do
  local v = redis.call('LPOP', KEYS[i])
  if v then return {KEYS[i], v} end
end
return false
"""

PUSHED, FULL, NOT_OWNER = 1, 0, -1
_scripts: dict = {}


def _script(redis, source: str):
    """The Script object of ``source`` (made once; callers always pass their own client)."""
    if source not in _scripts:
        _scripts[source] = redis.register_script(source)
    return _scripts[source]


def push_entry(redis, lock_key: str, queue: str, entry: str, mapping: dict, cap_entries: int,
               token: bytes | str, at_front: bool = False, client=None) -> int:
    """PUSHED, FULL (queue at its cap) or NOT_OWNER (``token`` no longer holds ``lock_key``).
    ``mapping`` is the entry's rq job hash (``entry_mapping``). With ``client`` a pipeline, the
    answer comes from its ``execute()``."""
    if isinstance(token, bytes):
        token = token.decode()
    flat: list = []
    for k, v in mapping.items():
        flat += [k, v]
    args = [token, cap_entries, "1" if at_front else "0", entry] + flat
    keys = [lock_key, queue_key(queue), RqJob.key_for(entry), Queue.redis_queues_keys]
    got = _script(redis, _PUSH)(keys=keys, args=args, client=client or redis)
    return got if client is not None else int(got)


# --- workers: the strict-order pop ----------------------------------------------------------

def pop_entry(redis: Redis, queues: list[str]) -> tuple[str, str] | None:
    """(queue name, entry id) of the head of the first non-empty queue, removed; or None."""
    got = _script(redis, _POP)(keys=[queue_key(q) for q in queues], args=[], client=redis)
    if not got:
        return None
    return queue_name_of(got[0].decode()), got[1].decode()


def wait_entry(redis: Redis, queues: list[str], timeout: int = 1) -> tuple[str, str] | None:
    """Like ``pop_entry``, blocking up to ``timeout`` seconds (BLPOP keeps the order)."""
    got = redis.blpop([queue_key(q) for q in queues], timeout=timeout)
    if not got:
        return None
    return queue_name_of(got[0].decode()), got[1].decode()


def fetch_entry(redis: Redis, entry: str) -> RqJob | None:
    try:
        return RqJob.fetch(entry, connection=redis)
    except NoSuchJobError:
        return None


# --- the defender and readers -------------------------------------------------------------

def entry_exists(redis: Redis, entry: str) -> bool:
    return RqJob.exists(entry, connection=redis)


def delete_entry(redis: Redis, entry: str) -> None:
    """Forget an entry: its job hash and its place in any queue or registry."""
    job = fetch_entry(redis, entry)
    if job is not None:
        job.delete(remove_from_queue=True)


def entries_waiting(redis: Redis, names: list[str]) -> set[str]:
    """Entry ids waiting in the queues ``names``."""
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.lrange(queue_key(name), 0, -1)
    return {i.decode() for ids in pipe.execute() for i in ids}


def oldest_enqueued_at(redis: Redis, name: str) -> datetime | None:
    """When the head of queue ``name`` was enqueued (UTC), or None if it is empty."""
    ids = Queue(name, connection=redis).get_job_ids(0, 1)
    job = fetch_entry(redis, ids[0]) if ids else None
    if job is None or job.enqueued_at is None:
        return None
    stamp = job.enqueued_at
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
