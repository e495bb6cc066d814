"""``downcluster task ...``: add a job's URLs, show one task, cancel and requeue tasks."""
from __future__ import annotations

import json
import sys

import click

from master.cli import audit_job, connect


@click.group()
def task() -> None:
    """Add, cancel and requeue URL tasks."""


@task.command("add")
@click.argument("name")
@click.argument("source", type=click.File("r", encoding="utf-8", errors="replace"), default="-")
@click.option("--host", default="", help="Only this host's workers may take these tasks.")
def task_add(name: str, source, host: str) -> None:
    """Add URLs (one a line) from SOURCE (a file, or - for stdin) to job NAME."""
    from master.intake import add_tasks

    connect()
    if sys.stderr.isatty():
        with click.progressbar(length=0, label="adding", file=sys.stderr) as bar:
            report = add_tasks(name, source, worker_host=host, progress=bar.update)
    else:
        report = add_tasks(name, source, worker_host=host)
    for number, reason in report.errors[:50]:
        click.echo(f"line {number}: {reason}", err=True)
    if len(report.errors) > 50:
        click.echo(f"... and {len(report.errors) - 50} more rejected lines", err=True)
    audit_job("tasks.add", name, added=report.added)
    click.echo(f"added {report.added}, duplicate {report.duplicate}, rejected {report.rejected}")


@task.command("show")
@click.argument("name")
@click.argument("key", metavar="URL|ID")
@click.option("--json", "as_json", is_flag=True)
def task_show(name: str, key: str, as_json: bool) -> None:
    """One task of job NAME, by URL or id: status, attempts, reasons, its data id, its download logs."""
    from master.views import task_detail

    connect()
    info = task_detail(name, key)
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    for k in (
        "id",
        "job",
        "url",
        "status",
        "attempts",
        "recoveries",
        "failed_reason",
        "retry_at",
        "host",
        "depth",
        "parent",
        "sitemap",
        "data_id",
        "add_datetime",
        "last_update_datetime",
    ):
        click.echo(f"{k}: {'-' if info[k] in (None, '') else info[k]}")
    click.echo(f"download logs ({len(info['download_logs'])}, newest first):")
    for log in info["download_logs"]:
        click.echo(
            f"  {log.get('add_datetime')}  {log.get('status'):<8}{log.get('spend_time', 0) / 1000:>9.0f} ms  "
            f"{log.get('downloads_hostname') or '-'}  {log.get('failed_reason') or ''}"
        )


@task.command("cancel")
@click.argument("name")
@click.option("--status", "statuses", multiple=True, default=("LIVE", "FAIL", "DISPATCH"), show_default=True,
              help="Cancel tasks in these statuses.")
def task_cancel(name: str, statuses: tuple[str, ...]) -> None:
    """Cancel NAME's unfinished tasks; a dispatched one is not stored when its download ends."""
    from master.ops.tasks import cancel

    connect()
    n = cancel(name, statuses)
    audit_job("tasks.cancel", name, tasks=n, statuses=list(statuses))
    click.echo(f"cancelled {n} tasks")


@task.command("requeue")
@click.argument("name")
@click.option("--status", "statuses", multiple=True, default=("FAIL", "DEAD"), show_default=True,
              help="Requeue tasks in these statuses.")
def task_requeue(name: str, statuses: tuple[str, ...]) -> None:
    """Put NAME's failed (and dead) tasks back to LIVE with their counters reset."""
    from master.ops.tasks import requeue

    connect()
    n = requeue(name, statuses)
    audit_job("tasks.requeue", name, tasks=n, statuses=list(statuses))
    click.echo(f"requeued {n} tasks")
