"""The master's commands: job, task, dispatch, defender, scheduler, stats, data."""
from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime

import click

from common.cli import SettingOption
from common.config import flag_env, settings
from common.errors import ValidationError
from common.store.connection import connect_mongo, redis_conn


def _connect() -> None:
    connect_mongo(ensure_indexes=True)


# --- job ---------------------------------------------------------------------------------

@click.group()
def job() -> None:
    """Register and administer downloader jobs."""


@job.command("register")
@click.argument("manifest", type=click.Path(dir_okay=False))
@click.option("--project", default=None, help="The project (id or name) of a new job, or to move the job "
              "to (default: `default` for a new job; an existing job keeps its own).")
def job_register(manifest: str, project: str | None) -> None:
    """Validate MANIFEST.toml and its code, then store (or update) the job."""
    from master import audit
    from master.projects import resolve
    from master.registry import register

    _connect()
    existed = _job_exists(manifest)
    stored = register(manifest, project=resolve(project) if project else None)
    audit.record(None, "job.change" if existed else "job.register", stored.name, stored.project)
    host = f", host {stored.host}" if stored.host else ""
    click.echo(f"registered job {stored.name} (priority {stored.priority}{host})")
    from master.generators import summary

    gen = summary(stored.id)
    if gen is not None:
        hint = f"; `downcluster generator test {stored.name}` dry-runs it" if gen["state"] == "test" else ""
        click.echo(f"generator: {gen['type']}, schedule {gen['schedule']!r}, state {gen['state']}{hint}")


@job.command("list")
def job_list() -> None:
    """List jobs with status, priority, host and downloader type."""
    from master.views import job_rows

    _connect()
    click.echo(f"{'name':<24}{'status':<8}{'priority':>9}  {'type':<8}host")
    for j in job_rows():
        click.echo(f"{j['name']:<24}{j['status']:<8}{j['priority']:>9}  {j['type']:<8}{j['host'] or '-'}")


@job.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the API's object).")
def job_show(name: str, as_json: bool) -> None:
    """Show one job, its settings (secrets masked), its task counts and its last failures."""
    from master.views import job_detail

    _connect()
    j = job_detail(name)
    if as_json:
        click.echo(json.dumps(j, indent=2))
        return
    click.echo(
        f"name: {j['name']}\nstatus: {j['status']}\npriority: {j['priority']}\nhost: {j['host'] or '-'}"
    )
    click.echo(f"type: {j['type']}\ncode: {j['code_chars']} characters")
    s = j.get("settings") or {}
    for key in ("dispatch_num", "max_retry_times", "download_engine", "report_mails", "host_concurrency",
                "host_delay", "obey_robots", "allow_private"):
        click.echo(f"{key}: {s.get(key)}")
    click.echo(f"prior: {s.get('prior')} ({s.get('prior_meaning')})")
    if s.get("download_js_chars"):
        click.echo(f"download_js: {s['download_js_chars']} characters")
    click.echo(f"proxy: {s.get('proxy') or '-'}\ncookie: {s.get('cookie') or '-'}")
    click.echo("tasks: " + ", ".join(f"{k} {v}" for k, v in j["counts"].items()))
    for t in j["recent_failures"][:5]:
        click.echo(f"failed: {t['uri']}: {t.get('failed_reason') or '-'}")
    g = j.get("generator")
    if g:
        last = f"{g['last_run_at'] or '-'} {g['last_status'] or ''}".rstrip()
        click.echo(f"generator: {g['type']}, schedule {g['schedule']!r}, state {g['state']}, next run "
                   f"{g['next_at'] or '-'}, last run {last}")


def _job_exists(manifest: str) -> bool:
    """Whether the job a manifest names is stored already (for the audit log's verb)."""
    from common.store.jobs import find
    from master.registry import guess_name

    try:
        with open(manifest, encoding="utf-8") as f:
            return find(guess_name(f.read())) is not None
    except (OSError, UnicodeDecodeError):
        return False


