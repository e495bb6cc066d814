"""Chromium for the browser engine: found, launched in a box of its own, driven over the DevTools
pipe, and kept in a pool per worker.

Each worker keeps a pool of BROWSER_POOL browsers, each in its own process group, dying with
the worker (PR_SET_PDEATHSIG) and run as an unprivileged uid when the worker is root. A
browser is restarted after BROWSER_MAX_PAGES pages, when it crashes, and (killed with its whole
group) when a page overruns DOWNLOAD_TIMEOUT; V8's heap is capped per page (BROWSER_MEMORY_MB).
"""
from __future__ import annotations

import asyncio
import ctypes
import fcntl
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import tempfile

from common.errors import DownloadError
from common.secrets import redact
from slave.download.engines import seccomp, wall
from slave.download.engines.sandbox import box_argv, interpreter

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
STDERR_TAIL = 4096  # the bytes of a browser's stderr kept, to say why it did not start
logger = logging.getLogger(__name__)


class Crashed(Exception):
    """The browser or the page's renderer went away."""


def chromium_path() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


# Run inside the box as root, before Chromium: the DevTools pipe onto fds 3 and 4 (where
# ``--remote-debugging-pipe`` looks), every other fd closed, then the browser's uid for good.
LAUNCH = ("import os,sys\n"
          "u,c,r=map(int,sys.argv[1:4])\n"
          "os.dup2(c,3);os.dup2(r,4);os.closerange(5,1<<16)\n"
          "if u>=0:\n os.setgroups([]);os.setresgid(u,u,u);os.setresuid(u,u,u)\n"
          "os.execv(sys.argv[4],sys.argv[4:])\n")
PIPE_LIMIT = 1 << 30  # the largest DevTools message read (a DOM within DOWNLOAD_MAXSIZE, as JSON)
BOX_TMP_BYTES = 1 << 30  # the box's /tmp (the profile and Chromium's caches)


