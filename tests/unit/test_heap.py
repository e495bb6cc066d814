"""A long-running process's collector after ``heap.settle``: what existed is frozen, the young
generation collected less often, and a new garbage cycle still collected."""
from __future__ import annotations

import gc
import weakref

from common import heap


class _Node:
    pass


def test_settle_freezes_the_start_and_still_collects_cycles():
    before = gc.get_threshold()
    kept = _Node()
    try:
        heap.settle()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (heap.YOUNG, before[1], before[2])
        assert not any(o is kept for o in gc.get_objects())  # frozen: out of the collector's scans
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
