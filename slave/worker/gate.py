"""The worker's gate: at most ``size`` downloads at once, the waiting ones let in by their queue's
level first (down_super before down_low), then in the order they came. A process loads more tasks
than it downloads at once (slave/worker/runner.py), so an urgent entry taken while others wait
is not queued behind them."""
from __future__ import annotations

import asyncio
import heapq
import itertools


class Gate:
    """A semaphore whose waiters go in by (rank, arrival): a lower rank first. A place is free
    only while nobody waits (``release`` hands it to a waiter if there is one)."""

    def __init__(self, size: int) -> None:
        self.free = size
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrival = itertools.count()

    async def acquire(self, rank: int) -> None:
        if self.free > 0:
            self.free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (rank, next(self._arrival), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # let in, then cancelled: the place goes on
                self.release()
            raise

    def release(self) -> None:
        while self._waiting:
            *_, fut = heapq.heappop(self._waiting)
            if not fut.done():  # (a waiter cancelled meanwhile is skipped)
                fut.set_result(None)
                return
        self.free += 1
