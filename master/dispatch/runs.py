"""The ways a dispatcher run is started besides once (``dispatcher.dispatch_once``): in a child
process (``dispatch_in_child``: the API's ``POST /api/v1/dispatch``) and standing (``dispatch_loop``:
``downcluster dispatch --loop``, holding the lock between top-ups, standing by while another holds it)."""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from dataclasses import dataclass

from redis import Redis

from common.config import settings
from common.errors import DispatchLocked, http_status
from common.queue import wake
from common.secrets import redact
from common.store.connection import connect_mongo, unreachable
from master.dispatch.dispatcher import check_settings, dispatch_once, timed_run
from master.dispatch.lock import DispatchLock

logger = logging.getLogger(__name__)


def dispatch_in_child(flags: dict) -> tuple[int, dict | str]:
    """One ``dispatch_once`` in a process of its own (``spawn``): its watchdog ends that child,
    never the caller (the web server), and a child that never answers is killed after
    DISPATCH_USE_POOL_TIMEOUT + 60 s. Returns (200, the report) or (an HTTP status, one line):
    409 another dispatcher holds the lock, 422 a malformed setting, 503 a service unreachable,
    500 anything else (sent to Sentry by the child)."""
    ctx = multiprocessing.get_context("spawn")
    answers, answer_end = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(flags, answer_end))  # not daemonic: a web worker may be
    child.start()
    answer_end.close()
    got = None
    try:
        if answers.poll(settings.DISPATCH_USE_POOL_TIMEOUT + 60):
            got = answers.recv()
    except EOFError:  # the child ended without answering: its watchdog stopped it
        pass
    finally:
        answers.close()
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join()
    if got is None:
        limit = settings.DISPATCH_USE_POOL_TIMEOUT
        return 500, f"the dispatcher run exceeded DISPATCH_USE_POOL_TIMEOUT={limit}s and was stopped"
    return got


def _child_main(flags: dict, answer_end) -> None:
    answer_end.send(_child_run(flags))
    answer_end.close()


def _child_run(flags: dict) -> tuple[int, dict | str]:
    from common.config import load
    from common.sentry import capture, init_sentry

    load(flags=flags)
    init_sentry(settings.SENTRY_DSN, server_name=settings.HOSTNAME or None)  # as every CLI process does
    try:
        connect_mongo()
        return 200, dispatch_once().as_dict()
    except Exception as exc:
        status = http_status(exc)
        if status is not None:
            return status, redact(str(exc))
        line = unreachable(exc)
        if line is None:
            capture(exc)
        return (503, line) if line else (500, redact(f"{type(exc).__name__}: {exc}"))


def dispatch_loop(redis: Redis, interval: float, max_runs: int | None = None, on_run=None) -> None:
    """``dispatch --loop``: keep the queues topped up, holding the lock between runs, ``interval``
    seconds apart or sooner when intake wakes it (``common.queue.wake``: found links, at least
    WAKE_GAP after the last run). The
    defender runs every HEARTBEAT_INTERVAL seconds (it cannot judge faster than heartbeats
    change), not every top-up. Finding the lock held, it stands by and takes over once it is
    free (a dead holder's lock expires within DISPATCH_LOCK_TTL). SIGTERM (a supervisor stopping
    it) ends it within DISPATCH_STOP_GRACE, its lock released."""
    check_settings()
    lock = DispatchLock(redis)
    stopping = threading.Event()

    def terminate(signum, frame) -> None:
        if stopping.is_set():
            return
        stopping.set()
        _exit_later(lock)  # even if a broad ``except`` on the way swallows the SystemExit
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, terminate)
    loop = _Loop(max_runs)
    while not stopping.is_set() and not loop.finished:
        if _take(lock, stopping, loop):
            _hold(redis, lock, stopping, interval, loop, on_run)


@dataclass
class _Loop:
    """What ``dispatch --loop`` keeps between runs."""

    max_runs: int | None
    done: int = 0
    defended: float = float("-inf")
    standing_by: bool = False

    @property
    def finished(self) -> bool:
        return self.max_runs is not None and self.done >= self.max_runs


def _take(lock: DispatchLock, stopping: threading.Event, loop: _Loop) -> bool:
    """Whether this loop now holds the lock (else it waited a little: Redis away, or another holds it)."""
    try:
        acquired = lock.acquire()
    except Exception as exc:  # Redis away (a failover, say): try again, never exit
        if unreachable(exc) is None:
            raise
        logger.warning("%s: trying again", unreachable(exc))
        stopping.wait(1.0)
        return False
    if not acquired:
        if not loop.standing_by:
            logger.warning("another dispatcher holds the lock: standing by")
            loop.standing_by = True
        stopping.wait(min(1.0, settings.DISPATCH_LOCK_TTL / 3))
        return False
    loop.standing_by = False
    return True


def _hold(redis: Redis, lock: DispatchLock, stopping: threading.Event, interval: float, loop: _Loop,
          on_run) -> None:
    """Run top-ups while the lock is ours; release it on the way out, whatever ends the runs."""
    try:
        while not stopping.is_set():
            defend = time.monotonic() - loop.defended >= settings.HEARTBEAT_INTERVAL
            if defend:
                loop.defended = time.monotonic()
            report = timed_run(redis, lock, True, defend)
            loop.done += 1
            if on_run:
                on_run(report)
            if loop.finished:
                break
            wake.rest(redis, interval, stopping)  # the interval, or less: found tasks wake it
            lock.keep()
    except DispatchLocked as exc:  # lost the lock (Redis away longer than its TTL): stand by again
        logger.warning("%s; standing by", exc)
    except Exception as exc:  # Redis away mid-run: its leases stay QUEUED for the defender; go on
        if unreachable(exc) is None:
            raise
        logger.warning("%s: trying again", unreachable(exc))
        stopping.wait(1.0)
    finally:
        try:
            lock.release()
        except Exception as exc:  # Redis away: the lock expires by itself within DISPATCH_LOCK_TTL
            logger.warning("lock not released: %s", type(exc).__name__)


def _exit_later(lock: DispatchLock) -> None:
    def fire() -> None:
        logger.error("dispatcher not stopped within DISPATCH_STOP_GRACE=%ss: lock released, exiting",
                     settings.DISPATCH_STOP_GRACE)
        lock.release()
        os._exit(0)

    timer = threading.Timer(settings.DISPATCH_STOP_GRACE, fire)
    timer.daemon = True
    timer.start()
