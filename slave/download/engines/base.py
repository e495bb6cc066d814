"""The engine seam: what every engine is (``Engine``), the one record it is asked with
(``Request``), what it returns (``Download``), and the limits it runs under (``Limits``).

Protocol: an engine is built once per worker event loop (``engines/registry.py``) and shares
nothing with another engine. ``fetch(request)`` downloads one page and returns its ``Download``
(a 2xx, or a final 3xx), or raises a failure of ``slave/download/engines/failures.py``, one line and
secret-free; anything else it raises is a bug (the pipeline fails the task with it, never the
entry). ``close()`` lets go of what it holds. ``traits`` (a row of ``common/engines.TRAITS``,
read by the master too) tells the pipeline which etiquette applies to it: the engine itself knows
nothing of robots.txt, coalescing or site slots.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol

import settings as declared  # the cluster settings' one declaration: their defaults
from common import revisit
from common.engines import Traits
from common.store.records import JobSettings, Prev

Scope = Callable[[str], str | None]  # why a redirect to a URL leaves the job's scope, or None


@dataclass
class Limits:
    """Per-download limits: the worker gives each from the effective settings; a field left out
    takes the declared default of the cluster setting named beside it."""

    timeout: float = float(declared.DOWNLOAD_TIMEOUT)   # total seconds for the whole download
    maxsize: int = declared.DOWNLOAD_MAXSIZE            # body bytes, after decompression
    max_redirects: int = declared.DOWNLOAD_MAX_REDIRECTS
    memory_mb: int = declared.SANDBOX_MEMORY_MB         # sandboxed downloaders: address space
    cpu_seconds: int = declared.SANDBOX_CPU_SECONDS
    max_processes: int = declared.SANDBOX_MAX_PROCESSES
    max_open_files: int = declared.SANDBOX_MAX_OPEN_FILES
    max_file_mb: int = declared.SANDBOX_MAX_FILE_MB
    stderr_bytes: int = declared.SANDBOX_STDERR_BYTES


@dataclass
class Request:
    """One page to fetch, all an engine is given. ``headers`` are the job's (a revisit's
    validators added for the engines that send them); ``previous`` the page's latest version
    (None on a first visit); ``scope`` refuses a redirect out of a following job's scope."""

    url: str
    task_id: str
    attempt: int
    job: str
    limits: Limits
    proxy: str = ""
    cookie: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    user_agent: str = ""
    allow_private: bool = False
    scope: Scope | None = None
    previous: Prev | None = None
    code: str = ""                     # a sandboxed downloader's code
    job_settings: JobSettings | None = None  # all the job's settings (a python downloader is told them)
    js: str = ""                       # the browser's download_js
    slot_left: Callable[[], float] | None = None  # seconds left of the site slot held for it
    cut: Any = None                    # an engines.http.Cut: stops a blocking fetch from outside

    def validators(self) -> dict[str, str]:
        """The revisit's conditional headers (If-None-Match, If-Modified-Since), {} on a first visit."""
        return revisit.validators(self.previous) if self.previous else {}


class Engine(Protocol):
    traits: ClassVar[Traits]

    def __init__(self, blocking: Executor) -> None: ...  # the loop's download threads, to share

    async def fetch(self, request: Request) -> Download: ...

    async def close(self) -> None: ...


@dataclass
class Download:
    """One successful download. ``body`` is the raw bytes, byte-exact."""

    status_code: int
    headers: dict[str, str]
    body: bytes
    url: str
    remote_ip: str = ""
    request_headers: dict[str, str] = field(default_factory=dict)
    request_body: bytes = b""
    encoding: str | None = None
    release: object = None  # a large body holds a slot of the worker's gate until stored: call this then
    links: list[str] | None = None  # the URLs a python downloader returned (None: it returned none)
    links_dropped: int = 0          # those it returned beyond the sandbox's caps
    fetched_at: datetime | None = None  # when the fetch started (naive UTC, the store's clock): WARC-Date
