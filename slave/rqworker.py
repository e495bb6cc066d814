"""``LoopWorker``: an rq worker whose entries run many at once on an event loop.

rq's own workers run one job at a time (``execute_job``); ours runs up to WORKER_INFLIGHT
downloads of many entries at once (``slave/runner.py``). This subclass is how rq sees it, through
rq's public worker API only: it registers its birth, heartbeat and death, listens for rq's
commands (``rq`` shutdown), and keeps rq's bookkeeping for every entry it runs, as rq's worker
does for its one job: an Execution in the queue's StartedJobRegistry and ``started_at`` /
``worker_name`` / status ``started`` on the job while it runs (``prepare_execution``,
``prepare_job_execution``), then ``handle_job_success`` or ``handle_job_failure``. So
``rq info``, rq-dashboard and ``Worker.all()`` show the worker with its queues and its entries.

Thread safety: the event loop's executor threads start and end executions while the heartbeat
thread beats them; one lock keeps rq's per-worker state consistent.
"""
from __future__ import annotations

import logging
import threading

from rq import Queue
from rq.executions import Execution
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import BaseWorker, WorkerStatus

from common.errors import ConfigError
from common.rqbridge import JsonJob

logger = logging.getLogger(__name__)


class LoopWorker(BaseWorker):
    """An rq worker for ``downcluster worker``; see the module docstring."""

    def __init__(self, queues: list[str], name: str, connection, beat_interval: float) -> None:
        super().__init__(queues, name=name, connection=connection, default_result_ttl=0,
                         job_monitoring_interval=max(30, int(beat_interval * 3)),
                         serializer=JSONSerializer, job_class=JsonJob)
        self._lock = threading.Lock()
        self.running: dict[str, tuple[Job, Queue, Execution]] = {}

    def execute_job(self, job: Job, queue: Queue):  # pragma: no cover - rq's loop is not used
        raise NotImplementedError("LoopWorker entries run on the event loop (slave/runner.py)")

    # --- life -----------------------------------------------------------------------------

    def born(self) -> None:
        try:
            self.register_birth()
        except ValueError:  # rq: a live worker of that name exists
            raise ConfigError(f"a live rq worker is already named {self.name!r}: choose another --name") from None
        self.subscribe()
        self.set_state(WorkerStatus.IDLE)

    def died(self) -> None:
        try:
            self.unsubscribe()
        finally:
            self.register_death()

    def beat(self) -> None:
        """The worker's heartbeat and each running execution's and job's, in one pipeline;
        rq's registry maintenance when it is due (as rq's own workers do it)."""
        with self._lock:
            running = list(self.running.values())
        ttl = self.job_monitoring_interval + 60
        with self.connection.pipeline() as pipe:
            self.heartbeat(ttl, pipeline=pipe)
            for job, queue, execution in running:
                execution.heartbeat(queue.started_job_registry, ttl, pipeline=pipe)
                job.heartbeat(now(), ttl, pipeline=pipe, xx=True)
            pipe.execute()
        if self.should_run_maintenance_tasks:
            self.run_maintenance_tasks()

    # --- one entry --------------------------------------------------------------------------

    def begin(self, job: Job, queue: Queue) -> Execution:
        """The entry starts: an Execution in the started registry, the job marked started."""
        with self._lock:
            execution = self.prepare_execution(job)
            self.prepare_job_execution(job)
            self.running[execution.id] = (job, queue, execution)
        return execution

    def succeeded(self, execution: Execution) -> None:
        job, queue = self._end(execution)
        with self._lock:
            self.handle_job_success(job, queue, queue.started_job_registry, execution)
            self._idle_when_done()

    def failed(self, execution: Execution, reason: str) -> None:
        """The entry raised (MongoDB gone past the writer's retries, say): rq's failed registry
        keeps it with ``reason``; its lease is recovered by the defender."""
        job, queue = self._end(execution)
        with self._lock:
            self.handle_job_failure(job, queue, queue.started_job_registry, exc_string=reason, execution=execution)
            self._idle_when_done()

    def _end(self, execution: Execution) -> tuple[Job, Queue]:
        with self._lock:
            job, queue, _ = self.running.pop(execution.id)
        job.ended_at = now()
        return job, queue

    def _idle_when_done(self) -> None:
        if not self.running:
            self.set_state(WorkerStatus.IDLE)
