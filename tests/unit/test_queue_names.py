"""Queue names: a priority's queue, host and foreign queues, and the order a worker reads them in."""
from __future__ import annotations

import pytest

from common.queue.names import cap, queue_for_priority, queue_name, worker_queue_names


@pytest.mark.parametrize(
    "priority,queue",
    [
        (-1, "down_super"),
        (0, "down_high"),
        (1, "down_high"),
        (2, "down_mid"),
        (3, "down_mid"),
        (4, "down_low"),
        (5, "down_low"),
    ],
)
def test_priority_mapping(priority, queue):
    assert queue_for_priority(priority) == queue


@pytest.mark.parametrize("bad", [-2, 6, 100])
def test_priority_out_of_range(bad):
    with pytest.raises(ValueError):
        queue_for_priority(bad)


def test_worker_order_puts_host_queue_first_at_each_level():
    assert worker_queue_names() == ["down_super", "down_high", "down_mid", "down_low"]
    assert worker_queue_names("h1") == ["down_super@h1", "down_super", "down_high@h1", "down_high",
                                        "down_mid@h1", "down_mid", "down_low@h1", "down_low"]
    assert queue_name("down_low", "h1") == "down_low@h1"
    assert cap("down_low@h1") == cap("down_low") == 1000


def test_foreign_queues_sit_between_host_and_shared_queues():
    from common.queue.names import base_of, queue_name

    assert (
        queue_name("down_mid", foreign=True) == "down_mid#foreign"
        and base_of("down_mid#foreign") == "down_mid"
    )
    assert queue_name("down_mid", "h1", foreign=True) == "down_mid@h1"  # a host is more specific
    assert worker_queue_names("h1", foreign=True)[:4] == ["down_super@h1", "down_super#foreign", "down_super",
                                                          "down_high@h1"]
    assert "down_low#foreign" not in worker_queue_names("h1")
