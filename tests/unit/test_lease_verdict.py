"""When a lease is judged broken, and whether its tasks lose an attempt."""
from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from common.store.leases import lease_verdict
from common.store.records import Lease

NOW = datetime(2026, 1, 1, 12, 0, 0)


@pytest.mark.parametrize(
    "lease,in_queue,broken,attempt",
    [
        ({"state": "QUEUED"}, True, False, None),
        (
            {"state": "QUEUED", "created_at": NOW - timedelta(days=2)},
            True,
            False,
            None,
        ),  # waiting is never death
        ({"state": "QUEUED"}, False, False, None),  # missing once: looked at again later
        (
            {"state": "QUEUED", "missing_at": NOW - timedelta(seconds=5)},
            False,
            False,
            None,
        ),  # not for long enough
        (
            {"state": "QUEUED", "missing_at": NOW - timedelta(seconds=11)},
            True,
            False,
            None,
        ),  # back in its queue
        ({"state": "QUEUED", "missing_at": NOW - timedelta(seconds=11)}, False, True, False),
        (
            {
                "state": "RUNNING",
                "started_at": NOW - timedelta(seconds=50),
                "beat_at": NOW - timedelta(seconds=3),
            },
            False,
            False,
            None,
        ),
        (
            {
                "state": "RUNNING",
                "started_at": NOW - timedelta(seconds=50),
                "beat_at": NOW - timedelta(seconds=30),
            },
            False,
            True,
            True,
        ),
        ({"state": "RUNNING", "started_at": NOW - timedelta(hours=2), "beat_at": NOW}, False, True, True),
        ({"state": "LOST", "lost_reason": "x", "started_at": NOW}, False, True, True),
    ],
)
def test_lease_verdict(lease, in_queue, broken, attempt):
    verdict = lease_verdict(Lease.from_doc({"_id": "l1", **lease}), in_queue, NOW, 20, 3600, 10)
    assert (verdict is not None) == broken
    if broken:
        assert verdict[1] == attempt


def test_the_status_an_entry_holds_its_tasks_in_is_its_guards():
    from common.store.leases import _held_by, held_status
    from common.store.models import AGAIN, FRESH, REVISIT

    for kind in (FRESH, AGAIN, REVISIT):
        assert held_status(kind) == _held_by("l1", kind, NOW)["status"]
