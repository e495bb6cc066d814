"""The sandbox's network wall: nftables rules on the host that match the sandbox uids.

Every python or shell downloader runs as a uid of its own (``uid_for``), and the kernel stamps
each socket with the uid that made it, which the downloader cannot change (it has no
capabilities). One nftables table per worker process matches those uids on the host's output
hook and rejects, for every sandbox:

  * the cluster's services: Redis, MongoDB (source, log, control), the web and metrics
    (``WEB_BIND``) — on any address of this host for services it holds, at their addresses
    for services elsewhere — and whatever the operator lists in ``SANDBOX_DENY``;

and for sandboxes of jobs without ``allow_private``:

  * every address of this host, loopback, link-local (cloud metadata), multicast; except the
    DNS servers of ``/etc/resolv.conf`` and the forward proxies listed in ``SANDBOX_ALLOW``.

Why this, and not a network namespace per sandbox with user-mode networking (pasta,
slirp4netns): those start a process per download and still reach the host's other addresses
and remote cluster hosts unless filtered again; a rule set matched by uid costs the download
nothing, covers loopback and remote hosts alike, and lets the job's proxy and the internet
through unchanged. A rejected connection fails at once, as "Connection refused".
"""
from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
import threading
from urllib.parse import urlsplit

from common.config import settings

__all__ = ["Unavailable", "check", "ensure", "remove", "uid_for"]

logger = logging.getLogger(__name__)

UID_BASE = 1_500_000_000      # far above any real account
UID_SPAN = 1 << 22            # the kernel's largest pid_max: n is a pid
PRIVATE_BASE = UID_BASE + UID_SPAN   # sandboxes of jobs with allow_private = true
UID_END = PRIVATE_BASE + UID_SPAN
TABLE_PREFIX = "downcluster_"
NFT_TIMEOUT = 10
INSTALL = "apt-get install -y bubblewrap nftables"

_lock = threading.Lock()
_installed: tuple[int, tuple] | None = None   # (pid, _inputs()) of this process's table


class Unavailable(Exception):
    """The box cannot be built on this host; python and shell downloaders are refused."""


def uid_for(n: int, allow_private: bool) -> int:
    """The uid of sandbox ``n`` (the pid of its bubblewrap process, unique while it lives)."""
    return (PRIVATE_BASE if allow_private else UID_BASE) + n % UID_SPAN


def check() -> str | None:
    """None when python and shell downloaders can run here, else one line saying why not."""
    if os.geteuid() != 0:
        return ("python and shell downloaders need the worker to run as root (each sandbox gets a uid, "
                "a pid namespace and firewall rules of its own)")
    missing = [name for name, tool in (("bubblewrap", "bwrap"), ("nftables", "nft")) if not shutil.which(tool)]
    if missing:
        return f"python and shell downloaders need {' and '.join(missing)}: {INSTALL}"
    return None


# --- what the wall keeps out ----------------------------------------------------------------

def _host_port(text: str, default: int | None) -> tuple[str, int | None]:
    """("host", port) of "host", "host:port", "[v6]:port" or a bare IPv6 address."""
    text = text.strip()
    try:
        ipaddress.ip_address(text)
        return text, default
    except ValueError:
        pass
    parts = urlsplit("//" + text)
    try:
        port = parts.port
    except ValueError:
        raise Unavailable(f"not a host:port: {text!r}") from None
    return parts.hostname or "", port or default


def _addresses(host: str) -> set[str]:
    try:
        return {ai[4][0] for ai in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        logger.warning("sandbox wall: cannot resolve %s; it is not walled off by address", host)
        return set()


def _is_local(address: str) -> bool:
    """Whether ``address`` is this host's (or the wildcard): a socket can bind to it."""
    ip = ipaddress.ip_address(address)
    if ip.is_unspecified or ip.is_loopback:
        return True
    with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET) as probe:
        try:
            probe.bind((address, 0))
            return True
        except OSError:
            return False


def service_endpoints() -> set[tuple[str, int]]:
    """(host, port) of every cluster service this worker knows of."""
    from pymongo.uri_parser import parse_uri

    from common.connections import control_uri

    found: set[tuple[str, int]] = set()
    redis = urlsplit(settings.REDIS_URL)
    if redis.scheme in ("redis", "rediss") and redis.hostname:
        found.add((redis.hostname, redis.port or 6379))
    for uri in {settings.MONGO_URI, settings.MONGO_LOG_URI, control_uri()}:
        try:
            found.update(parse_uri(uri)["nodelist"])
        except Exception as exc:  # noqa: BLE001 - e.g. an SRV record that cannot be resolved here
            logger.warning("sandbox wall: cannot read a MongoDB URI's hosts (%s)", type(exc).__name__)
    host, port = _host_port(settings.WEB_BIND, 8080)
    found.add((host or "0.0.0.0", port))
    return found


