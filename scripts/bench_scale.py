"""``make bench``'s scale phase: a store filled to N tasks of a few days' life, through the
document shapes the pipeline writes (tasks in every status, the data and download log of each
attempt), then every page, count and chore that must stay fast, timed against its target.

Run by scripts/bench.py (``--scale N``, default 1,000,000; 20,000 with ``--smoke``) in the bench's
own services and process: each figure calls what the command or the route calls.
"""
from __future__ import annotations

import calendar
import struct
import time
from datetime import datetime, timedelta

from bson import Binary, ObjectId

TARGETS = {"page_s": 1.0, "dispatch_s": 5.0, "decision_s": 0.5, "chore_per_s": 23.0 * 2}
BODY = Binary(b"<html>" + b"x" * 1500 + b"</html>")
CHUNK = 20_000
DUE_RETRIES = 210   # retries that come due in five minutes at 2 M pages a day (issue 30's case)
BACKLOG = 7_000     # a whole dispatch of retries due (after an outage of the sites, say)


def _oid(at: datetime, n: int) -> ObjectId:
    """The ``n``-th id made at ``at`` (ids carry their time: ranges and retention read it)."""
    return ObjectId(struct.pack(">I", calendar.timegm(at.utctimetuple())) + n.to_bytes(8, "big"))


def _fill(job_id, tasks: int, now) -> dict:
    """Insert ``tasks`` tasks: 75 % SUCCESS (each with its data and download log), 10 % FAIL
    (DUE_RETRIES of them due again), 1 % DEAD, the rest LIVE above the dispatch cursor."""
    from common.store.log_models import CrawlerDownloadLog
    from common.store.models import CrawlerDownloadData, CrawlerTask

    t_coll, d_coll, l_coll = (m._get_collection()
                              for m in (CrawlerTask, CrawlerDownloadData, CrawlerDownloadLog))
    shape = {"SUCCESS": 0, "FAIL": 0, "DEAD": 0, "LIVE": 0}
    start, since, span = time.monotonic(), now - timedelta(days=3), timedelta(days=2) / tasks
    for first in range(1, tasks + 1, CHUNK):
        ts, ds, ls = [], [], []
        for seq in range(first, min(first + CHUNK, tasks + 1)):
            r = seq % 100
            status = "SUCCESS" if r < 75 else "FAIL" if r < 85 else "DEAD" if r == 85 else "LIVE"
            shape[status] += 1
            old = since + span * seq  # made and settled over two days, three to one days ago
            tid, lease = _oid(old, seq), f"l{seq // 50}"
            url = f"http://site{seq % 32}.example/page/{seq}"
            task = {"_id": tid, "job": job_id, "uri": url, "seq": seq, "status": status, "host_name": "",
                    "download_times": 0 if status == "LIVE" else 1, "recoveries": 0, "retry_at": None,
                    "failed_reason": None, "add_datetime": old, "last_update_datetime": old}
            if status == "FAIL":  # the oldest DUE_RETRIES of them are due again now
                task.update(failed_reason="HTTP 503",
                            retry_at=now - timedelta(seconds=1) if shape["FAIL"] <= DUE_RETRIES else None)
            if status == "SUCCESS":  # due for a visit a day after it (read once revisits are on)
                task.update(data_lease=lease, retry_at=old + timedelta(days=1), revisit_every=86400.0,
                            versions=1, visits=1, etag=f'"e{seq}"')
                ds.append({"_id": _oid(old, 2 * tasks + seq), "job": job_id, "downloader": None, "task": tid,
                           "lease": lease, "url": url, "status_code": 200,
                           "requests_headers": {"User-Agent": "downcluster"},
                           "response_headers": {"Content-Type": "text/html"}, "requests_body": Binary(b""),
                           "response_body": BODY, "encoding": "utf-8", "hostname": "bench",
                           "remote_ip": "10.0.0.1", "add_datetime": old})
            if status != "LIVE":
                ls.append({"_id": _oid(old, 4 * tasks + seq), "job": job_id, "task": tid, "lease": lease,
                           "status": "SUCCESS" if status == "SUCCESS" else "FAIL", "requests_size": 0,
                           "response_size": 1513, "failed_reason": task["failed_reason"],
                           "downloads_hostname": "bench", "spend_time": 12000, "add_datetime": old})
            ts.append(task)
        t_coll.insert_many(ts, ordered=False)
        if ds:
            d_coll.insert_many(ds, ordered=False)
        if ls:
            l_coll.insert_many(ls, ordered=False)
    return {"tasks": tasks, **{k.lower(): v for k, v in shape.items()},
            "fill_s": round(time.monotonic() - start, 1)}


