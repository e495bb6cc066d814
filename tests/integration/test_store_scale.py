"""What keeps a store of millions of tasks fast: counts kept as tasks change (exact against a
recount through every kind of change), chores run on a cluster-wide schedule held in the store
(not by every cron dispatch), and an index behind every query of a hot or interactive path —
asked of the embedded store's planner (``explain``) and of the indexes the models declare, which
is what MongoDB's planner uses to serve a sort."""
from __future__ import annotations

from datetime import timedelta

import pytest
from bson import ObjectId
from pymongo import monitoring

from common.config import load, settings
from common.store import counts
from common.store.clock import utcnow
from common.store.leases import claim
from common.store.log_models import CrawlerDownloadLog
from common.store.models import (
    TASK_STATUSES,
    CrawlerDownloadData,
    CrawlerDownloadSetting,
    CrawlerLease,
    CrawlerOldVersion,
    CrawlerTask,
    CrawlerTaskKey,
    DefenderState,
    Job,
)
from common.store.records import ExportFilter
from master import maintenance as chores
from master.dispatch.dispatcher import dispatch_once
from master.ops import retention
from master.ops import tasks as task_ops
from tests.helpers import add_urls, burst_worker, register


def floors_hold(job_id) -> None:
    from tests.integration.test_status_floors import floors_hold as hold

    hold(job_id)


def listed_as_sorted(job_id, status: str) -> bool:
    from master import views
    from tests.integration.test_status_floors import _plain

    name = Job.objects.get(id=job_id).name
    page = views.task_page(name, status=status, limit=20)["tasks"]
    return [ObjectId(t["id"]) for t in page] == _plain(job_id, status)


def _recounted(job_id) -> dict[str, int]:
    got = dict.fromkeys(TASK_STATUSES, 0)
    for row in CrawlerTask._get_collection().aggregate([{"$match": {"job": job_id}},
                                                       {"$group": {"_id": "$status", "n": {"$sum": 1}}}]):
        got[row["_id"]] = row["n"]
    return got


def _kept(job_id) -> dict[str, int]:
    return counts.of_jobs([job_id]).get(job_id, dict.fromkeys(TASK_STATUSES, 0))


