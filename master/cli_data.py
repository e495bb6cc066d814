"""A job's stored data: ``downcluster data export`` (streamed here and now), ``downcluster
export ...`` (the download center's asynchronous exports) and ``downcluster archive``; the
options they share."""
from __future__ import annotations

import json
import os
import time
from datetime import datetime

import click

from common.errors import ValidationError
from common.store.connection import redis_conn
from master.cli import connect


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

    connect()
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
@click.option("--with-tasks", is_flag=True,
              help="Also the pages: final tasks (SUCCESS, FAIL for good, DEAD, CANCEL) last changed before "
                   "the date, each with every version of its data, removed with their data once the file "
                   "is complete.")
def archive(name: str, before: datetime, output: str | None, with_tasks: bool) -> None:
    """Save job NAME's earlier versions of pages and download logs stored before a date to a gzip
    JSON Lines file, then remove them from MongoDB (only once the file is complete); a page's
    latest version stays, unless --with-tasks archives and removes its final task with it."""
    from master.ops.archive import archive as run

    connect()
    path = output or f"{name}-before-{before:%Y%m%dT%H%M%S}.jsonl.gz"
    report = run(name, before, path, with_tasks)
    tasks = f"{report.tasks} final tasks, " if with_tasks else ""
    click.echo(f"archived {tasks}{report.data} data documents and {report.logs} download logs of {name} to "
               f"{path} ({report.bytes} bytes); removed them from MongoDB")


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

    connect()
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

    connect()
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

    connect()
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

    connect()
    url, ends = link(export_id, ttl)
    click.echo(f"valid until {ends:%Y-%m-%d %H:%M:%S} UTC", err=True)
    click.echo(url)


@export.command("cancel")
@click.argument("export_id")
def export_cancel(export_id: str) -> None:
    """Cancel a PENDING or RUNNING export (a running worker stops and removes its partial file)."""
    from master import audit
    from master.exports.service import cancel

    connect()
    cancelled = cancel(redis_conn(), export_id)
    audit.record(None, "export.cancel", cancelled.id, cancelled.project)
    click.echo(f"export {cancelled.id} is CANCEL")


@export.command("retry")
@click.argument("export_id")
def export_retry(export_id: str) -> None:
    """Put a FAIL export back to PENDING by hand (its attempts counted afresh) and queue it."""
    from master import audit
    from master.exports.service import retry

    connect()
    retried = retry(redis_conn(), export_id)
    audit.record(None, "export.retry", retried.id, retried.project)
    click.echo(f"export {retried.id} is {retried.state}")
