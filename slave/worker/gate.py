"""The worker's gate: at most ``size`` downloads at once, the waiting ones let in by their queue's
level first (down_super before down_low), then in the order they came. A process loads more tasks
than it downloads at once (slave/worker/runner.py), so an urgent entry taken while others wait
is not queued behind them. A task that has waited ``patience`` seconds is not overtaken any
more: from then on the oldest goes first, so a loaded task's wait stays bounded (its lease runs
meanwhile: LEASE_TIMEOUT, master/dispatch/dispatcher.py's ``held_timeout``)."""
from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque


class Gate:
    """A semaphore whose waiters go in by (rank, arrival): a lower rank first, unless the oldest
    waiter has waited ``patience`` seconds. A place is free only while nobody waits
    (``release`` hands it to a waiter if there is one)."""

    def __init__(self, size: int, patience: float) -> None:
        self.free, self.patience = size, patience
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []  # by rank, arrival
        self._oldest: deque[tuple[float, asyncio.Future[None]]] = deque()  # by arrival
        self._arrival = itertools.count()

    async def acquire(self, rank: int) -> None:
        if self.free > 0:
            self.free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._arrival), fut))
        self._oldest.append((time.monotonic(), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # let in, then cancelled: the place goes on
                self.release()
            raise

    def release(self) -> None:
        # (a future already done was let in, or cancelled while it waited: skipped in both lists)
        while self._oldest and self._oldest[0][1].done():
            self._oldest.popleft()
        if self._oldest and time.monotonic() - self._oldest[0][0] >= self.patience:
            self._oldest.popleft()[1].set_result(None)
            return
        while self._waiting:
            *_, fut = heapq.heappop(self._waiting)
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1