def _split(value: str) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _resolvers() -> set[str]:
    try:
        with open("/etc/resolv.conf", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver":
            try:
                found.add(str(ipaddress.ip_address(words[1].split("%")[0])))
            except ValueError:
                pass
    return found


def ruleset(table: str) -> str:
    """The nftables script that installs (or replaces) ``table``."""
    local_ports: set[int] = set()
    remote: set[tuple[str, int]] = set()
    for host, port in service_endpoints():
        for address in _addresses(host):
            if _is_local(address):
                local_ports.add(port)
            remote.add((address, port))
    denied: set[str] = set()
    for item in _split(settings.SANDBOX_DENY):
        try:
            denied.add(str(ipaddress.ip_network(item, strict=False)))
            continue
        except ValueError:
            pass
        host, port = _host_port(item, None)
        for address in _addresses(host):
            if port is None:
                denied.add(address)
            else:
                remote.add((address, port))
                if _is_local(address):
                    local_ports.add(port)
    allowed: set[tuple[str, int]] = {(a, 53) for a in _resolvers()}
    for item in _split(settings.SANDBOX_ALLOW):
        host, port = _host_port(item, None)
        if port is None:
            raise Unavailable(f"SANDBOX_ALLOW: {item!r} needs a port (host:port of a proxy)")
        allowed.update((a, port) for a in _addresses(host))

    def family(address: str) -> str:
        return "ip6" if ipaddress.ip_network(address, strict=False).version == 6 else "ip"

    def deny(match: str) -> list[str]:  # TCP gets a reset, so connect() fails at once
        return [f"meta l4proto tcp {match} reject with tcp reset", f"{match} reject with icmpx admin-prohibited"]

    rules: list[str] = []
    if local_ports:
        rules += deny(f"fib daddr type local tcp dport {{ {', '.join(map(str, sorted(local_ports)))} }}")
    for fam in ("ip", "ip6"):
        pairs = sorted(f"{a} . {p}" for a, p in remote if family(a) == fam)
        if pairs:
            rules += deny(f"{fam} daddr . tcp dport {{ {', '.join(pairs)} }}")
        nets = sorted(n for n in denied if family(n) == fam)
        if nets:
            rules += deny(f"{fam} daddr {{ {', '.join(nets)} }}")
        pairs = sorted(f"{a} . {p}" for a, p in allowed if family(a) == fam)
        if pairs:
            rules.append(f"{fam} daddr . tcp dport {{ {', '.join(pairs)} }} accept")
            rules.append(f"{fam} daddr . udp dport {{ {', '.join(pairs)} }} accept")
    rules.append(f"meta skuid >= {PRIVATE_BASE} accept")
    rules += deny("fib daddr type local")
    rules += deny("ip daddr { 0.0.0.0/8, 127.0.0.0/8, 169.254.0.0/16, 224.0.0.0/3 }")
    rules += deny("ip6 daddr { ::/127, fe80::/10, ff00::/8 }")
    body = "\n".join("    " + rule for rule in rules)
    # only packets of sandbox sockets enter chain "box" (the kernel's own replies have no socket)
    return (f"table inet {table}\ndelete table inet {table}\n"
            f"table inet {table} {{\n  chain out {{\n    type filter hook output priority filter; policy accept;\n"
            f"    meta skuid {UID_BASE}-{UID_END - 1} jump box\n  }}\n  chain box {{\n{body}\n  }}\n}}\n")


# --- the table's life -------------------------------------------------------------------------

def _nft(script: str | None = None, *args: str) -> str:
    argv = ["nft", *(("-f", "-") if script is not None else args)]
    try:
        done = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=NFT_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"nft failed: {type(exc).__name__}: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise Unavailable(f"nft failed: {last}")
    return done.stdout


def _sweep() -> None:
    """Remove the tables of worker processes that are gone (a SIGKILL leaves its table)."""
    for line in _nft(None, "list", "tables", "inet").splitlines():
        name = line.split()[-1] if line.startswith("table inet ") else ""
        pid = name.removeprefix(TABLE_PREFIX)
        if name.startswith(TABLE_PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                _nft(None, "delete", "table", "inet", name)
            except Unavailable:
                pass  # another worker removed it first


def _inputs() -> tuple:
    """The settings the rule set is made of: the table is made again only when they change."""
    from common.connections import control_uri

    return (settings.REDIS_URL, settings.MONGO_URI, settings.MONGO_LOG_URI, control_uri(), settings.WEB_BIND,
            settings.SANDBOX_DENY, settings.SANDBOX_ALLOW)


def ensure() -> None:
    """Install this process's table once (again if the services it walls off changed); cheap
    when it is in place. Unavailable, with one line, when the box cannot be built here."""
    global _installed
    inputs = (os.getpid(), _inputs())
    if _installed == inputs:
        return
    with _lock:
        if _installed == inputs:
            return
        why = check()
        if why:
            raise Unavailable(why)
        fresh = _installed is None or _installed[0] != os.getpid()
        if fresh:
            _sweep()
        _nft(ruleset(f"{TABLE_PREFIX}{os.getpid()}"))
        _installed = inputs
        if fresh:
            import atexit

            atexit.register(remove)


def remove() -> None:
    """Remove this process's table (a worker that stops)."""
    global _installed
    with _lock:
        if _installed is None or _installed[0] != os.getpid():
            return
        try:
            _nft(None, "delete", "table", "inet", f"{TABLE_PREFIX}{os.getpid()}")
        except Unavailable:
            pass
        _installed = None
