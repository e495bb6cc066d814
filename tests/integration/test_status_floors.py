"""The floor of each (job, status) (``common.store.floors``): a status's first page after a quiet
stretch and a burst reads a page, not the burst, and no listing ever misses a task — after
requeue of old tasks into the status, recovery, hand-back, cancel, a recount, and with intake
and requeues running while pages are read."""
from __future__ import annotations

import threading
from datetime import timedelta

from bson import ObjectId

from common.store import counts, floors
from common.store.models import TASK_STATUSES, CrawlerTask, CrawlerTaskCount, utcnow
from master import views
from master.ops import tasks as task_ops
from scripts.bench_scale import _oid
from tests.helpers import add_urls, register
from tests.integration.test_store_scale import _examined


def _plain(job_id, status: str, n: int = 20) -> list[ObjectId]:
    found = CrawlerTask._get_collection().find({"job": job_id, "status": status}, {"_id": 1}).sort("_id", 1)
    return [d["_id"] for d in found.limit(n)]


def _listed(name: str, status: str, n: int = 20, after=None) -> list[ObjectId]:
    return [ObjectId(t["id"]) for t in views.task_page(name, status=status, limit=n, after=after)["tasks"]]


def floors_hold(job_id) -> None:
    """Every known floor is at or below its status's first task."""
    doc = CrawlerTaskCount._get_collection().find_one({"_id": job_id}) or {}
    for status in TASK_STATUSES:
        if (doc.get("floor_ok") or {}).get(status):
            first = _plain(job_id, status, 1)
            assert not first or first[0] >= doc["floor"][status], (status, first, doc["floor"][status])


def _fill_burst(job_id, quiet: int, burst: int) -> list[ObjectId]:
    """``quiet`` SUCCESS and FAIL tasks made one a second over a stretch ending an hour ago, then
    ``burst`` LIVE tasks made within three seconds now (ids as intake makes them: consecutive)."""
    now = utcnow()
    since, docs = now - timedelta(hours=1, seconds=quiet), []
    for i in range(quiet):
        at = since + timedelta(seconds=i)
        docs.append({"_id": _oid(at, i), "job": job_id, "uri": f"http://example.org/old/{i}", "seq": i + 1,
                     "status": "FAIL" if i % 10 == 0 else "SUCCESS", "download_times": 1,
                     "add_datetime": at, "last_update_datetime": at})
    live = [_oid(now - timedelta(seconds=3 - i * 3 // burst), quiet + i) for i in range(burst)]
    docs += [{"_id": t, "job": job_id, "uri": f"http://example.org/new/{i}", "seq": quiet + i + 1,
              "status": "LIVE", "download_times": 0, "add_datetime": now, "last_update_datetime": now}
             for i, t in enumerate(live)]
    CrawlerTask._get_collection().insert_many(docs)
    return live


def test_first_live_page_after_a_burst_reads_a_page_and_misses_nothing(cluster, tmp_path):
    job = register(tmp_path, "burst")
    live = _fill_burst(job.id, quiet=2000, burst=3000)
    counts.recount()  # a store filled from outside, as documented; it sets every floor exactly
    CrawlerTaskCount._get_collection().update_one({"_id": job.id}, {"$unset": {"floor": "", "floor_ok": ""}})

    unbounded = _examined(lambda: _listed("burst", "LIVE"))  # no floor known: read from the first task
    assert _listed("burst", "LIVE") == live[:20]  # ... and that page set the floor
    bounded = _examined(lambda: _listed("burst", "LIVE"))
    nxt = _examined(lambda: _listed("burst", "LIVE", after=str(live[19])))
    print(f"\nLIVE first page after 2,000 quiet tasks and a burst of 3,000: {unbounded} documents examined "
          f"without a floor, {bounded} with it; the next page {nxt}")
    assert unbounded >= 1000 and bounded <= 100 and nxt <= 100
    assert _listed("burst", "LIVE", after=str(live[19])) == live[20:40]

    # old FAIL tasks requeued into LIVE after the burst: they come first
    assert task_ops.requeue("burst", ["FAIL"]) == 200
    floors_hold(job.id)
    assert _listed("burst", "LIVE") == _plain(job.id, "LIVE")
    assert _listed("burst", "LIVE")[0] < live[0]
    # ... cancelled again: the LIVE page is the burst's, and CANCEL's begins at the oldest
    task_ops.cancel("burst", ["LIVE"])
    assert _listed("burst", "LIVE") == [] and _listed("burst", "CANCEL") == _plain(job.id, "CANCEL")
    assert task_ops.requeue("burst", ["CANCEL"]) == 3200
    assert _listed("burst", "LIVE") == _plain(job.id, "LIVE")
    floors_hold(job.id)


def test_a_status_emptied_and_refilled_begins_at_its_new_first_task(cluster, tmp_path):
    """LIVE drained (all cancelled), the chore reads it empty (floor at the top), then an intake:
    its first task is the floor; a task recovered into LIVE with an older id lowers it."""
    from common.store.leases import give_back

    job = register(tmp_path, "refill")
    add_urls("refill", [f"http://example.org/a{i}" for i in range(30)])
    first = _listed("refill", "LIVE", 5)
    task_ops.cancel("refill", ["LIVE"])
    floors.tend(60.0)
    assert floors.read(job.id, "LIVE")[0] == counts.TOP and _listed("refill", "LIVE") == []
    add_urls("refill", [f"http://example.org/b{i}" for i in range(30)])
    fresh = _plain(job.id, "LIVE", 30)
    assert floors.read(job.id, "LIVE")[0] == fresh[0] and _listed("refill", "LIVE", 30) == fresh
    # an old task handed back into LIVE by its lease (as the defender or a worker gives back)
    CrawlerTask._get_collection().update_one({"_id": first[0]},
                                             {"$set": {"status": "DISPATCH", "lease": "l1"}})
    counts.move([(job.id, "CANCEL", "DISPATCH", 1)], floors={(job.id, "DISPATCH"): first[0]})
    assert give_back(job.id, [first[0]], "l1", "AGAIN", "test", utcnow()) == 1
    assert _listed("refill", "LIVE")[0] == first[0]
    floors_hold(job.id)


def test_pages_read_while_tasks_enter_the_status_miss_none(cluster, tmp_path):
    """Intake and requeues of old tasks into LIVE run while LIVE's first page is read over and
    over (each read may raise the floor): every floor holds after each change, and the first
    page is the plain sort's once they end."""
    job = register(tmp_path, "race", dispatch_num=10)
    add_urls("race", [f"http://example.org/old{i}" for i in range(200)])
    task_ops.cancel("race", ["LIVE"])
    stop, errors = threading.Event(), []

    def reader() -> None:
        while not stop.is_set():
            try:
                views.task_page("race", status="LIVE", limit=5)
                views.task_page("race", status="CANCEL", limit=5)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for round_ in range(6):
            add_urls("race", [f"http://example.org/r{round_}-{i}" for i in range(50)])
            task_ops.requeue("race", ["CANCEL"]) if round_ % 2 else task_ops.cancel("race", ["LIVE"])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors
    floors_hold(job.id)
    for status in ("LIVE", "CANCEL"):
        assert _listed("race", status) == _plain(job.id, status), status
