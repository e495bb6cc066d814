"""The slave's commands: ``downcluster worker`` and ``downcluster generator test`` (the dry run
runs the generator's sandbox where it is typed)."""
from __future__ import annotations

import click

from common.cli import SettingOption


@click.command()
@click.option("--burst", is_flag=True, help="Quit once the queues are empty.")
@click.option(
    "--host",
    default="",
    cls=SettingOption,
    setting="HOSTNAME",
    help="This host's name (default: HOSTNAME, else the machine's): its own queues are read "
    "before the shared ones.",
)
@click.option("--classic", "mode", flag_value="classic",
              help="Run rq's forking Worker (one entry at a time, a fork each) instead of the event loop.")
@click.option("--simple", "mode", flag_value="simple",
              help="Run rq's SimpleWorker (one entry at a time, in this process) instead of the event loop.")
@click.option(
    "--name", default=None, help="rq worker name (default: host.pid.random); unique among live workers."
)
@click.option(
    "--foreign",
    is_flag=True,
    help="Also take the foreign queues (jobs with prior = 2), before the shared ones: for hosts "
    "with an exit abroad.",
)
@click.option("--max-jobs", type=int, default=None, help="Stop after this many queue entries.")
@click.option("--exports/--no-exports", default=True, show_default=True,
              help="Also run export entries from down_export, one at a time in a thread of their own.")
@click.option("--logging-level", default="INFO", show_default=True)
def worker(burst: bool, host: str, mode: str | None, name: str | None, foreign: bool, max_jobs: int | None,
           exports: bool, logging_level: str) -> None:
    """Drain down_super > down_high > down_mid > down_low (host queues first), many entries at once."""
    from slave.worker.loop import run_worker

    # host: HOSTNAME in the settings, resolved when the command started
    run_worker(burst=burst, mode=mode or "async", name=name, logging_level=logging_level,
               max_jobs=max_jobs, foreign=foreign, exports=exports)


@click.command("test")
@click.argument("name")
@click.option("--limit", type=click.IntRange(0, 100000), default=20, show_default=True,
              help="URLs shown of those intake would add.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def generator_test(name: str, limit: int, as_json: bool) -> None:
    """Dry-run job NAME's generator here, in the sandbox: print the first URLs and what intake would
    do (added / duplicate / rejected, with line numbers); store nothing. A pass turns a generator
    in test on; a failure exits 1."""
    import json

    from common.store.connection import connect_mongo
    from slave.generate import dry_run

    connect_mongo(ensure_indexes=True)
    got = dry_run(name, limit)
    if as_json:
        click.echo(json.dumps(got, indent=2))
    else:
        for row in got.get("first", []):
            click.echo(row["url"] + (f"\t{row['host']}" if row["host"] else ""))
        for e in got.get("errors", [])[:50]:
            click.echo(f"line {e['line']}: {e['reason']}", err=True)
        if len(got.get("errors", [])) > 50:
            click.echo(f"... and {len(got['errors']) - 50} more rejected lines", err=True)
        if "added" in got:
            click.echo(f"would add {got['added']}, duplicate {got['duplicate']}, rejected {got['rejected']} "
                       f"({got['lines']} lines, {got['bytes']} bytes, {got['spend_time'] / 1e6:.2f} s)")
        if got["passed"]:
            click.echo(f"dry run passed: generator state {got['state']} (nothing stored)")
        else:
            click.echo(f"dry run failed: {got['failed_reason']} (state {got['state']})", err=True)
    if not got["passed"]:
        raise SystemExit(1)