def _set_status(name: str, status: str) -> None:
    from master import audit
    from master.registry import set_status

    _connect()
    job = set_status(name, status)
    audit.record(None, "job.on" if status == "ON" else "job.off", name, job.project)
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


def _audit_job(action: str, name: str, **detail) -> None:
    from common.store.jobs import named
    from master import audit

    audit.record(None, action, name, named(name).project, **detail)


# --- generator (``downcluster generator ...``: common/cli.py; ``test`` is slave/cli.py's) -------

def print_generator(shown: dict) -> None:
    click.echo(f"job {shown['job']}: {shown['type']} generator, schedule {shown['schedule']!r}, "
               f"schemes {', '.join(shown['schemes'])}")
    tested = "" if shown["tested"] else " (no passing dry run of this code yet)"
    click.echo(f"state: {shown['state']}{tested}")
    click.echo(f"next run: {shown['next_at'] or '-'}" + (f"; run {shown['running_run']} under way"
                                                         if shown["running_run"] else ""))
    if not shown["runs"]:
        click.echo("no runs yet")
    for r in shown["runs"]:
        line = (f"  {r['add_datetime']}  {r['status']:<8} {r['trigger'] or '':<8} added {r['added']}, "
                f"duplicate {r['duplicate']}, rejected {r['rejected']}, {r['bytes']} bytes, "
                f"{r['spend_time'] / 1e6:.2f} s, {r['hostname'] or '-'}")
        click.echo(line + (f": {r['failed_reason']}" if r["failed_reason"] else ""))
        for e in r["errors"][:5]:
            click.echo(f"      line {e['line']}: {e['reason']}")


@click.command("on")
@click.argument("name")
def generator_on(name: str) -> None:
    """Switch job NAME's generator on (it must have passed `generator test` since it last changed)."""
    from master.generators import set_state

    _connect()
    shown = set_state(name, "on")
    _audit_job("job.generator.on", name)
    click.echo(f"generator of {name}: on, next run {shown['next_at']}")


@click.command("off")
@click.argument("name")
def generator_off(name: str) -> None:
    """Switch job NAME's generator off (a run under way finishes)."""
    from master.generators import set_state

    _connect()
    set_state(name, "off")
    _audit_job("job.generator.off", name)
    click.echo(f"generator of {name}: off")


@click.command("show")
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 1000), default=10, show_default=True, help="Runs shown.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the API's object).")
def generator_show(name: str, limit: int, as_json: bool) -> None:
    """Job NAME's generator: state, schedule, next run and its last runs."""
    from master.generators import show

    _connect()
    shown = show(name, limit)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
    else:
        print_generator(shown)


@click.command("run")
@click.argument("name")
def generator_run(name: str) -> None:
    """Run job NAME's generator once now, through the queue (a worker runs it)."""
    from master.generators import run_now

    _connect()
    got = run_now(name, redis_conn())
    _audit_job("job.generator.run", name)
    click.echo(f"generator run {got['run']} of {name} queued on {got['queue']}")


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
    _audit_job("tasks.add", name, added=report.added)
    click.echo(f"added {report.added}, duplicate {report.duplicate}, rejected {report.rejected}")


@task.command("show")
@click.argument("name")
@click.argument("key", metavar="URL|ID")
@click.option("--json", "as_json", is_flag=True)
def task_show(name: str, key: str, as_json: bool) -> None:
    """One task of job NAME, by URL or id: status, attempts, reasons, its data id, its download logs."""
    from master.views import task_detail

    _connect()
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

    _connect()
    n = cancel(name, statuses)
    _audit_job("tasks.cancel", name, tasks=n, statuses=list(statuses))
    click.echo(f"cancelled {n} tasks")


@task.command("requeue")
@click.argument("name")
@click.option("--status", "statuses", multiple=True, default=("FAIL", "DEAD"), show_default=True,
              help="Requeue tasks in these statuses.")
