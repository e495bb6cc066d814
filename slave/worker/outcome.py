"""What the worker's writer stores: the outcome of one task's download (``Outcome``, made by
``slave/download/fetching.py``) and the outcomes of one queue entry in one bulk write (``Part``),
read by ``slave/worker/writer.py`` and ``slave/worker/found.py``."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from common.errors import DownloadError
from common.store.records import LeaseTask
from slave.download.engines.base import Download

if TYPE_CHECKING:
    from slave.download.links import Found
    from slave.download.sitemaps import Read
    from slave.worker.context import JobContext


@dataclass
class Outcome:
    task: LeaseTask
    download: Download | None
    error: DownloadError | None
    spend_us: int
    request_size: int = 0
    deferred: float | None = None  # handed back (busy or closed site): due again in this many s, no attempt
    coalesce_key: str | None = None      # this download leads identical requests: publish it once stored
    coalesced_from: object = None        # the task whose stored download this one copied
    data_id: object = None               # set by store_many: the data document written
    not_modified: str | None = None      # set by store_many: a revisit that brought nothing new
    retry_at: datetime | None = None     # set by store_many: a failure's next attempt (None: final)
    kept: bool = False                   # set by store_many: a final failure of a revisit (``_kept``)
    links: Found | None = None           # a following job's links found on the page (store_many adds them)
    sitemap: Read | None = None          # a sitemap task's pages and sitemaps (store_many adds them)


@dataclass
class Part:
    """Outcomes of one entry in one write."""

    ctx: JobContext
    lease: str
    kind: str
    outcomes: list[Outcome]
    sent_at: datetime | None = None  # the lease's created_at (a revisit entry's guard)


Pair = tuple[Part, Outcome]  # an outcome and the entry it belongs to