def test_counts_kept_as_tasks_change_equal_a_recount_at_every_step(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("DOWNCLUSTER_RETRY_BACKOFF_BASE", "0.01")  # the worker's retries come due at once
    load(flags=dict(settings.flags, RETRY_BACKOFF_BASE=0.01, HEARTBEAT_TTL=3, ABSENCE_GRACE=0))
    job = register(tmp_path, "c", dispatch_num=200, max_retry_times=2, obey_robots=False)
    site = cluster.site
    steps = []

    def check(step: str) -> None:
        steps.append(step)
        assert _kept(job.id) == _recounted(job.id), step
        floors_hold(job.id)  # every status's floor at or below its first task (common.store.floors)
        for status in TASK_STATUSES:  # each page equals a plain sort's (and raises its floor)
            assert listed_as_sorted(job.id, status), (step, status)

    add_urls("c", [f"{site}/page/{i}" for i in range(30)] + [f"{site}/status/500?{i}" for i in range(6)]
             + [f"{site}/page/1", "ftp://refused"])  # a duplicate and a rejected line
    check("intake")
    dispatch_once(cluster.redis)
    check("dispatch")
    for _ in range(4):  # attempts, retries sent again (DISPATCH) and settled, failures made final
        burst_worker(cluster, "--no-exports")
        check("worker")
        dispatch_once(cluster.redis)
        check("dispatch again")
    assert _recounted(job.id)["SUCCESS"] == 30 and _recounted(job.id)["FAIL"] == 6

    add_urls("c", [f"{site}/page/x{i}" for i in range(8)])
    assert task_ops.cancel("c", ["LIVE"]) == 8
    check("cancel")
    assert task_ops.requeue("c", ["CANCEL", "FAIL"]) == 14
    check("requeue")
    dispatch_once(cluster.redis)
    lease = CrawlerLease._get_collection().find_one({"job": job.id})
    claim(lease["_id"], "a-worker-that-dies")  # claimed, never beats: the defender recovers it
    CrawlerLease._get_collection().update_one({"_id": lease["_id"]},
                                              {"$set": {"beat_at": utcnow() - timedelta(seconds=60)}})
    assert dispatch_once(cluster.redis).recovered > 0
    check("defender")
    burst_worker(cluster, "--no-exports")
    check("worker after recovery")

    CrawlerDownloadSetting._get_collection().update_one({"job": job.id}, {"$set": {"data_retention_days": 1}})
    removed = retention.enforce(now=utcnow() + timedelta(days=30)).tasks
    assert removed > 0
    check("retention")
    print(f"\ncounts equal to a recount after each of: {', '.join(steps)}; retention removed {removed} tasks")

    CrawlerTask._get_collection().insert_one(
        {"job": job.id, "uri": "http://x/raw", "status": "LIVE"}
    )  # behind its back
    assert _kept(job.id) != _recounted(job.id)
    counts.recount()
    assert _kept(job.id) == _recounted(job.id)  # what `downcluster stats --recount` repairs
    floors_hold(job.id)


def test_a_cron_dispatch_runs_a_chore_only_when_it_is_due_cluster_wide(cluster, tmp_path):
    register(tmp_path, "ch")
    state = DefenderState._get_collection()

    def next_times() -> dict:
        return {d["_id"]: d["at"] for d in state.find({"_id": {"$regex": "^chore:"}})}

    dispatch_once(cluster.redis)  # the first run anywhere takes every chore
    first = next_times()
    assert set(first) == {f"chore:{c.name}" for c in chores.table() if c.every}
    dispatch_once(cluster.redis)  # as the next cron process would: none is due
    assert next_times() == first
    past = utcnow() - timedelta(seconds=1)
    state.update_one({"_id": "chore:retention"}, {"$set": {"at": past}})
    dispatch_once(cluster.redis)  # due cluster-wide: this run takes it (and only it)
    after = next_times()
    assert after.pop("chore:retention") > utcnow() and after == {
        k: v for k, v in first.items() if k != "chore:retention"
    }
    assert not chores.claim("retention", 600, utcnow())  # taken: a second process finds it not due


# --- every hot or interactive query has an index -------------------------------------------------

JOB, MARK = ObjectId(), ObjectId()
# (model, filter, sort key or None, what asks it). Sorts must be served by the index on MongoDB: the
# declared index holds the filter's equality fields first, then the sort key (or the range field).
QUERIES = [
    (
        CrawlerTask,
        {"job": JOB, "status": "SUCCESS", "_id": {"$gt": MARK}},
        "_id",
        "a job's tasks of one status (views.task_page)",
    ),
    (CrawlerTask, {"job": JOB, "_id": {"$gt": MARK}}, "_id", "a job's tasks (views.task_page)"),
    # a task by URL (task show, intake's duplicates, sitemap lastmods): its key, then the task by
    # _id (with the job and status fields checked on the documents found, which the store's explain
    # shows as a scan: see docs/benchmarks.md)
    (CrawlerTaskKey, {"_id": {"$in": [str(JOB) + "http://x/"]}}, None, "URLs' keys (tasks._by_uri)"),
    (CrawlerTask, {"_id": {"$in": [MARK]}}, None, "the tasks keys name (tasks._by_uri)"),
    (
        CrawlerTask,
        {"job": JOB, "status": "LIVE", "retry_at": None, "seq": {"$gt": 1, "$lte": 9}},
        "seq",
        "fresh tasks above the cursor (due.due_fresh)",
    ),
    (
        CrawlerTask,
        {"job": JOB, "status": "FAIL", "retry_at": {"$lte": MARK.generation_time}},
        "retry_at",
        "tasks that go again (due.due_again)",
    ),
    (
        CrawlerTask,
        {"job": JOB, "status": "SUCCESS", "retry_at": {"$gt": MARK.generation_time,
                                                         "$lte": MARK.generation_time}},
        "retry_at",
        "revisits due in a window of due time (due.due_revisits)",
    ),
    (CrawlerTask, {"job": JOB, "status": "SUCCESS", "retry_at": MARK.generation_time}, None,
     "revisits due at the floor's own time (due.due_revisits)"),
    (CrawlerOldVersion, {"job": JOB, "_id": {"$lt": MARK}}, "_id",
     "earlier versions past retention (retention.remove_old_versions)"),
    (CrawlerDownloadData, {"task": MARK}, None,
     "a page's documents by the (task, lease) index's prefix (leases.mark_superseded)"),
    (
        CrawlerTask,
        {"job": JOB, "status": "SUCCESS", "_id": {"$lt": MARK}},
        "_id",
        "final tasks past retention (retention.enforce)",
    ),
    (
        CrawlerTask,
        {"job": JOB, "status": "DEAD"},
        None,
        "a job drained? dead tasks (reports, cancel, requeue)",
    ),
    (
        CrawlerDownloadData,
        {"job": JOB, "_id": {"$gt": MARK}},
        "_id",
        "a job's data (views.data_page, exports)",
    ),
    # (task, lease): by task, then lease among its documents (one per version of its page)
    (CrawlerDownloadData, {"task": MARK}, None, "a task's data (the fence, task show)"),
    (CrawlerDownloadData, {"task": MARK, "version": 2}, None, "a page version's document (the writer)"),
    (
        CrawlerDownloadLog,
        {"job": JOB, "_id": {"$lt": MARK}},
        "_id",
        "a job's download logs (views.log_page, retention)",
    ),
    (CrawlerDownloadLog, {"task": MARK}, None, "a task's download logs (task show)"),
    (
        CrawlerLease,
        {"state": "RUNNING", "beat_at": {"$lt": MARK.generation_time}},
        "beat_at",
        "running leases (the defender, the workers view)",
    ),
]


def _declared(model) -> list[list[str]]:
    keys = [["_id"]]
    for spec in model._meta.get("index_specs") or []:
        keys.append([k for k, _ in spec["fields"]])
    return keys


def _served(model, flt: dict, sort: str | None) -> list[str] | None:
    """The declared index that serves ``flt`` (and ``sort``) as MongoDB's planner would: its first
    keys are the filter's equality fields, then the sort key or the one range field."""
    equal = {k for k, v in flt.items() if not isinstance(v, dict) or not any(op.startswith("$") for op in v)}
    ranged = [k for k in flt if k not in equal]
    after = sort or (ranged[0] if ranged else None)
    for keys in _declared(model):
        head = keys[:len(equal)]
        if set(head) == equal and (after is None or (len(keys) > len(equal) and keys[len(equal)] == after)):
            return keys
    return None


@pytest.mark.parametrize("model,flt,sort,what", QUERIES, ids=[q[3] for q in QUERIES])
def test_every_hot_query_has_an_index(cluster, model, flt, sort, what):
    assert _served(model, flt, sort), f"{what}: no declared index serves {sorted(flt)} sorted by {sort}"
    coll = model._get_collection()
    command = {"find": coll.name, "filter": flt, **({"sort": {sort: 1}} if sort else {}), "limit": 10}
    plan = coll.database.command("explain", command)["queryPlanner"]["winningPlan"]
    while "inputStage" in plan:
        plan = plan["inputStage"]
    if "_id" in flt and not isinstance(flt["_id"], dict):
        return  # a point read by _id: the embedded store serves it outside its planner
    assert plan["stage"] == "IXSCAN", f"{what}: the embedded store scans the collection ({plan})"


def test_a_query_without_an_index_is_caught(cluster):
    assert _served(CrawlerTask, {"job": JOB, "failed_reason": "x"}, "add_datetime") is None
    assert _served(CrawlerTask, {"job": JOB, "status": "SUCCESS"}, "last_update_datetime") is None
    coll = CrawlerTask._get_collection()
    plan = coll.database.command("explain", {"find": coll.name, "filter": {"failed_reason": "x"}})
    assert plan["queryPlanner"]["winningPlan"]["stage"] == "COLLSCAN"


# --- a small store: the queries of a week of data, on 50,000 tasks --------------------------------

def test_fifty_thousand_tasks_counted_paged_and_dispatched(cluster, tmp_path):
    import time

    from common.exports.templates import parse_template
    from common.store.data import export_fits
    from master import views
    from master.ops import stats

    job = register(tmp_path, "big", dispatch_num=700, max_retry_times=3)
    now = utcnow()
    coll, n = CrawlerTask._get_collection(), 50_000
    docs = []
    for i in range(1, n + 1):
        status = "SUCCESS" if i % 10 else "FAIL"
        docs.append({"job": job.id, "uri": f"http://example.org/{i}", "seq": i, "status": status,
                     "download_times": 1, "recoveries": 0, "host_name": "",
                     "retry_at": now - timedelta(seconds=1) if status == "FAIL" and i % 20 == 0 else None,
                     "add_datetime": now, "last_update_datetime": now})
    coll.insert_many(docs, ordered=False)
    Job._get_collection().update_one({"_id": job.id}, {"$set": {"seq_next": n, "seq_sent": n}})
    counts.recount()  # as `downcluster migrate` does for a store filled before counts were kept
    add_urls("big", [f"http://example.org/new/{i}" for i in range(300)])

    timings = {}
    start = time.perf_counter()
    counted = {row["job"]: row for row in stats.task_counts()}["big"]
    timings["task counts"] = time.perf_counter() - start
    assert counted["SUCCESS"] == 45_000 and counted["FAIL"] == 5_000 and counted["LIVE"] == 300
    start = time.perf_counter()
    page = views.task_page("big", status="FAIL", limit=50)
    timings["FAIL page"] = time.perf_counter() - start
    assert len(page["tasks"]) == 50 and page["next"]
    start = time.perf_counter()
    every = views.task_page("big", limit=50, newest=True)  # every status
    timings["newest page"] = time.perf_counter() - start
    newest = [str(d["_id"]) for d in coll.find({"job": job.id}, {"_id": 1}).sort("_id", -1).limit(100)]
    after = views.task_page("big", limit=50, newest=True, after=every["next"])
    assert [t["id"] for t in every["tasks"] + after["tasks"]] == newest
    start = time.perf_counter()
    report = dispatch_once(cluster.redis)
    timings["dispatch"] = time.perf_counter() - start
    assert report.total == 700  # 2,500 retries due: 700 of them, the job's dispatch_num
    assert _kept(job.id) == _recounted(job.id)
    # the synchronous download's decision: 45,000 successes, unfiltered, is too many without a count;
    # one HTTP status asked is counted, up to the limit only
    start = time.perf_counter()
    assert not export_fits(job.id, ExportFilter(), parse_template(None), settings.EXPORT_SYNC_MAX_ROWS)
    timings["sync decision"] = time.perf_counter() - start
    one_status = ExportFilter(status=(404,))
    assert export_fits(job.id, one_status, parse_template(None), settings.EXPORT_SYNC_MAX_ROWS)
    print("\n50,000 tasks: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))


def test_pages_read_in_windows_are_exact_whatever_the_ids_times(cluster):
    """``common.store.paging.by_id`` against a plain sort: ids made years before the job's span, in
    bursts, sparse, and by a clock a week ahead; pages of every size, both orders, any span."""
    import random
    from datetime import datetime, timezone

    from common.store.paging import Span, by_id

    rnd, now = random.Random(7), datetime.now(timezone.utc)
    job, other = ObjectId(), ObjectId()
    times = (
        [now - timedelta(days=900)]
        + [now - timedelta(hours=30, seconds=rnd.random()) for _ in range(120)]
        + [now - timedelta(seconds=rnd.uniform(0, 86_400)) for _ in range(80)]
        + [now + timedelta(days=7)]
    )
    docs = [{"_id": ObjectId(ObjectId.from_datetime(t).binary[:4] + rnd.randbytes(8)),
             "job": job} for t in times] + [{"job": other} for _ in range(30)]
    coll = CrawlerDownloadLog._get_collection()
    coll.insert_many(docs)
    ids = sorted(d["_id"] for d in docs if d["job"] == job)

    def walk(size: int, **kw) -> list:  # every page, each after the last one's final id
        got, after = [], None
        while True:
            page = by_id(coll, {"job": job}, size, after=after, **kw)
            got += [d["_id"] for d in page]
            if len(page) < size:
                return got
            after = page[-1]["_id"]

    # the oldest id far below the span, the newest far above it; a span not known; a wrong one
    for span in (
        Span(
            ObjectId.from_datetime(now - timedelta(hours=31)),
            ObjectId.from_datetime(now - timedelta(hours=2)),
        ),
        Span(),
        Span(ObjectId.from_datetime(now), ObjectId.from_datetime(now - timedelta(days=3))),
    ):
        for newest in (False, True):
            for size in (1, 7, 500):
                assert walk(size, span=span, newest=newest) == (ids[::-1] if newest else ids), (
                    span,
                    newest,
                    size,
                )
            for size in (1, 7, 500):  # fine windows from each page's last id
                assert walk(size, span=span, fine=True) == ids, (span, size)
        for cut in (ids[0], ids[1], ids[60], ids[150], ids[-1]):  # oldest first, below a bound
            for size in (3, 1000):
                assert walk(size, span=span, before=cut) == [i for i in ids if i < cut], (span, cut, size)


# --- pages bounded by what they read, not by the store ---------------------------------------------

class _Reads(monitoring.CommandListener):
    """The finds and aggregations sent while ``on``: replayed with ``explain`` to count the
    documents the store examined for them (registered before any client is made)."""

    def __init__(self) -> None:
        self.on, self.sent = False, []

    def started(self, event) -> None:
        if self.on and event.command_name in ("find", "aggregate"):
            self.sent.append((event.database_name, dict(event.command)))

    def succeeded(self, event) -> None:
        pass

    def failed(self, event) -> None:
        pass


READS = _Reads()
monitoring.register(READS)


def _examined(fn) -> int:
    """Documents the store examined for the reads of ``fn()``."""
    READS.sent, READS.on = [], True
    try:
        fn()
    finally:
        READS.on = False
    client, total = CrawlerTask._get_collection().database.client, 0
    for db, command in READS.sent:
        command = {k: v for k, v in command.items() if not k.startswith("$") and k != "lsid"}
        plan = client[db].command("explain", command, verbosity="executionStats")
        stats = plan.get("executionStats") or plan["stages"][0]["$cursor"]["executionStats"]
        total += stats["totalDocsExamined"]
    return total


def test_the_logs_and_data_pages_read_a_page_not_the_store(cluster, tmp_path):
    """A store filled from outside (then ``stats --recount``, as documented): 3,000 tasks made a
    day ago, their data and download logs an hour ago; a second job. The console's log page of
    every job (and of a user's jobs) and a job's data page examine what a page holds, not the
    store: a filter of ``_id`` alone or ``job`` $in makes the embedded store read the whole log
    for every window, and windows begun at the first task cross a day to reach the data."""
    from master import views
    from scripts.bench_scale import _oid

    big, other = register(tmp_path, "big"), register(tmp_path, "other")
    now, n = utcnow(), 3000
    made, stored = now - timedelta(days=1), now - timedelta(hours=1)
    tasks, data, logs = [], [], []
    for i in range(n):
        tid, at = _oid(made + timedelta(seconds=i // 10), i), stored + timedelta(seconds=i // 10)
        tasks.append({"_id": tid, "job": big.id, "uri": f"http://example.org/{i}", "seq": i + 1,
                      "status": "SUCCESS", "data_lease": f"l{i}", "add_datetime": made,
                      "last_update_datetime": made})
        data.append({"_id": _oid(at, n + i), "job": big.id, "task": tid, "lease": f"l{i}",
                     "url": f"http://example.org/{i}", "status_code": 200, "response_body": b"x",
                     "add_datetime": at})
        logs.append({"_id": _oid(at, 2 * n + i), "job": big.id, "task": tid, "status": "SUCCESS",
                     "add_datetime": at})
    CrawlerTask._get_collection().insert_many(tasks)
    CrawlerDownloadData._get_collection().insert_many(data)
    CrawlerDownloadLog._get_collection().insert_many(logs)
    CrawlerDownloadLog._get_collection().insert_many(
        [{"job": other.id, "task": ObjectId(), "status": "FAIL", "add_datetime": now} for _ in range(5)])
    CrawlerTask._get_collection().insert_one({"job": other.id, "uri": "http://example.org/o", "seq": 1,
                                              "status": "FAIL", "last_update_datetime": now})
    counts.recount()

    newest = sorted((d["_id"] for d in CrawlerDownloadLog._get_collection().find({}, {"_id": 1})),
                    reverse=True)
    every = views.log_page("download", limit=100)
    assert [ObjectId(d["id"]) for d in every["logs"]] == newest[:100] and every["next"]
    second = views.log_page("download", limit=100, after=every["next"])
    assert [ObjectId(d["id"]) for d in second["logs"]] == newest[100:200]
    oldest = sorted(d["_id"] for d in data)
    page = views.data_page("big", limit=50)
    assert [ObjectId(d["id"]) for d in page["data"]] == oldest[:50]

    reads = {
        "logs of every job": _examined(lambda: views.log_page("download", limit=100)),
        "logs of every job, next page": _examined(lambda: views.log_page("download", limit=100,
                                                                         after=every["next"])),
        "logs of a user's jobs": _examined(lambda: views.log_page("download", limit=100,
                                                                  job_ids=[big.id, other.id])),
        "a job's logs": _examined(lambda: views.log_page("download", "big", limit=100)),
        "a job's data": _examined(lambda: views.data_page("big", limit=50)),
    }
    print(f"\ndocuments examined of {2 * n + 6:,} tasks, data and logs: {reads}")
    assert all(k <= 800 for k in reads.values()), reads


def test_turning_revisits_on_leaves_the_stored_pages_to_a_chore(cluster, tmp_path):
    """Registering ``revisit`` for a job with stored pages returns at once (a million pages took
    about 12 minutes inside the request); the "revisits" chore makes them due, batch by batch,
    resuming where its time ran out."""
    import time

    from common.store import due

    job = register(tmp_path, "late")
    made = utcnow()
    CrawlerTask._get_collection().insert_many([
        {"job": job.id, "uri": f"http://example.org/{i}", "seq": i + 1,
         "status": "SUCCESS" if i < 5 else "FAIL",
         "retry_at": None, "data_lease": f"l{i}", "add_datetime": made, "last_update_datetime": made}
        for i in range(7)])
    counts.recount()
    register(tmp_path, "late", revisit=3600.0)
    assert all(t.retry_at is None for t in CrawlerTask.objects(job=job.id))  # nothing done in the request
    assert Job.objects.get(id=job.id).revisit_backlog is not None
    assert due.make_due(time.monotonic() - 1) == 0  # no time left: nothing, the backlog kept
    assert "revisits" in {c.name for c in chores.table()}
    assert due.make_due(time.monotonic() + 60, batch=2) == 5
    when = {t.status: t.retry_at for t in CrawlerTask.objects(job=job.id)}
    assert when["SUCCESS"] is not None and when["FAIL"] is None
    assert Job.objects.get(id=job.id).revisit_backlog is None and due.make_due(time.monotonic() + 60) == 0
    register(tmp_path, "late", revisit=3600.0)  # registering again starts nothing
    assert Job.objects.get(id=job.id).revisit_backlog is None
