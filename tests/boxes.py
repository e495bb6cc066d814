"""Looking for what a sandbox left behind: processes running as a sandbox uid."""
from __future__ import annotations

import os
import time

from slave.engines.wall import UID_BASE, UID_END


def boxed_processes() -> set[int]:
    """Pids of live (not zombie) processes whose real uid is a sandbox's."""
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
        if UID_BASE <= uid < UID_END and not fields.get("State", "").strip().startswith(("Z", "X")):
            found.add(int(entry))
    return found


def eventually_no_boxed_processes(before: set[int] = frozenset(), timeout: float = 10.0) -> set[int]:
    """The sandbox processes (not in ``before``) still alive after waiting up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        left = boxed_processes() - set(before)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)
