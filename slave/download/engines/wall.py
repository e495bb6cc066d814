"""The sandbox's network wall: nftables rules on the host that match the sandbox uids.

Every python or shell downloader runs as a uid of its own, and the kernel stamps each socket
with the uid that made it, which the downloader cannot change (it has no capabilities). Each
worker process owns a block of uids: SLOTS for ordinary jobs (the last of them for its browsers
of such jobs), then SLOTS for ``allow_private`` jobs (the last for its browsers of those), and
one nftables table matching exactly that block on the host's output hook, so workers of other
clusters or settings on the same host never meet each other's rules. The table rejects, for
every sandbox and browser:

  * the cluster's services, as ``common.netguard`` finds them for the built-in engines: Redis,
    MongoDB (source, log, control), the web and metrics (``WEB_BIND``, ``PUBLIC_URL``) — on any
    address of this host for services it holds, at their addresses for services elsewhere, as
    named and as they really are behind their URLs (Sentinels' masters and replicas, MongoDB
    members, names resolved again every SERVICES_REFRESH s: the table follows) — and those
    addresses carried inside IPv6 ones (NAT64, 6to4, IPv4-compatible), Teredo entirely, and
    whatever the operator lists in ``SANDBOX_DENY``;

and for those of jobs without ``allow_private``:

  * every address of this host and every address that is not global (loopback, private,
    link-local such as cloud metadata, multicast, reserved), also when an IPv6 address carries
    it; except the DNS servers of ``/etc/resolv.conf`` and the proxies listed in
    ``SANDBOX_ALLOW``.

A browser is matched by its uid like a downloader, so what a page does in it (a name that
rebinds to a private address, a WebSocket, WebRTC) meets the same rules in the kernel.
Unix sockets are not a way round: the box has no ``/run``, and a seccomp filter refuses
``socket(AF_UNIX)`` (path and abstract sockets alike) and io_uring to its processes.

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
from contextlib import contextmanager
from urllib.parse import urlsplit

from common import netguard
from common.config import settings

__all__ = ["Unavailable", "browser_uid", "check", "ensure", "remove", "sandbox_uid"]

logger = logging.getLogger(__name__)

UID_BASE = 1_500_000_000      # far above any real account
SLOTS = 256                   # uids per kind of job in one worker process: sandboxes, then a browser's
BLOCK = 2 * SLOTS             # a worker process's uids: ordinary jobs', then allow_private jobs'
PID_SPAN = 1 << 22            # the kernel's largest pid_max (UID_BASE + PID_SPAN * BLOCK < 2**32 - 1)
TABLE_PREFIX = "downcluster_"
# what ordinary jobs' downloaders may not reach: every address that is not global (IANA's
# special-purpose registries: loopback, private, shared, link-local, documentation, benchmark,
# multicast, reserved), as the built-in engines judge it (common/netguard.py)
NOT_GLOBAL_V4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
                 "192.0.0.0/24", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15", "198.51.100.0/24",
                 "203.0.113.0/24", "224.0.0.0/3")
NOT_GLOBAL_V6 = ("::/127", "100::/64", "2001:db8::/32", "fc00::/7", "fe80::/10", "ff00::/8")
TEREDO = "2001::/32"   # its IPv4 address is scrambled, not at a fixed place: refused whole
NFT_TIMEOUT = 10
INSTALL = "apt-get install -y bubblewrap nftables"

_lock = threading.Lock()
_installed: tuple[int, tuple] | None = None   # (pid, _inputs()) of this process's table


class Unavailable(Exception):
    """The box cannot be built on this host; python and shell downloaders are refused."""


def block_of(pid: int) -> int:
    """The first uid of worker process ``pid``'s block (unique while it lives; its sandboxes and
    browsers die with it)."""
    return UID_BASE + pid % PID_SPAN * BLOCK


class _Slots:
    """This process's free uids, one per sandbox running at once."""

    def __init__(self) -> None:
        self.pid = -1
        self.free: dict[bool, list[int]] = {}

    def take(self, allow_private: bool) -> int:
        with _lock:
            if self.pid != os.getpid():  # a forked work-horse owns a block of its own
                base = block_of(os.getpid())
                self.pid = os.getpid()
                self.free = {False: list(range(base, base + SLOTS - 1)),  # the last of each: browsers
                             True: list(range(base + SLOTS, base + BLOCK - 1))}
            if not self.free[allow_private]:
                raise Unavailable(f"more than {SLOTS} sandboxes at once in one worker process")
            return self.free[allow_private].pop()

    def give(self, uid: int) -> None:
        with _lock:
            if self.pid == os.getpid():
                self.free[uid - block_of(self.pid) >= SLOTS].append(uid)


_slots = _Slots()


@contextmanager
def sandbox_uid(allow_private: bool):
    """A uid of this worker's block for one sandbox, free again once the sandbox is gone."""
    uid = _slots.take(allow_private)
    try:
        yield uid
    finally:
        _slots.give(uid)


def browser_uid(allow_private: bool) -> int:
    """The uid of this worker's browsers for jobs with or without ``allow_private``: walled as
    those jobs' downloaders are."""
    return block_of(os.getpid()) + (BLOCK if allow_private else SLOTS) - 1


def check() -> str | None:
    """None when python and shell downloaders can run here, else one line saying why not."""
    if os.geteuid() != 0:
        return ("python and shell downloaders need the worker to run as root (each sandbox gets a uid, "
                "a pid namespace and firewall rules of its own)")
    tools = (("bubblewrap", "bwrap"), ("nftables", "nft"))
    missing = [name for name, tool in tools if not shutil.which(tool)]
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
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        return {str(ai[4][0]).split("%")[0] for ai in infos}  # an IPv6 scope ("%eth0") dropped
    except (OSError, UnicodeError):
        logger.warning("sandbox wall: cannot resolve %s; it is not walled off by address", host)
        return set()


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


