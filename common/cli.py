"""The ``downcluster`` command: one click group whose commands live in master/ and slave/.

Commands are loaded lazily by dotted path (click's lazy-group pattern), so common/ imports
neither side and a slave host never loads master code it does not run.
"""
from __future__ import annotations

import importlib
import sys

import click

from common.errors import ConfigError, DispatchLocked, ValidationError

COMMANDS = {
    "job": "master.cli:job",
    "task": "master.cli:task",
    "dispatch": "master.cli:dispatch",
    "defender": "master.cli:defender",
    "migrate": "master.cli:migrate",
    "scheduler": "master.cli:scheduler",
    "stats": "master.cli:stats",
    "data": "master.cli:data",
    "export": "master.cli:export",
    "worker": "slave.cli:worker",
    "web": "master.cli:web",
    "token": "master.cli:token",
    "archive": "master.cli:archive",
    "type": "master.cli:types",
}

EXIT_INVALID = 2
EXIT_LOCKED = 75  # EX_TEMPFAIL: another dispatcher holds the lock; cron may simply go on


def import_attribute(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return import_attribute(COMMANDS[name]) if name in COMMANDS else None

    def invoke(self, ctx: click.Context):
        from common.store.connection import unreachable
        from common.secrets import redact

        from common.config import settings
        from common.sentry import capture, init_sentry

        init_sentry(settings.SENTRY_DSN, server_name=settings.HOSTNAME or None)  # every process: dispatcher, defender, ...
        try:
            return super().invoke(ctx)
        except (ValidationError, ConfigError) as exc:
            click.secho(f"error: {redact(str(exc))}", err=True, fg="red")
            ctx.exit(EXIT_INVALID)
        except DispatchLocked as exc:
            click.secho(str(exc), err=True, fg="yellow")
            ctx.exit(EXIT_LOCKED)
        except Exception as exc:
            line = unreachable(exc)
            if line is None:
                capture(exc)
                raise
            click.secho(f"error: {line}", err=True, fg="red")
            ctx.exit(1)


@click.group(cls=LazyGroup)
@click.version_option("1.0.0", prog_name="downcluster")
def main() -> None:
    """downcluster: a distributed, crawler-style download cluster (rq + Redis + MongoDB)."""


if __name__ == "__main__":
    sys.exit(main())
