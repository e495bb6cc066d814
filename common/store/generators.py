"""Generators: ``crawler_generator`` (one per job that declares one: its code, schedule, state and
the run under way) and, on the log alias, ``crawler_generator_log`` (one document per run:
RUNNING, then SUCCESS or FAIL; SKIPPED when it came due while the previous run was under way).

Indexes: ``crawler_generator`` is unique on ``job`` and indexed by ``(state, next_at)`` (the
dispatchers' "which are due" read); ``crawler_generator_log`` by ``(job, _id)`` (a job's runs by
time) and a TTL index on ``add_datetime`` (LOG_RETENTION_DAYS, ``common.store.retention``).

Invariant: a run is started only by a compare-and-set that moves ``next_at`` from the value read
to the next time after now and sets ``running_run`` while it was empty, so however many
dispatchers see a generator due, one run starts per due time, and after an outage the missed
times collapse into one run; a run's log is taken by its worker by compare-and-set on
``started_at``, so an entry delivered twice runs once. A run is claimed work
(``common.store.claims``, as ``RUN``): the dispatcher's ``claim_run`` only reserves it (like a
lease made QUEUED); the worker that takes it claims it (``beat_at``, from nothing) and beats it
while the generator runs; a run whose worker stops beating for HEARTBEAT_TTL, or that no worker
took within the wait its caller gives (``lost_runs``), is given up (``give_up``): FAIL, with a
``generator_fail`` alert — never run again, the next due time runs. ``running_run`` is cleared
only by the run it names (its end, or its recovery).
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from bson import ObjectId
from pymongo.collection import Collection

from common.config import settings
from common.store import claims
from common.store.connection import collection
from common.store.log_models import CrawlerGeneratorLog
from common.store.logrecords import GeneratorRun
from common.store.models import FAIL, GEN_ON, GEN_TEST, RUN_RUNNING, RUN_SKIPPED, CrawlerGenerator
from common.store.records import Generator

LOG_FIELDS = {"run": 1, "trigger": 1, "status": 1, "added": 1, "duplicate": 1, "rejected": 1, "lines": 1,
              "errors": 1, "bytes": 1, "spend_time": 1, "hostname": 1, "failed_reason": 1,
              "started_at": 1, "finished_at": 1, "add_datetime": 1}


def _coll() -> Collection[dict[str, Any]]:
    return collection(CrawlerGenerator)


def _logs() -> Collection[dict[str, Any]]:
    return collection(CrawlerGeneratorLog)


RUN = claims.Claimed("generator run", _coll, owner="running_run", ttl=lambda: float(settings.HEARTBEAT_TTL),
                     max_recoveries=lambda: 1, held={"running_run": {"$ne": None}}, alert="generator_fail")


# --- registration and state ------------------------------------------------------------------

def store(job_id: ObjectId, kind: str, code: str, schedule: str, schemes: Sequence[str], digest: str,
          now: datetime) -> Generator:
    """Create or update the job's generator; a new one, or one whose ``digest`` (type, schedule,
    code) changed, is in state test. The generator as stored."""
    current = _coll().find_one({"job": job_id}, {"digest": 1})
    fields: dict[str, Any] = {"type": kind, "code": code, "schedule": schedule, "schemes": list(schemes),
                              "digest": digest, "last_update_datetime": now}
    if current is None or current.get("digest") != digest:
        fields.update(state=GEN_TEST, next_at=None)
    _coll().update_one({"job": job_id}, {"$set": fields, "$setOnInsert": {"add_datetime": now}}, upsert=True)
    stored = of_job(job_id)
    assert stored is not None  # just written
    return stored


def remove(job_id: ObjectId) -> bool:
    """Remove the job's generator (its manifest no longer declares one); whether there was one."""
    return bool(_coll().delete_one({"job": job_id}).deleted_count)


def of_job(job_id: ObjectId) -> Generator | None:
    return Generator.maybe(_coll().find_one({"job": job_id}))


