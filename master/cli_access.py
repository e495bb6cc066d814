"""``downcluster project ...`` and ``downcluster audit``: the master's commands for projects and
the audit log (the operator at the master's command line holds every project)."""
from __future__ import annotations

import json

import click

from master.cli import connect


@click.group()
def project() -> None:
    """Create, list and show projects (each job, export and token grant belongs to one)."""


@project.command("create")
@click.argument("name")
@click.option("--allow-private", is_flag=True,
              help="Its download tasks may pull source_url from private addresses "
                   "(never from the cluster's services).")
def project_create(name: str, allow_private: bool) -> None:
    """Create project NAME; the cluster assigns its id, printed alone on the last line."""
    from master.projects import create

    connect()
    made = create(name, allow_private=allow_private)
    click.echo(f"created project {made['name']}", err=True)
    click.echo(str(made["id"]))


@project.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the API's object).")
def project_list(as_json: bool) -> None:
    """Every project: id, name, created."""
    from master.projects import listing

    connect()
    rows = listing()
    if as_json:
        click.echo(json.dumps({"projects": rows}, indent=2))
        return
    click.echo(f"{'id':>6}  {'name':<32}created")
    for p in rows:
        click.echo(f"{p['id']:>6}  {p['name']:<32}{p['created']}")


@project.command("show")
@click.argument("key", metavar="ID|NAME")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def project_show(key: str, as_json: bool) -> None:
    """One project, its jobs and the tokens that hold it."""
    from master.projects import detail

    connect()
    shown = detail(key)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    click.echo(f"id: {shown['id']}\nname: {shown['name']}\ncreated: {shown['created']}")
    click.echo(f"jobs: {', '.join(shown['jobs']) or '-'}")
    click.echo(f"tokens: {', '.join(shown['tokens']) or '-'}")


@click.command()
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True,
              help="Entries shown.")
@click.option("--action", default=None,
              help="Only this action (job.register, token.create, export.retry ...).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the API's object).")
def audit(limit: int, action: str | None, as_json: bool) -> None:
    """Who changed what, and when, newest first: jobs, tokens, projects, grants, exports."""
    from master.audit import page

    connect()
    shown = page(limit, None, action)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    click.echo(f"{'at':<22}{'actor':<20}{'action':<22}{'target':<28}project")
    for e in shown["entries"]:
        at = (e["at"] or "")[:19].replace("T", " ")
        click.echo(f"{at:<22}{e['actor'][:19]:<20}{e['action']:<22}{e['target'][:27]:<28}"
                   f"{e['project'] or '-'}")
