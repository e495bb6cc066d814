"""The slave's command: ``downcluster worker``."""
from __future__ import annotations

import click

from common.config import settings


@click.command()
@click.option("--burst", is_flag=True, help="Quit once the queues are empty.")
@click.option("--host", default="", envvar="DOWNCLUSTER_HOSTNAME",
              help="This host's name: its own queues are read before the shared ones.")
@click.option("--simple", is_flag=True, help="Run jobs in the worker process (no fork per queue entry).")
@click.option("--name", default=None, help="rq worker name (default: rq's).")
@click.option("--max-jobs", type=int, default=None, help="Stop after this many queue entries.")
@click.option("--logging-level", default="INFO", show_default=True)
def worker(burst: bool, host: str, simple: bool, name: str | None, max_jobs: int | None, logging_level: str) -> None:
    """Run an rq worker over down_super > down_high > down_mid > down_low (host queues first)."""
    from slave.worker import run_worker

    if host:
        settings.override(HOSTNAME=host)
    run_worker(host=host, burst=burst, simple=simple, name=name, logging_level=logging_level, max_jobs=max_jobs)
