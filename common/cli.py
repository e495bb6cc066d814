"""The ``downcluster`` command: one click group whose commands live in master/ and slave/.

Commands are loaded lazily by dotted path (click's lazy-group pattern), so common/ imports
neither side and a slave host never loads master code it does not run.
"""
from __future__ import annotations

import importlib
import sys

import click

from common.errors import EXIT_LOCKED, exit_code

COMMANDS = {
    "job": "master.cli_jobs:job",
    "task": "master.cli_tasks:task",
    "dispatch": "master.cli_ops:dispatch",
    "defender": "master.cli_ops:defender",
    "migrate": "master.cli_ops:migrate",
    "scheduler": "master.cli_ops:scheduler",
    "stats": "master.cli_ops:stats",
    "data": "master.cli_data:data",
    "export": "master.cli_data:export",
    "center": "master.center.cli:center",
    "caller": "master.center.cli:caller",
    "worker": "slave.cli:worker",
    "web": "master.cli_web:web",
    "token": "master.cli_web:token",
    "archive": "master.cli_data:archive",
    "type": "master.cli_jobs:types",
    "project": "master.cli_access:project",
    "audit": "master.cli_access:audit",
    "generator": "common.cli:generator",
}
# ``downcluster generator ...``: the dry run runs the generator's sandbox here (slave code), the
# rest are the master's
GENERATOR_COMMANDS = {
    "test": "slave.cli:generator_test",
    "on": "master.cli_jobs:generator_on",
    "off": "master.cli_jobs:generator_off",
    "show": "master.cli_jobs:generator_show",
    "run": "master.cli_jobs:generator_run",
}


def import_attribute(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


class SettingOption(click.Option):
    """A command-line flag that sets a cluster setting (``setting=NAME``): the highest precedence,
    applied when the process resolves its settings (LazyGroup.invoke), before anything reads them."""

    def __init__(self, *args, setting: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.setting = setting


def setting_flags(command: click.Command, ctx: click.Context, args: list[str]) -> dict:
    """The settings given as ``command``'s SettingOption flags in ``args`` (unset ones left out)."""
    options = [p for p in command.params if isinstance(p, SettingOption)]
    if not options:
        return {}
    params = command.make_context(command.name, list(args), parent=ctx, resilient_parsing=True).params
    return {o.setting: params[o.name] for o in options if params.get(o.name) not in (None, "")}


class LazyGroup(click.Group):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["downcluster.args"] = list(args)  # the command and its arguments, for invoke
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return import_attribute(COMMANDS[name]) if name in COMMANDS else None

    def invoke(self, ctx: click.Context):
        from common.config import add_flags, settings
        from common.secrets import redact
        from common.sentry import capture, init_sentry
        from common.store.connection import unreachable

        _, command, args = self.resolve_command(ctx, ctx.meta["downcluster.args"])
        try:
            flags = setting_flags(command, ctx, args) if command else {}
            if flags:  # before anything reads a setting; without flags they resolve at the first read
                add_flags(flags)
            init_sentry(settings.SENTRY_DSN, server_name=settings.HOSTNAME or None)  # every process
            return super().invoke(ctx)
        except Exception as exc:
            code = exit_code(exc)
            if code == EXIT_LOCKED:
                click.secho(str(exc), err=True, fg="yellow")
                ctx.exit(code)
            if code is not None:
                click.secho(f"error: {redact(str(exc))}", err=True, fg="red")
                ctx.exit(code)
            line = unreachable(exc)
            if line is None:
                capture(exc)
                raise
            click.secho(f"error: {line}", err=True, fg="red")
            ctx.exit(1)


class LazySubgroup(click.Group):
    """A group whose commands are loaded by dotted path from ``commands`` (master's and slave's)."""

    def __init__(self, *args, commands_by_name: dict[str, str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.by_name = commands_by_name

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.by_name)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return import_attribute(self.by_name[name]) if name in self.by_name else None


@click.group(cls=LazySubgroup, commands_by_name=GENERATOR_COMMANDS)
def generator() -> None:
    """A job's URL generator: dry-run it, switch it on or off, show its runs, run it now."""


@click.group(cls=LazyGroup)
@click.version_option("1.0.0", prog_name="downcluster")
def main() -> None:
    """downcluster: a distributed, crawler-style download cluster (rq + Redis + MongoDB)."""


if __name__ == "__main__":
    sys.exit(main())