def task_requeue(name: str, statuses: tuple[str, ...]) -> None:
    """Put NAME's failed (and dead) tasks back to LIVE with their counters reset."""
    from master.ops.tasks import requeue

    _connect()
    n = requeue(name, statuses)
    _audit_job("tasks.requeue", name, tasks=n, statuses=list(statuses))
    click.echo(f"requeued {n} tasks")


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
@click.option("--json", "as_json", is_flag=True, help="One run; print its report as JSON.")
def dispatch(loop: bool, interval: float | None, max_runs: int | None, as_json: bool) -> None:
    """One dispatcher run (cron it every 5 minutes), or --loop to run continuously."""
    from master.dispatch.dispatcher import dispatch_once
    from master.dispatch.runs import dispatch_loop

    _connect()
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

    _connect()
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

    _connect()
    report = run()
    click.echo(f"numbered {report.numbered} tasks; sent {report.sent_again} tasks of old entries again; "
               f"moved {report.secrets_moved} secrets, tokens and sessions to the control database; "
               f"named the owning token of {report.owners_filled} exports; put "
               f"{report.projects_filled[0]} jobs, {report.projects_filled[1]} exports and "
               f"{report.projects_filled[2]} tokens into project default; "
               f"moved {report.claims_moved} notification claims to the one claim protocol; dropped "
               f"{report.indexes_retired} indexes an earlier version kept")
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

    _connect()
    run_scheduler(redis_conn(), cron, burst=burst, interval=interval)


# --- stats, data -------------------------------------------------------------------------

@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--recount", is_flag=True,
              help="First count every job's tasks again from the tasks (one scan; repairs the kept counts "
                   "after a process died mid-change; best while no dispatcher or worker runs).")
def stats(as_json: bool, recount: bool) -> None:
    """Queue depths and oldest-entry ages, task counts per job, success rate of the last hour."""
    from master.ops.stats import collect, render

    _connect()
    if recount:
        from common.store.counts import recount as count_again

        count_again()
    data = collect(redis_conn())
    click.echo(json.dumps(data, indent=2) if as_json else render(data))


@click.group()
def data() -> None:
    """Read stored download data."""


TEMPLATE_OPTION = click.option(
    "--template",
    type=click.File("r", encoding="utf-8"),
    default=None,
    help="Export template (TOML or JSON: columns, header trees, row headers, tables).",
)
STATUS_OPTION = click.option(
    "--status", "codes", multiple=True, help="Only rows with this HTTP status code (repeatable)."
)
class DateTime(click.ParamType):
    """Every date option of the command line: an RFC 3339 date-time, or a plain date (its
    midnight UTC), as naive UTC (``master.exports.service.parse_time``)."""

    name = "date-time"

    def convert(self, value, param, ctx):
        from master.exports.service import parse_time

        try:
            return parse_time(value, "", plain_date=True)
        except ValidationError as exc:
            self.fail(str(exc).removeprefix(": "), param, ctx)


DATE_TIME = DateTime()
SINCE_OPTION = click.option(
    "--since",
    type=DATE_TIME,
    default=None,
    help="Only data stored at or after this RFC 3339 date-time (2026-11-01T00:00:00Z) or date "
         "(its midnight UTC).",
)
UNTIL_OPTION = click.option(
    "--until", type=DATE_TIME, default=None,
    help="Only data stored before this RFC 3339 date-time or date (its midnight UTC).")
VERSIONS_OPTION = click.option(
    "--versions", type=click.Choice(["latest", "all"]), default="latest", show_default=True,
    help="Revisited pages: each page's latest version, or every stored version.")


