"""Generators, the master's side: when they run, their states, and what people read of them.

A job's manifest may declare a ``[generator]`` (``master/registry.py``): code that produces URLs
on a schedule. It runs on a worker, never here (``slave/generate.py``, in the downloaders'
sandbox), as an entry of its own on ``down_generate``; its URLs go through the one intake.

States: a new or changed generator is ``test`` and never runs on its schedule until
``downcluster generator test NAME`` (a dry run) passes, which turns it ``on``; ``on`` and ``off``
switch it, and ``on`` refuses code that no dry run has passed since it last changed.

A generator of a job that is OFF never runs: its due times wait (they collapse into one run once
the job is enabled again), ``generator run`` is refused, and a run queued before the job was
turned off ends SKIPPED on its worker without running.

Scheduling (``tend``, the "generators" chore of every dispatcher run): each ``on`` generator
of an ON job whose ``next_at`` has come is claimed by compare-and-set, moving ``next_at`` to the
schedule's next time after now, so two dispatchers never start the same run and the runs an
outage missed collapse into one. One still under way when the next comes due is not started again: that due
time is logged SKIPPED. A run is claimed work (``common.store.claims``): its worker beats it; one
whose worker stops beating for HEARTBEAT_TTL, or that no worker took within ``stale_after()``
seconds, is given up (FAIL, a ``generator_fail`` alert), freeing the generator.
"""
from __future__ import annotations

from bson import ObjectId
from redis import Redis

from common.config import settings
from common.cron import next_after
from common.errors import Conflict, NotFound, ValidationError
from common.queue.names import GENERATE_QUEUE
from common.queue.rqbridge import push_generate
from common.secrets import redact
from common.store import generators, jobs
from common.store.clock import iso, store_now, utcnow
from common.store.logrecords import GeneratorRun
from common.store.models import FAIL, GEN_OFF, GEN_ON, GEN_TEST, OFF
from common.store.records import Generator, Job

RUNS_SHOWN = 10


def stale_after() -> float:
    """Seconds after which a run that no worker took is taken as lost: its deadline twice, plus
    time to wait in the queue and to store its URLs."""
    return 2 * float(settings.DOWNLOAD_TIMEOUT) + 600


def entry_timeout() -> int:
    """rq's job timeout of a generator entry (the sandbox ends the run well before)."""
    return int(settings.DOWNLOAD_TIMEOUT) + 600


def _generator_of(name: str) -> tuple[Job, Generator]:
    job = jobs.named(name)
    gen = generators.of_job(job.id)
    if gen is None:
        raise NotFound(f"job {name!r} declares no generator")
    return job, gen


def _start(redis: Redis, gen: Generator, run_id: str, trigger: str) -> None:
    """The run is reserved: log it RUNNING and queue its entry (a push that fails ends it FAIL)."""
    now = store_now()
    generators.open_log(run_id, gen.job, trigger, now, settings.HOSTNAME)
    try:
        push_generate(redis, GENERATE_QUEUE, run_id, entry_timeout())
    except Exception as exc:
        reason = redact(f"could not queue the run: {type(exc).__name__}: {exc}")
        generators.end_run(run_id, gen.job, now, status=FAIL, failed_reason=reason)
        raise


def tend(redis: Redis) -> dict[str, int]:
    """Start the runs that are due (see the module docstring); what was done."""
    now = store_now()
    done = {"started": 0, "skipped": 0, "lost": 0}
    for gen, reason in generators.lost_runs(now, stale_after()):
        done["lost"] += generators.give_up(gen, reason, f"generator of job {jobs.name_of(gen.job)}", now)
    for gen in generators.due(now, jobs.off_ids()):
        following = next_after(gen.schedule, now)
        run_id = generators.new_run_id()
        if generators.claim_run(gen.id, gen.next_at, following, run_id, now):
            _start(redis, gen, run_id, "schedule")
            done["started"] += 1
        elif generators.skip_due(gen.id, gen.next_at, following):
            generators.skipped(run_id, gen.job, now, settings.HOSTNAME,
                               f"due while run {gen.running_run} was still under way: "
                               "not started twice")
            done["skipped"] += 1
    return done


