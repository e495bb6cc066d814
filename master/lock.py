"""The cluster-wide dispatcher lock (the defender's lease judgement relies on it too)."""
from __future__ import annotations

from redis import Redis
from redis.exceptions import LockError

from common.config import settings
from common.errors import DispatchLocked
from common.queues import LOCK_KEY


class DispatchLock:
    """Held for one run (or a ``--loop``); released on every way out, also by the watchdog."""

    def __init__(self, redis: Redis) -> None:
        # not thread-local: the watchdog thread must be able to release it
        self.lock = redis.lock(LOCK_KEY, timeout=settings.DISPATCH_USE_POOL_TIMEOUT + 30, blocking=False,
                               thread_local=False)

    @property
    def token(self):
        return self.lock.local.token

    def __enter__(self) -> "DispatchLock":
        if not self.lock.acquire(blocking=False):
            raise DispatchLocked("another dispatcher is running (lock held); this run exits")
        return self

    def keep(self) -> None:
        """Extend the lock between loop runs; DispatchLocked if it was lost meanwhile."""
        try:
            if self.lock.reacquire():
                return
        except LockError:
            pass
        raise DispatchLocked("lost the dispatcher lock; stopping")

    def release(self) -> None:
        try:
            self.lock.release()
        except LockError:  # expired or taken over already: nothing of ours to release
            pass
        except Exception:  # Redis away: the lock expires by itself
            pass

    def __exit__(self, *exc) -> None:
        self.release()
