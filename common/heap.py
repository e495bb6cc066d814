"""The garbage collector of a long-running process (``downcluster worker``).

Python's cyclic collector scans every container object it tracks: a worker's oldest generation
holds the ~70,000 objects its imports and start built (modules, classes, the store's documents),
and every full collection walked all of them again (45 ms each, measured). ``settle`` freezes what
exists once the process is up (``gc.freeze``: those objects live as long as the process anyway)
and lets the youngest generation grow to YOUNG objects before it is collected (default 700), so a
page's short-lived objects are mostly gone before a collection looks at them. Every garbage
cycle is still collected; only the moments change. In the 3,000-page bench (docs/benchmarks.md)
the worker's collector time went from 0.23 s to 0.13 s; ``dispatch --loop`` (fewer objects made,
rare full collections) gained nothing there, and does not call it.
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
