"""A job's generator, run on a worker (``slave.worker.entries.run_generator``, an entry of
``down_generate``) or as a dry run where ``downcluster generator test`` is typed.

Either way the generator runs in the downloaders' sandbox (``slave/download/engines/sandbox.py``:
the same box, limits, deadline and network wall), never in this process. Its whole output is
collected first; only a run that ended well hands its lines to the one intake
(``common/intake.py``: validation, the generator's schemes, dedup, line numbers of rejects), so a
failing or hanging generator adds nothing. A run is claimed work (``common.store.claims``):
its claim is beaten while it runs, so a worker that dies is found within HEARTBEAT_TTL. Each run
ends its log (``common/store/generators.py``);
a failed one also writes a ``generator_fail`` alert, which the job's ``report_mails`` hear of
(``master/ops/reports.py``).
"""
from __future__ import annotations

import logging
import time

from bson import ObjectId

from common.config import settings, worker_host
from common.cron import next_after
from common.errors import DownloadError, NotFound
from common.intake import add_tasks, preview
from common.secrets import redact
from common.store import claims, generators, jobs, logs
from common.store.clock import store_now, store_time, utcnow
from common.store.jobs import WorkerJob
from common.store.models import FAIL, OFF, RUN_SKIPPED, SUCCESS
from common.store.records import Generator
from slave.download.engines import sandbox
from slave.download.job import limits_from_settings

logger = logging.getLogger(__name__)
MAX_LOGGED_ERRORS = 20  # rejected lines kept in a run's log (the count is exact)


def _lines(output: bytes) -> list[str]:
    return output.decode("utf-8", "replace").splitlines()


def _sandboxed(gen: Generator, context: WorkerJob | None) -> bytes:
    """The generator's whole output, run in the sandbox with the downloaders' limits."""
    private = bool(context and context.settings.allow_private)
    return sandbox.run_generator(gen.type, gen.code, limits_from_settings(), private)


def run(run_id: str) -> dict:
    """Run generator run ``run_id`` once: its counts, or {"skipped": 1} if it was not ours to run."""
    taken = generators.start_run(run_id, worker_host(), store_time())
    if taken is None:
        logger.info("generator run %s was taken or given up before it started: skipped", run_id)
        return {"skipped": 1}
    gen = taken[1]
    job_id, started, size = gen.job, time.monotonic(), 0
    name = jobs.name_of(job_id)
    context = jobs.context(job_id)
    if context is None or context.status == OFF:  # queued before the job was turned off
        generators.end_run(run_id, job_id, store_time(), status=RUN_SKIPPED,
                           failed_reason=f"job {name} is OFF: not run")
        logger.info("generator run %s of %s skipped: the job is OFF", run_id, name)
        return {"skipped": 1}
    try:
        with claims.Beating(generators.RUN, gen.id, run_id, settings.HEARTBEAT_INTERVAL):
            output = _sandboxed(gen, context)
            size = len(output)
            if not claims.beat(generators.RUN, [gen.id], run_id):  # given up meanwhile: not ours
                logger.warning("generator run %s was given up while it ran: its URLs not added", run_id)
                return {"skipped": 1}
            report = add_tasks(name, _lines(output), schemes=gen.schemes or None, worker_hosts=True)
    except DownloadError as exc:
        return _failed(run_id, job_id, name, size, started, exc.reason)
    except Exception as exc:  # MongoDB away mid-intake: what was added stays; the run says why it stopped
        _failed(run_id, job_id, name, size, started, redact(f"{type(exc).__name__}: {exc}"))
        raise
    generators.end_run(run_id, job_id, store_time(), status=SUCCESS, added=report.added,
                       duplicate=report.duplicate, rejected=report.rejected, lines=len(_lines(output)),
                       errors=report.errors[:MAX_LOGGED_ERRORS], size=size,
                       spend_time=int((time.monotonic() - started) * 1e6))
    logger.info("generator of %s: %s added, %s duplicate, %s rejected", name, report.added, report.duplicate,
                report.rejected)
    return {"added": report.added, "duplicate": report.duplicate, "rejected": report.rejected}


def _failed(run_id: str, job_id: ObjectId, name: str, size: int, started: float, reason: str) -> dict:
    now = store_time()
    generators.end_run(run_id, job_id, now, status=FAIL, failed_reason=reason[:10000], size=size,
                       spend_time=int((time.monotonic() - started) * 1e6))
    alert = f"generator of job {name} failed: {reason}"[:10000]
    logs.add_alerts([(job_id, "generator_fail", alert)], utcnow())
    logger.warning("generator of %s failed: %s", name, reason)
    return {"failed": 1}


def dry_run(name: str, first: int = 20) -> dict:
    """``downcluster generator test NAME``: run the generator here, in the sandbox, and say what
    intake would do with its output, storing no task and no run. It passes when it ends well and
    yields at least one URL intake accepts (new or already known); a pass of the current code
    turns a generator in test on."""
    job = jobs.named(name)
    gen = generators.of_job(job.id)
    if gen is None:
        raise NotFound(f"job {name!r} declares no generator")
    started = time.monotonic()
    out: dict = {"job": name, "type": gen.type, "schedule": gen.schedule, "state_before": gen.state}
    try:
        output = _sandboxed(gen, jobs.context(job.id))
    except DownloadError as exc:
        return {**out, "passed": False, "failed_reason": exc.reason, "state": gen.state,
                "spend_time": int((time.monotonic() - started) * 1e6)}
    lines = _lines(output)
    report, shown = preview(name, lines, gen.schemes or None, worker_hosts=True, first=first)
    passed = report.added + report.duplicate > 0
    out.update(passed=passed, bytes=len(output), lines=len(lines), added=report.added,
               duplicate=report.duplicate, rejected=report.rejected,
               errors=[{"line": n, "reason": r} for n, r in report.errors],
               first=[{"url": u, "host": h} for u, h in shown],
               spend_time=int((time.monotonic() - started) * 1e6))
    if not passed:
        out.update(failed_reason="the generator produced no URL intake would accept", state=gen.state)
        return out
    after = generators.mark_tested(job.id, gen.digest, next_after(gen.schedule, store_now()), utcnow())
    out["state"] = (after or gen).state
    return out
