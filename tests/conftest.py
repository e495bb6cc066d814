"""Session fixtures: a private redis-server, a SecantusDB (:memory:) and the sample site,
all on free loopback ports; ``cluster`` gives each test clean databases and queues."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pymongo
import pytest
import redis as redis_lib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

from sample_site import start_site  # noqa: E402
from services import MongoServer, RedisServer, env_for  # noqa: E402


@pytest.fixture(scope="session")
def redis_server():
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="session")
def mongo_server():
    with MongoServer(":memory:") as server:
        yield server


@pytest.fixture(scope="session")
def site():
    server, base = start_site()
    yield base
    server.shutdown()


@dataclass
class Cluster:
    redis: redis_lib.Redis
    env: dict
    site: str
    redis_server: RedisServer
    mongo_server: MongoServer


def _wipe(mongo_server: MongoServer) -> None:
    client = pymongo.MongoClient(mongo_server.uri("admin"))
    try:
        for name in ("dc_test", "dc_test_log"):
            db = client[name]
            for coll in db.list_collection_names():
                db[coll].delete_many({})
    finally:
        client.close()


@pytest.fixture
def cluster(redis_server, mongo_server, site, monkeypatch):
    from common.config import settings
    from common.connections import connect_mongo, disconnect_mongo

    env = env_for(redis_server.url, mongo_server.uri("dc_test"), mongo_server.uri("dc_test_log"), HOSTNAME="testhost")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings.reload()
    client = redis_lib.Redis.from_url(redis_server.url)
    client.flushall()  # our own server
    _wipe(mongo_server)
    disconnect_mongo()
    connect_mongo(ensure_indexes=True)
    yield Cluster(redis=client, env=dict(env), site=site, redis_server=redis_server, mongo_server=mongo_server)
    monkeypatch.undo()
    settings.reload()
    disconnect_mongo()
