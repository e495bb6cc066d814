"""The rq adapter: how downcluster's queue entries are rq jobs, and everything it does below
rq's public API, in one module. Matches rq 3.0.0 (``RQ_VERSION``); ``tests/integration/test_rqbridge.py``
fails when rq changes a format relied on here.

Entries are real rq jobs of four entry kinds (``EntryKind``), each stated in the job's meta
(``{"kind": ...}``): a download entry ``dc-<lease>`` calls ``slave.worker.entries.run_batch(lease)``,
an export entry ``dcx-<export id>`` calls ``slave.worker.entries.run_export(id)``, a generator run
``dcg-<run id>`` calls ``slave.worker.entries.run_generator(id)``, a job's dry run on one URL
``dcd-<dry run id>`` calls ``slave.worker.entries.run_dry_run(id)``, so a plain ``rq worker`` runs any,
and rq's tools (``rq info``, rq-dashboard, ``Worker.all()``) read them. ``fetch_entry`` reads an
entry as an ``Entry`` (its entry kind and the record it names); an entry queued before kinds were
stated gets its kind from its function, there and only there.

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

Nothing read from Redis is ever unpickled. rq's default serializer is pickle, so anyone who can
write Redis could run code in whatever process reads an entry; every queue, job and worker here
is JSON (``JsonJob``, ``rq_queue``; a plain rq worker is started with ``--serializer json``).
An id that is not ours is never read at all, and one of ours whose hash does not parse as JSON
or does not call what its id says is refused (``ForeignEntry``), never run.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum

from redis import Redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job as RqJob
from rq.job import JobStatus
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp, str_to_date

from common.queue.names import QUEUE_NAMES, base_of

RQ_VERSION = "3.0.0"

DOWNLOAD_FUNCTION = "slave.worker.entries.run_batch"
EXPORT_FUNCTION = "slave.worker.entries.run_export"
GENERATE_FUNCTION = "slave.worker.entries.run_generator"
DRY_RUN_FUNCTION = "slave.worker.entries.run_dry_run"


class EntryKind(str, Enum):
    """What a queue entry runs."""

    DOWNLOAD = "download"  # a lease's tasks (the download queues)
    EXPORT = "export"      # one attempt of an export (down_export)
    GENERATE = "generate"  # one generator run (down_generate)
    DRY_RUN = "dry_run"    # a job's engine on one URL, storing nothing (down_super: common/dryrun.py)


@dataclass(frozen=True)
class _Form:
    prefix: str    # the entry id is prefix + the id of the record it names
    function: str  # what rq calls, with that id as its one argument


FORMS = {
    EntryKind.DOWNLOAD: _Form("dc-", DOWNLOAD_FUNCTION),
    EntryKind.EXPORT: _Form("dcx-", EXPORT_FUNCTION),
    EntryKind.GENERATE: _Form("dcg-", GENERATE_FUNCTION),
    EntryKind.DRY_RUN: _Form("dcd-", DRY_RUN_FUNCTION),
}
# what entries queued before the rooms layout call: still run (slave/jobs.py keeps the names for plain rq
# workers)
LEGACY_FUNCTIONS = {"slave.jobs.run_batch": DOWNLOAD_FUNCTION, "slave.jobs.run_export": EXPORT_FUNCTION}
REFUSED_TTL = 7 * 24 * 3600   # seconds a refused entry's id stays in rq's failed registry

logger = logging.getLogger(__name__)


class JsonJob(RqJob):
    """An rq job (de)serialized as JSON whatever its caller asks for: rq-scheduler, rq's
    registries and workers create and fetch jobs through their ``job_class`` without passing
    a serializer, and JSON cannot run code."""

    def __init__(self, id: str | None = None, connection: Redis | None = None, serializer=None) -> None:
        super().__init__(id, connection=connection, serializer=JSONSerializer)


def rq_queue(name: str, redis: Redis) -> Queue:
    """rq queue ``name`` with JSON entries: the only way this project makes one."""
    return Queue(name, connection=redis, serializer=JSONSerializer, job_class=JsonJob)


class ForeignEntry(Exception):
    """An entry in our queues that is not one of ours: never deserialized into objects, never run."""


# --- names ------------------------------------------------------------------------------

def queue_key(name: str) -> str:
    """The Redis list of rq queue ``name``."""
    return Queue.redis_queue_namespace_prefix + name


def queue_name_of(key: str) -> str:
    return key.removeprefix(Queue.redis_queue_namespace_prefix)


def entry_id(lease: str) -> str:
    return FORMS[EntryKind.DOWNLOAD].prefix + lease


def export_entry_id(export_id) -> str:
    return FORMS[EntryKind.EXPORT].prefix + str(export_id)


def generate_entry_id(run_id: str) -> str:
    return FORMS[EntryKind.GENERATE].prefix + run_id


def _meta(entry_kind: EntryKind) -> dict:
    return {"kind": entry_kind.value}


def push_generate(redis: Redis, queue: str, run_id: str, timeout: int) -> None:
    """Queue generator run ``run_id`` on ``queue`` (down_generate; not capped, as down_export: at
    most one entry per generator is ever out)."""
    rq_queue(queue, redis).enqueue_call(GENERATE_FUNCTION, args=(run_id,), job_id=generate_entry_id(run_id),
                                        result_ttl=0, failure_ttl=7 * 24 * 3600, timeout=timeout,
                                        description=f"generator run {run_id}", meta=_meta(EntryKind.GENERATE))


def push_dry_run(redis: Redis, queue: str, ref: str, timeout: int, ttl: int) -> None:
    """Queue dry run ``ref`` on ``queue`` (down_super; not capped: one person's click, and a
    worker takes it before any download entry); gone unrun after ``ttl`` seconds."""
    entry = f"{FORMS[EntryKind.DRY_RUN].prefix}{ref}"
    rq_queue(queue, redis).enqueue_call(DRY_RUN_FUNCTION, args=(ref,), job_id=entry, result_ttl=0,
                                        failure_ttl=ttl, ttl=ttl, timeout=timeout,
                                        description=f"dry run {ref}", meta=_meta(EntryKind.DRY_RUN))


def push_export(redis: Redis, queue: str, export_id: str, timeout: int) -> None:
    """Queue an attempt of export ``export_id`` on ``queue`` (down_export; not capped)."""
    rq_queue(queue, redis).enqueue_call(EXPORT_FUNCTION, args=(export_id,), job_id=export_entry_id(export_id),
                                        result_ttl=0, failure_ttl=7 * 24 * 3600, timeout=timeout,
                                        meta=_meta(EntryKind.EXPORT))


def our_queues(redis: Redis) -> list[str]:
    """Our download queues: the four shared ones and every host or foreign queue rq knows of."""
    known = (q.name for q in Queue.all(connection=redis) if base_of(q.name) in QUEUE_NAMES)
    return sorted({*QUEUE_NAMES, *known})


# --- dispatch: the capped push ------------------------------------------------------------

def entry_mapping(queue: Queue, lease: str, timeout: int, failure_ttl: int, description: str,
                  enqueued_at: datetime) -> dict:
    """The rq job hash of a download entry, as ``Queue.enqueue_job`` would save it."""
    job = queue.create_job(DOWNLOAD_FUNCTION, args=(lease,), job_id=entry_id(lease), timeout=timeout,
                           result_ttl=0, failure_ttl=failure_ttl, description=description,
                           status=JobStatus.QUEUED, meta=_meta(EntryKind.DOWNLOAD))
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
    return queue_name_of(_decoded(got[0])), _decoded(got[1])


def _decoded(reply: bytes | str) -> str:
    """A Redis reply as text (our clients answer bytes; redis-py's types allow str too)."""
    return reply.decode() if isinstance(reply, bytes) else reply


@dataclass(frozen=True)
class Entry:
    """A queue entry as read by a worker: its entry kind, the record it names, rq's job."""

    entry_kind: EntryKind
    ref: str  # the lease, export or generator run id
    job: RqJob


def _ours(entry: str) -> bool:
    return any(entry.startswith(form.prefix) for form in FORMS.values())


def _entry_kind_of(job: RqJob, function: str) -> EntryKind | None:
    """The entry kind an entry states; for one queued before kinds were stated, the kind of the function
    it calls (the one place this is derived)."""
    stated = job.meta.get("kind")
    if stated is None:
        return next((entry_kind for entry_kind, form in FORMS.items() if form.function == function), None)
    return next((entry_kind for entry_kind in EntryKind if entry_kind.value == stated), None)


def fetch_entry(redis: Redis, entry: str) -> Entry | None:
    """Our entry ``entry`` read as JSON and checked to call what its entry kind and id say; None if it is
    gone. ForeignEntry for anything else: an id not ours is not even read."""
    if not _ours(entry):
        raise ForeignEntry(f"{entry[:80]!r} is not a downcluster entry")
    try:
        job = JsonJob.fetch(entry, connection=redis)
        name = job.func_name or ""
        function = LEGACY_FUNCTIONS.get(name, name)
        call = (function, list(job.args), dict(job.kwargs))
        entry_kind = _entry_kind_of(job, function)
    except NoSuchJobError:
        return None
    except Exception as exc:  # pickle, bad JSON, a hash of another shape
        raise ForeignEntry(f"{entry[:80]!r} is not JSON of rq's form ({type(exc).__name__})") from None
    if entry_kind is None or not entry.startswith(FORMS[entry_kind].prefix):
        raise ForeignEntry(f"{entry[:80]!r} is of no kind its id allows ({str(call[0])[:80]!r})")
    form = FORMS[entry_kind]
    ref = entry[len(form.prefix):]
    if call != (form.function, [ref], {}):
        raise ForeignEntry(f"{entry[:80]!r} calls {str(call[0])[:80]!r}, not {form.function}")
    return Entry(entry_kind, ref, job)


def refuse_entry(redis: Redis, queue_name: str, entry: str, why: str) -> None:
    """Log a popped foreign entry once and list its id in the queue's rq failed registry (rq's
    tools show it; a pickle worker may requeue it), without reading its hash."""
    logger.warning("refused an entry in %s, not run: %s", queue_name, why)
    registry = FailedJobRegistry(queue_name, connection=redis, serializer=JSONSerializer, job_class=JsonJob)
    redis.zadd(registry.key, {entry: current_timestamp() + REFUSED_TTL})


# --- the defender and readers -------------------------------------------------------------

def entry_exists(redis: Redis, entry: str) -> bool:
    return RqJob.exists(entry, connection=redis)


def delete_entry(redis: Redis, entry: str) -> None:
    """Forget an entry: its job hash and its place in any queue or registry."""
    try:
        got = fetch_entry(redis, entry)
    except ForeignEntry as exc:
        logger.warning("not deleting a foreign entry: %s", exc)
        return
    if got is not None:
        got.job.delete(remove_from_queue=True)


UNREADABLE = ("DeserializationError", "UnpicklingError")  # in rq's exc_info: the worker could not read it


def failed_unread(redis: Redis, entry: str) -> str | None:
    """The name of the rq worker that popped ``entry`` and failed it without reading it (a plain
    ``rq worker`` unpickles; our entries are JSON): rq records such a job as failed, in its
    queue's FailedJobRegistry, with a DeserializationError in its latest result's exc_info.
    None for anything else (the entry gone, waiting, or failed for another reason)."""
    try:
        got = fetch_entry(redis, entry)
    except ForeignEntry:
        return None
    if got is None or got.job.get_status(refresh=False) != JobStatus.FAILED:
        return None
    registry = FailedJobRegistry(got.job.origin, connection=redis, serializer=JSONSerializer,
                                 job_class=JsonJob)
    result = got.job.latest_result()
    text = (result.exc_string or "") if result is not None else ""
    if entry not in registry or not any(word in text for word in UNREADABLE):
        return None
    return got.job.worker_name or "?"


def entries_waiting(redis: Redis, names: list[str]) -> set[str]:
    """Entry ids waiting in the queues ``names``."""
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.lrange(queue_key(name), 0, -1)
    return {i.decode() for ids in pipe.execute() for i in ids}


def oldest_enqueued_at(redis: Redis, name: str) -> datetime | None:
    """When the head of queue ``name`` was enqueued (UTC), or None if it is empty or unreadable:
    one field of its hash, read as text (never the entry's data)."""
    head = redis.lindex(queue_key(name), 0)
    return _enqueued_at(redis.hget(RqJob.key_for(_decoded(head)), "enqueued_at") if head else None)


def depths_and_oldest(redis: Redis, names: list[str]) -> list[tuple[int, datetime | None]]:
    """Each queue's depth and ``oldest_enqueued_at``, read in two round trips for all of them."""
    pipe = redis.pipeline(transaction=False)
    for name in names:
        pipe.llen(queue_key(name))
        pipe.lindex(queue_key(name), 0)
    got = pipe.execute()
    depths, heads = got[0::2], got[1::2]
    pipe = redis.pipeline(transaction=False)
    for head in heads:
        if head:
            pipe.hget(RqJob.key_for(_decoded(head)), "enqueued_at")
    stamps = iter(pipe.execute())
    return [(int(depth), _enqueued_at(next(stamps)) if head else None) for depth, head in zip(depths, heads)]


def _enqueued_at(raw) -> datetime | None:
    """An entry's ``enqueued_at`` field as UTC; None when absent or unreadable."""
    try:
        stamp = str_to_date(raw) if raw else None
    except ValueError:
        return None
    if stamp is None:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=timezone.utc)
