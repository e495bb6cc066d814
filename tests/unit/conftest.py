"""Holds tests/unit to its promise: a test here that asks for a service fixture fails at set-up,
before the fixture starts anything."""
from __future__ import annotations

import pytest

SERVICES = {"cluster", "redis_server", "mongo_server", "site"}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    used = SERVICES & set(item.fixturenames)
    if used:
        pytest.fail(f"{item.nodeid} uses {sorted(used)}: a test with services belongs in tests/integration",
                    pytrace=False)
