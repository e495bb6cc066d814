"""What every downloader engine returns, and the limits it runs under."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import settings as declared  # the cluster settings' one declaration: their defaults


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
