"""``downcluster worker``: drain the priority queues, host queues first.

By default one process runs many entries at once on an event loop (slave/worker/runner.py), at
most WORKER_INFLIGHT downloads at a time, taking the next entry in strict queue order while fewer
than twice as many of its tasks are loaded; rq sees it as a worker with an execution per entry
(slave/worker/rqworker.py). ``--classic`` / ``--simple`` run rq's own Worker / SimpleWorker
instead (one entry at a time; on Redis's clock, see slave/worker/rqworker.py), exactly what a plain
``rq worker down_super down_high down_mid down_low`` does.
"""
from __future__ import annotations

import logging

from rq.serializers import JSONSerializer

from common.config import settings, worker_host
from common.queue.names import GENERATE_QUEUE, worker_queue_names
from common.queue.rqbridge import JsonJob, rq_queue
from common.secrets import install_logging_filter
from common.sentry import init_sentry
from common.store.connection import redis_conn
from slave.worker.rqworker import ClassicSimpleWorker, ClassicWorker


def build_worker(simple: bool = False, name: str | None = None,
                 foreign: bool = False) -> ClassicWorker | ClassicSimpleWorker:
    """An rq worker reading down_generate (generator runs), then each level's host queue (and
    foreign queue) before the shared one."""
    redis = redis_conn()
    queues = [rq_queue(n, redis) for n in [GENERATE_QUEUE, *worker_queue_names(worker_host(), foreign)]]
    cls = ClassicSimpleWorker if simple else ClassicWorker
    return cls(queues, connection=redis, name=name, serializer=JSONSerializer, job_class=JsonJob)


def build_the_wall() -> None:
    """The sandbox's network wall, up before the first entry; where it cannot be built, one line
    says so and python and shell downloads fail (retryable, so another worker may take them)."""
    from slave.download.engines import wall

    try:
        wall.ensure()
    except wall.Unavailable as exc:
        logging.getLogger(__name__).warning("python and shell downloads are refused on this worker: %s", exc)


def run_worker(burst: bool = False, mode: str = "async", name: str | None = None,
               logging_level: str = "INFO", max_jobs: int | None = None, foreign: bool = False,
               exports: bool = True) -> bool:
    logging.basicConfig(level=logging_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_logging_filter()
    init_sentry(settings.SENTRY_DSN, server_name=worker_host())
    build_the_wall()
    if mode == "async":
        from slave.worker.runner import serve

        serve(
            worker_queue_names(worker_host(), foreign),
            burst=burst,
            max_jobs=max_jobs,
            exports=exports,
            name=name,
        )
        return True
    worker = build_worker(simple=mode == "simple", name=name, foreign=foreign)
    return worker.work(burst=burst, logging_level=logging_level, max_jobs=max_jobs)
