"""The job as an entry sees it (``JobContext``: its settings, its engine resolved once when the
job is read) and the limits every download runs under."""
from __future__ import annotations

from dataclasses import dataclass, field

from bson import ObjectId

from common.config import settings
from common.engines import Traits, engine_key, traits
from common.jobsettings import Follow, Sitemaps
from common.store.records import JobSettings
from slave.download.engines.base import Limits


@dataclass
class JobContext:
    job_id: ObjectId
    name: str
    status: str
    download_id: ObjectId | None
    language: str  # the downloader type: python, shell or none (the built-in engine)
    code: str
    engine: str
    max_retry_times: int
    settings: JobSettings
    supported: bool = True  # its downloader type's is_support (an administrator may disable a language)
    follow: Follow | None = None  # the job's [follow]: its pages are read for links, the links followed
    sitemaps: Sitemaps | None = None  # the job's [sitemaps]: its sitemap tasks are read as sitemaps
    project: int | None = None  # its project: requests are coalesced only within one
    key: str = field(init=False)  # its engine (``common/engines.py``), resolved once here
    traits: Traits = field(init=False)

    def __post_init__(self) -> None:
        self.key = engine_key(self.language, self.engine)
        self.traits = traits(self.language, self.engine)


def limits_from_settings() -> Limits:
    return Limits(
        timeout=float(settings.DOWNLOAD_TIMEOUT), maxsize=settings.DOWNLOAD_MAXSIZE,
        max_redirects=settings.DOWNLOAD_MAX_REDIRECTS, memory_mb=settings.SANDBOX_MEMORY_MB,
        cpu_seconds=settings.SANDBOX_CPU_SECONDS, max_processes=settings.SANDBOX_MAX_PROCESSES,
        max_open_files=settings.SANDBOX_MAX_OPEN_FILES, max_file_mb=settings.SANDBOX_MAX_FILE_MB,
        stderr_bytes=settings.SANDBOX_STDERR_BYTES,
    )
