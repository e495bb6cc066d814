"""The built-in engine on asyncio and aiohttp (``download_engine = "aiohttp"``, the default).

Same contract and limits as the requests engine (slave/download/engines/http.py): one GET under a total
deadline, the body counted after decompression while it streams, redirects followed by hand
so every hop is checked (http/https only, credentials dropped across sites; the path both
engines share, ``engines/rules.py``), and every failure
a one-line, secret-free ``DownloadError`` with the same reasons. Many fetches share one event
loop: a worker process keeps hundreds in flight for a fraction of a millisecond of CPU each.

The addresses a session may reach (``common/netguard.py``) are judged where aiohttp decides
them: its resolver judges every address a name resolves to (the connector connects to exactly
those), and its socket factory judges the address of every socket before it connects (an IP in
a URL skips the resolver). Through a proxy, which resolves names itself, the target is judged
when it is an address.
"""
from __future__ import annotations

import asyncio
import socket
import ssl

import aiohttp
from aiohttp.abc import AbstractResolver
from aiohttp.resolver import DefaultResolver
from multidict import CIMultiDict
from yarl import URL

import settings as declared  # the cluster settings' one declaration: their defaults
from common import netguard
from common.errors import DownloadError, ValidationError
from common.secrets import redact
from slave.download.engines.base import Download, Limits
from slave.download.engines.charset import body_encoding
from slave.download.engines.rules import (
    CONNECT_TIMEOUT,
    Body,
    Redirects,
    Scope,
    classify_status,
    masked,
    one_line,
    secrets_of,
)

__all__ = ["Client", "fetch", "classify_aio"]

ACCEPT_ENCODING = "gzip, deflate"
# Proxy failures raised through aiohttp-socks, matched by name (it is imported only for a proxy).
PROXY_ERROR_NAMES = ("ProxyError", "ProxyConnectionError", "ProxyTimeoutError")


class _GuardedResolver(AbstractResolver):
    """aiohttp's resolver, refusing a name when any address it resolves to is refused."""

    def __init__(self, allow_private: bool, proxied: bool = False) -> None:
        self.judge = _judge_for(allow_private, proxied)
        self._inner = DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET):
        found = await self._inner.resolve(host, port, family)
        for info in found:
            self.judge(info["host"], info["port"])
        return found

    async def close(self) -> None:
        await self._inner.close()


def _judge_for(allow_private: bool, proxied: bool):
    """How a session's connections are judged: a proxy session's go to the job's proxy."""
    if proxied:
        return lambda ip, port: netguard.judge_proxy_peer(ip, port, allow_private)
    return lambda ip, port: netguard.judge(ip, port, allow_private)


def _guarded_socket(allow_private: bool, proxied: bool = False):
    """A socket factory that judges the address each socket is about to connect to."""
    judge = _judge_for(allow_private, proxied)

    def make(addr_info) -> socket.socket:
        family, type_, proto, _, address = addr_info
        judge(address[0], address[1])
        return socket.socket(family, type_, proto)
    return make


class Client:
    """The sessions of one event loop: one pooled session for direct fetches under each rule
    (``allow_private`` or not), one for HTTP proxies under each rule (a private proxy only with
    ``allow_private``, a service of the cluster never), one per SOCKS proxy. Close it when the loop ends."""

    def __init__(self, limit: int = 512) -> None:
        self.limit = limit
        self._sessions: dict[tuple, aiohttp.ClientSession] = {}

    def session(self, proxy: str, allow_private: bool = False) -> aiohttp.ClientSession:
        socks = proxy.lower().startswith("socks")
        key = (proxy,) if socks else ("proxy" if proxy else "", bool(allow_private))
        s = self._sessions.get(key)
        if s is None or s.closed:
            if socks:
                from aiohttp_socks import ProxyConnector

                # socks5h: the proxy resolves names; socks5: we do
                remote_dns = proxy.lower().startswith("socks5h")
                url = "socks5" + proxy[len("socks5h"):] if remote_dns else proxy
                connector: aiohttp.BaseConnector = ProxyConnector.from_url(url, limit=self.limit,
                                                                           rdns=remote_dns)
            else:
                allow, proxied = bool(allow_private), bool(proxy)  # a proxy under the job's rule
                connector = aiohttp.TCPConnector(limit=self.limit, limit_per_host=0, ttl_dns_cache=300,
                                                 resolver=_GuardedResolver(allow, proxied),
                                                 socket_factory=_guarded_socket(allow, proxied))
            s = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                                      trust_env=False, auto_decompress=True,
                                      skip_auto_headers=("User-Agent", "Accept-Encoding"),
                                      timeout=aiohttp.ClientTimeout(total=None))
            self._sessions[key] = s
        return s

    async def close(self) -> None:
        for s in self._sessions.values():
            await s.close()
        self._sessions.clear()


