"""Where the cluster's own requests may go: the address rules that the built-in engines and the
webhooks share. A request is judged on the address it connects to, never on a URL's text.

- Refused always: the cluster's own services (the hosts and ports of REDIS_URL, MONGO_URI,
  MONGO_LOG_URI, MONGO_CONTROL_URI, WEB_BIND and PUBLIC_URL; a service on this machine is matched on any
  local address of its port), and unspecified or multicast addresses.
- Refused unless allowed (a job's ``allow_private``, WEBHOOK_ALLOW_PRIVATE): every address that
  is not globally routable: loopback, private, link-local (169.254.169.254, the cloud metadata
  service), shared and reserved ranges.
"""
from __future__ import annotations

import ipaddress
import socket
from functools import lru_cache
from urllib.parse import urlsplit

from common.config import settings
from common.errors import AddressRefused

DOWNLOAD_HINT = "set allow_private = true for intranet crawls"
DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "mongodb": 27017, "http": 80, "https": 443}
LOCAL = "local"  # an endpoint on this machine: its port on any local address

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def parse_ip(text: str) -> Address | None:
    """The address in ``text`` (an IPv6 zone and an IPv4-mapped form are undone), else None."""
    try:
        ip = ipaddress.ip_address(text.split("%", 1)[0].strip("[]"))
    except ValueError:
        return None
    return (ip.ipv4_mapped or ip) if isinstance(ip, ipaddress.IPv6Address) else ip


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
    elif parse_ip(host) is not None:
        judge(host, port, allow_private, hint)


def judge_url(url: str, allow_private: bool) -> None:
    """``judge_literal`` on a checked http(s) URL's host and port."""
    parts = urlsplit(url)
    default_port = 443 if parts.scheme.lower() == "https" else 80
    judge_literal(parts.hostname, parts.port or default_port, allow_private)


def judge_proxy(proxy: str) -> None:
    """A proxy a job names may be private (its choice), never a service of the cluster: judged by
    its address when it is one (the engines judge an HTTP proxy's connection again on its peer)."""
    try:
        parts = urlsplit(proxy)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme.lower(), 1080)
    except ValueError:
        return  # the engine says what is wrong with it
    judge_literal(parts.hostname, port, allow_private=True)


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
    """(address or LOCAL, port) of every service of the cluster, resolved once per configuration:
    Redis, MongoDB (source, log, control), the web where it listens and where it is published."""
    return _endpoints(settings.REDIS_URL, settings.MONGO_URI, settings.MONGO_LOG_URI,
                      settings.MONGO_CONTROL_URI, settings.WEB_BIND, settings.PUBLIC_URL)


@lru_cache(maxsize=4)
def _endpoints(*urls: str) -> frozenset:
    found = set()
    for url in filter(None, urls):
        for host, port in _hosts_of(url):
            try:
                infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
            except (OSError, UnicodeError):  # a name that does not resolve here cannot be reached from here
                continue
            for info in infos:
                ip = parse_ip(str(info[4][0]))
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
