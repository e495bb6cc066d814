"""What the worker's writer stores: the outcome of one task's download (``Outcome``, made by the
runner of what ``slave/download/fetching.py`` answered) and the outcomes of one queue entry in
one bulk write (``Part``), read by ``slave/worker/writer.py`` and ``slave/worker/found.py``."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from slave.download.fetching import Fetched

if TYPE_CHECKING:
    from slave.download.job import JobContext


@dataclass
class Outcome(Fetched):
    """A task's ``Fetched`` as the writer stores it: the fields below are the writer's to set."""

    data_id: object = None               # set by store_many: the data document written
    not_modified: str | None = None      # set by store_many: a revisit that brought nothing new
    retry_at: datetime | None = None     # set by store_many: a failure's next attempt (None: final)
    kept: bool = False                   # set by store_many: a final failure of a revisit (``_kept``)

    @classmethod
    def of(cls, fetched: Fetched) -> Outcome:
        return cls(**vars(fetched))


@dataclass
class Part:
    """Outcomes of one entry in one write."""

    ctx: JobContext
    lease: str
    attempt_kind: str  # the lease's (FRESH, AGAIN, REVISIT): which guard its settles take
    outcomes: list[Outcome]
    sent_at: datetime | None = None  # the lease's created_at (a revisit entry's guard)


Pair = tuple[Part, Outcome]  # an outcome and the entry it belongs to