@data.command("export")
@click.argument("name")
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "jsonl", "xlsx", "warc"]), default="jsonl", show_default=True
)
@TEMPLATE_OPTION
@STATUS_OPTION
@SINCE_OPTION
@UNTIL_OPTION
@VERSIONS_OPTION
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), default="-", help="File to write (default stdout)."
)
def data_export(name: str, fmt: str, template, codes, since, until, versions: str, output: str) -> None:
    """Stream job NAME's stored data as CSV, JSON Lines, Excel or WARC, here and now.

    Without a template: every field, with the body byte-exact (base64) in JSON Lines. With one:
    what the template says, as the export center writes it (xlsx needs --output). WARC: every
    stored version and revisit as WARC 1.1 records, gzip per record (docs/exports.md)."""
    from master.exports.dump import export

    _connect()
    started = time.monotonic()
    text = template.read() if template else ""
    flt = {"status": list(codes), "since": since, "until": until, "versions": versions}
    if output == "-":
        if fmt == "xlsx":
            raise click.UsageError("xlsx needs --output FILE")
        with click.open_file("-", "wb") as out:
            count = export(name, fmt, out, text, flt)
    else:
        try:
            with open(output, "wb") as out:
                count = export(name, fmt, out, text, flt)
        except ValidationError:  # refused before a row was written: leave no empty file behind
            os.unlink(output)
            raise
    if output != "-":
        click.echo(
            f"exported {count} documents of {name} to {output} in {time.monotonic() - started:.1f}s", err=True
        )


@click.group("type")
def types() -> None:
    """Downloader languages the cluster supports (CrawlerDownloadType)."""


@types.command("list")
def type_list() -> None:
    """Each downloader type, whether it is supported, and the jobs using it."""
    from master.registry import type_rows

    _connect()
    click.echo(f"{'language':<12}{'support':<12}jobs")
    for t, used in type_rows():
        click.echo(f"{t.language:<12}{t.is_support:<12}{used}")


@types.command("enable")
@click.argument("language")
def type_enable(language: str) -> None:
    """Support LANGUAGE again (python, shell or none)."""
    from master.registry import set_type_support

    _connect()
    click.echo(f"downloader type {set_type_support(language, True)[0].language} is supported")


@types.command("disable")
@click.argument("language")
def type_disable(language: str) -> None:
    """Stop supporting LANGUAGE: new jobs of it are refused, workers fail its tasks (not retried)."""
    from master.registry import set_type_support

    _connect()
    t, used = set_type_support(language, False)
    click.echo(
        f"downloader type {t.language} is not supported; {used} job(s) use it: their tasks fail "
        "with that reason until it is enabled again"
    )


@click.command()
@click.argument("name")
@click.option(
    "--before",
    type=DATE_TIME,
    required=True,
    help="Archive what was stored before this RFC 3339 date-time (2026-01-01T00:00:00Z) or date (2026-01-01: "
         "its midnight UTC).",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="The archive to write (default NAME-before-DATE.jsonl.gz here); never overwritten.")
def archive(name: str, before: datetime, output: str | None) -> None:
    """Save job NAME's earlier versions of pages and download logs stored before a date to a gzip
    JSON Lines file, then remove them from MongoDB (only once the file is complete); a page's
    latest version stays."""
    from master.ops.archive import archive as run

    _connect()
    path = output or f"{name}-before-{before:%Y%m%dT%H%M%S}.jsonl.gz"
    report = run(name, before, path)
    click.echo(f"archived {report.data} data documents and {report.logs} download logs of {name} to {path} "
               f"({report.bytes} bytes); removed them from MongoDB")


# --- web, token --------------------------------------------------------------------------

@click.command()
@click.option("--bind", default=None, cls=SettingOption, setting="WEB_BIND",
              help="HOST:PORT to serve on (default: the WEB_BIND setting).")
@click.option("--workers", type=int, default=1, show_default=True, help="Server processes (uvicorn workers).")
def web(bind: str | None, workers: int) -> None:
    """Serve the HTTP API (/api/v1) and the web console (/) with uvicorn."""
    import uvicorn

    from common.errors import ConfigError

    bind = settings.WEB_BIND  # --bind, if given, was resolved into the settings when the command started
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--bind must be HOST:PORT, got {bind!r}")
    from master.web.routes.metrics import networks

    networks(settings.METRICS_ALLOW)  # a bad network is one line here, not a 500 at every scrape
    if workers > 1:  # uvicorn spawns them with this process's environment: the one way to hand them the flags
        os.environ.update(flag_env())
    click.echo(f"downcluster web on http://{bind}/ (API under /api/v1)", err=True)
    uvicorn.run("master.web.app:create_app", factory=True, host=host.strip("[]"), port=int(port),
                workers=workers, log_level="info", server_header=False)


