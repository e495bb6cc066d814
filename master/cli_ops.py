"""The master's running chores as commands: ``dispatch``, ``defender``, ``migrate``, ``scheduler``
and ``stats``."""
from __future__ import annotations

import json

import click

from common.config import settings
from common.store.connection import redis_conn
from master.cli import connect


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
@click.option("--json", "as_json", is_flag=True, help="One run; print its report as JSON.")
def dispatch(loop: bool, interval: float | None, max_runs: int | None, as_json: bool) -> None:
    """One dispatcher run (cron it every 5 minutes), or --loop to run continuously."""
    from master.dispatch.dispatcher import dispatch_once
    from master.dispatch.runs import dispatch_loop

    connect()
    if not loop:
        report = dispatch_once(redis_conn())
        click.echo(json.dumps(report.as_dict())) if as_json else _print_report(report)
        return
    dispatch_loop(redis_conn(), interval or settings.DISPATCH_LOOP_INTERVAL, max_runs, on_run=_print_report)


@click.command()
def defender() -> None:
    """Recover tasks whose queue entry was lost or whose worker died, remove data no task names,
    tend exports and enforce retention: now, whether or not master/maintenance.py has them due."""
    from master.dispatch.defender import recover, sweep

    connect()
    from master.exports.service import tend

    report = recover(redis_conn())  # takes the dispatcher lock
    click.echo(f"recovered {report.recovered} tasks, {report.dead} dead, "
               f"{report.requeued} sent again (never started)")
    for reason in report.reasons:
        click.echo(f"  {reason}")
    click.echo(f"removed {sweep()} data documents that no task names")
    from master.ops.retention import enforce

    kept = enforce(budget=600.0)
    click.echo(
        f"retention: removed {kept.data} data documents, {kept.tasks} final tasks, {kept.download_logs} "
        f"download logs, {kept.notifications} notifications" + ("" if kept.finished else " (more next run)")
    )
    tended = tend(redis_conn())
    click.echo(
        f"exports: {tended.recovered} recovered, {tended.overran} over their time limit, "
        f"{tended.sent} sent again, "
        f"{tended.expired} expired; "
        f"{tended.notified} notifications delivered"
    )


@click.command()
def migrate() -> None:
    """Bring an earlier downcluster's data to this version (safe to run twice): number old tasks,
    send old entries again, move secrets, tokens and sessions to the control database."""
    from master.ops.migrate import migrate as run

    connect()
    report = run()
    click.echo(f"numbered {report.numbered} tasks; sent {report.sent_again} tasks of old entries again; "
               f"moved {report.secrets_moved} secrets, tokens and sessions to the control database; "
               f"named the owning token of {report.owners_filled} exports; put "
               f"{report.projects_filled[0]} jobs, {report.projects_filled[1]} exports and "
               f"{report.projects_filled[2]} tokens into project default; "
               f"moved {report.claims_moved} notification claims to the one claim protocol; dropped "
               f"{report.indexes_retired} indexes an earlier version kept (made {report.keys_made} "
               f"keys of tasks first)")
    for name in report.private_revoked or []:
        click.echo(f"  job {name}: allow_private withdrawn (its project is not opened to private addresses; "
                   "an admin may register it again to grant it)", err=True)
    for left in report.secrets_kept or []:
        click.echo(
            f"  left in the source database (the control database has another of that name): {left}", err=True
        )


@click.command()
@click.option("--cron", default="*/5 * * * *", show_default=True, help="When to dispatch.")
@click.option("--burst", is_flag=True, help="Install the schedule, run what is due, and exit.")
@click.option(
    "--interval", type=float, default=10.0, show_default=True, help="Seconds between checks for due runs."
)
def scheduler(cron: str, burst: bool, interval: float) -> None:
    """Run the dispatcher on a cron schedule through rq-scheduler (foreground)."""
    from master.dispatch.schedule import run_scheduler

    connect()
    run_scheduler(redis_conn(), cron, burst=burst, interval=interval)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--recount", is_flag=True,
              help="First count every job's tasks again from the tasks (one scan; repairs the kept counts "
                   "after a process died mid-change; best while no dispatcher or worker runs).")
def stats(as_json: bool, recount: bool) -> None:
    """Queue depths and oldest-entry ages, task counts per job, success rate of the last hour."""
    from master.ops.stats import collect, render

    connect()
    if recount:
        from common.store.counts import recount as count_again

        count_again()
    data = collect(redis_conn())
    click.echo(json.dumps(data, indent=2) if as_json else render(data))