def run_now(name: str, redis: Redis) -> dict:
    """``downcluster generator run NAME``: one run now, through the queue, whatever its state and
    schedule (refused while a run is under way)."""
    job, gen = _generator_of(name)
    if job.status == OFF:
        raise Conflict(f"job {name!r} is OFF: its generator runs once it is enabled again")
    run_id = generators.new_run_id()
    if not generators.claim_run(gen.id, None, None, run_id, store_now(), state=None):
        raise Conflict(f"the generator of {name!r} has a run under way ({gen.running_run})")
    _start(redis, gen, run_id, "manual")
    return {"job": name, "run": run_id, "queue": GENERATE_QUEUE}


def set_state(name: str, state: str) -> dict:
    """``generator on`` / ``off``: on needs a passed dry run of the current code."""
    job, gen = _generator_of(name)
    if state == GEN_ON:
        if gen.tested_digest != gen.digest:
            raise Conflict(f"the generator of {name!r} changed since its last passing dry run "
                                  f"(or never had one): run `downcluster generator test {name}` first")
        next_at = gen.next_at if gen.state == GEN_ON else next_after(gen.schedule, store_now())
        generators.set_state(job.id, GEN_ON, next_at, utcnow())
    elif state == GEN_OFF:
        generators.set_state(job.id, GEN_OFF, None, utcnow())
    else:
        raise ValidationError(f"state must be on or off, got {str(state)[:20]!r}")
    return show(name)


def _run_row(run: GeneratorRun) -> dict:
    return {"run": run.run or str(run.id), "trigger": run.trigger, "status": run.status,
            "added": run.added, "duplicate": run.duplicate, "rejected": run.rejected, "lines": run.lines,
            "errors": [{"line": n, "reason": r} for n, r in run.rejected_lines()],
            "bytes": run.bytes, "spend_time": run.spend_time,
            "hostname": run.hostname or "", "failed_reason": run.failed_reason,
            "started_at": iso(run.started_at), "finished_at": iso(run.finished_at),
            "add_datetime": iso(run.add_datetime)}


def show(name: str, limit: int = RUNS_SHOWN, before: str | None = None) -> dict:
    """The generator of job ``name``: its declaration, state, next run and a page of its runs
    (newest first; ``next``: the cursor of the following page)."""
    job, gen = _generator_of(name)
    if before is not None and not (isinstance(before, str) and len(before) == 24
                                   and all(c in "0123456789abcdef" for c in before.lower())):
        raise ValidationError(f"before is not a run id: {str(before)[:40]!r}")
    got = generators.runs(job.id, limit + 1, before)
    more = len(got) > limit
    got = got[:limit]
    return {"job": name, "type": gen.type, "schedule": gen.schedule, "schemes": list(gen.schemes),
            "state": gen.state, "tested": gen.tested_digest == gen.digest,
            "next_at": iso(gen.next_at) if gen.state == GEN_ON else None,
            "running_run": gen.running_run, "last_run_at": iso(gen.last_run_at),
            "last_status": gen.last_status, "code_chars": len(gen.code or ""),
            "runs": [_run_row(d) for d in got], "next": str(got[-1].id) if more and got else None}


def summary(job_id: ObjectId, runs: int = 5) -> dict | None:
    """The generator of a job in a few words and its last ``runs`` runs, for the job's page
    (``job show``, the API's job and the console): None if it has none."""
    gen = generators.of_job(job_id)
    if gen is None:
        return None
    return {"state": gen.state, "schedule": gen.schedule, "type": gen.type,
            "tested": gen.tested_digest == gen.digest,
            "next_at": iso(gen.next_at) if gen.state == GEN_ON else None,
            "last_status": gen.last_status, "last_run_at": iso(gen.last_run_at),
            "runs": [_run_row(d) for d in generators.runs(job_id, runs)] if runs else []}


__all__ = ["GEN_TEST", "run_now", "set_state", "show", "summary", "tend"]
