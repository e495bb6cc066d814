"""``downcluster migrate``: bring data written by an earlier downcluster to this version's model.

Earlier versions kept a per-job ``_id`` watermark and marked every dispatched task DISPATCH
with a lease that had no ``crawler_lease`` document. This numbers every task without a
``seq`` (in ``_id`` order, through intake's reservations, so it is safe while intake and the
dispatcher run) and sends again, at once and without counting an attempt, every DISPATCH
task whose lease has no document older than a minute (its entry can no longer be claimed).
It also moves the cluster's secrets, token digests and console sessions out of the source
database (which analysts read) into the control database (``MONGO_CONTROL_URI``): each document
is written there, then removed from the source. Last it counts each job's tasks per status
(``common/store/counts.py``; run it while no dispatcher or worker runs, as after an upgrade).
Exports stored before they named their requester by token id get the id of the live token of
their ``requested_by`` name, unless they are older than that token (a revoked token of the same
name requested them: they stay without an owner, seen by admins and by the job's grants only).
Jobs and exports stored before projects go to the ``default`` project, and every token but the
admins' stored before projects is given ``default`` (an analyst read every job before).
A notification an earlier version held by ``claimed_until`` is held, as the one claim protocol
holds it (``common.store.claims``), until the same moment.
Indexes an earlier version made and this one no longer keeps are dropped, and a page version
stored twice (before one document per version was kept) keeps the document its task names;
before the unique (job, uri) of ``crawler_task`` is dropped, every task gets its key
(``crawler_task_key``), a job's tasks in batches. A job that asked for ``allow_private`` before
private reach was an administrator's grant keeps it if its project was opened to it, and loses it
otherwise (named in the report; an admin may register it again to grant it).

Idempotent: a second run finds nothing to do.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from common.store import control, counts, exports, jobs, leases, notifications, projects, tasks
from common.store.clock import utcnow
from common.store.upgrade import move_secrets, retire_indexes

CHUNK = 5000


@dataclass
class MigrationReport:
    numbered: int = 0
    sent_again: int = 0
    secrets_moved: int = 0
    owners_filled: int = 0
    claims_moved: int = 0  # notifications an earlier version held (``claimed_until``)
    projects_filled: tuple[int, int, int] = (0, 0, 0)  # jobs, exports, tokens put into `default`
    indexes_retired: int = 0
    keys_made: int = 0  # keys of tasks stored before crawler_task_key (their URLs unique by an index)
    private_revoked: list[str] | None = None  # jobs that asked for allow_private, in a project not open to it
    secrets_kept: list[str] | None = (
        None  # documents left in the source: the control database has another by that name
    )


def migrate() -> MigrationReport:
    report = MigrationReport()
    for job_id in jobs.names():
        while ids := tasks.unnumbered(job_id, CHUNK):
            first = tasks.reserve(job_id, len(ids))
            try:
                tasks.number(ids, first)
            finally:
                tasks.commit(job_id, first, len(ids))
            report.numbered += len(ids)
    sent = tasks.dispatched_leases(utcnow() - timedelta(minutes=1))
    now = utcnow()
    for lease in sent - leases.existing(sent):
        report.sent_again += tasks.send_again(lease, "sent again: entry of an earlier version", now)
    tasks.forget_watermarks()
    counts.recount()  # tasks per job and status, kept from now on as they change
    report.secrets_moved, report.secrets_kept = move_secrets()
    report.owners_filled = exports.fill_owners({t.name: (t.id, t.add_datetime) for t in control.tokens()})
    report.projects_filled = projects.upgrade()
    report.claims_moved = notifications.upgrade_claims()
    report.indexes_retired, report.keys_made = retire_indexes()
    opened = {p.id for p in projects.listing(None) if p.allow_private}
    report.private_revoked = jobs.settle_private_grants(opened, projects.default_id())
    return report

