"""Where the cluster's own requests may go: the address rules that the built-in engines and the
webhooks share. A request is judged on the address it connects to, never on a URL's text.

- Refused always: the cluster's own services (the hosts and ports of REDIS_URL, MONGO_URI,
  MONGO_LOG_URI, MONGO_CONTROL_URI, WEB_BIND and PUBLIC_URL; a service on this machine is matched on any
  local address of its port), and unspecified or multicast addresses.
- Refused unless allowed (a job's ``allow_private``, which only an administrator grants;
  WEBHOOK_ALLOW_PRIVATE; for a proxy, also its listing in SANDBOX_ALLOW): every address that
  is not globally routable: loopback, private, link-local (169.254.169.254, the cloud metadata
  service), shared and reserved ranges.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
from functools import lru_cache
from urllib.parse import urlsplit

from common.config import settings
from common.errors import AddressRefused

DOWNLOAD_HINT = "private reach is an administrator's grant: allow_private in a project opened to it"
PROXY_HINT = "a proxy on a private address needs the job's allow_private, an administrator's grant"
DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "mongodb": 27017, "http": 80, "https": 443}
LOCAL = "local"  # an endpoint on this machine: its port on any local address

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


# IPv6 prefixes that carry an IPv4 address (RFC 6052 NAT64, RFC 8215 local-use NAT64, RFC 3056
# 6to4, RFC 4380 Teredo, RFC 4291 IPv4-compatible and -mapped): an address in one of them is
# judged by the IPv4 address inside it, which a translator on the way may well reach
NAT64 = ipaddress.ip_network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
V4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, NAT64, 6to4, Teredo's
    client), else None."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in NAT64 or (ip in V4_COMPATIBLE and int(ip) > 1):  # ::1 and :: are themselves
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in NAT64_LOCAL:  # RFC 6052's /48 form: the IPv4 address around the reserved octet 8
        raw = ip.packed
        return ipaddress.IPv4Address(raw[6:8] + raw[9:11])
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def embedding_networks(net: ipaddress.IPv4Network) -> list[ipaddress.IPv6Network]:
    """The IPv6 networks whose addresses carry an IPv4 address of ``net`` at a fixed place
    (NAT64 /96 and local-use /48, IPv4-compatible, 6to4), for rules that match prefixes."""
    v4, n = int(net.network_address), net.prefixlen
    nat64_local = (int(NAT64_LOCAL.network_address) | (v4 >> 16) << 64 | (v4 & 0xFFFF) << 40)
    return [ipaddress.IPv6Network((int(NAT64.network_address) | v4, 96 + n)),
            ipaddress.IPv6Network((nat64_local, 48 + n if n <= 16 else 56 + n)),
            ipaddress.IPv6Network((v4, 96 + n)),
            ipaddress.IPv6Network((0x2002 << 112 | v4 << 80, 16 + n))]


def parse_ip(text: str) -> Address | None:
    """The address in ``text`` (an IPv6 zone undone; an IPv6 address that carries an IPv4 one
    is that IPv4 address), else None."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0].strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        return embedded_ipv4(ip) or ip
    return ip


@lru_cache(maxsize=4096)  # a pure function of the text, asked for every page's host
def literal_ip(host: str) -> Address | None:
    """``host`` as an address when it is one in any form a resolver takes as a number without
    asking DNS: dotted quads, and ``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``
    (inet_aton's forms); IPv6 in brackets or not."""
    found = parse_ip(host)
    if found is not None or not host or not all(c in "0123456789abcdefxABCDEFX." for c in host):
        return found
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except (OSError, ValueError):
        return None


def refusal(ip: Address, port: int, allow_private: bool, hint: str = DOWNLOAD_HINT) -> str | None:
    """Why a connection to ``ip``:``port`` is refused (one line), or None when it may go."""
    if _is_cluster_service(ip, port):
        return f"refused: {_hostport(ip, port)} is a service of this cluster"
    if ip.is_unspecified or ip.is_multicast:
        return f"refused: {ip} is {'an unspecified' if ip.is_unspecified else 'a multicast'} address"
    if allow_private or ip.is_global:
        return None
    kind = ("a loopback" if ip.is_loopback else "a link-local" if ip.is_link_local
            else "a private" if ip.is_private else "a non-public")
    return f"refused: {ip} is {kind} address ({hint})"


