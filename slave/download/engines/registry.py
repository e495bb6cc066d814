"""The engines a worker knows, by the key ``common/engines.engine_key`` gives a job (its
downloader type and, for the built-in ones, its ``download_engine``); a job's key is resolved once,
when its context is read (``JobContext.key``).

Adding an engine: a row of ``common/engines.TRAITS`` and a class here, each engine's
``traits`` being its row (``tests/unit/test_engine_seam.py`` holds the two together).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from common.config import settings
from slave.download.engines.aio import AioEngine
from slave.download.engines.base import Engine
from slave.download.engines.boxed import PythonEngine, ShellEngine
from slave.download.engines.browser import BrowserEngine
from slave.download.engines.http import RequestsEngine

REGISTERED: dict[str, type[Engine]] = {
    "aiohttp": AioEngine, "requests": RequestsEngine, "browser": BrowserEngine,
    "python": PythonEngine, "shell": ShellEngine,
}


class Engines:
    """One of each registered engine for one event loop, the blocking ones (requests, the
    sandboxes) sharing DOWNLOAD_CONCURRENCY download threads."""

    def __init__(self) -> None:
        self.blocking = ThreadPoolExecutor(max_workers=settings.DOWNLOAD_CONCURRENCY,
                                           thread_name_prefix="download")
        self.running: dict[str, Engine] = {key: cls(self.blocking) for key, cls in REGISTERED.items()}

    def __getitem__(self, key: str) -> Engine:
        return self.running[key]

    async def close(self) -> None:
        for engine in self.running.values():
            await engine.close()
        self.blocking.shutdown(wait=False, cancel_futures=True)