def _timed(fn) -> float | str:
    """Seconds ``fn`` took, or why it failed (a figure that fails is reported, not fatal)."""
    start = time.perf_counter()
    try:
        fn()
    except Exception as exc:
        return f"failed after {time.perf_counter() - start:.1f} s: {type(exc).__name__}: {str(exc)[:120]}"
    return round(time.perf_counter() - start, 3)


def run(bench, tasks: int) -> dict:
    """The phase, on a SecantusDB that keeps its data in a directory: in ``:memory:`` mode all of
    it must fit WiredTiger's cache (1 GB by default; past it inserts fail with WT_CACHE_FULL)."""
    import shutil
    import tempfile

    from bench_common import ROOT
    from common.store.connection import connect_mongo, disconnect_mongo

    (ROOT / "var").mkdir(exist_ok=True)
    disk = tempfile.mkdtemp(prefix="bench-scale-", dir=ROOT / "var")
    disconnect_mongo()
    bench.mongo.stop()
    bench.mongo.storage = disk
    bench.mongo.start()
    connect_mongo(ensure_indexes=True)
    try:
        return _run(bench, tasks)
    finally:
        disconnect_mongo()
        bench.mongo.stop()
        bench.mongo.storage = ":memory:"
        bench.mongo.start()
        connect_mongo(ensure_indexes=True)
        shutil.rmtree(disk, ignore_errors=True)


