"""Connections to MongoDB (aliases "source", "log" and "control") and Redis, made lazily per process.

rq's forking worker runs each job in a fresh child; a pymongo client must not cross a fork,
so ``connect_mongo`` reconnects when it finds itself in a new process.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, TypeVar
from urllib.parse import unquote, urlsplit

import mongoengine
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.errors import ConnectionFailure, OperationFailure
from redis import Redis
from redis.maint_notifications import MaintNotificationsConfig

from common.config import settings
from common.errors import ConfigError
from common.queue.retry import backoff

logger = logging.getLogger(__name__)
DUPLICATE_KEY = 11000
_lock = threading.Lock()
_mongo_pid: int | None = None
_redis: tuple[int, str, Redis] | None = None
T = TypeVar("T")


def control_uri() -> str:
    """MONGO_CONTROL_URI, or the source URI with its database named ``<source>_control``."""
    if settings.MONGO_CONTROL_URI:
        return str(settings.MONGO_CONTROL_URI)
    parts = urlsplit(settings.MONGO_URI)
    name = parts.path.strip("/") or "downcluster"
    return str(parts._replace(path=f"/{name}_control").geturl())


ALIASES = ("source", "log", "control")


def connect_mongo(ensure_indexes: bool = False) -> None:
    """Register the "source", "log" and "control" aliases (idempotent within one process)."""
    global _mongo_pid
    with _lock:
        if _mongo_pid == os.getpid():
            return
        if _mongo_pid is not None:
            disconnect_mongo_unlocked()
        opts = dict(serverSelectionTimeoutMS=int(settings.MONGO_TIMEOUT * 1000), connect=False,
                    uuidRepresentation="standard")
        if settings.MONGO_SOCKET_TIMEOUT:
            opts["socketTimeoutMS"] = int(settings.MONGO_SOCKET_TIMEOUT * 1000)
        mongoengine.connect(alias="source", host=settings.MONGO_URI, **opts)
        mongoengine.connect(alias="log", host=settings.MONGO_LOG_URI, **opts)
        mongoengine.connect(alias="control", host=control_uri(), **opts)
        _mongo_pid = os.getpid()
    if ensure_indexes:
        from common.store.schema import ALL_MODELS

        for model in ALL_MODELS:
            try:
                model.ensure_indexes()
            except OperationFailure as exc:
                if exc.code != DUPLICATE_KEY:
                    raise
                # a unique index this version adds, over data an earlier one stored twice
                logger.warning("an index of %s is not made (%s): run `downcluster migrate`",
                               model._get_collection_name(), str(exc).split(",")[0])
        from common.store.upgrade import retired_left

        for index in retired_left():
            logger.warning("the store keeps an index of an earlier version, %s: run `downcluster migrate`",
                           index)


def disconnect_mongo_unlocked() -> None:
    global _mongo_pid
    for alias in ALIASES:
        mongoengine.disconnect(alias)
    _mongo_pid = None


def disconnect_mongo() -> None:
    with _lock:
        disconnect_mongo_unlocked()


def collection(model: Any) -> Collection[dict[str, Any]]:
    """The pymongo collection of a document class (typed: mongoengine's own calls are not)."""
    found: Collection[dict[str, Any]] = model._get_collection()
    return found


def mongo_client(alias: str = "source") -> MongoClient[dict[str, Any]]:
    connect_mongo()
    client: MongoClient[dict[str, Any]] = mongoengine.get_connection(alias)
    return client


def mongo_answers(seconds: float) -> bool:
    """Whether the source database answers a ping within ``seconds`` (a web started while
    MongoDB is away still starts, and answers 503s until it is back)."""
    from pymongo.errors import PyMongoError

    client: MongoClient[dict[str, Any]] = MongoClient(
        settings.MONGO_URI, serverSelectionTimeoutMS=int(seconds * 1000), connect=False)
    try:
        client.admin.command("ping")
        return True
    except PyMongoError:
        return False
    finally:
        client.close()


def _hosts_of(url: str) -> str:
    """host:port[,host:port] of a mongodb:// or redis:// URL, never its credentials."""
    netloc = urlsplit(url).netloc.rpartition("@")[2]
    return netloc or "?"


def unreachable(exc: BaseException) -> str | None:
    """One line naming the service ``exc`` says is unreachable and its host:port, or None when
    ``exc`` is not a connection failure."""
    from redis.exceptions import AuthenticationError, ResponseError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeout

    if isinstance(exc, OperationFailure) and exc.code in MONGO_AUTH_CODES:
        return f"MongoDB refused the credentials at {_hosts_of(settings.MONGO_URI)}"
    if isinstance(exc, ConnectionFailure):
        return f"MongoDB unreachable at {_hosts_of(settings.MONGO_URI)}"
    refused = isinstance(exc, ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))
    if isinstance(exc, AuthenticationError) or refused:
        return f"Redis refused the credentials at {_hosts_of(settings.REDIS_URL)}"
    if isinstance(exc, (RedisConnectionError, RedisTimeout)):
        return f"Redis unreachable at {_hosts_of(settings.REDIS_URL)}"
    return None


