"""The built-in engine (downloader type "none"): one GET with requests under a total deadline,
a body-size cap counted after decompression, and redirects followed by hand so every hop is
checked (both on the path every built-in engine shares: ``engines/rules.py``). Everything that
goes wrong comes out as a one-line, secret-free ``DownloadError``.

Every connection is judged on the address it reached (``common/netguard.py``) before a byte of
a request goes out, kept-alive ones again before each request; through a proxy, which resolves
names itself, the target is judged when it is an address and the proxy must not be one of the
cluster's services.
"""
from __future__ import annotations

import socket
import ssl
import threading
import time
from typing import TYPE_CHECKING

import requests
import requests.exceptions as rex
import urllib3.exceptions as u3
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import ProxyManager

import settings as declared  # the cluster settings' one declaration: their defaults
from common import netguard
from common.errors import AddressRefused, DownloadError, ValidationError
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

__all__ = ["fetch", "new_session", "classify_exception", "Cut"]

CHUNK = 64 * 1024



# --- the total deadline -------------------------------------------------------------------

_local = threading.local()


class _Deadline:
    """The time budget of one fetch. When it runs out, a timer shuts the sockets this fetch is
    using, so a read blocked on a hung or trickling server returns at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        self.end = time.monotonic() + self.seconds
        self.expired = False
        self._done = False
        self._lock = threading.Lock()
        self._conns: list = []
        self._timer = threading.Timer(max(self.seconds, 0.0), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> "_Deadline":
        _local.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._done = True
        self._timer.cancel()
        _local.deadline = None

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def error(self) -> DownloadError:
        self.expired = True
        return DownloadError(f"timeout after {self.seconds}s", retryable=True)

    def check(self) -> None:
        if self.expired or self.remaining() <= 0:
            raise self.error()

    def attach(self, conn) -> None:
        """Mark ``conn`` as used by this fetch (shut down at expiry)."""
        if conn is None:
            return
        conn._dc_deadline = self
        with self._lock:
            if not any(c is conn for c in self._conns):
                self._conns.append(conn)
            if self.expired and not self._done:
                _shutdown(conn)

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self.expired = True
            for conn in self._conns:
                # a connection already handed back to the pool and taken by another fetch
                # carries that fetch's deadline: leave it alone
                if getattr(conn, "_dc_deadline", None) is self:
                    _shutdown(conn)


class Cut:
    """Lets another thread end a fetch at once, as its deadline would (its sockets shut)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadline: _Deadline | None = None
        self._cut = False

    def bind(self, deadline: _Deadline) -> None:
        with self._lock:
            self._deadline = deadline
            cut = self._cut
        if cut:
            deadline._expire()

    def __call__(self) -> None:
        with self._lock:
            self._cut = True
            deadline = self._deadline
        if deadline is not None:
            deadline._expire()


def _shutdown(conn) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:  # the plain socket call, also for TLS sockets, so the blocked reader wakes up
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass


if TYPE_CHECKING:
    _ConnectionBase = HTTPConnection  # what the mixin is mixed into, for the type checker
else:
    _ConnectionBase = object


class _TrackedConnection(_ConnectionBase):
    """Connection mixin: registers itself with the calling thread's deadline on use, and sends
    nothing to an address the calling fetch may not reach."""

    def connect(self) -> None:
        _track(self)
        super().connect()

    def _new_conn(self):
        sock = super()._new_conn()
        try:  # before the TLS handshake or the request: the socket's peer is what was reached
            _judge_peer(self, sock)
        except AddressRefused:
            sock.close()
            raise
        return sock

    def request(self, *args, **kwargs):
        _track(self)
        if self.sock is not None:  # kept alive, maybe for a fetch under other rules
            _judge_peer(self, self.sock)
        return super().request(*args, **kwargs)


def _judge_peer(conn, sock) -> None:
    """The connection's peer — the site, or the proxy the job chose — against the calling fetch's
    rules."""
    ip, port = sock.getpeername()[:2]
    allow = getattr(_local, "allow_private", False)
    if conn.proxy:
        netguard.judge_proxy_peer(ip, port, allow)
    else:
        netguard.judge(ip, port, allow)


