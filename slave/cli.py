"""The slave's command: ``downcluster worker``."""
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
