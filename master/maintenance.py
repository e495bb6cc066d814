"""The maintenance table: each chore, how often it runs cluster-wide, and what runs it.

A chore with an interval is due when its next time, kept in the store (``common.store.state``,
by the store's clock), has come; the process that takes it by
compare-and-set runs it and every other skips it, so a cron ``dispatch`` does only dispatching
unless a chore is due cluster-wide, however many dispatchers run and however often. Chores
without an interval are cheap checks each dispatcher run makes (each reads what its own state
says is due). Every dispatcher run calls ``run_due`` after filling the queues;
``downcluster defender`` runs them all at once, due or not.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from redis import Redis

from common.secrets import redact
from common.sentry import capture
from common.store import state
from common.store.clock import store_now

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Chore:
    name: str
    every: float  # seconds between runs cluster-wide; 0: every dispatcher run
    run: Callable[[Redis, float], object]  # (redis, time budget in seconds) -> its report


def table() -> tuple[Chore, ...]:
    from common.store import due, floors
    from master import generators
    from master.dispatch import defender
    from master.exports import service as exports
    from master.ops import reports, retention
    from master.ops.stalls import check_stalls

    return (
        Chore("stalls", 0, lambda redis, budget: check_stalls(redis)),
        Chore("generators", 0, lambda redis, budget: generators.tend(redis)),
        Chore("reports", 0, lambda redis, budget: reports.send_reports()),
        Chore("exports", 0, lambda redis, budget: exports.tend(redis)),
        Chore("revisits", 0, lambda redis, budget: due.make_due(time.monotonic() + budget)),
        Chore("orphan_sweep", 60, lambda redis, budget: defender.sweep(budget)),
        Chore("retention", 600, lambda redis, budget: retention.enforce(budget=budget)),
        # each status's floor raised to its first task (common.store.floors): a status emptied
        # in a quiet stretch is read as empty, so a burst after it begins its own first page
        Chore("floors", 300, lambda redis, budget: floors.tend(budget)),
    )


def claim(name: str, every: float, now: datetime) -> bool:
    """Take chore ``name`` if it is due (``common.store.state.claim_chore``)."""
    return state.claim_chore(name, every, now)


def run_due(redis: Redis, budget: float, force: bool = False) -> dict[str, object]:
    """Run the chores that are due (all of them with ``force``); one failing never stops the
    others nor its caller. Returns {name: report} of those run."""
    now, ran = store_now(), {}
    for chore in table():
        if chore.every and not force and not claim(chore.name, chore.every, now):
            continue
        try:
            ran[chore.name] = chore.run(redis, budget)
        except Exception as exc:
            logger.warning("chore %s failed: %s", chore.name, redact(f"{type(exc).__name__}: {exc}"))
            capture(exc)
    return ran
