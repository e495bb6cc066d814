"""The dispatcher's plan without a store: queue room and the total cap, batches, retries before
fresh tasks and the fresh cursor, intake reservations, and the order jobs are served in."""
from __future__ import annotations

from datetime import datetime, timedelta

from bson import ObjectId

from common.store.due import Picked, fresh_cursor, fresh_limit
from common.store.models import AGAIN, FRESH, REVISIT
from common.store.records import Job
from master.dispatch.dispatcher import JobWork, order_key, plan

NOW = datetime(2026, 1, 1, 12, 0, 0)


def _job(name: str, priority: int, host: str) -> Job:
    return Job(id=ObjectId(), name=name, priority=priority, worker_host=host)


def _work(name: str, priority: int, n: int, again: int = 0, host: str = "") -> JobWork:
    job = Job(id=ObjectId(), name=name, priority=priority, worker_host=host)
    return JobWork(job=job, dispatch_num=n + again, max_retry_times=5,
                   again=[Picked(f"{name}-a{i}", "") for i in range(again)],
                   fresh=[Picked(f"{name}-{i}", "", i + 1) for i in range(n)])


def _taken(work: JobWork, attempt_kind: str = FRESH) -> int:
    return sum(len(e.ids) for e in work.entries if e.attempt_kind == attempt_kind)


def test_plan_respects_queue_room_and_writes_alert():
    a, b = _work("a", -1, 120), _work("b", -1, 50)
    free = {"down_super": 3}
    alerts = plan([a, b], free, total=10_000, batch_size=50)
    assert _taken(a) == 120 and _taken(b) == 0  # 3 entries: 50+50+20
    assert [len(e.ids) for e in a.entries] == [50, 50, 20] and free["down_super"] == 0
    assert [(w.name, kind) for w, kind, _ in alerts] == [("b", "queue_full")]


def test_plan_respects_total_cap():
    a, b = _work("a", 0, 80), _work("b", 5, 80)
    alerts = plan([a, b], {"down_high": 100, "down_low": 100}, total=100, batch_size=10)
    assert _taken(a) == 80 and _taken(b) == 20 and b.fresh_taken == 20
    assert alerts[0][1] == "total_cap" and "60 of 80" in alerts[0][2]


def test_plan_with_batch_size_one_counts_tasks():
    a = _work("a", 5, 10)
    plan([a], {"down_low": 4}, total=100, batch_size=1)
    assert _taken(a) == 4 and a.fresh_taken == 4


def test_retries_go_first_and_fresh_tasks_stop_at_the_first_that_does_not_fit():
    a = _work("a", 5, 30, again=5)
    a.fresh[3] = Picked("a-3", "h1", 4)  # bound for host h1, whose queue has no room
    plan([a], {"down_low": 10, "down_low@h1": 0}, total=100, batch_size=10)
    assert _taken(a, AGAIN) == 5 and a.fresh_taken == 3  # the cursor may pass seq 1..3 only
    assert fresh_cursor(a.fresh, 30, a.fresh_taken) == 3
    assert fresh_cursor(a.fresh, 30, len(a.fresh)) == 30


def test_fresh_limit_stops_below_intake_in_progress():
    now = NOW
    job = Job(id=ObjectId(), name="a", seq_next=500,
              intake=[{"seq": 301, "at": now}, {"seq": 101, "at": now - timedelta(hours=1)}])
    assert fresh_limit(job, now) == 300  # the stale reservation (a dead intake) no longer holds it
    assert fresh_limit(Job(id=ObjectId(), name="a", seq_next=7), now) == 7


def test_order_by_priority_host_or_both():
    jobs = [_job(name="x", priority=5, host=""), _job(name="y", priority=0, host="h2"),
            _job(name="z", priority=0, host="")]
    assert [j.name for j in sorted(jobs, key=lambda j: order_key(j, "priority"))] == ["y", "z", "x"]
    assert [j.name for j in sorted(jobs, key=lambda j: order_key(j, "host"))] == ["y", "z", "x"]
    jobs.append(_job(name="w", priority=5, host="h1"))
    assert [j.name for j in sorted(jobs, key=lambda j: order_key(j, "host"))] == ["w", "y", "z", "x"]
    assert [j.name for j in sorted(jobs, key=lambda j: order_key(j, "priority,host"))] == ["y", "z", "w", "x"]


def test_revisits_stop_at_the_first_that_does_not_fit_and_the_floor_follows():
    a = _work("a", 5, 0)
    a.revisits = [Picked(f"r{i}", "h1" if i == 4 else "", 0, due=NOW + timedelta(seconds=i))
                  for i in range(8)]
    a.revisit_floor = (NOW + timedelta(seconds=7), "r7")
    plan([a], {"down_low": 10, "down_low@h1": 0}, total=100, batch_size=10)
    assert _taken(a, REVISIT) == 4  # r4's host queue is full: r5.. wait behind it, never sent twice
    assert a.next_revisit_floor() == (NOW + timedelta(seconds=3), "r3")
    b = _work("b", 5, 0)
    b.revisits, b.revisit_floor = a.revisits[:4], (NOW + timedelta(seconds=3), "r3")
    plan([b], {"down_low": 10}, total=100, batch_size=10)
    assert b.next_revisit_floor() == b.revisit_floor  # all sent: what due_revisits said
