"""The browser engine (``download_engine = "browser"``): headless Chromium over the DevTools
protocol (a pipe; Debian's ``chromium``, nothing downloaded at run time).

Per page: a fresh browser context (no cookie leaks between jobs) with the job's proxy, cookie,
headers and user agent; every request paused and checked (``browser_page.py``: http/https only,
each host's address judged, the job's headers to the task's site alone, the cookie host-only),
dialogs dismissed, downloads denied. It waits for the load event and then for the network to be
idle (at most BROWSER_IDLE_MAX), evaluates the job's ``download_js`` (a function body; a returned
Promise is awaited) and stores the script's string result, or else the final DOM, as UTF-8. The
main document's status and headers are recorded and classified like the other engines'.

The browsers themselves, their box, their pipe and their pool are ``chromium.py``'s.
"""
from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from requests.structures import CaseInsensitiveDict

from common import netguard
from common.errors import AddressRefused, DownloadError, ValidationError
from common.secrets import redact
from common.urls import check_url
from slave.download.engines.base import Download, Limits
from slave.download.engines.browser_page import Page, answering, prepare
from slave.download.engines.chromium import Browser, Crashed, Pool
from slave.download.engines.rules import Scope, classify_status, masked, secrets_of, too_big


def _proxy_server(proxy: str) -> tuple[str, str, str]:
    """(proxy server for Chromium without credentials, user, password)."""
    parts = urlsplit(proxy)
    scheme = "socks5" if parts.scheme.startswith("socks") else parts.scheme
    return f"{scheme}://{parts.hostname}:{parts.port or (1080 if scheme == 'socks5' else 80)}", \
        parts.username or "", parts.password or ""


async def fetch(url: str, *, limits: Limits, pool: Pool, proxy: str = "", cookie: str = "",
                headers: dict | None = None, js: str = "", user_agent: str = "downcluster/1.0",
                idle_max: float = 5.0, allow_private: bool = False, scope: Scope | None = None) -> Download:
    """Render ``url`` within ``limits``; the DOM (or ``js``'s string result) as a Download.
    ``allow_private``: loopback, private and link-local addresses may be reached too; ``scope``:
    no redirect of the page it refuses is followed."""
    secrets = secrets_of(proxy, cookie, CaseInsensitiveDict(headers or {}))
    try:
        url = check_url(url)
    except ValidationError as exc:
        raise DownloadError(f"invalid URL: {exc}", retryable=False) from None
    try:
        netguard.judge_url(url, allow_private)
        if proxy:
            await asyncio.get_running_loop().run_in_executor(None, netguard.judge_proxy, proxy, allow_private)
    except AddressRefused as exc:
        raise DownloadError(redact(exc.reason, secrets), retryable=False) from None
    browser = await pool.acquire(allow_private)
    try:
        async with asyncio.timeout(limits.timeout):
            return await _render(browser, url, limits, proxy, cookie, headers or {}, js, user_agent, idle_max,
                                 allow_private, scope)
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


async def _render(b: Browser, url: str, limits: Limits, proxy: str, cookie: str, headers: dict, js: str,
                  user_agent: str, idle_max: float, allow_private: bool = False,
                  scope: Scope | None = None) -> Download:
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
    page = Page(b, session, limits, user, password, allow_private, bool(proxy), url, extra, scope)
    navigating = None
    try:
        await prepare(b, ctx, session, user_agent, url, cookie)
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
        body = await answering(page, events, _result(b, session, js))
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
