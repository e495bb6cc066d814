"""The master's commands, one room per command group (common/cli.py loads each lazily):
cli_jobs.py (job, generator, type), cli_tasks.py (task), cli_ops.py (dispatch, defender,
migrate, scheduler, stats), cli_data.py (data, export, archive), cli_web.py (web, token),
cli_access.py (project, audit) and center/cli.py (center, caller); here, what the rooms share."""
from __future__ import annotations

from common.store.connection import connect_mongo


def connect() -> None:
    """The master's MongoDB connection, its indexes ensured: every command's first step."""
    connect_mongo(ensure_indexes=True)


def audit_job(action: str, name: str, **detail) -> None:
    """Record ``action`` on job NAME in the audit log, under the job's project."""
    from common.store.jobs import named
    from master import audit

    audit.record(None, action, name, named(name).project, **detail)
