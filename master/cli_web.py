"""``downcluster web`` (the API and the console) and ``downcluster token ...`` (who may use them)."""
from __future__ import annotations

import os

import click

from common.cli import SettingOption
from common.config import flag_env, settings
from master.cli import connect


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
    from master.tokens import create, holding

    connect()
    ids = holding(role, [resolve(k) for k in project_keys])
    secret = create(name, role, ids)
    audit.record(None, "token.create", name, role=role, projects=ids)
    if not project_keys and role != "admin":
        click.echo(f"no --project: {name} holds project default (id {ids[0]}), where jobs registered "
                   "without a project go", err=True)
    click.echo(f"created {role} token {name}; store it now, it is not shown again:", err=True)
    click.echo(secret)


@token.command("list")
def token_list() -> None:
    """List tokens (names and roles; never the tokens)."""
    from master.tokens import listing

    connect()
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

    connect()
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

    connect()
    revoke(name)
    audit.record(None, "token.revoke", name)
    click.echo(f"revoked token {name}")