def _endpoint(address: str, port: int, local_ports: set[int], remote: set[tuple[str, int]]) -> None:
    """Wall off ``address:port``; on any address of this host too when it is one of ours."""
    remote.add((address, port))
    if netguard.is_local(ipaddress.ip_address(address)):
        local_ports.add(port)


def _targets() -> tuple[set[int], set[tuple[str, int]], set[str], set[tuple[str, int]]]:
    """(local service ports, remote (address, port) services, denied networks, allowed
    (address, port)) from the cluster's settings."""
    local_ports: set[int] = set()
    remote: set[tuple[str, int]] = set()
    denied: set[str] = set()
    for address, port in netguard.cluster_endpoints():  # the same services the built-in engines refuse
        if address == netguard.LOCAL:
            local_ports.add(port)
        else:
            remote.add((str(address), port))
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
                _endpoint(address, port, local_ports, remote)
    allowed: set[tuple[str, int]] = {(a, 53) for a in _resolvers()}
    for item in _split(settings.SANDBOX_ALLOW):
        host, port = _host_port(item, None)
        if port is None:
            raise Unavailable(f"SANDBOX_ALLOW: {item!r} needs a port (host:port of a proxy)")
        allowed.update((a, port) for a in _addresses(host))
    return local_ports, remote, denied, allowed


def _local_ipv4() -> list[ipaddress.IPv4Network]:
    """This host's IPv4 addresses (and loopback), as ``ip`` lists them."""
    found = [ipaddress.IPv4Network("127.0.0.0/8")]
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True,
                             timeout=NFT_TIMEOUT).stdout
    except (OSError, subprocess.TimeoutExpired):
        return found
    for line in out.splitlines():
        words = line.split()
        if "inet" in words and words.index("inet") + 1 < len(words):
            try:
                found.append(ipaddress.IPv4Network(words[words.index("inet") + 1].split("/")[0]))
            except ValueError:
                pass
    return found


def _embedded(nets) -> str:
    """The IPv6 prefixes carrying the IPv4 networks ``nets`` (see netguard.embedding_networks)."""
    return ", ".join(sorted({str(e) for n in nets for e in netguard.embedding_networks(n)}))


def _family(address: str) -> str:
    return "ip6" if ipaddress.ip_network(address, strict=False).version == 6 else "ip"


def _deny(match: str) -> list[str]:
    """Reject what ``match`` matches; TCP with a reset, so connect() fails at once."""
    return [f"meta l4proto tcp {match} reject with tcp reset", f"{match} reject with icmpx admin-prohibited"]


def _pairs(items, fam: str) -> str:
    return ", ".join(sorted(f"{a} . {p}" for a, p in items if _family(a) == fam))


def ruleset() -> str:
    """The nftables script that installs (or replaces) this process's table."""
    table, first = _table(), block_of(os.getpid())
    local_ports, remote, denied, allowed = _targets()
    rules: list[str] = []
    if local_ports:
        ports = ", ".join(map(str, sorted(local_ports)))
        rules += _deny(f"fib daddr type local tcp dport {{ {ports} }}")
        rules += _deny(f"ip6 daddr {{ {_embedded(_local_ipv4())} }} tcp dport {{ {ports} }}")
    for address, port in sorted(remote):
        if _family(address) == "ip":
            rules += _deny(f"ip6 daddr {{ {_embedded([ipaddress.IPv4Network(address)])} }} tcp dport {port}")
    rules += _deny(f"ip6 daddr {TEREDO}")
    for fam in ("ip", "ip6"):
        if _pairs(remote, fam):
            rules += _deny(f"{fam} daddr . tcp dport {{ {_pairs(remote, fam)} }}")
        nets = ", ".join(sorted(n for n in denied if _family(n) == fam))
        if nets:
            rules += _deny(f"{fam} daddr {{ {nets} }}")
        if _pairs(allowed, fam):
            rules += [f"{fam} daddr . {proto} dport {{ {_pairs(allowed, fam)} }} accept"
                      for proto in ("tcp", "udp")]
    rules.append(f"meta skuid >= {first + SLOTS} accept")  # allow_private jobs, browsers: the rest is theirs
    rules += _deny("fib daddr type local")
    rules += _deny(f"ip daddr {{ {', '.join(NOT_GLOBAL_V4)} }}")
    rules += _deny(f"ip6 daddr {{ {', '.join(NOT_GLOBAL_V6)} }}")
    carried = _embedded(map(ipaddress.IPv4Network, NOT_GLOBAL_V4))
    rules += _deny(f"ip6 daddr {{ {netguard.NAT64_LOCAL}, {carried} }}")
    body = "\n".join("    " + rule for rule in rules)
    # only packets of sandbox sockets enter chain "box" (the kernel's own replies have no socket)
    return (f"table inet {table}\ndelete table inet {table}\n"
            f"table inet {table} {{\n  chain out {{\n"
            f"    type filter hook output priority filter; policy accept;\n"
            f"    meta skuid {first}-{first + BLOCK - 1} jump box\n  }}\n  chain box {{\n{body}\n  }}\n}}\n")


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


def _table() -> str:
    return f"{TABLE_PREFIX}{os.getpid()}"


def _inputs() -> tuple:
    """What the rule set is made of: the table is made again only when it changes."""
    return netguard.cluster_endpoints(), settings.SANDBOX_DENY, settings.SANDBOX_ALLOW


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
        _nft(ruleset())
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
            _nft(None, "delete", "table", "inet", _table())
        except Unavailable:
            pass
        _installed = None
