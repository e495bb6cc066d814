"""Report mails of a job's ``report_mails`` setting, sent by dispatcher runs:

- a summary when a job is found drained (no LIVE, DISPATCH or retryable FAIL task) with outcomes
  it has not reported yet: counts by status, success rate, the five most frequent failure
  reasons, time span; once per drain;
- an alert when tasks of the job became DEAD or a ``queue_full``, ``queue_stall`` or
  ``generator_fail`` alert was written for it, at most one per job per ALERT_MAIL_INTERVAL.

Reasons in mails are the stored ones (already redacted); nothing else from the job's settings
(cookie, proxy, headers) is ever put in a mail.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from common.config import settings
from common.notify import queue_mail
from common.store import counts as tallies
from common.store import jobs, logs, pages
from common.store.clock import utcnow
from common.store.models import DEAD, FAIL, SUCCESS
from common.store.records import Job

EPOCH = datetime(1970, 1, 1)


def send_reports(now: datetime | None = None) -> int:
    """Queue the summaries and alerts that are due; how many mails were queued."""
    now = now or utcnow()
    sent = 0
    for job, report_mails in jobs.reported():
        mails = [m.strip() for m in report_mails.split(",") if m.strip()]
        sent += _summary(job, mails, now) + _alert(job, mails, now)
    return sent


def _summary(job: Job, mails: list[str], now: datetime) -> int:
    if not pages.drained(job.id):
        return 0
    counts = {k: n for k, n in tallies.of_jobs([job.id]).get(job.id, {}).items() if n}
    if not counts or counts == (job.report_counts or {}):
        return 0  # nothing new since the last summary
    if not jobs.claim_summary(job, counts, now):
        return 0  # another run reported it
    done = sum(counts.get(s, 0) for s in (SUCCESS, FAIL, DEAD))
    rate = f"{100 * counts.get(SUCCESS, 0) / done:.1f}%" if done else "-"
    reasons = pages.failure_reasons(job.id)
    span = pages.time_span(job.id)
    lines = [f"Job {job.name} has no task left to download.", "", "Tasks by status:"]
    lines += [f"  {status:<9}{n}" for status, n in sorted(counts.items())]
    lines += ["", f"Success rate: {rate} ({counts.get(SUCCESS, 0)} of {done} finished tasks)", ""]
    lines += ["Most frequent failure reasons:"] + (
        [f"  {n:>6}  {reason or '-'}" for reason, n in reasons] or ["  none"]
    )
    if span is not None:
        lines += ["", f"Time span: {span[0]:%Y-%m-%d %H:%M:%S} to {span[1]:%Y-%m-%d %H:%M:%S} UTC"]
    for to in mails:
        queue_mail(
            to,
            "job.report",
            f"downcluster: job {job.name} drained, success {rate}",
            "\n".join(lines) + "\n",
        )
    return len(mails)


def _alert(job: Job, mails: list[str], now: datetime) -> int:
    last = job.alert_mail_at
    if last and now - last < timedelta(seconds=settings.ALERT_MAIL_INTERVAL):
        return 0
    since = last or EPOCH
    dead = pages.dead_since(job.id, since)
    full, stalls = logs.alerts_since(job.id, since)
    generator = logs.generator_failures_since(job.id, since)
    if not dead and not full and not stalls and not generator:
        return 0
    if not jobs.claim_alert(job, last, now):
        return 0
    lines = [f"Job {job.name} needs attention:"]
    if dead:
        lines.append(f"  {dead} task(s) became DEAD (their attempts died {settings.MAX_RECOVERIES} times); "
                     f"`downcluster task requeue {job.name} --status DEAD` sends them again.")
    if full:
        lines.append(f"  {full} queue_full alert(s): its queue was at its cap when the dispatcher ran.")
    lines += [f"  {reason}" for reason in stalls]
    lines += [f"  {reason}" for reason in generator]
    if generator:
        lines.append(f"  (`downcluster generator show {job.name}` lists its runs.)")
    lines.append(f"At most one such mail per {settings.ALERT_MAIL_INTERVAL} s per job.")
    for to in mails:
        queue_mail(to, "job.alert", f"downcluster alert: job {job.name}", "\n".join(lines) + "\n")
    return len(mails)