def classify_aio(exc: BaseException) -> DownloadError:
    """The DownloadError for an exception raised by aiohttp or the socket layer."""
    if isinstance(exc, DownloadError):
        return exc
    if isinstance(exc, (aiohttp.InvalidURL, ValidationError)):
        found: tuple[str, bool] | None = (f"invalid URL: {exc}", False)
    else:
        found = _connect_failure(exc) or _transfer_failure(exc)
    reason, retryable = found or (f"{type(exc).__name__}: {exc}", True)
    return DownloadError(redact(one_line(reason)), retryable=retryable)


def _connect_failure(exc: BaseException) -> tuple[str, bool] | None:
    """What went wrong reaching the server (TLS, proxy, DNS, connect), or None."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cert = exc.certificate_error
        return f"TLS certificate error: {getattr(cert, 'verify_message', '') or 'verification failed'}", False
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS error: {exc}", True
    if isinstance(exc, aiohttp.ClientProxyConnectionError) or type(exc).__name__ in PROXY_ERROR_NAMES:
        return "proxy error", True
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return f"DNS lookup failed: {exc.os_error}", True
    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error
        if isinstance(err, ConnectionRefusedError):
            return "connection refused", True
        if isinstance(err, OSError) and err.errno in (-2, -3, -5):
            return f"DNS lookup failed: {err}", True
        return f"connection error: {type(err).__name__}: {err}", True
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect timeout", True
    return None


def _transfer_failure(exc: BaseException) -> tuple[str, bool] | None:
    """What went wrong once connected (timeouts, a broken body, a reset), or a request the
    client refused to send; None when nothing here names it."""
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return "read timeout", True
    if isinstance(exc, aiohttp.ClientPayloadError):
        text = str(exc)
        if "decode" in text.lower() or "compress" in text.lower():
            return "content decoding failed", True
        return f"connection error: ClientPayloadError: {text}", True
    if isinstance(exc, ConnectionResetError) or (
            isinstance(exc, aiohttp.ClientOSError) and isinstance(exc.__cause__, ConnectionResetError)):
        return "connection reset", True
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientResponseError,
                        aiohttp.ClientError, OSError)):
        return f"connection error: {type(exc).__name__}: {exc}", True
    if isinstance(exc, (ValueError, UnicodeError)):
        return f"invalid request: {type(exc).__name__}: {exc}", False
    return None


def _header_ok(value: str) -> bool:
    return "\r" not in value and "\n" not in value and "\0" not in value


LARGE_BODY = 256 * 1024  # a body past this size reads on only while it holds a ``large_gate`` slot


async def fetch(url: str, *, limits: Limits, client: Client, proxy: str = "", cookie: str = "",
                headers: dict | None = None, user_agent: str = declared.DOWNLOAD_USER_AGENT,
                large_gate: asyncio.Semaphore | None = None, allow_private: bool = False,
                scope: Scope | None = None) -> Download:
    """GET ``url`` within ``limits``; a 2xx (or final 3xx) Download, else DownloadError.
    ``allow_private``: loopback, private and link-local addresses may be reached too; ``scope``:
    no redirect it refuses is followed (``Redirects``).
    ``large_gate`` bounds how many bodies over LARGE_BODY a worker holds at once: such a body
    keeps its slot after the fetch (``Download.release`` frees it, once it is stored)."""
    sent = CIMultiDict({"User-Agent": user_agent, "Accept": "*/*", "Accept-Encoding": ACCEPT_ENCODING})
    for k, v in (headers or {}).items():
        sent[str(k)] = str(v)
    if cookie:
        sent["Cookie"] = cookie
    secrets = secrets_of(proxy, cookie, sent)
    try:
        async with asyncio.timeout(limits.timeout):
            return await _fetch(url, limits, sent, proxy, client, large_gate, allow_private, scope)
    except Exception as exc:  # noqa: BLE001 - the contract: only DownloadError leaves, secret-free
        if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ServerTimeoutError):
            # the total deadline
            error = DownloadError(f"timeout after {float(limits.timeout)}s", retryable=True)
        else:
            error = classify_aio(exc)  # a DownloadError passes through
        raise DownloadError(redact(error.reason, secrets), error.retryable, error.retry_after) from None


async def _fetch(url: str, limits: Limits, sent: CIMultiDict, proxy: str, client: Client,
                 large_gate: asyncio.Semaphore | None = None, allow_private: bool = False,
                 scope: Scope | None = None) -> Download:
    redirects = Redirects(url, sent, limits.max_redirects, allow_private, scope)
    if not all(_header_ok(str(k)) and _header_ok(str(v)) for k, v in sent.items()):
        raise DownloadError("invalid request: a header name or value has forbidden characters",
                            retryable=False)
    if proxy:
        await asyncio.get_running_loop().run_in_executor(None, netguard.judge_proxy, proxy,
                                                         allow_private)  # may resolve
    resp = await _follow(redirects, limits, proxy, client, allow_private)
    try:
        error = classify_status(resp.status, resp.headers.get("Retry-After"))
        if error is not None:
            raise error
        return await _read(resp, limits, large_gate)
    finally:
        resp.close()


async def _follow(redirects: Redirects, limits: Limits, proxy: str, client: Client,
                  allow_private: bool) -> aiohttp.ClientResponse:
    """The response at the end of the redirects (each hop's address judged first; credentials
    not carried to another site)."""
    session = client.session(proxy, allow_private)
    http_proxy = proxy if proxy and not proxy.lower().startswith("socks") else None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(CONNECT_TIMEOUT, limits.timeout))
    while True:
        resp = await session.get(URL(redirects.url(), encoded=False), headers=redirects.sent,
                                 allow_redirects=False, proxy=http_proxy, timeout=timeout, ssl=ssl_context())
        location = redirects.location(resp.status, resp.headers)
        if not location:
            return resp
        resp.close()  # the redirect's body is never read
        redirects.follow(location)


async def _read(resp: aiohttp.ClientResponse, limits: Limits,
                large_gate: asyncio.Semaphore | None) -> Download:
    """The body within ``limits.maxsize``; past LARGE_BODY it reads on only holding a slot of
    ``large_gate``, which then travels with the Download (``release``)."""
    peer = _peer(resp)
    body = Body(limits.maxsize, resp.headers)
    held: asyncio.Semaphore | None = None  # large_gate, once a slot of it is taken
    try:
        async for chunk in resp.content.iter_any():
            body.add(chunk)
            if large_gate is not None and held is None and body.size > LARGE_BODY:
                await large_gate.acquire()
                held = large_gate
        data = body.take()
        response_headers = {str(k): str(v) for k, v in resp.headers.items()}
        got = Download(status_code=resp.status, headers=response_headers, body=bytes(data),
                       url=str(resp.url), remote_ip=peer[0] if peer else "",
                       request_headers=masked(resp.request_info.headers),
                       encoding=body_encoding(response_headers, data),
                       release=held.release if held is not None else None)
        held = None  # the slot now travels with the body
        return got
    finally:
        if held is not None:
            held.release()


def _peer(resp: aiohttp.ClientResponse):
    """(ip, port) of the server, best effort: a small body may have released the connection
    already, but its protocol still holds the transport."""
    for holder in (resp.connection, getattr(resp.content, "_protocol", None)):
        transport = getattr(holder, "transport", None)
        if transport is not None:
            peer = transport.get_extra_info("peername")
            if peer:
                return peer
    return None


_ssl: ssl.SSLContext | None = None


def ssl_context() -> ssl.SSLContext:
    """Certificate-verifying context, made once (creating one per request costs milliseconds)."""
    global _ssl
    if _ssl is None:
        _ssl = ssl.create_default_context()
    return _ssl
