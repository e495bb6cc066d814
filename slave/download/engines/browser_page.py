"""One page of the browser engine in its DevTools session: set up (downloads denied, every request
paused, the job's cookie host-only), then fed the session's events, each answered.

Requests (``Fetch.requestPaused``): http/https only, so a redirect or a script navigating to
``file://`` is refused; the job's headers are added to requests to the task's own site alone;
a following job's page is not redirected out of its scope (the hop refused before it goes);
proxy credentials answered, dialogs dismissed.

Addresses (``common/netguard.py``): every paused request's host is resolved and judged before it
may go (an address in the URL as it is; through a proxy only that), and the main document is
refused when the address Chromium reports it came from is. Chromium resolves names itself, so
this is not pinned as the other engines are: a name that changes its answer between the two
lookups can still reach a subresource, never the stored main document.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Awaitable, Callable
from urllib.parse import urlsplit

from common import netguard
from common.errors import AddressRefused, DownloadError
from common.secrets import keeps_credentials
from slave.download.engines.failures import BadResponse, ConnectFailed, Invalid, TooManyRedirects
from slave.download.engines.rules import out_of_scope

if TYPE_CHECKING:
    from slave.download.engines.base import Limits
    from slave.download.engines.chromium import Browser
    from slave.download.engines.rules import Scope

IDLE_QUIET = 0.25  # seconds without a request in flight that count as "network idle"
# Chromium's net errors (after those named in ``_net_error``) that another try cannot mend
NET_ERRORS_FINAL = ("ERR_INVALID_URL", "ERR_UNSAFE_", "ERR_DISALLOWED_URL_SCHEME", "ERR_CERT_",
                    "ERR_BLOCKED_BY_CLIENT")


def _net_error(text: str) -> DownloadError:
    if "ERR_CONNECTION_REFUSED" in text:
        return ConnectFailed("connection refused", retryable=True)
    if "ERR_NAME_NOT_RESOLVED" in text:
        return ConnectFailed(f"DNS lookup failed: {text}", retryable=True)
    if "ERR_TOO_MANY_REDIRECTS" in text:
        return TooManyRedirects("too many redirects", retryable=False)
    if "ERR_UNSAFE_REDIRECT" in text:
        return Invalid("redirect to unsupported scheme", retryable=False)
    return ConnectFailed(f"connection error: {text}", retryable=not any(c in text for c in NET_ERRORS_FINAL))


class Page:
    """The state of one page load, fed with the DevTools events of its session."""

    def __init__(self, b: Browser, session: str, limits: Limits, user: str, password: str,
                 allow_private: bool = False, proxied: bool = False, site: str = "",
                 headers: dict | None = None, scope: Scope | None = None) -> None:
        self.b, self.session, self.limits = b, session, limits
        self.user, self.password = user, password
        self.site, self.headers = site, headers or {}  # the job's headers go to the task's site only
        self.allow_private, self.proxied = allow_private, proxied
        self.judged: dict[tuple[str, int], str | None] = {}  # (host, port): why refused, or None
        self.main_frame = self.loader = None
        self.response: dict = {}
        self.refused: list[str] = []
        self.scope = scope
        self.out_of_scope: DownloadError | None = None  # a redirect of the page out of the job's scope
        self.inflight: set[str] = set()
        self.redirects = 0
        self.loaded_at: float | None = None
        self.idle_since: float | None = None

    def failed_navigation(self, text: str) -> DownloadError:
        if self.out_of_scope is not None:
            return self.out_of_scope
        refused = next((why for why in self.judged.values() if why), None)
        if refused and "ERR_ADDRESS_UNREACHABLE" in text:
            return AddressRefused(refused)
        if self.refused:
            return Invalid(f"redirect to unsupported scheme {self.refused[0]!r}", retryable=False)
        return _net_error(text)

    async def on(self, ev: dict) -> None:
        """Answer one event of the session: its handler in ``EVENTS``; any other is not ours."""
        handler = EVENTS.get(ev.get("method") or "")
        if handler is not None:
            await handler(self, ev.get("params", {}))

    async def _crashed(self, p: dict) -> None:  # Inspector.targetCrashed
        raise BadResponse("page crashed (out of memory?)", retryable=True)

    async def _paused(self, p: dict) -> None:  # Fetch.requestPaused
        """http(s) goes if its address may be reached, data: and blob: go, any other scheme never."""
        b, session = self.b, self.session
        scheme = urlsplit(p["request"]["url"]).scheme.lower()
        if self.redirected_out(p):
            await b.call("Fetch.failRequest",
                         {"requestId": p["requestId"], "errorReason": "BlockedByClient"}, session)
        elif scheme in ("http", "https") and await self.refusal(p["request"]["url"]):
            await b.call("Fetch.failRequest",
                         {"requestId": p["requestId"], "errorReason": "AddressUnreachable"}, session)
        elif scheme in ("http", "https", "data", "blob"):
            await b.call("Fetch.continueRequest", self.continued(p), session)
        else:  # file:, chrome:, ftp: ... never
            self.refused.append(scheme)
            await b.call("Fetch.failRequest",
                         {"requestId": p["requestId"], "errorReason": "BlockedByClient"}, session)

    async def _auth(self, p: dict) -> None:  # Fetch.authRequired
        """The proxy's challenge answered with the job's credentials; a site's cancelled."""
        if p.get("authChallenge", {}).get("source") == "Proxy" and self.user:
            answer = {"response": "ProvideCredentials", "username": self.user, "password": self.password}
        else:
            answer = {"response": "CancelAuth"}
        await self.b.call("Fetch.continueWithAuth",
                          {"requestId": p["requestId"], "authChallengeResponse": answer}, self.session)

    async def _dialog(self, p: dict) -> None:  # Page.javascriptDialogOpening
        await self.b.call("Page.handleJavaScriptDialog", {"accept": False}, self.session)

    def _main_document(self, p: dict) -> bool:
        """Whether a network event is of the main frame's document, before the page loaded."""
        return p.get("type") == "Document" and p.get("frameId") == self.main_frame and self.loaded_at is None

    async def _request(self, p: dict) -> None:  # Network.requestWillBeSent
        self.inflight.add(p["requestId"])
        if self._main_document(p):
            if p.get("redirectResponse"):
                self.redirects += 1
                if self.redirects > self.limits.max_redirects:
                    raise TooManyRedirects(f"too many redirects (more than {self.limits.max_redirects})",
                                        retryable=False)
                # the hop's request, if paused before this event told of it, was refused there
                refused = out_of_scope(self.scope, p["request"]["url"])
                if refused is not None:
                    raise refused
            self.loader = p["requestId"]

    async def _response(self, p: dict) -> None:  # Network.responseReceived
        """The main document's response, refused when the address it came from is."""
        if not self._main_document(p):
            return
        self.response = p["response"]
        ip = netguard.parse_ip(str(self.response.get("remoteIPAddress") or ""))
        if ip is not None and not self.proxied:  # where the stored page really came from
            why = netguard.refusal(ip, int(self.response.get("remotePort") or 0), self.allow_private)
            if why:
                raise AddressRefused(why)

    async def _finished(self, p: dict) -> None:  # Network.loadingFinished
        self.inflight.discard(p["requestId"])

    async def _failed(self, p: dict) -> None:  # Network.loadingFailed
        self.inflight.discard(p["requestId"])
        if p["requestId"] == self.loader and not self.response:
            raise self.failed_navigation(p.get("errorText", "failed"))

    async def _loaded(self, p: dict) -> None:  # Page.loadEventFired
        self.loaded_at = time.monotonic()

    def redirected_out(self, paused: dict) -> bool:
        """Whether a paused request is a redirect of the page out of the job's scope (noted in
        ``out_of_scope``: the navigation then fails with it)."""
        if self.scope is None or not paused.get("redirectedRequestId") \
                or paused.get("resourceType") != "Document" or paused.get("frameId") != self.main_frame:
            return False
        self.out_of_scope = out_of_scope(self.scope, paused["request"]["url"])
        return self.out_of_scope is not None

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


# The events a page answers, one handler each (``Page.on``).
EVENTS: dict[str, Callable[[Page, dict], Awaitable[None]]] = {
    "Inspector.targetCrashed": Page._crashed,
    "Fetch.requestPaused": Page._paused,
    "Fetch.authRequired": Page._auth,
    "Page.javascriptDialogOpening": Page._dialog,
    "Network.requestWillBeSent": Page._request,
    "Network.responseReceived": Page._response,
    "Network.loadingFinished": Page._finished,
    "Network.loadingFailed": Page._failed,
    "Page.loadEventFired": Page._loaded,
}


async def prepare(b: Browser, ctx: str, session: str, user_agent: str, url: str, cookie: str) -> None:
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


async def answering(page: Page, events: asyncio.Queue, work):
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