def judge(ip: str | Address, port: int, allow_private: bool, hint: str = DOWNLOAD_HINT) -> None:
    """Raise AddressRefused unless ``ip``:``port`` may be connected to."""
    address = parse_ip(ip) if isinstance(ip, str) else ip
    if address is None:
        raise AddressRefused(f"refused: {ip!r} is not an IP address")
    reason = refusal(address, port, allow_private, hint)
    if reason:
        raise AddressRefused(reason)


def judge_literal(host: str | None, port: int, allow_private: bool, hint: str = DOWNLOAD_HINT) -> None:
    """Judge ``host`` when it is an IP address or ``localhost`` (no DNS); a name passes. For
    requests through a proxy, which resolves names itself, and as a cheap first look."""
    host = (host or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        judge("127.0.0.1", port, allow_private, hint)
    else:
        address = literal_ip(host)
        if address is not None:
            judge(address, port, allow_private, hint)


def judge_url(url: str, allow_private: bool) -> None:
    """``judge_literal`` on a checked http(s) URL's host and port."""
    parts = urlsplit(url)
    default_port = 443 if parts.scheme.lower() == "https" else 80
    judge_literal(parts.hostname, parts.port or default_port, allow_private)


def judge_proxy(proxy: str, allow_private: bool) -> None:
    """A proxy a job names is judged by the job's own rule — a private one only with the grant
    of ``allow_private``, a service of the cluster never — on every address its host resolves
    to (numbers in any form a resolver accepts included; names resolved at most once a PROXY_TTL
    per host and port). Blocking: call it off an event loop."""
    try:
        parts = urlsplit(proxy)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower(), 1080)
    except ValueError:
        return  # the engine says what is wrong with it
    host = (parts.hostname or "").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        addresses: tuple[str, ...] = ("127.0.0.1",)
    elif literal_ip(host) is not None:
        addresses = (str(literal_ip(host)),)
    else:
        addresses = _proxy_addresses(host, port, int(time.monotonic() // PROXY_TTL)) if host else ()
    for address in addresses:  # one refused refuses the proxy
        judge_proxy_peer(address, port, allow_private)


def judge_proxy_peer(ip: str, port: int, allow_private: bool) -> None:
    """Judge the address a connection to a job's proxy goes to: the job's rule, or the operator's
    listing of it in SANDBOX_ALLOW."""
    listed = _operator_proxies(settings.SANDBOX_ALLOW, int(time.monotonic() // PROXY_TTL))
    granted = (parse_ip(ip), port) in listed
    judge(ip, port, allow_private or granted, PROXY_HINT)


PROXY_TTL = 60.0


@lru_cache(maxsize=8)
def _operator_proxies(listed: str, epoch: int) -> frozenset:
    """(address, port) of the proxies the operator lists in SANDBOX_ALLOW (``host:port``, comma
    or space separated): private ones a job may use without ``allow_private``, as its sandbox may."""
    found = set()
    for item in listed.replace(",", " ").split():
        host, _, port = item.rpartition(":")
        if not port.isdigit() or not host.strip("[]"):
            continue
        host = host.strip("[]")
        for address in ((host,) if parse_ip(host) is not None else _proxy_addresses(host, int(port), epoch)):
            found.add((parse_ip(address), int(port)))
    return frozenset(found)


@lru_cache(maxsize=256)
def _proxy_addresses(host: str, port: int, epoch: int) -> tuple[str, ...]:
    """The addresses of a proxy's host in one PROXY_TTL epoch (none when it does not resolve: the
    engine then fails to connect and says so)."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return ()
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


def resolve(host: str, port: int, allow_private: bool, hint: str = DOWNLOAD_HINT) -> list[str]:
    """The addresses ``host`` resolves to, each judged (one refused refuses them all): connect to
    one of these, not to the name again, so what was judged is what is reached."""
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise OSError(f"cannot resolve {host}: {exc}") from None
    # str(): an IPv4 or IPv6 sockaddr starts with the address text (typeshed allows other families)
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        judge(address, port, allow_private, hint)
    return addresses


# --- the cluster's own services -----------------------------------------------------------

def _is_cluster_service(ip: Address, port: int) -> bool:
    endpoints = cluster_endpoints()
    return (ip, port) in endpoints or ((LOCAL, port) in endpoints and is_local(ip))


def cluster_endpoints() -> frozenset:
    """(address or LOCAL, port) of every service of the cluster: Redis, MongoDB (source, log,
    control), the web where it listens and where it is published — as named in their URLs and
    as they really are behind them (Sentinels' masters and replicas, MongoDB members, SRV
    records; ``common.store.connection.service_members``), every name resolved again each
    SERVICES_REFRESH seconds by a thread in the background, so a caller never waits on DNS but
    for the first time in a process (or after the settings change)."""
    return _services.current()


class _Services:
    """The last view of the cluster's endpoints, and the thread that keeps it fresh. A member
    once seen stays walled for this process's life: a failed refresh or a failover forgets none."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: tuple | None = None      # (pid, the settings the view was made of)
        self.view: frozenset = frozenset()
        self.members: set[tuple[str, int]] = set()
        self.at = 0.0                       # when the view was made (monotonic)

    @staticmethod
    def _urls() -> tuple:
        return (settings.REDIS_URL, settings.MONGO_URI, settings.MONGO_LOG_URI, settings.MONGO_CONTROL_URI,
                settings.WEB_BIND, settings.PUBLIC_URL)

    def current(self) -> frozenset:
        key = (os.getpid(), self._urls())
        if self.key != key:
            with self.lock:
                if self.key != key:
                    if self.key is None or self.key[0] != key[0]:  # this process's own thread
                        threading.Thread(target=self._keep_fresh, name="netguard-services",
                                         daemon=True).start()
                    if self.key is None or self.key[1] != key[1]:
                        self.members = set()
                    self._refresh(key)
        return self.view

    def _refresh(self, key: tuple) -> None:
        from common.store.connection import service_members

        try:
            self.members |= service_members()
        except Exception:  # noqa: BLE001 - what cannot be asked now is asked again next time
            pass
        named = [hp for url in filter(None, key[1]) for hp in _hosts_of(url)]
        self.view = _resolve_all(named + sorted(self.members))
        self.key, self.at = key, time.monotonic()

    def _keep_fresh(self) -> None:
        pid = os.getpid()
        while os.getpid() == pid:
            time.sleep(min(1.0, settings.SERVICES_REFRESH))
            if self.key is not None and time.monotonic() - self.at >= settings.SERVICES_REFRESH:
                with self.lock:
                    if self.key is not None:
                        self._refresh(self.key)


_services = _Services()


def _resolve_all(hosts: list[tuple[str, int]]) -> frozenset:
    found = set()
    for host, port in hosts:
        try:
            infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):  # a name that does not resolve here cannot be reached from here
            continue
        for info in infos:
            ip = parse_ip(str(info[4][0]))
            if ip is not None:
                found.add((LOCAL if is_local(ip) else ip, port))
    return frozenset(found)


def _hosts_of(url: str) -> list[tuple[str, int]]:
    """(host, port) of each server a connection URL (or a bare host:port) names."""
    if "://" not in url:
        url = "tcp://" + url
    scheme, netloc = url.split("://", 1)[0].lower(), urlsplit(url).netloc
    default = DEFAULT_PORTS.get(scheme.split("+")[0], 80)
    out = []
    for part in netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = part.rpartition(":") if not part.endswith("]") else (part, "", "")
        if not host or host.endswith(":"):  # no port, or a bare IPv6 address
            host, port = part, ""
        if host.strip("[]"):
            out.append((host.strip("[]"), int(port) if port.isdigit() else default))
    return out


@lru_cache(maxsize=4096)
def is_local(ip: Address) -> bool:
    """Whether ``ip`` reaches this machine: loopback, unspecified, or one of its own addresses
    (a socket can be bound to it)."""
    if ip.is_loopback or ip.is_unspecified:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(ip), 0))
        return True
    except OSError:
        return False


def _hostport(ip: Address, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"
