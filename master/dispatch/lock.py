"""The cluster-wide dispatcher lock (the defender's lease judgement relies on it too).

A short Redis lease (DISPATCH_LOCK_TTL) that a thread of its holder renews, token-checked, every
third of it: a holder that dies (SIGKILL, a lost host) frees it within DISPATCH_LOCK_TTL, and
one that stops releases it at once (token-checked: never someone else's)."""
from __future__ import annotations

import logging
import threading

from redis import Redis
from redis.exceptions import LockError

from common.config import settings
from common.errors import DispatchLocked
from common.queue.names import LOCK_KEY

logger = logging.getLogger(__name__)


class DispatchLock:
    """Held for one run (or a ``--loop``); released on every way out, also by the watchdog."""

    def __init__(self, redis: Redis) -> None:
        # not thread-local: the keeper and the watchdog threads must be able to renew and release it
        self.lock = redis.lock(
            LOCK_KEY, timeout=settings.DISPATCH_LOCK_TTL, blocking=False, thread_local=False
        )
        self.lost = threading.Event()
        self._halt = threading.Event()
        self._missed = None  # our token, when Redis was away as we released (a failover keeps the lock)

    @property
    def token(self):
        return self.lock.local.token

    def acquire(self) -> bool:
        """Take the lock if it is free (and keep it alive from then on)."""
        if self._missed is not None:  # ours still, on the master Sentinel promoted: free it first
            self.lock.local.token = self._missed
            try:
                self.lock.release()
            except LockError:  # expired or taken over meanwhile
                pass
            self._missed = None
        if not self.lock.acquire(blocking=False):
            return False
        self.lost.clear()
        self._halt = threading.Event()
        threading.Thread(target=self._keep, args=(self._halt,), daemon=True, name="dispatch-lock").start()
        return True

    def __enter__(self) -> "DispatchLock":
        if not self.acquire():
            raise DispatchLocked("another dispatcher is running (lock held); this run exits")
        return self

    def _renew(self) -> bool | None:
        """Push the lock's expiry (token-checked): True; False if it is no longer ours; None if
        Redis failed."""
        try:
            return bool(self.lock.reacquire())
        except LockError:
            return False
        except Exception as exc:  # Redis away: try again; pushes check the token, so none goes out unlocked
            logger.warning("dispatcher lock not renewed: %s", type(exc).__name__)
            return None

    def _keep(self, halt: threading.Event) -> None:
        while not halt.wait(settings.DISPATCH_LOCK_TTL / 3):
            if self._renew() is False and not halt.is_set():
                logger.warning("lost the dispatcher lock")
                self.lost.set()
                return

    def keep(self) -> None:
        """Between loop runs: DispatchLocked if the lock was lost meanwhile."""
        if self.lost.is_set() or self._renew() is False:
            raise DispatchLocked("lost the dispatcher lock; stopping")

    def release(self) -> None:
        self._halt.set()
        token = self.lock.local.token
        try:
            self.lock.release()
        except LockError:  # expired or taken over already: nothing of ours to release
            pass
        except Exception:  # Redis away: released at the next acquire, else it expires by itself
            self._missed = token

    def __exit__(self, *exc) -> None:
        self.release()