def set_state(job_id: ObjectId, state: str, next_at: datetime | None, now: datetime) -> Generator | None:
    """Switch the generator to ``state`` (on: first due at ``next_at``); the generator after."""
    _coll().update_one({"job": job_id}, {"$set": {"state": state, "next_at": next_at,
                                                  "last_update_datetime": now}})
    return of_job(job_id)


def mark_tested(job_id: ObjectId, digest: str, next_at: datetime, now: datetime) -> Generator | None:
    """A dry run of ``digest`` passed: remember it; a generator in test (of that digest) goes on,
    first due at ``next_at``. The generator after (None if it changed meanwhile)."""
    coll = _coll()
    tested = coll.update_one({"job": job_id, "digest": digest}, {"$set": {"tested_digest": digest}})
    if not tested.matched_count:
        return None
    coll.update_one({"job": job_id, "digest": digest, "state": GEN_TEST},
                    {"$set": {"state": GEN_ON, "next_at": next_at, "last_update_datetime": now}})
    return of_job(job_id)


# --- scheduling -------------------------------------------------------------------------------

def due(now: datetime, off_jobs: list[ObjectId], limit: int = 200) -> list[Generator]:
    """On generators whose next time has come (by ``(state, next_at)``), but those of ``off_jobs``."""
    found = _coll().find({"state": GEN_ON, "next_at": {"$lte": now}, "job": {"$nin": off_jobs}},
                         {"job": 1, "next_at": 1, "schedule": 1, "running_run": 1, "running_since": 1})
    return [Generator.from_doc(d) for d in found.limit(limit)]


def claim_run(gen_id: ObjectId, seen_next: datetime | None, new_next: datetime | None, run_id: str,
              now: datetime, state: str | None = GEN_ON) -> bool:
    """Start run ``run_id``: ``next_at`` moves from ``seen_next`` to ``new_next`` and the run is
    under way, if no run is and nobody moved ``next_at`` first (``state`` None: any state, for a
    run asked by hand; ``seen_next`` is then left as it is)."""
    match: dict[str, Any] = {"_id": gen_id, "running_run": None}
    change: dict[str, Any] = {"running_run": run_id, "running_since": now, claims.BEAT: None}
    if state is not None:
        match.update(state=state, next_at=seen_next)
        change["next_at"] = new_next
    return bool(_coll().update_one(match, {"$set": change}).modified_count)


def skip_due(gen_id: ObjectId, seen_next: datetime | None, new_next: datetime) -> bool:
    """Move ``next_at`` on without a run (the previous one is still under way), if nobody did first."""
    return bool(_coll().update_one({"_id": gen_id, "state": GEN_ON, "next_at": seen_next,
                                    "running_run": {"$ne": None}},
                                   {"$set": {"next_at": new_next}}).modified_count)


def lost_runs(now: datetime, wait: float) -> list[tuple[Generator, str]]:
    """Runs to give up, each with why: claimed and silent for HEARTBEAT_TTL (``claims.expired``),
    or reserved since before ``wait`` seconds ago and taken by no worker."""
    fields = {"job": 1, "running_since": 1}
    silent = [(Generator.from_doc(g), f"no heartbeat for {RUN.ttl():g} s (its worker died)")
              for g in claims.expired(RUN, now, fields, limit=100)]
    waiting = _coll().find({"running_run": {"$ne": None}, claims.BEAT: None,
                            "running_since": {"$lt": now - timedelta(seconds=wait)}},
                           {**fields, "running_run": 1, claims.BEAT: 1, claims.COUNTER: 1}).limit(100)
    return silent + [(Generator.from_doc(g), f"still under way after {wait:g} s (its worker vanished?)")
                     for g in waiting]


