"""The browser engine (``download_engine = "browser"``): headless Chromium over the DevTools
protocol (a websocket; Debian's ``chromium``, nothing downloaded at run time).

Per page: a fresh browser context (no cookie leaks between jobs) with the job's proxy, cookie,
headers and user agent; every request paused and checked (http/https only, so a redirect or a
script navigating to ``file://`` is refused), proxy credentials answered, dialogs dismissed,
downloads denied. It waits for the load event and then for the network to be idle (at most
BROWSER_IDLE_MAX), evaluates the job's ``download_js`` (a function body; a returned Promise is
awaited) and stores the script's string result, or else the final DOM, as UTF-8. The main
document's status and headers are recorded and classified like the other engines'.

Addresses (``common/netguard.py``): every paused request's host is resolved and judged before it
may go (an address in the URL as it is; through a proxy only that), and the main document is
refused when the address Chromium reports it came from is. Chromium resolves names itself, so
this is not pinned as the other engines are: a name that changes its answer between the two
lookups can still reach a subresource, never the stored main document.

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
import os
import shutil
import signal
import sys
import tempfile
import time
from urllib.parse import urlsplit

from requests.structures import CaseInsensitiveDict

from common import netguard
from common.errors import AddressRefused, DownloadError, ValidationError
from common.secrets import keeps_credentials, redact
from common.urls import check_url
from slave.download.engines import seccomp, wall
from slave.download.engines.base import Download, Limits
from slave.download.engines.rules import classify_status, masked, secrets_of, too_big
from slave.download.engines.sandbox import box_argv

IDLE_QUIET = 0.25  # seconds without a request in flight that count as "network idle"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# Chromium's net errors (after those named in ``_net_error``) that another try cannot mend
NET_ERRORS_FINAL = ("ERR_INVALID_URL", "ERR_UNSAFE_", "ERR_DISALLOWED_URL_SCHEME", "ERR_CERT_",
                    "ERR_BLOCKED_BY_CLIENT")


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
        self.dead = False

    def _argv(self, exe: str, commands: int, replies: int) -> tuple[list[str], tuple[int, ...]]:
        """The command that starts Chromium, and the fds it must be handed."""
        flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-extensions", "--disable-dev-shm-usage", "--mute-audio", "--hide-scrollbars",
                 "--no-default-browser-check", "--password-store=basic",
                 f"--js-flags=--max-old-space-size={self.memory_mb}", "--remote-debugging-pipe"]
        launch = [sys.executable, "-I", "-S", "-c", LAUNCH]
        if os.geteuid() != 0:  # no box without root (nor a wall): a developer's machine
            self.dir = tempfile.mkdtemp(prefix="downcluster-browser-")
            return (launch + ["-1", str(commands), str(replies), exe, *flags,
                              f"--user-data-dir={self.dir}", "about:blank"], (commands, replies))
        try:  # never render untrusted pages as root, nor where the wall does not hold
            wall.ensure()
        except wall.Unavailable as exc:
            raise DownloadError(f"browser engine: sandbox unavailable on this worker: {exc}",
                                retryable=True) from None
        uid = wall.browser_uid(self.allow_private)
        info, rules = os.open(os.devnull, os.O_WRONLY), seccomp.pipe_fd(unix=True)
        argv = box_argv(info, rules, BOX_TMP_BYTES) + [
            "--chdir", "/tmp", "--", *launch, str(uid), str(commands), str(replies), exe, *flags,
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
                stderr=asyncio.subprocess.DEVNULL, env=env, preexec_fn=child, pass_fds=handed,
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
        try:
            async with asyncio.timeout(30):
                await self.call("Browser.getVersion")
        except (TimeoutError, Crashed):
            self.kill()
            raise DownloadError("browser engine: chromium did not start", retryable=True) from None

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


def _proxy_server(proxy: str) -> tuple[str, str, str]:
    """(proxy server for Chromium without credentials, user, password)."""
    parts = urlsplit(proxy)
    scheme = "socks5" if parts.scheme.startswith("socks") else parts.scheme
    return f"{scheme}://{parts.hostname}:{parts.port or (1080 if scheme == 'socks5' else 80)}", \
        parts.username or "", parts.password or ""


def _net_error(text: str) -> DownloadError:
    if "ERR_CONNECTION_REFUSED" in text:
        return DownloadError("connection refused", retryable=True)
    if "ERR_NAME_NOT_RESOLVED" in text:
        return DownloadError(f"DNS lookup failed: {text}", retryable=True)
    if "ERR_TOO_MANY_REDIRECTS" in text:
        return DownloadError("too many redirects", retryable=False)
    if "ERR_UNSAFE_REDIRECT" in text:
        return DownloadError("redirect to unsupported scheme", retryable=False)
    return DownloadError(f"connection error: {text}", retryable=not any(c in text for c in NET_ERRORS_FINAL))


async def fetch(url: str, *, limits: Limits, pool: Pool, proxy: str = "", cookie: str = "",
                headers: dict | None = None, js: str = "", user_agent: str = "downcluster/1.0",
                idle_max: float = 5.0, allow_private: bool = False) -> Download:
    """Render ``url`` within ``limits``; the DOM (or ``js``'s string result) as a Download.
    ``allow_private``: loopback, private and link-local addresses may be reached too."""
    secrets = secrets_of(proxy, cookie, CaseInsensitiveDict(headers or {}))
    try:
        url = check_url(url)
    except ValidationError as exc:
        raise DownloadError(f"invalid URL: {exc}", retryable=False) from None
    try:
        netguard.judge_url(url, allow_private)
        if proxy:
            await asyncio.get_running_loop().run_in_executor(None, netguard.judge_proxy, proxy)
    except AddressRefused as exc:
        raise DownloadError(redact(exc.reason, secrets), retryable=False) from None
    browser = await pool.acquire(allow_private)
    try:
        async with asyncio.timeout(limits.timeout):
            return await _render(browser, url, limits, proxy, cookie, headers or {}, js, user_agent, idle_max,
                                 allow_private)
    except TimeoutError:
        browser.kill()  # a page that never ends takes its browser with it; the next one is fresh
        raise DownloadError(f"timeout after {float(limits.timeout)}s", retryable=True) from None
    except asyncio.CancelledError:  # stopped from outside (its site slot lost): no request of its goes on
        browser.kill()
        raise
    except Crashed as exc:
        browser.kill()
        raise DownloadError(f"browser crashed: {exc}", retryable=True) from None
    except DownloadError as exc:
        raise DownloadError(redact(exc.reason, secrets), exc.retryable, exc.retry_after) from None
    except Exception as exc:  # noqa: BLE001 - the contract: only DownloadError leaves
        browser.kill()
        reason = redact(f"browser error: {type(exc).__name__}: {exc}", secrets)
        raise DownloadError(reason, retryable=True) from None
    finally:
        browser.pages += 1
        pool.release(browser)


class _Page:
    """The state of one page load, fed with the DevTools events of its session."""

    def __init__(self, b: Browser, session: str, limits: Limits, user: str, password: str,
                 allow_private: bool = False, proxied: bool = False, site: str = "",
                 headers: dict | None = None) -> None:
        self.b, self.session, self.limits = b, session, limits
        self.user, self.password = user, password
        self.site, self.headers = site, headers or {}  # the job's headers go to the task's site only
        self.allow_private, self.proxied = allow_private, proxied
        self.judged: dict[tuple[str, int], str | None] = {}  # (host, port): why refused, or None
        self.main_frame = self.loader = None
        self.response: dict = {}
        self.refused: list[str] = []
        self.inflight: set[str] = set()
        self.redirects = 0
        self.loaded_at: float | None = None
        self.idle_since: float | None = None

    def failed_navigation(self, text: str) -> DownloadError:
        refused = next((why for why in self.judged.values() if why), None)
        if refused and "ERR_ADDRESS_UNREACHABLE" in text:
            return AddressRefused(refused)
        if self.refused:
            return DownloadError(f"redirect to unsupported scheme {self.refused[0]!r}", retryable=False)
        return _net_error(text)

    async def on(self, ev: dict) -> None:  # noqa: C901 - one branch per event
        b, session = self.b, self.session
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Inspector.targetCrashed":
            raise DownloadError("page crashed (out of memory?)", retryable=True)
        if method == "Fetch.requestPaused":
            scheme = urlsplit(p["request"]["url"]).scheme.lower()
            if scheme in ("http", "https") and await self.refusal(p["request"]["url"]):
                await b.call("Fetch.failRequest",
                             {"requestId": p["requestId"], "errorReason": "AddressUnreachable"}, session)
            elif scheme in ("http", "https", "data", "blob"):
                await b.call("Fetch.continueRequest", self.continued(p), session)
            else:  # file:, chrome:, ftp: ... never
                self.refused.append(scheme)
                await b.call("Fetch.failRequest",
                             {"requestId": p["requestId"], "errorReason": "BlockedByClient"}, session)
        elif method == "Fetch.authRequired":
            if p.get("authChallenge", {}).get("source") == "Proxy" and self.user:
                answer = {"response": "ProvideCredentials", "username": self.user, "password": self.password}
            else:
                answer = {"response": "CancelAuth"}
            await b.call("Fetch.continueWithAuth",
                         {"requestId": p["requestId"], "authChallengeResponse": answer}, session)
        elif method == "Page.javascriptDialogOpening":
            await b.call("Page.handleJavaScriptDialog", {"accept": False}, session)
        elif method == "Network.requestWillBeSent":
            self.inflight.add(p["requestId"])
            if p.get("type") == "Document" and p.get("frameId") == self.main_frame and self.loaded_at is None:
                if p.get("redirectResponse"):
                    self.redirects += 1
                    if self.redirects > self.limits.max_redirects:
                        raise DownloadError(f"too many redirects (more than {self.limits.max_redirects})",
                                            retryable=False)
                self.loader = p["requestId"]
        elif method == "Network.responseReceived":
            if p.get("type") == "Document" and p.get("frameId") == self.main_frame and self.loaded_at is None:
                self.response = p["response"]
                ip = netguard.parse_ip(str(self.response.get("remoteIPAddress") or ""))
                if ip is not None and not self.proxied:  # where the stored page really came from
                    why = netguard.refusal(ip, int(self.response.get("remotePort") or 0), self.allow_private)
                    if why:
                        raise AddressRefused(why)
        elif method in ("Network.loadingFinished", "Network.loadingFailed"):
            self.inflight.discard(p["requestId"])
            if method == "Network.loadingFailed" and p["requestId"] == self.loader and not self.response:
                raise self.failed_navigation(p.get("errorText", "failed"))
        elif method == "Page.loadEventFired":
            self.loaded_at = time.monotonic()

    def continued(self, paused: dict) -> dict:
        """Fetch.continueRequest's parameters for a paused request: the job's headers added when
        it goes to the task's own site (each redirect hop is paused and judged anew)."""
        request = paused["request"]
        if not self.headers or not keeps_credentials(self.site, request["url"]):
            return {"requestId": paused["requestId"]}
        merged = {str(k): str(v) for k, v in (request.get("headers") or {}).items()
                  if str(k).lower() not in {h.lower() for h in self.headers}}
        merged.update(self.headers)
        return {"requestId": paused["requestId"],
                "headers": [{"name": k, "value": v} for k, v in merged.items()]}

    async def refusal(self, url: str) -> str | None:
        """Why a request to ``url`` may not go (its host judged once per page), or None."""
        parts = urlsplit(url)
        try:
            host, port = parts.hostname or "", parts.port or (443 if parts.scheme.lower() == "https" else 80)
        except ValueError:
            return None  # Chromium refuses it itself
        if (host, port) not in self.judged:
            why = None
            try:
                netguard.judge_literal(host, port, self.allow_private)
                if not self.proxied and netguard.parse_ip(host) is None:
                    await asyncio.get_running_loop().run_in_executor(
                        None, netguard.resolve, host, port, self.allow_private)
            except AddressRefused as exc:
                why = exc.reason
            except OSError:  # does not resolve: Chromium says so
                pass
            self.judged[(host, port)] = why
        return self.judged[(host, port)]

    def settled(self, idle_max: float) -> bool:
        """Loaded, and the network idle for IDLE_QUIET seconds (or idle_max passed since load)."""
        if self.loaded_at is None:
            return False
        now = time.monotonic()
        self.idle_since = (self.idle_since or now) if not self.inflight else None
        quiet = self.idle_since is not None and now - self.idle_since >= IDLE_QUIET
        return quiet or now - self.loaded_at >= idle_max


async def _render(b: Browser, url: str, limits: Limits, proxy: str, cookie: str, headers: dict, js: str,
                  user_agent: str, idle_max: float, allow_private: bool = False) -> Download:
    ctx_params: dict = {"disposeOnDetach": True}
    user = password = ""
    if proxy:
        ctx_params["proxyServer"], user, password = _proxy_server(proxy)
    ctx = (await b.call("Target.createBrowserContext", ctx_params))["browserContextId"]
    created = await b.call("Target.createTarget", {"url": "about:blank", "browserContextId": ctx})
    target = created["targetId"]
    session = (await b.call("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
    events = b.listen(session)
    extra = {str(k): str(v) for k, v in headers.items() if str(k).lower() != "cookie"}
    page = _Page(b, session, limits, user, password, allow_private, bool(proxy), url, extra)
    navigating = None
    try:
        await _prepare(b, ctx, session, user_agent, url, cookie)
        page.main_frame = (await b.call("Page.getFrameTree", session=session))["frameTree"]["frame"]["id"]
        # the navigation's own request waits in Fetch: answer events while Page.navigate runs
        navigating = asyncio.ensure_future(b.call("Page.navigate", {"url": url}, session))
        while not page.settled(idle_max):
            if navigating is not None and navigating.done():
                nav, navigating = navigating.result(), None
                if nav.get("errorText"):
                    raise page.failed_navigation(nav["errorText"])
            try:
                ev = await asyncio.wait_for(events.get(), 0.1)
            except TimeoutError:
                continue
            await page.on(ev)
        response = page.response
        if not response:
            raise DownloadError("no response for the page", retryable=True)
        status = int(response.get("status", 0))
        error = classify_status(status, CaseInsensitiveDict(response.get("headers") or {}).get("Retry-After"))
        if error is not None:
            raise error
        body = await _answering(page, events, _result(b, session, js))
        if len(body) > limits.maxsize:
            raise too_big(limits.maxsize)
        sent = {"User-Agent": user_agent, **headers, **({"Cookie": cookie} if cookie else {})}
        return _download(response, status, body, url, sent)
    finally:
        if navigating is not None:
            navigating.cancel()
        b.forget(session)
        try:
            await b.call("Target.disposeBrowserContext", {"browserContextId": ctx})
        except Exception:  # noqa: BLE001 - the browser may be gone; it is restarted then
            pass


def _download(response: dict, status: int, body: bytes, url: str, sent: dict) -> Download:
    """The page's Download: its response's headers and address, the DOM the browser built
    (serialised by us as UTF-8), the request's headers with secrets masked."""
    got = {str(k): str(v) for k, v in (response.get("headers") or {}).items()}
    return Download(status_code=status, headers=got, body=body, url=response.get("url") or url,
                    remote_ip=response.get("remoteIPAddress", ""), request_headers=masked(sent),
                    encoding="utf-8")


async def _prepare(b: Browser, ctx: str, session: str, user_agent: str, url: str, cookie: str) -> None:
    """A new page's set-up: downloads refused, the domains it reports, every request paused in
    Fetch (to be judged, and given the job's headers when it goes to the task's site), the user
    agent, and the job's cookie as host-only cookies of the task's URL (the browser sends them
    to that host alone)."""
    await b.call("Browser.setDownloadBehavior", {"behavior": "deny", "browserContextId": ctx})
    for method in ("Page.enable", "Network.enable", "Runtime.enable"):
        await b.call(method, session=session)
    await b.call("Fetch.enable", {"handleAuthRequests": True, "patterns": [{"urlPattern": "*"}]}, session)
    await b.call("Network.setUserAgentOverride", {"userAgent": user_agent}, session)
    cookies = _cookies(cookie, url)
    if cookies:
        await b.call("Network.setCookies", {"cookies": cookies}, session)


def _cookies(cookie: str, url: str) -> list[dict]:
    """A raw Cookie header (``a=1; b=2``) as DevTools cookies bound to ``url``'s host and path
    ``/`` (no Domain attribute: host-only)."""
    parts = urlsplit(url)
    origin = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}/"
    found = []
    for pair in cookie.split(";"):
        name, eq, value = pair.strip().partition("=")
        if not eq:  # a bare value is a cookie with an empty name, as browsers read "Cookie: x"
            name, value = "", name
        if name or value:
            found.append({"name": name.strip(), "value": value.strip(), "url": origin, "path": "/"})
    return found


async def _answering(page: _Page, events: asyncio.Queue, work):
    """``work``'s result, the page's events answered meanwhile: a request the script makes waits
    paused in Fetch until it is continued or refused."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            getter = asyncio.ensure_future(events.get())
            done, _ = await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                await page.on(getter.result())
            else:
                getter.cancel()
            if task.done():
                return task.result()
    finally:
        task.cancel()


async def _result(b: Browser, session: str, js: str) -> bytes:
    """``js``'s string result, else the DOM, as UTF-8."""
    if js:
        expression = f"(async () => {{\n{js}\n}})()"
        got = await b.call("Runtime.evaluate",
                           {"expression": expression, "awaitPromise": True, "returnByValue": True}, session)
        if got.get("exceptionDetails"):
            details = got["exceptionDetails"]
            text = (details.get("exception") or {}).get("description") or details.get("text", "exception")
            raise DownloadError(f"download_js error: {' '.join(str(text).split())[:300]}", retryable=False)
        value = (got.get("result") or {}).get("value")
        if isinstance(value, str):
            return value.encode("utf-8")
    got = await b.call("Runtime.evaluate", {"expression": "document.documentElement.outerHTML",
                                            "returnByValue": True}, session)
    return str((got.get("result") or {}).get("value") or "").encode("utf-8")
