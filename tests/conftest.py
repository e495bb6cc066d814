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
sys.path.insert(0, str(ROOT / "scripts"))  # sample_site, services
sys.path.insert(0, str(ROOT))

from sample_site import start_site  # noqa: E402
from services import MongoServer, RedisServer, env_for  # noqa: E402

TEST_DBS = ("dc_test", "dc_test_log", "dc_test_control")  # the control database is named after the source


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
    """Base URL of the sample site, e.g. ``http://127.0.0.1:PORT``."""
    server, base = start_site()
    yield base
    server.shutdown()


@dataclass
class Cluster:
    redis: redis_lib.Redis
    env: dict  # the DOWNCLUSTER_* variables, to merge into a copy of os.environ for subprocesses
    site: str
    redis_server: RedisServer
    mongo_server: MongoServer


def _drop_test_dbs(mongo_server: MongoServer) -> None:
    """drop_database: measured faster than dropping or emptying each collection on SecantusDB."""
    client = pymongo.MongoClient(mongo_server.uri("admin"))
    try:
        for name in TEST_DBS:
            client.drop_database(name)
    finally:
        client.close()


@pytest.fixture
def cluster(redis_server, mongo_server, site, monkeypatch):
    """Settings from DOWNCLUSTER_* pointing at the session services, an empty Redis, empty
    test databases with their indexes, and a fresh mongoengine connection."""
    from common.config import load
    from common.store.connection import connect_mongo, disconnect_mongo

    env = env_for(redis_server.url, mongo_server.uri(TEST_DBS[0]), mongo_server.uri(TEST_DBS[1]),
                  HOSTNAME="testhost")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    load()  # this test's environment, no flags (a CLI run in an earlier test may have given --host)
    client = redis_lib.Redis.from_url(redis_server.url)
    client.flushall()  # our own server
    disconnect_mongo()
    _drop_test_dbs(mongo_server)
    connect_mongo(ensure_indexes=True)
    yield Cluster(
        redis=client, env=dict(env), site=site, redis_server=redis_server, mongo_server=mongo_server
    )
    client.close()
    monkeypatch.undo()  # restore the environment before reloading from it
    load()
    disconnect_mongo()


@pytest.fixture
def fast_recovery(cluster, monkeypatch):
    """``cluster`` where a killed worker is judged dead within seconds (a heartbeat a second,
    stale after 3 s, no grace): its entries recovered by the next dispatch. A test adds its own
    settings with ``with_settings`` on top."""
    from tests.helpers import FAST_RECOVERY, with_settings

    return with_settings(cluster, monkeypatch, FAST_RECOVERY)



# `make test` runs the suite on pytest-xdist workers (`-n 3 --dist loadgroup`, Makefile). Each
# worker has its own session services above (free ports), so tests share nothing by default; the
# tests here do share something of the machine, and a group runs on one worker, one test after
# another (a key names a file, or one test of it). xdist's own xdist_group marks do not group under
# pytest 9.2 (xdist 3.8 renames ``item._nodeid``, which pytest 9 no longer reads): the scheduler
# below groups by these names instead.
XDIST_GROUPS = {
    # var/ of the checkout: `make demo` empties it; pywb's venv, screenshots and a PNG live there
    "tests/e2e/test_make_commands.py": "checkout-var",
    "tests/e2e/test_warc.py": "checkout-var",
    "tests/e2e/test_console_browser.py": "checkout-var",
    "tests/e2e/test_console_roles.py": "checkout-var",
    "tests/integration/test_download_center.py::test_seed_template_in_excel_openpyxl_and_libreoffice":
        "checkout-var",
    # the machine's network: namespaces, the fixed 198.18.0.201/30 on a veth, /etc/hosts
    "tests/e2e/test_multihost.py": "machine-net",
    "tests/e2e/test_sandbox_walls.py": "machine-net",
    "tests/e2e/test_wall_blind_spots.py": "machine-net",
    # the second checks that the cluster fixture undid what the first wrote: one worker, in order
    "tests/integration/test_infra.py::test_isolation_write": "infra-isolation",
    "tests/integration/test_infra.py::test_isolation_clean_with_indexes": "infra-isolation",
    "tests/integration/test_infra.py::test_cluster_env_and_settings": "infra-isolation",
    "tests/integration/test_infra.py::test_settings_restored_after_a_test": "infra-isolation",
    # whole Chromiums with page waits: one at a time here, beside the console's
    "tests/e2e/test_browser_engine.py": "chromium",
    "tests/e2e/test_center_browser.py": "chromium",
    "tests/e2e/test_install_anywhere.py": "chromium",
}


def xdist_group(nodeid: str) -> str | None:
    """The group of XDIST_GROUPS that test ``nodeid`` belongs to, if any."""
    path, _, name = nodeid.partition("::")
    return XDIST_GROUPS.get(f"{path}::{name.split('[')[0]}") or XDIST_GROUPS.get(path)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: every test a unit of its own, each group one unit (largest first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return GroupScheduling(config, log)