def give_up(gen: Generator, reason: str, what: str, now: datetime) -> bool:
    """End a lost run FAIL (``claims.recover``: by compare-and-set on the run as judged, with the
    one alert); whether this did."""
    ended = {"$set": {"running_since": None, claims.BEAT: None, "last_run_at": now, "last_status": FAIL}}
    judged = {"_id": gen.id, "running_run": gen.running_run, claims.BEAT: gen.beat_at,
              claims.COUNTER: gen.recoveries}
    if claims.recover(RUN, judged, reason, ended, ended, job=gen.job, what=what) is None:
        return False
    _logs().update_one({"_id": ObjectId(gen.running_run), "status": RUN_RUNNING},
                       {"$set": {"status": FAIL, "failed_reason": f"run given up: {reason}",
                                 "finished_at": now}})
    return True


# --- runs -------------------------------------------------------------------------------------

def new_run_id() -> str:
    return str(ObjectId())


def open_log(run_id: str, job_id: ObjectId, trigger: str, now: datetime, hostname: str,
             status: str = RUN_RUNNING, reason: str | None = None) -> None:
    """The run's log: RUNNING until a worker ends it (or SKIPPED, with ``reason``, at once)."""
    run = GeneratorRun(id=ObjectId(run_id), job=job_id, run=run_id, trigger=trigger, status=status,
                       hostname=hostname, add_datetime=now, failed_reason=reason,
                       finished_at=now if status == RUN_SKIPPED else None)
    _logs().insert_one(run.to_doc())


def skipped(run_id: str, job_id: ObjectId, now: datetime, hostname: str, reason: str) -> None:
    open_log(run_id, job_id, "schedule", now, hostname, RUN_SKIPPED, reason)


def start_run(run_id: str, hostname: str, now: datetime) -> tuple[GeneratorRun, Generator] | None:
    """Take run ``run_id`` for this worker: its log, then the run's claim on its generator
    (``claims.claim``: ``beat_at`` from nothing); the log and generator, or None if it is not
    RUNNING, already started, given up, or its generator is gone."""
    try:
        oid = ObjectId(run_id)
    except Exception:
        return None
    found = _logs().find_one_and_update({"_id": oid, "status": RUN_RUNNING, "started_at": None},
                                        {"$set": {"started_at": now, "hostname": hostname}})
    if found is None:
        return None
    log = GeneratorRun.from_doc(found)
    free = {"job": log.job, "running_run": run_id, claims.BEAT: None}
    gen = Generator.maybe(claims.claim(RUN, free, run_id))
    if gen is None:
        end_run(run_id, log.job, now, status=FAIL, failed_reason="generator removed or run given up")
        return None
    return log, gen


def end_run(run_id: str, job_id: ObjectId | None, now: datetime, *, status: str,
            failed_reason: str | None = None, added: int = 0, duplicate: int = 0, rejected: int = 0,
            lines: int = 0, errors: Sequence[tuple[int, str]] = (), size: int = 0,
            spend_time: int = 0) -> None:
    """End the run (``status``, its counts, the first rejected lines as (line, reason), the
    output's ``size`` in bytes) and free its generator for the next one."""
    ended: dict[str, Any] = {"status": status, "finished_at": now, "added": added, "duplicate": duplicate,
                             "rejected": rejected, "lines": lines, "bytes": size, "spend_time": spend_time,
                             "errors": [{"line": n, "reason": r} for n, r in errors]}
    if failed_reason is not None:
        ended["failed_reason"] = failed_reason
    _logs().update_one({"_id": ObjectId(run_id), "status": RUN_RUNNING}, {"$set": ended})
    _coll().update_one({"job": job_id, **claims.holding(RUN, run_id)},
                       {"$set": {"running_run": None, "running_since": None, claims.BEAT: None,
                                 "last_run_at": now, "last_status": status}})


def runs(job_id: ObjectId, limit: int = 20, before: str | None = None) -> list[GeneratorRun]:
    """The job's runs, newest first (``before``: older than that run id), by ``(job, _id)``."""
    match: dict[str, Any] = {"job": job_id}
    if before:
        match["_id"] = {"$lt": ObjectId(before)}
    return [GeneratorRun.from_doc(d) for d in _logs().find(match, LOG_FIELDS).sort("_id", -1).limit(limit)]
