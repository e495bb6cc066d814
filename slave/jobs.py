"""The rq function names of entries queued before the rooms layout (``slave.jobs.run_batch``,
``slave.jobs.run_export``), kept so that a plain ``rq worker`` runs such entries after an upgrade
instead of failing them. New entries name ``slave.worker.entries``; once no queue holds an entry
older than the upgrade, this module can go."""
from slave.worker.entries import run_batch, run_export

__all__ = ["run_batch", "run_export"]
