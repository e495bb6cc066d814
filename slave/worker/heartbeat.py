"""The worker's heartbeat: one thread that, every HEARTBEAT_INTERVAL, tells MongoDB the worker's
leases are alive (``beat_at``, stamped with the store's clock: what the defender judges deaths
by, so a Redis restart never fakes one), measures this machine's clock against the store's,
beats rq (the worker, each execution, each job) and refreshes the worker's download figures for
``stats`` and the console. Site slots are renewed by a thread of their own (``slave/download/etiquette.py``),
never held up by MongoDB."""
from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any

from common.config import settings, worker_host
from common.queue.names import WORKER_KEY_PREFIX
from common.store import leases
from common.store.clock import sync_store_clock
from common.store.connection import redis_conn

logger = logging.getLogger(__name__)


def new_worker_id() -> str:
    """This worker's name: in rq, in its leases and in logs (host.pid.random)."""
    return f"{worker_host()}.{os.getpid()}.{uuid.uuid4().hex[:6]}"


class Heartbeat(threading.Thread):
    """An entry given up on drops out of ``runner.active`` and stops beating, so the defender
    takes it; ``runner.rq`` (the rq worker, when there is one) is beaten too. ``runner`` is the
    ``slave.worker.runner.Runner`` of this process (not imported here: it imports this module)."""

    def __init__(self, runner: Any) -> None:
        super().__init__(daemon=True, name="heartbeat")
        self.runner, self.halt = runner, threading.Event()

    def beat(self) -> None:
        try:
            leases.beat(list(self.runner.active), self.runner.worker_id)
            sync_store_clock()
        except Exception as exc:  # MongoDB away: the writer retries; the defender may recover us
            logger.warning("heartbeat failed: %s", type(exc).__name__)
        if self.runner.rq is not None:
            try:
                self.runner.rq.beat()
            except Exception as exc:  # Redis away: rq's tools may call us dead; the leases are what count
                logger.warning("rq heartbeat failed: %s", type(exc).__name__)

    def announce(self) -> None:
        runner = self.runner
        try:
            key = WORKER_KEY_PREFIX + runner.worker_id
            pipe = redis_conn().pipeline(transaction=False)
            pipe.hset(key, mapping={"host": worker_host(), "inflight": runner.inflight,
                                    "peak_inflight": runner.peak_inflight, "entries": runner.entries_done})
            pipe.expire(key, max(settings.HEARTBEAT_TTL, 3 * settings.HEARTBEAT_INTERVAL))
            pipe.execute()
        except Exception as exc:  # Redis away: only stats miss us
            logger.debug("worker figures not refreshed: %s", type(exc).__name__)

    def forget(self) -> None:
        try:
            redis_conn().delete(WORKER_KEY_PREFIX + self.runner.worker_id)
        except Exception:  # Redis away: the figures expire
            pass

    def run(self) -> None:
        last = time.monotonic()
        self.beat()
        self.announce()
        while not self.halt.wait(min(1.0, settings.HEARTBEAT_INTERVAL)):
            if time.monotonic() - last >= settings.HEARTBEAT_INTERVAL:
                last = time.monotonic()
                self.beat()
            self.announce()
