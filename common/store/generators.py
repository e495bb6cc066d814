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

from datetime import datetime, timedelta

from bson import ObjectId

from common.config import settings
from common.store import claims
from common.store.models import (
    FAIL,
    GEN_ON,
    GEN_TEST,
    RUN_RUNNING,
    RUN_SKIPPED,
    CrawlerGenerator,
    CrawlerGeneratorLog,
)

LOG_FIELDS = {"run": 1, "trigger": 1, "status": 1, "added": 1, "duplicate": 1, "rejected": 1, "lines": 1,
              "errors": 1, "bytes": 1, "spend_time": 1, "hostname": 1, "failed_reason": 1,
              "started_at": 1, "finished_at": 1, "add_datetime": 1}


def _coll():
    return CrawlerGenerator._get_collection()


def _logs():
    return CrawlerGeneratorLog._get_collection()


RUN = claims.Claimed("generator run", _coll, owner="running_run", ttl=lambda: float(settings.HEARTBEAT_TTL),
                     max_recoveries=lambda: 1, held={"running_run": {"$ne": None}}, alert="generator_fail")


# --- registration and state ------------------------------------------------------------------

def store(job_id, kind: str, code: str, schedule: str, schemes: list[str], digest: str,
          now: datetime) -> dict:
    """Create or update the job's generator; a new one, or one whose ``digest`` (type, schedule,
    code) changed, is in state test. The generator as stored."""
    current = _coll().find_one({"job": job_id}, {"digest": 1})
    fields = {"type": kind, "code": code, "schedule": schedule, "schemes": schemes, "digest": digest,
              "last_update_datetime": now}
    if current is None or current.get("digest") != digest:
        fields.update(state=GEN_TEST, next_at=None)
    _coll().update_one({"job": job_id}, {"$set": fields, "$setOnInsert": {"add_datetime": now}},
                       upsert=True)
    return of_job(job_id) or {}


def remove(job_id) -> bool:
    """Remove the job's generator (its manifest no longer declares one); whether there was one."""
    return bool(_coll().delete_one({"job": job_id}).deleted_count)


def of_job(job_id) -> dict | None:
    return _coll().find_one({"job": job_id})


def set_state(job_id, state: str, next_at: datetime | None, now: datetime) -> dict | None:
    """Switch the generator to ``state`` (on: first due at ``next_at``); the generator after."""
    _coll().update_one({"job": job_id}, {"$set": {"state": state, "next_at": next_at,
                                                  "last_update_datetime": now}})
    return of_job(job_id)


def mark_tested(job_id, digest: str, next_at: datetime, now: datetime) -> dict | None:
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

def due(now: datetime, off_jobs: list, limit: int = 200) -> list[dict]:
    """On generators whose next time has come (by ``(state, next_at)``), but those of ``off_jobs``."""
    return list(_coll().find({"state": GEN_ON, "next_at": {"$lte": now}, "job": {"$nin": off_jobs}},
                             {"job": 1, "next_at": 1, "schedule": 1, "running_run": 1, "running_since": 1})
                .limit(limit))


def claim_run(gen_id, seen_next: datetime | None, new_next: datetime | None, run_id: str,
              now: datetime, state: str | None = GEN_ON) -> bool:
    """Start run ``run_id``: ``next_at`` moves from ``seen_next`` to ``new_next`` and the run is
    under way, if no run is and nobody moved ``next_at`` first (``state`` None: any state, for a
    run asked by hand; ``seen_next`` is then left as it is)."""
    match: dict = {"_id": gen_id, "running_run": None}
    change: dict = {"running_run": run_id, "running_since": now, claims.BEAT: None}
    if state is not None:
        match.update(state=state, next_at=seen_next)
        change["next_at"] = new_next
    return bool(_coll().update_one(match, {"$set": change}).modified_count)


def skip_due(gen_id, seen_next: datetime, new_next: datetime) -> bool:
    """Move ``next_at`` on without a run (the previous one is still under way), if nobody did first."""
    return bool(_coll().update_one({"_id": gen_id, "state": GEN_ON, "next_at": seen_next,
                                    "running_run": {"$ne": None}},
                                   {"$set": {"next_at": new_next}}).modified_count)


