"""The master's commands: job, task, dispatch, defender, scheduler, stats, data."""
from __future__ import annotations

import json
import sys
import time

import click

from common.config import settings
from common.connections import connect_mongo, redis_conn


def _connect() -> None:
    connect_mongo(ensure_indexes=True)


# --- job ---------------------------------------------------------------------------------

@click.group()
def job() -> None:
    """Register and administer downloader jobs."""


@job.command("register")
@click.argument("manifest", type=click.Path(dir_okay=False))
def job_register(manifest: str) -> None:
    """Validate MANIFEST.toml and its code, then store (or update) the job."""
    from master.registry import register

    _connect()
    stored = register(manifest)
    click.echo(f"registered job {stored.name} (priority {stored.priority}{', host ' + stored.host if stored.host else ''})")


@job.command("list")
def job_list() -> None:
    """List jobs with status, priority, host and downloader type."""
    from common.models import CrawlerDownload, Job

    _connect()
    kinds = {d.job.id: d.types.language for d in CrawlerDownload.objects.select_related()}
    click.echo(f"{'name':<24}{'status':<8}{'priority':>9}  {'type':<8}host")
    for j in Job.objects.order_by("priority", "name"):
        click.echo(f"{j.name:<24}{j.status:<8}{j.priority:>9}  {kinds.get(j.id, '?'):<8}{j.host or '-'}")


