"""The worker's gate (slave/worker/gate.py): never more than its size inside, the waiting let in
by their queue's level, then in arrival order, but one that waited its patience first; a
cancelled waiter loses its place and gives back one it was handed."""
from __future__ import annotations

import asyncio

from slave.worker.gate import Gate


async def _enter(gate: Gate, rank: int, name: str, order: list[str], leave: asyncio.Event) -> None:
    await gate.acquire(rank)
    order.append(name)
    try:
        await leave.wait()
    finally:
        gate.release()


def test_a_higher_queue_goes_first_then_arrival_order():
    async def main() -> list[str]:
        gate, order, leave = Gate(2, 60), [], asyncio.Event()
        inside = [asyncio.create_task(_enter(gate, 3, f"low{i}", order, leave)) for i in range(2)]
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(_enter(gate, r, n, order, leave))
                   for r, n in ((3, "low2"), (3, "low3"), (0, "super"), (1, "high"))]
        await asyncio.sleep(0)
        assert order == ["low0", "low1"] and gate.free == 0  # two inside, four waiting
        leave.set()
        await asyncio.gather(*inside, *waiting)
        assert gate.free == 2
        return order

    assert asyncio.run(main()) == ["low0", "low1", "super", "high", "low2", "low3"]


def test_a_task_that_waited_its_patience_is_not_overtaken():
    async def main() -> list[str]:
        gate, order, leave = Gate(1, 0), [], asyncio.Event()  # every waiter is old at once
        await gate.acquire(0)  # held here
        waiting = [asyncio.create_task(_enter(gate, r, n, order, leave))
                   for r, n in ((3, "low"), (0, "super"), (3, "low2"))]
        await asyncio.sleep(0)
        gate.release()
        leave.set()
        await asyncio.wait_for(asyncio.gather(*waiting), 5)
        assert gate.free == 1
        return order

    assert asyncio.run(main()) == ["low", "super", "low2"]  # arrival order, levels aside


def test_never_more_inside_than_its_size():
    async def main() -> int:
        gate, inside, peak = Gate(3, 60), 0, 0

        async def one(rank: int) -> None:
            nonlocal inside, peak
            await gate.acquire(rank)
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0)
            inside -= 1
            gate.release()

        await asyncio.gather(*(one(i % 4) for i in range(50)))
        assert gate.free == 3
        return peak

    assert asyncio.run(main()) == 3


def test_a_cancelled_waiter_loses_its_place_and_passes_on_one_handed_to_it():
    async def main() -> list[str]:
        gate, order, leave = Gate(1, 60), [], asyncio.Event()
        await gate.acquire(0)  # held here
        gone = asyncio.create_task(_enter(gate, 0, "gone", order, leave))
        handed = asyncio.create_task(_enter(gate, 1, "handed", order, leave))
        last = asyncio.create_task(_enter(gate, 2, "last", order, leave))
        await asyncio.sleep(0)
        gone.cancel()  # still waiting: skipped
        await asyncio.sleep(0)
        gate.release()  # goes to "handed" ...
        handed.cancel()  # ... cancelled before it ran: the place goes on to "last"
        leave.set()
        await asyncio.gather(gone, handed, return_exceptions=True)
        await asyncio.wait_for(last, 5)  # (a place lost with "handed" would keep it out for ever)
        assert gate.free == 1
        return order

    assert asyncio.run(main()) == ["last"]


def test_an_entry_ranks_by_its_queue_level_whatever_the_host_or_foreign_queue():
    from slave.worker.runner import _rank

    assert [_rank(q) for q in ("down_super", "down_high@h1", "down_mid#foreign", "down_low")] == [0, 1, 2, 3]
    assert _rank("") == 4  # an entry whose lease names no queue goes last
