"""The rq job function: one queue entry, run by any rq worker.

``run_batch(lease)`` claims the entry's lease, downloads its tasks and stores the results
(slave/worker/runner.py); ``run_generator(run)`` runs a job's generator once (slave/generate.py).
A plain ``rq worker -u REDIS_URL down_super down_high down_mid down_low down_generate``
runs it with connections from the DOWNCLUSTER_* environment; ``downcluster worker`` runs the
same steps for many entries at once. A failure reaches rq (and Sentry through its RQ
integration) once.
"""
from __future__ import annotations

from slave.worker.runner import run_one


def run_batch(lease: str) -> dict[str, int]:
    """Entry point for rq. Returns counts for the rq result (kept 0 s by default)."""
    return run_one(lease) or {"success": 0, "fail": 0}


def run_export(export_id: str) -> str:
    """Entry point for rq on ``down_export``: one attempt of an export (a plain ``rq worker
    down_export`` runs it; ``downcluster worker`` takes these entries itself)."""
    import os

    from common.config import worker_host
    from common.store.connection import connect_mongo
    from slave.exporter import run_export as run

    connect_mongo()
    return run(export_id, f"rq-{worker_host()}-{os.getpid()}")


def run_dry_run(ref: str) -> dict:
    """Entry point for rq on ``down_super``: a job's dry run on one URL, storing nothing
    (``slave/worker/dryrun.py``); ``downcluster worker`` takes these entries itself."""
    from slave.worker.dryrun import run

    return run(ref)


def run_generator(run_id: str) -> dict:
    """Entry point for rq on ``down_generate``: one run of a job's generator (its URLs go through
    intake); ``downcluster worker`` takes these entries itself."""
    from common.store.connection import connect_mongo
    from slave.generate import run

    connect_mongo()
    return run(run_id)
