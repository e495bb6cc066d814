"""``downcluster job ...``, ``downcluster generator on|off|show|run`` (the group is common/cli.py's;
its ``test`` is slave/cli.py's) and ``downcluster type ...``: jobs, their generators, the
downloader types they use."""
from __future__ import annotations

import json

import click

from common.store.connection import redis_conn
from master.cli import audit_job, connect


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

    connect()
    existed = _job_exists(manifest)
    stored = register(manifest, project=resolve(project) if project else None)
    audit.record(None, "job.change" if existed else "job.register", stored.name, stored.project)
    host = f", host {stored.worker_host}" if stored.worker_host else ""
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

    connect()
    click.echo(f"{'name':<24}{'status':<8}{'priority':>9}  {'type':<8}host")
    for j in job_rows():
        click.echo(f"{j['name']:<24}{j['status']:<8}{j['priority']:>9}  {j['type']:<8}{j['host'] or '-'}")


@job.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the API's object).")
def job_show(name: str, as_json: bool) -> None:
    """Show one job, its settings (secrets masked), its task counts and its last failures."""
    from master.views import job_detail

    connect()
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
    f = j.get("follow")
    if f:
        sites = f" {', '.join(f['sites'])}" if f["sites"] else ""
        click.echo(f"follow: scope {f['scope']}{sites}, max_depth {f['max_depth']}, "
                   f"max_pages {f['max_pages']}, links_per_page {f['links_per_page']}, "
                   f"{len(f['allow'])} allow and {len(f['deny'])} deny "
                   f"patterns, parses {', '.join(f['content_types'])}")
    m = j.get("sitemaps")
    if m:
        click.echo(f"sitemaps: {len(m['urls'])} urls, robots.txt {'yes' if m['robots'] else 'no'}, "
                   f"lastmod {'feeds revisits' if m['lastmod'] else 'ignored'}")


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

    connect()
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

    connect()
    shown = set_state(name, "on")
    audit_job("job.generator.on", name)
    click.echo(f"generator of {name}: on, next run {shown['next_at']}")


@click.command("off")
@click.argument("name")
def generator_off(name: str) -> None:
    """Switch job NAME's generator off (a run under way finishes)."""
    from master.generators import set_state

    connect()
    set_state(name, "off")
    audit_job("job.generator.off", name)
    click.echo(f"generator of {name}: off")


@click.command("show")
@click.argument("name")
@click.option("--limit", type=click.IntRange(1, 1000), default=10, show_default=True, help="Runs shown.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the API's object).")
def generator_show(name: str, limit: int, as_json: bool) -> None:
    """Job NAME's generator: state, schedule, next run and its last runs."""
    from master.generators import show

    connect()
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

    connect()
    got = run_now(name, redis_conn())
    audit_job("job.generator.run", name)
    click.echo(f"generator run {got['run']} of {name} queued on {got['queue']}")


@click.group("type")
def types() -> None:
    """Downloader languages the cluster supports (CrawlerDownloadType)."""


@types.command("list")
def type_list() -> None:
    """Each downloader type, whether it is supported, and the jobs using it."""
    from master.registry import type_rows

    connect()
    click.echo(f"{'language':<12}{'support':<12}jobs")
    for t, used in type_rows():
        click.echo(f"{t.language:<12}{t.is_support:<12}{used}")


@types.command("enable")
@click.argument("language")
def type_enable(language: str) -> None:
    """Support LANGUAGE again (python, shell or none)."""
    from master.registry import set_type_support

    connect()
    click.echo(f"downloader type {set_type_support(language, True)[0].language} is supported")


@types.command("disable")
@click.argument("language")
def type_disable(language: str) -> None:
    """Stop supporting LANGUAGE: new jobs of it are refused, workers fail its tasks (not retried)."""
    from master.registry import set_type_support

    connect()
    t, used = set_type_support(language, False)
    click.echo(
        f"downloader type {t.language} is not supported; {used} job(s) use it: their tasks fail "
        "with that reason until it is enabled again"
    )
