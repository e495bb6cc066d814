"""``downcluster worker``: an rq worker over the priority queues, host queues first.

Plain ``rq worker -u REDIS_URL down_super down_high down_mid down_low`` works as well; this
entry adds the host's own queues, Sentry, the hostname and secret-scrubbing logs.
"""
from __future__ import annotations

import logging

from rq import Queue, SimpleWorker, Worker

from common.config import settings
from common.connections import redis_conn
from common.queues import worker_queue_names
from common.secrets import install_logging_filter
from common.sentry import init_sentry


def build_worker(host: str = "", simple: bool = False, name: str | None = None) -> Worker:
    """A worker reading each level's host queue before the shared queue of that level."""
    redis = redis_conn()
    queues = [Queue(n, connection=redis) for n in worker_queue_names(host)]
    cls = SimpleWorker if simple else Worker
    return cls(queues, connection=redis, name=name)


def run_worker(host: str = "", burst: bool = False, simple: bool = False, name: str | None = None,
               logging_level: str = "INFO", max_jobs: int | None = None) -> bool:
    logging.basicConfig(level=logging_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_logging_filter()
    init_sentry(settings.SENTRY_DSN, server_name=settings.HOSTNAME)
    worker = build_worker(host, simple=simple, name=name)
    return worker.work(burst=burst, logging_level=logging_level, max_jobs=max_jobs)