def _high_fd(fd: int) -> int:
    """``fd`` moved to a number of at least 10 (so putting the pipe on 3 and 4 clobbers neither)."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Browser:
    """One headless Chromium in a box of its own, driven over a pipe (DevTools' ``--remote-
    debugging-pipe``: no port any other process could reach), for jobs with ``allow_private``
    or for those without: its uid is walled as their downloaders' are (``wall.browser_uid``)."""

    def __init__(self, memory_mb: int, allow_private: bool = False) -> None:
        self.memory_mb = memory_mb
        self.allow_private = allow_private
        self.proc: asyncio.subprocess.Process | None = None
        self.dir = ""  # the profile, where there is no box (a worker not run as root)
        self.out: asyncio.WriteTransport | None = None  # set by start()
        self.pages = 0
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._listeners: dict[str, asyncio.Queue] = {}
        self._reader: asyncio.Task | None = None
        self._stderr: asyncio.Task | None = None
        self.stderr_tail = b""
        self.dead = False

    def _argv(self, exe: str, commands: int, replies: int) -> tuple[list[str], tuple[int, ...]]:
        """The command that starts Chromium, and the fds it must be handed."""
        flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
                 "--no-default-browser-check", "--password-store=basic",
                 f"--js-flags=--max-old-space-size={self.memory_mb}", "--remote-debugging-pipe"]
        if os.geteuid() != 0:  # no box without root (nor a wall): a developer's machine
            self.dir = tempfile.mkdtemp(prefix="downcluster-browser-")
            return ([sys.executable, "-I", "-S", "-c", LAUNCH, "-1", str(commands), str(replies), exe, *flags,
                     f"--user-data-dir={self.dir}", "about:blank"], (commands, replies))
        try:  # never render untrusted pages as root, nor where the wall does not hold
            wall.ensure()
        except wall.Unavailable as exc:
            raise DownloadError(f"browser engine: sandbox unavailable on this worker: {exc}",
                                retryable=True) from None
        uid = wall.browser_uid(self.allow_private)
        info, rules = os.open(os.devnull, os.O_WRONLY), seccomp.pipe_fd(unix=True)
        python = interpreter()  # the python downloaders' own, which the box mounts as theirs
        argv = box_argv(info, rules, BOX_TMP_BYTES, python) + [
            "--chdir", "/tmp", "--", python, "-I", "-S", "-c", LAUNCH, str(uid), str(commands), str(replies),
            exe, *flags,
            "--user-data-dir=/tmp/profile", "about:blank"]
        return argv, (commands, replies, info, rules)

    async def start(self) -> None:
        exe = chromium_path()
        if exe is None:
            raise DownloadError("browser engine: chromium is not installed (apt-get install chromium)",
                                retryable=True)
        commands_r, commands_w = os.pipe()
        replies_r, replies_w = os.pipe()
        commands_r, replies_w = _high_fd(commands_r), _high_fd(replies_w)
        handed: tuple[int, ...] = (commands_r, replies_w)
        try:
            argv, handed = self._argv(exe, commands_r, replies_w)

            def child() -> None:
                os.setsid()  # its own process group, killed as a whole
                ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: dies with us

            env = {"HOME": self.dir or "/tmp", "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env=env, preexec_fn=child, pass_fds=handed,
                cwd=self.dir or "/")
        except BaseException:  # not started: our ends of the pipe go too
            os.close(commands_w)
            os.close(replies_r)
            raise
        finally:
            for fd in set(handed) | {commands_r, replies_w}:
                os.close(fd)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=PIPE_LIMIT)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                     os.fdopen(replies_r, "rb", 0))
        self.out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(commands_w, "wb", 0))
        self._reader = asyncio.create_task(self._read(reader))
        assert self.proc.stderr is not None
        self._stderr = asyncio.create_task(self._keep_stderr(self.proc.stderr))
        try:
            async with asyncio.timeout(30):
                await self.call("Browser.getVersion")
        except (TimeoutError, Crashed):
            self.kill()
            raise DownloadError(await self._not_started(), retryable=True) from None

    async def _keep_stderr(self, stream: asyncio.StreamReader) -> None:
        """Read the browser's (and its box's) stderr for its whole life, keeping the last
        STDERR_TAIL bytes (a pipe nobody reads would stall it)."""
        while chunk := await stream.read(65536):
            self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL:]

    async def _not_started(self) -> str:
        """Why the browser did not start: the last lines of its stderr (bubblewrap's too),
        secrets masked; also logged."""
        if self._stderr is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._stderr), 2)  # what it wrote before dying
            except (TimeoutError, asyncio.CancelledError):
                pass
        text = self.stderr_tail.decode("utf-8", "replace")
        lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
        tail = redact(" | ".join(lines[-3:]))[-600:]
        logger.warning("browser engine: chromium did not start; its stderr ends: %s", tail or "(nothing)")
        return "browser engine: chromium did not start" + (f": {tail}" if tail else " (its stderr is empty)")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                try:
                    raw = await reader.readuntil(b"\0")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                    break
                data = json.loads(raw[:-1])
                if "id" in data:
                    fut = self._pending.pop(data["id"], None)
                    if fut and not fut.done():
                        fut.set_result(data)
                else:
                    queue = self._listeners.get(data.get("sessionId", ""))
                    if queue is not None:
                        queue.put_nowait(data)
        finally:
            self.dead = True
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(Crashed("the browser went away"))
            for queue in self._listeners.values():
                queue.put_nowait({"method": "Inspector.targetCrashed"})

    async def call(self, method: str, params: dict | None = None, session: str = "") -> dict:
        if self.dead or self.out is None or self.out.is_closing():
            raise Crashed("the browser went away")
        msg_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        msg = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self.out.write(json.dumps(msg).encode() + b"\0")
        reply = await fut
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error'].get('message', reply['error'])}")
        return reply.get("result", {})

    def listen(self, session: str) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue()
        self._listeners[session] = queue
        return queue

    def forget(self, session: str) -> None:
        self._listeners.pop(session, None)

    async def close(self) -> None:
        self.kill()
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except (TimeoutError, ProcessLookupError):
                pass
        if self._stderr is not None:
            self._stderr.cancel()

    def kill(self) -> None:
        """SIGKILL the whole process group (the box goes with it) and forget the pipe."""
        self.dead = True
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self._reader is not None:
            self._reader.cancel()
        if self.out is not None:
            self.out.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class Pool:
    """At most BROWSER_POOL browsers per worker, one page at a time each, started on first use;
    a browser serves jobs of one kind (``allow_private`` or not), and an idle one of the other
    kind gives way when a page needs room."""

    def __init__(self, size: int = 2, max_pages: int = 100, memory_mb: int = 512) -> None:
        self.size, self.max_pages, self.memory_mb = size, max_pages, memory_mb
        self._slots: asyncio.Semaphore | None = None
        self._idle: dict[bool, list[Browser]] = {False: [], True: []}
        self._busy = 0

    async def acquire(self, allow_private: bool = False) -> Browser:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        await self._slots.acquire()
        self._busy += 1
        try:
            idle = self._idle[allow_private]
            while idle:
                browser = idle.pop()
                if not browser.dead and browser.pages < self.max_pages:
                    return browser
                browser.kill()
            other = self._idle[not allow_private]
            if other and self._busy + len(other) > self.size:
                other.pop(0).kill()
            browser = Browser(self.memory_mb, allow_private)
            await browser.start()
            return browser
        except BaseException:
            self._busy -= 1
            self._slots.release()
            raise

    def release(self, browser: Browser) -> None:
        assert self._slots is not None, "release follows acquire"
        if browser.dead:
            browser.kill()
        else:
            self._idle[browser.allow_private].append(browser)
        self._busy -= 1
        self._slots.release()

    def idle(self, allow_private: bool) -> list[Browser]:
        """The idle browsers of one kind (most recently used last)."""
        return list(self._idle[allow_private])

    async def close(self) -> None:
        for kind in (False, True):
            while self._idle[kind]:
                await self._idle[kind].pop().close()