MONGO_AUTH_CODES = (13, 18)  # Unauthorized, AuthenticationFailed
TRANSIENT_CODES = (91, 189, 11600, 11602, 10107, 13435, 13436)  # shutdown, stepdown, not primary


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` says MongoDB is away for a while (a lost connection, a primary stepping
    down): the same command may succeed when tried again."""
    if isinstance(exc, OperationFailure):
        return exc.has_error_label("RetryableWriteError") or exc.code in TRANSIENT_CODES
    return isinstance(exc, ConnectionFailure)


def with_retries(fn: Callable[[], T], what: str, deadline: float = 120.0) -> T:
    """Call ``fn`` until it stops failing on a lost connection (``transient``), for up to
    ``deadline`` seconds, with backoff; any other failure, or the last one, is raised."""
    end, attempt = time.monotonic() + deadline, 0
    while True:
        try:
            return fn()
        except (ConnectionFailure, OperationFailure) as exc:
            if not transient(exc):
                raise
            attempt += 1
            delay = backoff(attempt, base=0.2, cap=5.0, jitter=False)
            if time.monotonic() + delay > end:
                raise
            logger.warning(
                "MongoDB unavailable during %s (%s); retrying in %.1fs", what, type(exc).__name__, delay
            )
            time.sleep(delay)


# redis-py 8 asks every new RESP3 connection for maintenance notifications (a Redis Enterprise
# feature): on Redis 7 that is a failed command per connection, whose swallowed error held the
# caller's asyncio task (and its downloaded body) in a reference cycle until the next GC.
REDIS_OPTIONS = {"maint_notifications_config": MaintNotificationsConfig(enabled=False)}


SENTINEL_SCHEME = "redis+sentinel://"
SENTINEL_SOCKET_TIMEOUT = 30.0


def redis_client(url: str | None = None, asynchronous: bool = False, **options: Any) -> Any:
    """A Redis client (redis.asyncio's with ``asynchronous``) for ``url``, by default REDIS_URL:
    ``redis://``, ``rediss://``, ``unix://``, or ``redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT…]
    /SERVICE[/DB]`` — the master that the Sentinels name SERVICE, found again after a failover
    (the password is the master's and the Sentinels')."""
    url = url or settings.REDIS_URL
    options = {**REDIS_OPTIONS, **options}
    if not url.startswith(SENTINEL_SCHEME):
        if asynchronous:
            from redis.asyncio import Redis as AsyncRedis

            return AsyncRedis.from_url(url, **options)
        return Redis.from_url(url, **options)
    parts = urlsplit(url)
    password = unquote(parts.password) if parts.password else None
    hosts = []
    for item in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = item.rpartition(":")
        hosts.append((host.strip("[]") or "127.0.0.1", int(port or 26379)))
    service, _, db = parts.path.strip("/").partition("/")
    if not service:
        raise ConfigError("REDIS_URL: a redis+sentinel:// URL names its service: redis+sentinel://HOST:PORT/SERVICE")
    from redis.asyncio.sentinel import Sentinel as AsyncSentinel
    from redis.sentinel import Sentinel as SyncSentinel

    Sentinel = AsyncSentinel if asynchronous else SyncSentinel
    options.setdefault("socket_timeout", SENTINEL_SOCKET_TIMEOUT)  # a failover must not leave a call hanging
    sentinel = Sentinel(hosts, sentinel_kwargs={"password": password, "socket_timeout": 5},
                        password=password, db=int(db or 0), **options)
    return sentinel.master_for(service)


def redis_conn() -> Redis:
    """One Redis client per process and URL."""
    global _redis
    url = settings.REDIS_URL
    if _redis is None or _redis[0] != os.getpid() or _redis[1] != url:
        _redis = (os.getpid(), url, redis_client(url, health_check_interval=30))
    return _redis[2]


def as_text(value: bytes | str) -> str:
    """A Redis reply as text (a client made with decode_responses gives str already)."""
    return value if isinstance(value, str) else value.decode()


# --- the servers behind the connection URLs --------------------------------------------------

def service_members(timeout: float = 5.0) -> set[tuple[str, int]]:
    """(host, port) of the servers the cluster's connection URLs lead to without naming them: the
    Redis masters, replicas and fellow Sentinels that the Sentinels of a ``redis+sentinel://``
    REDIS_URL know, and each MongoDB URI's members (``mongodb+srv://`` resolved, and the replica
    set's members this process's clients have found). What cannot be asked now is left out: the
    caller keeps what it knew."""
    found: set[tuple[str, int]] = set()
    if settings.REDIS_URL.startswith(SENTINEL_SCHEME):
        found |= _sentinel_members(settings.REDIS_URL, timeout)
    for alias, uri in zip(ALIASES, (settings.MONGO_URI, settings.MONGO_LOG_URI, control_uri())):
        found |= _mongo_members(alias, uri, timeout)
    return found


def _sentinel_members(url: str, timeout: float) -> set[tuple[str, int]]:
    from redis.sentinel import Sentinel

    parts = urlsplit(url)
    password = unquote(parts.password) if parts.password else None
    found: set[tuple[str, int]] = set()
    for item in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = item.rpartition(":")
        where = [(host.strip("[]") or "127.0.0.1", int(port or 26379))]
        options = {"password": password, "socket_timeout": timeout}
        sentinel = Sentinel(where, sentinel_kwargs=options)  # type: ignore[no-untyped-call]
        conn = sentinel.sentinels[0]
        try:
            masters: Any = conn.sentinel_masters()
            for name, master in masters.items():
                found.add((str(master["ip"]), int(master["port"])))
                replicas: Any = conn.sentinel_slaves(name)
                sentinels: Any = conn.sentinel_sentinels(name)
                for peer in list(replicas) + list(sentinels):
                    found.add((str(peer["ip"]), int(peer["port"])))
        except Exception:  # noqa: BLE001 - a Sentinel that does not answer now tells nothing
            continue
        finally:
            conn.close()
    return found


def _mongo_members(alias: str, uri: str, timeout: float) -> set[tuple[str, int]]:
    from pymongo.uri_parser import parse_uri

    found: set[tuple[str, int]] = set()
    try:
        found.update((str(h), int(p)) for h, p in parse_uri(uri, connect_timeout=timeout)["nodelist"])
    except Exception:  # noqa: BLE001 - an SRV name that does not resolve now tells nothing
        pass
    with _lock:  # never beside a disconnect: a connection asked for then would be made again half-way
        if _mongo_pid == os.getpid():
            try:
                client = mongoengine.get_connection(alias)
                found.update((str(h), int(p)) for h, p in client.topology_description.server_descriptions())
            except Exception:  # noqa: BLE001 - not connected here
                pass
    return found
