"""The garbage collector of a long-running process (``downcluster worker``).

Python's cyclic collector scans every container object it tracks: a worker's oldest generation
holds the objects its imports and start built (modules, classes, the store's documents), and
every full collection walks all of them again. ``settle`` freezes what exists once the process
is up (``gc.freeze``: those objects live as long as the process anyway) and lets the youngest
generation grow to YOUNG objects before it is collected (default 700), so a page's short-lived
objects are mostly gone before a collection looks at them. Invariant: every garbage cycle is
still collected; only the moments change. ``dispatch --loop`` (fewer objects made, rare full
collections) does not call it. What it saves, measured: docs/benchmarks.md ("What was cut").
"""
from __future__ import annotations

import gc

YOUNG = 10_000  # container objects allocated (net) between collections of the youngest generation


def settle() -> None:
    """Call once the process has imported and built what it runs with."""
    gc.collect()  # what start left as garbage goes first, not frozen with the rest
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG, middle, old)