@click.group()
def token() -> None:
    """Create, list and revoke tokens of the HTTP API and console."""


@token.command("create")
@click.argument("name")
@click.option("--role", type=click.Choice(["admin", "user", "analyst"]), required=True,
              help="admin: everything; user: registers and runs the jobs of its projects, requests exports; "
                   "analyst: reads its projects' jobs, data and logs, requests exports.")
@click.option("--project", "project_keys", multiple=True,
              help="A project (id or name) the token holds (repeatable; an admin holds every project).")
def token_create(name: str, role: str, project_keys: tuple[str, ...]) -> None:
    """Create token NAME; the token is printed once, alone on the last line (only its hash is kept)."""
    from master import audit
    from master.projects import resolve
    from master.tokens import create

    _connect()
    ids = sorted({resolve(k) for k in project_keys})
    secret = create(name, role, ids)
    audit.record(None, "token.create", name, role=role, projects=ids)
    click.echo(f"created {role} token {name}; store it now, it is not shown again:", err=True)
    click.echo(secret)


@token.command("list")
def token_list() -> None:
    """List tokens (names and roles; never the tokens)."""
    from master.tokens import listing

    _connect()
    click.echo(f"{'name':<24}{'role':<10}{'created':<22}{'last used':<22}{'projects':<16}granted jobs")
    for t in listing():
        last = t["last_used"].strftime("%Y-%m-%d %H:%M") if t["last_used"] else "-"
        held = "all" if t["role"] == "admin" else ",".join(map(str, t["projects"])) or "-"
        click.echo(f"{t['name']:<24}{t['role']:<10}{t['created']:%Y-%m-%d %H:%M}{'':<6}{last:<22}{held:<16}"
                   f"{', '.join(t['jobs']) or '-'}")


@token.command("grant")
@click.argument("name")
@click.argument("jobs", nargs=-1)
@click.option("--project", "project_keys", multiple=True,
              help="Give the token this project (id or name; repeatable).")
@click.option("--remove", is_flag=True, help="Take the grants away instead.")
def token_grant(name: str, jobs: tuple[str, ...], project_keys: tuple[str, ...], remove: bool) -> None:
    """Give token NAME projects (--project), or let it see and download every export of JOBS
    (of its projects), not only its own."""
    from master import audit
    from master.projects import grant as grant_projects
    from master.tokens import grant

    _connect()
    if not jobs and not project_keys:
        raise click.UsageError("name JOBS or --project")
    if project_keys:
        held = grant_projects(name, list(project_keys), remove)
        click.echo(f"token {name} holds projects: {', '.join(map(str, held)) or 'none'}")
    if jobs:
        granted = grant(name, list(jobs), remove)
        audit.record(None, "token.ungrant" if remove else "token.grant", name, jobs=list(jobs))
        click.echo(f"token {name} is granted: {', '.join(granted) or 'no jobs'}")


@token.command("revoke")
@click.argument("name")
def token_revoke(name: str) -> None:
    """Revoke token NAME at once (its console sessions end too)."""
    from master import audit
    from master.tokens import revoke

    _connect()
    revoke(name)
    audit.record(None, "token.revoke", name)
    click.echo(f"revoked token {name}")


# --- export ------------------------------------------------------------------------------

@click.group()
def export() -> None:
    """Asynchronous exports of a job's data (run by workers, kept in GridFS, signed links)."""