def _track(conn) -> None:
    deadline = getattr(_local, "deadline", None)
    if deadline is not None:
        deadline.attach(conn)


class _HTTPConnection(_TrackedConnection, HTTPConnection):
    pass


class _HTTPSConnection(_TrackedConnection, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _Adapter(HTTPAdapter):
    """HTTPAdapter whose connections report to the fetch deadline (also through a proxy)."""

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy, **proxy_kwargs):
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if type(manager) is ProxyManager:  # not SOCKS, which has its own pool classes
            manager.pool_classes_by_scheme = _POOLS
        return manager


def new_session() -> requests.Session:
    """A session for up to 16 concurrent fetches; share one per worker thread pool. Only its
    connections judge the address they reach: a session made elsewhere checks addresses in URLs
    alone."""
    session = requests.Session()
    session.trust_env = False
    adapter = _Adapter(pool_connections=16, pool_maxsize=32, max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


# --- classification -----------------------------------------------------------------------

def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception it wraps (args, reason, cause, context)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 20:
        e = todo.pop(0)
        if any(e is s for s in seen):
            continue
        seen.append(e)
        for nxt in (*getattr(e, "args", ()), getattr(e, "reason", None), e.__cause__, e.__context__):
            if isinstance(nxt, BaseException):
                todo.append(nxt)
    return seen


def classify_exception(exc: BaseException) -> DownloadError:
    """The DownloadError for an exception raised by requests/urllib3/socket during a fetch."""
    if isinstance(exc, DownloadError):
        return exc
    chain = _chain(exc)

    def has(*types) -> BaseException | None:
        return next((e for e in chain if isinstance(e, types)), None)

    reason, retryable = _invalid_request(has) or _network_failure(has, chain) or (
        f"{type(exc).__name__}: {exc}", True)
    return DownloadError(redact(one_line(reason)), retryable=retryable)


def _invalid_request(has) -> tuple[str, bool] | None:
    """What is wrong with the request itself (never retried), or None."""
    if has(rex.TooManyRedirects):
        return "too many redirects", False
    bad = has(rex.InvalidURL, rex.MissingSchema, rex.InvalidSchema, rex.URLRequired,
              u3.LocationValueError, ValidationError)
    if bad is not None:
        return f"invalid URL: {bad}", False
    if has(rex.InvalidHeader):  # its message quotes the value, which may be a secret
        return "invalid request: a header name or value has forbidden characters", False
    if has(UnicodeEncodeError) and not has(OSError):
        return "invalid request: a header is not latin-1 encodable", False
    bad = None if has(OSError) else has(ValueError)
    if bad is not None:
        return f"invalid request: {bad}", False
    return None


def _network_failure(has, chain: list[BaseException]) -> tuple[str, bool] | None:
    """What went wrong on the way (retried, but for a certificate that does not verify), or None."""
    if has(ConnectionRefusedError):
        return "connection refused", True
    if has(ConnectionResetError):
        return "connection reset", True
    dns = has(u3.NameResolutionError, socket.gaierror)
    if dns is not None:
        return f"DNS lookup failed: {dns}", True
    # urllib3's NewConnectionError (refused, unreachable, DNS) subclasses ConnectTimeoutError
    if has(rex.ConnectTimeout) or (has(u3.ConnectTimeoutError) and not has(u3.NewConnectionError)):
        return "connect timeout", True
    if has(rex.Timeout, u3.TimeoutError, socket.timeout):
        return "read timeout", True
    tls = has(ssl.SSLError, rex.SSLError, u3.SSLError)
    if tls is not None:
        text = " ".join(str(e) for e in chain)
        if has(ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in text:
            cert = has(ssl.SSLCertVerificationError)
            detail = getattr(cert, "verify_message", "") or "verification failed"
            return f"TLS certificate error: {detail}", False
        return f"TLS error: {tls}", True
    if has(rex.ProxyError, u3.ProxyError):
        return "proxy error", True
    if has(rex.ContentDecodingError, u3.DecodeError):
        return "content decoding failed", True
    broken = has(rex.ChunkedEncodingError, u3.ProtocolError, ConnectionError, rex.ConnectionError, OSError)
    if broken is not None:
        inner = chain[-1]
        return f"connection error: {type(inner).__name__}: {inner}", True
    return None


# --- the fetch ----------------------------------------------------------------------------

def _peer_ip(resp: requests.Response) -> str:
    try:
        return resp.raw._connection.sock.getpeername()[0]
    except Exception:  # noqa: BLE001 - cheap best effort only
        return ""


def _read_body(resp: requests.Response, limits: Limits, deadline: _Deadline) -> bytes:
    """The decoded body, aborting as soon as it exceeds maxsize or the deadline passes."""
    body = Body(limits.maxsize, resp.headers)
    for chunk in resp.iter_content(CHUNK):
        body.add(chunk)
        deadline.check()
    deadline.check()  # a socket shut at expiry may look like a clean end of body
    return body.take()


def fetch(url: str, *, limits: Limits, proxy: str = "", cookie: str = "",
          headers: dict | None = None, session: requests.Session | None = None,
          user_agent: str = declared.DOWNLOAD_USER_AGENT, allow_private: bool = False,
          cut: Cut | None = None, scope: Scope | None = None) -> Download:
    """GET ``url`` within ``limits``; a 2xx (or final 3xx) Download, else DownloadError.
    ``allow_private``: loopback, private and link-local addresses may be reached too; ``cut``:
    called from another thread, ends the fetch at once; ``scope``: no redirect it refuses is
    followed (``Redirects``)."""
    sent = CaseInsensitiveDict({"User-Agent": user_agent, "Accept": "*/*",
                                "Accept-Encoding": requests.utils.DEFAULT_ACCEPT_ENCODING})
    sent.update(headers or {})
    if cookie:
        sent["Cookie"] = cookie
    secrets = secrets_of(proxy, cookie, sent)
    proxies = {"http": proxy, "https": proxy} if proxy else {}
    own_session = session is None
    session = session or new_session()
    _local.allow_private = allow_private
    try:
        with _Deadline(limits.timeout) as deadline:
            if cut is not None:
                cut.bind(deadline)
            try:
                return _fetch(url, limits, sent, proxies, session, deadline, scope)
            except Exception as exc:  # noqa: BLE001 - the contract: only DownloadError leaves
                if not isinstance(exc, DownloadError) and (deadline.expired or deadline.remaining() <= 0):
                    raise deadline.error() from None
                error = classify_exception(exc)
                reason = redact(error.reason, secrets)
                raise DownloadError(reason, error.retryable, error.retry_after) from None
    finally:
        _local.allow_private = False
        if own_session:
            session.close()


def _fetch(url, limits, sent, proxies, session, deadline, scope: Scope | None = None) -> Download:
    redirects = Redirects(url, sent, limits.max_redirects, getattr(_local, "allow_private", False), scope)
    if proxies:
        netguard.judge_proxy(proxies["http"], getattr(_local, "allow_private", False))
    while True:
        deadline.check()
        url = redirects.url()
        prepared = requests.Request("GET", url, headers=dict(sent)).prepare()
        remaining = max(deadline.remaining(), 0.001)
        # adapter.send, not session.send: the latter reads a redirect's whole body unbounded
        adapter = session.get_adapter(url)
        resp = adapter.send(prepared, stream=True, timeout=(min(remaining, CONNECT_TIMEOUT), remaining),
                            verify=True, cert=None, proxies=proxies)
        deadline.attach(getattr(resp.raw, "_connection", None))
        location = redirects.location(resp.status_code, resp.headers)
        if not location:
            break
        resp.close()
        redirects.follow(location)
    try:
        error = classify_status(resp.status_code, resp.headers.get("Retry-After"))
        if error is not None:
            raise error
        remote_ip = _peer_ip(resp)
        body = _read_body(resp, limits, deadline)
        response_headers = {str(k): str(v) for k, v in resp.headers.items()}
        return Download(status_code=resp.status_code, headers=response_headers, body=body,
                        url=resp.url or url, remote_ip=remote_ip,
                        request_headers=masked(prepared.headers),
                        encoding=body_encoding(response_headers, body))
    finally:
        resp.close()
