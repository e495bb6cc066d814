"""``LoopWorker``: an rq worker whose entries run many at once on an event loop.

rq's own workers run one job at a time (``execute_job``); ours runs up to WORKER_INFLIGHT
downloads of many entries at once (``slave/worker/runner.py``). This subclass is how rq sees it, through
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
import math
import threading
import time
from typing import TYPE_CHECKING

from rq import Queue
from rq.executions import Execution
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import now
from rq.worker import BaseWorker, SimpleWorker, Worker, WorkerStatus

from common.errors import ConfigError
from common.queue.rqbridge import JsonJob

logger = logging.getLogger(__name__)


if TYPE_CHECKING:
    _WorkerBase = BaseWorker  # what the mixin is mixed into, for the type checker
else:
    _WorkerBase = object


class RedisClock(_WorkerBase):
    """rq scores its StartedJobRegistry by the clock of the worker that writes an entry (now +
    TTL) and cleans it by the clock of whichever worker runs maintenance, so between hosts whose
    clocks differ by more than the TTL's margin a healthy worker's running entries are taken as
    abandoned (``AbandonedJobError``, moved to the failed registry under it). Our workers score
    on Redis's clock: the TTLs they score with grow by as much as this machine's clock is behind
    Redis's. rq's maintenance (``clean_registries``) judges by the local clock and takes no other,
    so a worker leaves it to the others while its clock is ahead of Redis's: a clock behind only
    cleans late, never early."""

    clock_behind = 0  # whole seconds this machine's clock is behind Redis's, as last measured
    clock_ahead = 0   # whole seconds it is ahead
    AHEAD_TOLERANCE = 1  # seconds ahead still judged as on time (rq's scores are whole seconds)

    def redis_now(self) -> float:
        seconds, micros = self.connection.time()
        now = seconds + micros / 1e6
        local = time.time()
        self.clock_behind = max(0, math.ceil(now - local))
        self.clock_ahead = max(0, math.floor(local - now))
        return now

    def register_birth(self, *args, **kwargs):
        self.redis_now()  # before the first entry is scored
        return super().register_birth(*args, **kwargs)

    def heartbeat(self, timeout=None, pipeline=None):
        self.redis_now()
        return super().heartbeat(timeout, pipeline=pipeline)

    def get_heartbeat_ttl(self, job: Job, working_time: float = 0.0) -> int:
        return super().get_heartbeat_ttl(job, working_time) + self.clock_behind

    def clean_registries(self) -> None:
        """rq's own maintenance, unless this machine's clock is ahead of Redis's."""
        self.redis_now()
        if self.clock_ahead > self.AHEAD_TOLERANCE:
            self.log.info("Worker %s: clock %ss ahead of Redis's: registries left to other workers",
                          self.name, self.clock_ahead)
            self.last_cleaned_at = now()  # type: ignore[assignment]  # rq declares it None, then sets datetimes
            return
        super().clean_registries()


class ClassicWorker(RedisClock, Worker):
    """rq's Worker (``downcluster worker --classic``), on Redis's clock."""


class ClassicSimpleWorker(RedisClock, SimpleWorker):
    """rq's SimpleWorker (``downcluster worker --simple``), on Redis's clock."""


class LoopWorker(RedisClock, BaseWorker):
    """An rq worker for ``downcluster worker``; see the module docstring."""

    def __init__(self, queues: list[str], name: str, connection, beat_interval: float) -> None:
        super().__init__(queues, name=name, connection=connection, default_result_ttl=0,
                         job_monitoring_interval=max(30, int(beat_interval * 3)),
                         serializer=JSONSerializer, job_class=JsonJob)
        self._lock = threading.Lock()
        self.running: dict[str, tuple[Job, Queue, Execution]] = {}

    def execute_job(self, job: Job, queue: Queue):  # pragma: no cover - rq's loop is not used
        raise NotImplementedError("LoopWorker entries run on the event loop (slave/worker/runner.py)")

    # --- life -----------------------------------------------------------------------------

    def born(self) -> None:
        try:
            self.register_birth()
        except ValueError:  # rq: a live worker of that name exists
            raise ConfigError(
                f"a live rq worker is already named {self.name!r}: choose another --name"
            ) from None
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
        self.redis_now()
        ttl = self.job_monitoring_interval + 60 + self.clock_behind
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
            self.handle_job_failure(
                job, queue, queue.started_job_registry, exc_string=reason, execution=execution
            )
            self._idle_when_done()

    def _end(self, execution: Execution) -> tuple[Job, Queue]:
        with self._lock:
            job, queue, _ = self.running.pop(execution.id)
        job.ended_at = now()
        return job, queue

    def _idle_when_done(self) -> None:
        if not self.running:
            self.set_state(WorkerStatus.IDLE)
