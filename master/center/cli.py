"""``downcluster center``: the general download center's download tasks at the command line, the
same actions as ``/v1/task`` and ``/v1/tasks`` (``master.center.service``) with the /v1
parameter names as options; ``downcluster caller``: the calling systems of its /v1 interface
(``master.center.callers``)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from common.store.connection import redis_conn
from master.cli import connect

JSON_TEXT = "JSON text, or @FILE to read it from a file"


def _text(value: str | None) -> str | None:
    """An option's value, or a file's text for @FILE (long JSON: templates, source_data)."""
    if value and value.startswith("@"):
        return Path(value[1:]).read_text(encoding="utf-8")
    return value


@click.group()
def center() -> None:
    """Download tasks whose rows come from a caller's source_url or source_data."""


@center.command("request")
@click.option("--project-id", required=True, help="The download task's project (a whole number).")
@click.option("--name", required=True, help="The download task's name, 2-60 characters.")
@click.option("--source-url", default=None, help="Pulled page by page: GET with page, page_size, _task_id.")
@click.option("--source-data", default=None, help=f"The rows ({JSON_TEXT}); wins over --source-url.")
@click.option("--type", "kind", type=click.Choice(["csv", "excel"]), default="csv")
@click.option("--file-name", default=None, help="The file's name without extension (default: date + random).")
@click.option("--step", type=int, default=None, help="Rows per page, 100-5000 (default 1000).")
@click.option("--callback", default=None, help="URL to POST a signed webhook to when it ends.")
@click.option("--operator-id", default=None)
@click.option("--merchant-type", type=int, default=None, help="0 platform 1 station 2 group 3 stations.")
@click.option("--merchant-id", type=int, default=None)
@click.option("--template", default=None, help=f"Excel template ({JSON_TEXT}).")
@click.option("--title", default=None)
@click.option("--summary", default=None)
@click.option("--header", default=None, help=f"Key/value pairs above the table ({JSON_TEXT}).")
@click.option("--footer", default=None, help=f"Key/value pairs below the table ({JSON_TEXT}).")
@click.option("--default-width", type=float, default=None, help="Column width in points.")
@click.option("--default-height", type=float, default=None, help="Row height in points.")
@click.option("--max-exec-time", type=int, default=None, help="Seconds an attempt may run (default 3600).")
def center_request(**options) -> None:
    """Deliver a download task (as POST /v1/task); prints its id alone on the last line."""
    from master.center.service import deliver

    params = {k: _text(v) if isinstance(v, str) else v for k, v in options.items() if v is not None}
    if "kind" in params:
        params["type"] = params.pop("kind")
    connect()
    export = deliver(redis_conn(), params)
    click.echo(str(export.id))


@center.command("show")
@click.argument("task_id")
def center_show(task_id: str) -> None:
    """A download task as GET /v1/task/ID answers it (JSON)."""
    from master.center.service import describe, get

    connect()
    click.echo(json.dumps(describe(get(task_id)), indent=2, ensure_ascii=False))


@center.command("list")
@click.option("--project-ids", required=True, help="Comma-separated project ids.")
@click.option("--status", default=None, help="Status numbers, comma-separated (1 waiting .. 6 expired).")
@click.option("--page", type=int, default=None)
@click.option("--page-size", type=int, default=None)
def center_list(project_ids: str, status: str | None, page: int | None, page_size: int | None) -> None:
    """Download tasks of these projects, newest first."""
    from master.center.service import listing

    connect()
    params = {"project_ids": project_ids, "status": status, "page": page, "page_size": page_size}
    got = listing({k: v for k, v in params.items() if v is not None})
    click.echo(f"{'task_id':<26}{'project':>8}  {'status':<12}{'rows':>10}  name")
    for t in got.download_tasks:
        rows = f"{t.rows_done}/{t.rows_total if t.rows_total is not None else '?'}"
        name = t.center.name if t.center is not None else None
        click.echo(f"{str(t.id):<26}{t.project:>8}  {t.state:<12}{rows:>10}  {name}")
    click.echo(f"{got.total} in all", err=True)


@center.command("delete")
@click.option("--project-ids", required=True, help="Comma-separated project ids.")
@click.argument("task_ids", nargs=-1, required=True)
def center_delete(project_ids: str, task_ids: tuple[str, ...]) -> None:
    """Delete download tasks and their files (a running one stops)."""
    from master.center.service import delete

    connect()
    got = delete(redis_conn(), list(task_ids), project_ids)
    click.echo(f"deleted {len(got['deleted'])}; not found: {', '.join(got['not_found']) or '-'}")


@click.group()
def caller() -> None:
    """The systems that call the download center's /v1 interface with signed requests."""


@caller.command("add")
@click.argument("app_id")
@click.option("--project", "project_keys", multiple=True, required=True,
              help="A project (id or name) the caller may use; repeat for more.")
@click.option("--secret", default=None, help="The secret it already signs with (default: a new one, "
              "printed once). Prefer DOWNCLUSTER_CALLER_SECRET: argv is visible to other users.")
def caller_add(app_id: str, project_keys: tuple[str, ...], secret: str | None) -> None:
    """Register APP_ID for these projects; prints the generated secret alone on the last line."""
    import os

    from master import audit
    from master.center import callers
    from master.projects import resolve

    connect()
    secret = secret or os.environ.get("DOWNCLUSTER_CALLER_SECRET") or None
    added = callers.add(app_id, [resolve(k) for k in project_keys], secret)
    audit.record(None, "caller.add", app_id, projects=added.projects)
    click.echo(f"caller {app_id} may use projects {', '.join(map(str, added.projects))}", err=True)
    if added.secret is not None:
        click.echo("its secret (shown this once):", err=True)
        click.echo(added.secret)


@caller.command("list")
def caller_list() -> None:
    """Every caller: app id, projects (never secrets)."""
    from master.center import callers

    connect()
    for c in callers.listing():
        click.echo(f"{c['app_id']:<32}{','.join(map(str, c['projects'])) or '-'}")


@caller.command("remove")
@click.argument("app_id")
def caller_remove(app_id: str) -> None:
    """Remove APP_ID: its signed requests are refused from now on."""
    from master import audit
    from master.center import callers

    connect()
    callers.remove(app_id)
    audit.record(None, "caller.remove", app_id)
    click.echo(f"removed caller {app_id}")


@caller.command("alias")
@click.argument("key")
@click.argument("project_key")
def caller_alias(key: str, project_key: str) -> None:
    """Let callers name project PROJECT_KEY (id or name) by KEY: the string id an earlier center
    gave them (``project_id`` of their requests)."""
    from master import audit
    from master.center import callers
    from master.projects import resolve

    connect()
    number = resolve(project_key)
    callers.alias(key, number)
    audit.record(None, "caller.alias", key, number)
    click.echo(f"project {number} is {key} for callers")