def _run(bench, tasks: int) -> dict:
    from bench_common import CAP, hwm_mb  # scripts/ is on the path
    from common.config import load, settings
    from common.exports.templates import parse_template
    from common.queue.rqbridge import queue_key
    from common.store import counts
    from common.store.clock import store_now, utcnow
    from common.store.data import export_fits
    from common.store.models import CrawlerDownloadData, CrawlerDownloadSetting, CrawlerTask, Job
    from common.store.orphans import tombstone
    from common.store.records import ExportFilter
    from common.store.tasks import build_keys
    from master import maintenance as chores
    from master import views
    from master.dispatch import defender
    from master.dispatch.dispatcher import dispatch_once
    from master.ops import retention, stats

    redis = bench.redis()
    redis.flushall()
    job = bench.new_job("bench-scale", 7000)
    now = utcnow()
    filled = _fill(job.id, tasks, now)
    live_from = filled["success"] + filled["fail"] + filled["dead"]
    Job._get_collection().update_one({"_id": job.id}, {"$set": {"seq_next": tasks, "seq_sent": 0}})
    # what `downcluster migrate` does once for a store filled before counts
    recount_s = _timed(counts.recount)
    keys_s = _timed(lambda: build_keys(job.id))  # ... and the tasks' keys (the URL of each once)
    tcoll = CrawlerTask._get_collection()
    deep_seq = min(62_000, tasks // 2)  # ids follow seq here
    deep = tcoll.find_one({"job": job.id, "seq": deep_seq}, {"_id": 1})["_id"]
    deep_ok = tcoll.find_one({"job": job.id, "seq": deep_seq // 100 * 100 + 1}, {"_id": 1})["_id"]
    one = tcoll.find_one({"job": job.id, "status": "SUCCESS"}, {"uri": 1})
    figures = {
        "stats (= /metrics, /api/v1/overview counts)": _timed(lambda: stats.collect(redis)),
        "/api/v1/overview": _timed(lambda: views.overview(redis)),
        "/api/v1/jobs": _timed(views.job_rows),
        "a job's page": _timed(lambda: views.job_detail("bench-scale")),
        "tasks of a job, first page": _timed(lambda: views.task_page("bench-scale")),
        "tasks of a job, deep page": _timed(lambda: views.task_page("bench-scale", after=str(deep))),
        "SUCCESS tasks, deep page": _timed(
            lambda: views.task_page("bench-scale", status="SUCCESS", after=str(deep_ok))),
        "download logs page": _timed(lambda: views.log_page("download", "bench-scale")),
        "a job's data page": _timed(lambda: views.data_page("bench-scale")),
        "task show": _timed(lambda: views.task_detail("bench-scale", one["uri"])),
        "synchronous download's decision": _timed(lambda: export_fits(
            job.id, ExportFilter(), parse_template(None), settings.EXPORT_SYNC_MAX_ROWS)),
        "synchronous download's decision, one HTTP status asked": _timed(lambda: export_fits(
            job.id, ExportFilter(status=(200,)), parse_template(None), settings.EXPORT_SYNC_MAX_ROWS)),
    }
    due = tcoll.count_documents({"job": job.id, "status": "FAIL", "retry_at": {"$ne": None}})
    for chore in chores.table():  # as in a running cluster: no chore due (each is timed on its own below)
        if chore.every:
            chores.claim(chore.name, chore.every, store_now())
    sent = []
    figures["cron dispatch (retries due, then fresh)"] = _timed(
        lambda: sent.append(dispatch_once(redis).total))
    full = max(1, redis.llen(queue_key("down_high")))
    load(flags=dict(settings.flags, Q_DOWN_HIGH_LEN=full))  # the job's queue is full
    figures["cron dispatch, queues full"] = _timed(lambda: dispatch_once(redis))
    load(flags=dict(settings.flags, Q_DOWN_HIGH_LEN=CAP))
    failed = tcoll.find({"job": job.id, "status": "FAIL", "retry_at": None}, {"_id": 1}).limit(BACKLOG)
    backlog = [d["_id"] for d in failed]
    for k in range(0, len(backlog), 50):
        tcoll.update_many({"_id": {"$in": backlog[k:k + 50]}},
                          {"$set": {"retry_at": now - timedelta(seconds=1)}})
    for chore in chores.table():
        if chore.every:
            chores.claim(chore.name, chore.every, store_now())
    figures[f"cron dispatch, a backlog of {len(backlog):,} retries due"] = _timed(
        lambda: dispatch_once(redis))

    figures.update(_revisits(bench, redis, job, filled, since=now - timedelta(days=3)))

    # orphans as they arise: stored under leases given back meanwhile (tombstoned), whose tasks
    # never came to name them
    orphans, per = (5_000 if tasks >= 100_000 else 500), 50
    gone = now - timedelta(days=1)
    for k in range(orphans // per):
        lease, ids = f"lost{k}", [_oid(gone, 6 * tasks + k * per + i) for i in range(per)]
        CrawlerDownloadData._get_collection().insert_many(
            [{"_id": _oid(gone, 7 * tasks + k * per + i), "job": job.id, "task": t, "lease": lease,
              "url": "http://x/", "status_code": 200, "response_body": BODY, "add_datetime": gone}
             for i, t in enumerate(ids)])
        tombstone(lease, job.id, "worker died while downloading", ids, gone)
    start = time.perf_counter()
    swept = defender.sweep(budget=60.0)
    sweep_rate = round(swept / max(1e-6, time.perf_counter() - start), 1)
    CrawlerDownloadSetting._get_collection().update_one({"job": job.id}, {"$set": {"data_retention_days": 1,
                                                                                  "log_retention_days": 1}})
    start = time.perf_counter()
    kept = retention.enforce(budget=120.0)
    took = time.perf_counter() - start
    retention_rate = round((kept.tasks + kept.data + kept.download_logs) / max(1e-6, took), 1)
    removed = {"tasks": kept.tasks, "data": kept.data, "download_logs": kept.download_logs,
               "seconds": round(took, 1), "finished": kept.finished}
    return {**filled, "recount_s": recount_s, "keys_s": keys_s, "figures": figures, "due_retries": due,
            "dispatched": sent[0] if sent else 0, "orphans_swept": swept, "sweep_docs_per_s": sweep_rate,
            "retention_removed": kept.tasks, "retention": removed, "retention_docs_per_s": retention_rate,
            "store_rss_mb": round(hwm_mb(bench.mongo.proc.pid)), "live_from_seq": live_from}


def _revisits(bench, redis, job, filled: dict, since) -> dict:
    """The job turns to revisits (a day apart) with no fresh task or retry left: every SUCCESS task
    is due (visited one to three days ago); two cron dispatches each pick ``dispatch_num``. Then
    revisits are off again (the retention below measures what it always did)."""
    from common.queue.names import QUEUE_NAMES
    from common.queue.rqbridge import queue_key
    from common.store.clock import store_now
    from common.store.models import CrawlerDownloadSetting, CrawlerLease, CrawlerTask, Job
    from master import maintenance as chores
    from master.dispatch.dispatcher import dispatch_once

    Job._get_collection().update_one({"_id": job.id}, {"$set": {"seq_sent": filled["tasks"],
                                                                "revisit_from": since}})
    CrawlerTask._get_collection().update_many({"job": job.id, "status": "FAIL"}, {"$set": {"retry_at": None}})
    CrawlerDownloadSetting._get_collection().update_one({"job": job.id}, {"$set": {"revisit": 86400.0}})
    out, picked = {}, []
    for run in ("first", "second"):
        redis.delete(*[queue_key(q) for q in QUEUE_NAMES])
        CrawlerLease._get_collection().delete_many({})
        for chore in chores.table():
            if chore.every:
                chores.claim(chore.name, chore.every, store_now())
        out[f"cron dispatch, {filled['success']:,} revisits due ({run} run)"] = _timed(
            lambda: picked.append(dispatch_once(redis).total))
    out["revisits picked per run"] = f"{picked}"
    CrawlerDownloadSetting._get_collection().update_one({"job": job.id}, {"$set": {"revisit": 0.0}})
    return out


def rows(s: dict) -> list[tuple[str, str, str, str]]:
    """The scale phase's lines of the bench table: (what, measured, target, verdict)."""
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    out = [(f"scale: a store of {s['tasks']:,} tasks ({s['success']:,} SUCCESS with data and logs)",
            f"filled in {s['fill_s']} s; counts built in {s['recount_s']} s, keys in {s.get('keys_s')} s",
            "", "")]
    for name, seconds in s["figures"].items():
        if "decision" in name:
            target = TARGETS["decision_s"]
        elif "dispatch" in name:
            target = TARGETS["dispatch_s"]
        else:
            target = TARGETS["page_s"]
        if name == "revisits picked per run":
            out.append((f"  {name}", seconds, "", ""))
        elif isinstance(seconds, str):
            out.append((f"  {name}", seconds, f"<= {target:g} s", "MISSED"))
        else:
            out.append((f"  {name}", f"{seconds} s", f"<= {target:g} s", ok(seconds <= target)))
    out.append(("  orphan sweep", f"{s['sweep_docs_per_s']:,} docs/s ({s['orphans_swept']:,})",
                f">= {TARGETS['chore_per_s']:g}/s", ok(s["sweep_docs_per_s"] >= TARGETS["chore_per_s"])))
    r = s.get("retention") or {}
    out.append(("  retention (final tasks, data, logs)",
                f"{s['retention_docs_per_s']:,} docs/s ({s['retention_removed']:,} tasks, "
                f"{r.get('data', 0):,} data, {r.get('download_logs', 0):,} logs in {r.get('seconds')} s"
                f"{'' if r.get('finished', True) else ', unfinished'})",
                f">= {TARGETS['chore_per_s']:g}/s", ok(s["retention_docs_per_s"] >= TARGETS["chore_per_s"])))
    out.append(("  SecantusDB peak RSS", f"{s['store_rss_mb']:,} MB", "", ""))
    if s["tasks"] < 10_000_000:
        hours = s["fill_s"] * 10_000_000 / s["tasks"] / 3600
        out.append(("scale: 10,000,000 tasks not run", f"its fill alone would take about {hours:.1f} h here "
                    "(--scale 10000000 runs it)", "", ""))
    return out
