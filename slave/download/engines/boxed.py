"""The sandboxed engines: a job's own python or shell downloader, run in the sandbox
(``sandbox.py``) in a download thread. Such a downloader cannot be stopped mid-way: its time
limit is cut to what is left of its site slot when it starts, and it is killed then."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import replace
from typing import ClassVar

from common.engines import TRAITS, Traits
from slave.download.engines import sandbox
from slave.download.engines.base import Download, Limits, Request


def _within_slot(request: Request, run: Callable[[Limits], Download]) -> Download:
    """In a download thread: ``run(limits)``, its time limit cut to what is left of its slot."""
    limits = request.limits
    left = request.slot_left() if request.slot_left is not None else limits.timeout
    return run(replace(limits, timeout=max(0.0, min(limits.timeout, left))))


class PythonEngine:
    """Downloader type ``python``: the job's ``download(task)``, told the task and the page's
    latest version (it may send the validators itself and answer ``{"status_code": 304}``)."""

    traits: ClassVar[Traits] = TRAITS["python"]

    def __init__(self, blocking: Executor) -> None:
        self.blocking = blocking

    @staticmethod
    def task(request: Request) -> dict:
        """What the downloader's ``download(task)`` is given."""
        prev = request.previous
        previous = None if not prev else {
            "etag": prev.etag, "last_modified": prev.last_modified, "sha256": prev.digest,
            "version": prev.versions, "headers": request.validators()}
        return {"url": request.url, "task_id": request.task_id, "job": request.job,
                "attempt": request.attempt,
                "settings": request.job_settings.by_name() if request.job_settings else {},
                "previous": previous}

    async def fetch(self, request: Request) -> Download:
        task = self.task(request)
        return await asyncio.get_running_loop().run_in_executor(
            self.blocking, _within_slot, request, lambda lim: sandbox.run_python(request.code, task, lim))

    async def close(self) -> None:
        pass


class ShellEngine:
    """Downloader type ``shell``: ``/bin/sh -c CODE sh URL``, its stdout the body."""

    traits: ClassVar[Traits] = TRAITS["shell"]

    def __init__(self, blocking: Executor) -> None:
        self.blocking = blocking

    async def fetch(self, request: Request) -> Download:
        def run(lim: Limits) -> Download:
            return sandbox.run_shell(request.code, request.url, lim, request.proxy, request.cookie,
                                     request.allow_private)
        return await asyncio.get_running_loop().run_in_executor(self.blocking, _within_slot, request, run)

    async def close(self) -> None:
        pass
