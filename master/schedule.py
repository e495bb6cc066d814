"""``downcluster scheduler``: the dispatcher on a cron schedule through rq-scheduler.

rq-scheduler puts a dispatch job on the ``down_dispatch`` queue at each cron time; this
process runs the scheduler loop and a worker for that queue, so slaves never run master code.
"""
from __future__ import annotations

import logging
import threading

from redis import Redis
from rq import Queue, SimpleWorker
from rq_scheduler import Scheduler

from common.config import settings
from common.errors import DispatchLocked

logger = logging.getLogger(__name__)

QUEUE = "down_dispatch"
JOB_ID = "downcluster-dispatch-cron"


def scheduled_dispatch() -> str:
    """What the cron entry runs: one dispatcher run; a held lock is not an error."""
    from master.dispatcher import dispatch_once

    try:
        report = dispatch_once(watchdog=False)
    except DispatchLocked as exc:
        return str(exc)
    return f"dispatched {report.total} tasks"


def install(redis: Redis, cron: str) -> Scheduler:
    sched = Scheduler(queue_name=QUEUE, connection=redis, interval=10)
    if JOB_ID in sched:
        sched.cancel(JOB_ID)
    sched.cron(cron, func=scheduled_dispatch, id=JOB_ID, queue_name=QUEUE,
               timeout=settings.DISPATCH_USE_POOL_TIMEOUT, result_ttl=600, use_local_timezone=False)
    return sched


def run_scheduler(redis: Redis, cron: str, burst: bool = False) -> None:
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sched = install(redis, cron)
    worker = SimpleWorker([Queue(QUEUE, connection=redis)], connection=redis)
    if burst:
        sched.enqueue_jobs()
        worker.work(burst=True)
        return
    threading.Thread(target=sched.run, daemon=True, name="rq-scheduler").start()
    worker.work()
