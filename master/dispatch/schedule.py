"""``downcluster scheduler``: the dispatcher on a cron schedule through rq-scheduler.

rq-scheduler keeps the cron entry (visible to its own tools) and moves it onto the
``down_dispatch`` queue at each due time; this process then runs that queue with an rq
SimpleWorker in burst mode. Both steps run in the main thread, one after the other, every
``interval`` seconds, so signals work and no second loop shares a Redis connection; slaves
never run master code.

Between its checks it looks for the dispatcher's wake-up (``common.queue.wake``: tasks found
on stored pages, to send now) every 0.2 s, and on one puts a run on ``down_dispatch`` at once:
a crawl under cron goes a level deeper in seconds, not one cron period a level.
"""
from __future__ import annotations

import logging
import signal
import time

from redis import Redis
from rq import SimpleWorker
from rq.serializers import JSONSerializer
from rq_scheduler import Scheduler

from common.config import settings
from common.errors import DispatchLocked
from common.queue.rqbridge import JsonJob, rq_queue
from common.queue.wake import woken

logger = logging.getLogger(__name__)

QUEUE = "down_dispatch"
JOB_ID = "downcluster-dispatch-cron"


def scheduled_dispatch() -> str:
    """What the cron entry runs: one dispatcher run; a held lock is not an error."""
    from master.dispatch.dispatcher import dispatch_once

    try:
        report = dispatch_once(watchdog=False)
    except DispatchLocked as exc:
        return str(exc)
    return f"dispatched {report.total} tasks"


def install(redis: Redis, cron: str) -> Scheduler:
    sched = Scheduler(queue_name=QUEUE, connection=redis, interval=10, job_class=JsonJob)
    if JOB_ID in sched:
        sched.cancel(JOB_ID)
    sched.cron(cron, func=scheduled_dispatch, id=JOB_ID, queue_name=QUEUE,
               timeout=settings.DISPATCH_USE_POOL_TIMEOUT, result_ttl=600, use_local_timezone=False)
    return sched


def _rest(redis: Redis, interval: float, stopping: list) -> None:
    """Wait ``interval`` seconds, or until a signal or a wake-up: a run is then queued now."""
    end = time.monotonic() + interval
    while not stopping and time.monotonic() < end:
        if woken(redis):
            rq_queue(QUEUE, redis).enqueue(scheduled_dispatch, job_timeout=settings.DISPATCH_USE_POOL_TIMEOUT,
                                           result_ttl=600)
            return
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


def run_scheduler(redis: Redis, cron: str, burst: bool = False, interval: float = 10.0) -> None:
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sched = install(redis, cron)
    stopping = []

    def stop(signum, frame) -> None:
        stopping.append(signum)

    logger.info("scheduler: dispatch on %r, checking every %ss", cron, interval)
    while True:
        if sched.acquire_lock():  # one scheduler process moves due entries, however many run
            try:
                sched.enqueue_jobs()
            finally:
                sched.remove_lock()
        worker = SimpleWorker(
            [rq_queue(QUEUE, redis)], connection=redis, serializer=JSONSerializer, job_class=JsonJob
        )
        worker.work(burst=True, logging_level="WARNING")
        if burst:
            return
        # SIGTERM/SIGINT came while it worked
        if getattr(worker, "_shutdown_requested_date", None) is not None:
            logger.info("scheduler: stopping")
            return
        for sig in (signal.SIGTERM, signal.SIGINT):  # the worker installs its own while it works
            signal.signal(sig, stop)
        _rest(redis, interval, stopping)
        if stopping:
            logger.info("scheduler: stopping")
            return