@job.command("show")
@click.argument("name")
def job_show(name: str) -> None:
    """Show one job, its settings (secrets masked) and its task counts."""
    from common.errors import ValidationError
    from common.models import CrawlerDownload, CrawlerDownloadSetting, Job
    from master.stats import task_counts

    _connect()
    j = Job.objects(name=name).first()
    if j is None:
        raise ValidationError(f"no job named {name!r}")
    d = CrawlerDownload.objects(job=j).first()
    s = CrawlerDownloadSetting.objects(job=j).first()
    click.echo(f"name: {j.name}\nstatus: {j.status}\npriority: {j.priority}\nhost: {j.host or '-'}")
    if d:
        click.echo(f"type: {d.types.language}\ncode: {len(d.code)} characters")
    if s:
        for key in ("dispatch_num", "max_retry_times", "download_engine", "report_mails"):
            click.echo(f"{key}: {s[key]}")
        meaning = {0: "normal", 1: "urgency: entries go to the front of their queue",
                   2: "foreign: entries go to the foreign queues (workers with --foreign)"}
        click.echo(f"prior: {s.prior} ({meaning.get(s.prior, '?')})")
        if s.download_js:
            click.echo(f"download_js: {len(s.download_js)} characters")
        click.echo(f"proxy: {'***' if s.proxy else '-'}\ncookie: {'***' if s.cookie else '-'}")
    for row in task_counts():
        if row["job"] == name:
            click.echo("tasks: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "job"))


def _set_status(name: str, status: str) -> None:
    from master.registry import set_status

    _connect()
    set_status(name, status)
    click.echo(f"job {name} is {status}")


@job.command("enable")
@click.argument("name")
def job_enable(name: str) -> None:
    """Let the dispatcher take NAME's tasks."""
    _set_status(name, "ON")


@job.command("disable")
@click.argument("name")
def job_disable(name: str) -> None:
    """Stop dispatching NAME's tasks (queued ones go back to LIVE when a worker meets them)."""
    _set_status(name, "OFF")


# --- task --------------------------------------------------------------------------------

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

    _connect()
    if sys.stderr.isatty():
        with click.progressbar(length=0, label="adding", file=sys.stderr) as bar:
            report = add_tasks(name, source, host=host, progress=bar.update)
    else:
        report = add_tasks(name, source, host=host)
    for number, reason in report.errors[:50]:
        click.echo(f"line {number}: {reason}", err=True)
    if len(report.errors) > 50:
        click.echo(f"... and {len(report.errors) - 50} more rejected lines", err=True)
    click.echo(f"added {report.added}, duplicate {report.duplicate}, rejected {report.rejected}")


@task.command("cancel")
@click.argument("name")
@click.option("--status", "statuses", multiple=True, default=("LIVE", "FAIL", "DISPATCH"), show_default=True,
              help="Cancel tasks in these statuses.")
def task_cancel(name: str, statuses: tuple[str, ...]) -> None:
    """Cancel NAME's unfinished tasks; a dispatched one is not stored when its download ends."""
    from master.tasks import cancel

    _connect()
    click.echo(f"cancelled {cancel(name, statuses)} tasks")


@task.command("requeue")
@click.argument("name")
@click.option("--status", "statuses", multiple=True, default=("FAIL", "DEAD"), show_default=True,
              help="Requeue tasks in these statuses.")
def task_requeue(name: str, statuses: tuple[str, ...]) -> None:
    """Put NAME's failed (and dead) tasks back to LIVE with their counters reset."""
    from master.tasks import requeue

    _connect()
    click.echo(f"requeued {requeue(name, statuses)} tasks")


# --- dispatch, defender, scheduler -------------------------------------------------------

def _print_report(report) -> None:
    for queue in sorted(report.tasks):
        click.echo(f"{queue}: {report.tasks[queue]} tasks in {report.entries[queue]} entries")
    click.echo(f"dispatched {report.total} tasks; recovered {report.recovered}")
    for alert in report.alerts:
        click.echo(f"alert: {alert}", err=True)


@click.command()
@click.option("--loop", is_flag=True, help="Keep topping the queues up as they drain (one lock, same rules).")
@click.option("--interval", type=float, default=None, help="Seconds between top-ups with --loop.")
@click.option("--max-runs", type=int, default=None, help="With --loop: stop after this many runs.")
def dispatch(loop: bool, interval: float | None, max_runs: int | None) -> None:
    """One dispatcher run (cron it every 5 minutes), or --loop to run continuously."""
    from master.dispatcher import dispatch_loop, dispatch_once

    _connect()
    if not loop:
        _print_report(dispatch_once(redis_conn()))
        return
    dispatch_loop(redis_conn(), interval or settings.DISPATCH_LOOP_INTERVAL, max_runs, on_run=_print_report)


@click.command()
def defender() -> None:
    """Recover tasks whose queue entry was lost or whose worker died (runs in every dispatch too)."""
    from master.defender import recover

    _connect()
    report = recover(redis_conn())  # takes the dispatcher lock
    click.echo(f"recovered {report.recovered} tasks, {report.dead} dead, {report.requeued} sent again (never started)")
    for reason in report.reasons:
        click.echo(f"  {reason}")


@click.command()
def migrate() -> None:
    """Bring tasks written by an earlier downcluster to this version (safe to run twice)."""
    from master.migrate import migrate as run

    _connect()
    report = run()
    click.echo(f"numbered {report.numbered} tasks; sent {report.sent_again} tasks of old entries again")


@click.command()
@click.option("--cron", default="*/5 * * * *", show_default=True, help="When to dispatch.")
@click.option("--burst", is_flag=True, help="Install the schedule, run what is due, and exit.")
@click.option("--interval", type=float, default=10.0, show_default=True, help="Seconds between checks for due runs.")
def scheduler(cron: str, burst: bool, interval: float) -> None:
    """Run the dispatcher on a cron schedule through rq-scheduler (foreground)."""
    from master.schedule import run_scheduler

    _connect()
    run_scheduler(redis_conn(), cron, burst=burst, interval=interval)


# --- stats, data -------------------------------------------------------------------------

@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def stats(as_json: bool) -> None:
    """Queue depths and oldest-entry ages, task counts per job, success rate of the last hour."""
    from master.stats import collect, render

    _connect()
    data = collect(redis_conn())
    click.echo(json.dumps(data, indent=2) if as_json else render(data))


@click.group()
def data() -> None:
    """Read stored download data."""


@data.command("export")
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="jsonl", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="-", help="File to write (default stdout).")
def data_export(name: str, fmt: str, output: str) -> None:
    """Stream job NAME's stored data as CSV or JSON Lines."""
    from master.export import export

    _connect()
    started = time.monotonic()
    if output == "-":
        count = export(name, fmt, click.get_text_stream("stdout"))
    else:
        with open(output, "w", encoding="utf-8", newline="") as out:
            count = export(name, fmt, out)
    if output != "-":
        click.echo(f"exported {count} documents of {name} to {output} in {time.monotonic() - started:.1f}s", err=True)