def lost_runs(now: datetime, wait: float) -> list[tuple[dict, str]]:
    """Runs to give up, each with why: claimed and silent for HEARTBEAT_TTL (``claims.expired``),
    or reserved since before ``wait`` seconds ago and taken by no worker."""
    fields = {"job": 1, "running_since": 1}
    silent = [(g, f"no heartbeat for {RUN.ttl():g} s (its worker died)")
              for g in claims.expired(RUN, now, fields, limit=100)]
    waiting = _coll().find({"running_run": {"$ne": None}, claims.BEAT: None,
                            "running_since": {"$lt": now - timedelta(seconds=wait)}},
                           {**fields, "running_run": 1, claims.BEAT: 1, claims.COUNTER: 1}).limit(100)
    return silent + [(g, f"still under way after {wait:g} s (its worker vanished?)")
                     for g in waiting]


def give_up(gen: dict, reason: str, what: str, now: datetime) -> bool:
    """End a lost run FAIL (``claims.recover``: by compare-and-set on the run as judged, with the
    one alert); whether this did."""
    run_id = gen["running_run"]
    ended = {"$set": {"running_since": None, claims.BEAT: None, "last_run_at": now, "last_status": FAIL}}
    if claims.recover(RUN, gen, reason, ended, ended, job=gen["job"], what=what) is None:
        return False
    _logs().update_one({"_id": ObjectId(run_id), "status": RUN_RUNNING},
                       {"$set": {"status": FAIL, "failed_reason": f"run given up: {reason}",
                                 "finished_at": now}})
    return True


# --- runs -------------------------------------------------------------------------------------

def new_run_id() -> str:
    return str(ObjectId())


def open_log(run_id: str, job_id, trigger: str, now: datetime, hostname: str, status: str = RUN_RUNNING,
             reason: str | None = None) -> None:
    """The run's log: RUNNING until a worker ends it (or SKIPPED, with ``reason``, at once)."""
    doc = {"_id": ObjectId(run_id), "job": job_id, "run": run_id, "trigger": trigger, "status": status,
           "added": 0, "duplicate": 0, "rejected": 0, "lines": 0, "errors": [], "bytes": 0, "spend_time": 0,
           "hostname": hostname, "add_datetime": now}
    if reason is not None:
        doc["failed_reason"] = reason
    if status == RUN_SKIPPED:
        doc["finished_at"] = now
    _logs().insert_one(doc)


def skipped(run_id: str, job_id, now: datetime, hostname: str, reason: str) -> None:
    open_log(run_id, job_id, "schedule", now, hostname, RUN_SKIPPED, reason)


def start_run(run_id: str, hostname: str, now: datetime) -> dict | None:
    """Take run ``run_id`` for this worker: its log, then the run's claim on its generator
    (``claims.claim``: ``beat_at`` from nothing); the log and generator, or None if it is not
    RUNNING, already started, given up, or its generator is gone."""
    try:
        oid = ObjectId(run_id)
    except Exception:
        return None
    log = _logs().find_one_and_update({"_id": oid, "status": RUN_RUNNING, "started_at": None},
                                      {"$set": {"started_at": now, "hostname": hostname}})
    if log is None:
        return None
    gen = claims.claim(RUN, {"job": log["job"], "running_run": run_id, claims.BEAT: None}, run_id)
    if gen is None:
        end_run(run_id, log["job"], {"status": FAIL, "failed_reason": "generator removed or run given up"},
                now)
        return None
    return {"log": log, "generator": gen}


def end_run(run_id: str, job_id, fields: dict, now: datetime) -> None:
    """End the run (``fields``: status, counts, errors, bytes, spend_time, failed_reason) and free
    its generator for the next one."""
    _logs().update_one({"_id": ObjectId(run_id), "status": RUN_RUNNING},
                       {"$set": {**fields, "finished_at": now}})
    _coll().update_one({"job": job_id, **claims.holding(RUN, run_id)},
                       {"$set": {"running_run": None, "running_since": None, claims.BEAT: None,
                                 "last_run_at": now, "last_status": fields.get("status")}})


def runs(job_id, limit: int = 20, before: str | None = None) -> list[dict]:
    """The job's runs, newest first (``before``: older than that run id), by ``(job, _id)``."""
    match: dict = {"job": job_id}
    if before:
        match["_id"] = {"$lt": ObjectId(before)}
    return list(_logs().find(match, LOG_FIELDS).sort("_id", -1).limit(limit))

