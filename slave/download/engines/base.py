"""What every downloader engine returns, and the limits it runs under."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Limits:
    """Per-download limits, taken from settings by the job function."""

    timeout: float = 300.0          # total seconds for the whole download
    maxsize: int = 64 * 1024 * 1024  # body bytes, after decompression
    max_redirects: int = 10
    memory_mb: int = 1024            # sandboxed downloaders: address space
    cpu_seconds: int = 300
    max_processes: int = 64
    max_open_files: int = 256
    max_file_mb: int = 64
    stderr_bytes: int = 4096


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