@export.command("request")
@click.argument("name")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl", "xlsx", "warc"]), required=True)
@TEMPLATE_OPTION
@STATUS_OPTION
@SINCE_OPTION
@UNTIL_OPTION
@VERSIONS_OPTION
@click.option("--callback", default=None, help="URL to POST a signed JSON webhook to when it ends.")
@click.option("--mail", "mails", multiple=True, help="Address to mail when it ends (repeatable).")
@click.option(
    "--max-exec-time",
    type=int,
    default=None,
    help="Seconds an attempt may run before it is stopped and retried (default EXPORT_MAX_EXEC_TIME).",
)
def export_request(
    name: str, fmt: str, template, codes, since, until, versions, callback, mails, max_exec_time
) -> None:
    """Request an export of job NAME's data; prints its id alone on the last line."""
    from master.exports.service import request

    _connect()
    got = request(
        redis_conn(),
        name,
        fmt,
        template.read() if template else "",
        {"status": list(codes), "since": since, "until": until, "versions": versions},
        callback,
        list(mails),
        requested_by="cli",
        max_exec_time=max_exec_time,
    )
    if got.deduplicated:
        click.echo(f"an identical export is {got.export.state}: reusing it", err=True)
    else:
        from master import audit

        audit.record(None, "export.request", got.export.id, got.export.project, job=got.export.job_name,
                     format=got.export.format)
    click.echo(str(got.export.id))


@export.command("show")
@click.argument("export_id")
@click.option("--json", "as_json", is_flag=True)
def export_show(export_id: str, as_json: bool) -> None:
    """State, progress, size, attempts, error, and a signed URL when done."""
    from master.exports.service import describe, get

    _connect()
    info = describe(get(export_id))
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    for key in ("id", "job", "format", "state", "rows_done", "rows_total", "bytes", "attempts", "error",
                "created_at", "finished_at", "expires_at", "url"):
        click.echo(f"{key}: {'-' if info[key] is None else info[key]}")


@export.command("list")
@click.argument("name", required=False)
def export_list(name: str | None) -> None:
    """The latest exports (of job NAME)."""
    from master.exports.service import listing

    _connect()
    click.echo(f"{'id':<26}{'job':<20}{'format':<7}{'state':<9}{'rows':>10}{'bytes':>12}  created")
    for e in listing(name):
        rows = f"{e.rows_done}/{e.rows_total if e.rows_total is not None else '?'}"
        click.echo(
            f"{str(e.id):<26}{e.job_name:<20}{e.format:<7}{e.state:<9}{rows:>10}{e.bytes:>12}  "
            f"{e.created_at:%Y-%m-%d %H:%M}"
        )


@export.command("url")
@click.argument("export_id")
@click.option("--ttl", type=int, default=None,
              help="Seconds the link is valid (default EXPORT_URL_TTL, 300; at most EXPORT_URL_MAX_TTL).")
def export_url(export_id: str, ttl: int | None) -> None:
    """A signed, absolute link to a finished export's file, alone on the last line."""
    from master.exports.service import link

    _connect()
    url, ends = link(export_id, ttl)
    click.echo(f"valid until {ends:%Y-%m-%d %H:%M:%S} UTC", err=True)
    click.echo(url)


@export.command("cancel")
@click.argument("export_id")
def export_cancel(export_id: str) -> None:
    """Cancel a PENDING or RUNNING export (a running worker stops and removes its partial file)."""
    from master import audit
    from master.exports.service import cancel

    _connect()
    cancelled = cancel(redis_conn(), export_id)
    audit.record(None, "export.cancel", cancelled.id, cancelled.project)
    click.echo(f"export {cancelled.id} is CANCEL")


@export.command("retry")
@click.argument("export_id")
def export_retry(export_id: str) -> None:
    """Put a FAIL export back to PENDING by hand (its attempts counted afresh) and queue it."""
    from master import audit
    from master.exports.service import retry

    _connect()
    retried = retry(redis_conn(), export_id)
    audit.record(None, "export.retry", retried.id, retried.project)
    click.echo(f"export {retried.id} is {retried.state}")
