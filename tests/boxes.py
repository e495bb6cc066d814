"""Looking for what a sandbox left behind: processes running as a sandbox uid."""
from __future__ import annotations

import os
import time

from slave.download.engines.wall import BLOCK, block_of


def boxed_processes(owner: int | None = None) -> set[int]:
    """Pids of live (not zombie) processes running as a sandbox uid of worker process ``owner``
    (default: this process), so sandboxes of other processes on the machine do not count."""
    first = block_of(os.getpid() if owner is None else owner)
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        uid = int(fields.get("Uid", "0").split()[0])
        if first <= uid < first + BLOCK and not fields.get("State", "").strip().startswith(("Z", "X")):
            found.add(int(entry))
    return found


def eventually_no_boxed_processes(before: set[int] = frozenset(), timeout: float = 10.0,
                                  owner: int | None = None) -> set[int]:
    """The sandbox processes of ``owner`` (not in ``before``) still alive after waiting up to
    ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        left = boxed_processes(owner) - set(before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)
