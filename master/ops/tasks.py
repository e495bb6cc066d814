"""Task state changes an administrator asks for: cancel and requeue.

    LIVE (fresh) --sent in an entry, no write--> SUCCESS | FAIL (retry_at set: due again) | FAIL (final)
    FAIL (due) | LIVE (retry_at set) --sent again--> DISPATCH --download--> SUCCESS | FAIL
    an entry whose attempt died --> LIVE with retry_at (recoveries + 1) | DEAD (recovery cap)
    LIVE | FAIL | DISPATCH --cancel--> CANCEL          FAIL | DEAD | CANCEL --requeue--> LIVE (retry_at: now)
"""
from __future__ import annotations

from common.errors import ValidationError
from common.store import tasks
from common.store.clock import utcnow
from common.store.jobs import named as job_named
from common.store.models import CANCEL, DEAD, DISPATCH, FAIL, LIVE

CANCELLABLE = {LIVE, FAIL, DISPATCH}
REQUEUEABLE = {FAIL, DEAD, CANCEL}
CANCELLABLE_DEFAULT = (LIVE, FAIL, DISPATCH)
REQUEUE_DEFAULT = (FAIL, DEAD)


def _job_id(name: str):
    return job_named(name).id


def cancel(name: str, statuses=CANCELLABLE_DEFAULT) -> int:
    """Cancel the job's tasks in ``statuses``; a worker holding one will not store its data."""
    bad = set(statuses) - CANCELLABLE
    if bad:
        raise ValidationError(f"cannot cancel tasks in status {sorted(bad)[0]}")
    return tasks.cancel(_job_id(name), statuses)


def requeue(name: str, statuses=REQUEUE_DEFAULT) -> int:
    """Put the job's tasks in ``statuses`` back to LIVE with fresh counters, due at once."""
    bad = set(statuses) - REQUEUEABLE
    if bad:
        raise ValidationError(f"cannot requeue tasks in status {sorted(bad)[0]}")
    return tasks.requeue(_job_id(name), statuses, utcnow())
