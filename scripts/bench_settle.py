"""The settle's cost on the store alone (issue 40): a SecantusDB of its own, ``--tasks`` fresh
tasks of one job (plus ``--settled`` already SUCCESS, so the indexes are not empty), leased in
entries of ``--batch`` and settled entry by entry through the real store functions
(``leases.settle_success`` in one ``tasks.settle`` bulk write, as the writer does on the happy
path). Prints the store process's CPU (utime + stime of ``/proc/<pid>/stat``) per settled task,
and the wall time. ``--failures``: settle every task as a failure instead (``settle_failure``,
one UpdateOne each, with a retry time). Repeat with ``--repeat``; the median is printed.
``--pages``: the store's whole write of each stored page instead, as the writer sends it on the
happy path (an entry's data documents of ``--body`` bytes in one insert, its download logs in
one, its settles), with the store CPU per page and per collection (``top``). ``--indexes``:
compare index sets, alternated (``models``: the models' own; ``before``: those of issue 40's
first step — crawler_task's four, data's (task, lease) — kept for the comparison; ``uri``: the
models' and crawler_task's unique (job, uri), as before the keys of ``crawler_task_key``).

    .venv/bin/python scripts/bench_settle.py --tasks 4096 --batch 64 --repeat 3
    .venv/bin/python scripts/bench_settle.py --pages --indexes before,models --repeat 4
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def _cpu(pid: int) -> float:
    """Seconds of CPU (user + system) the process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# the index sets of issue 40's first step, for ``--indexes before``: {collection: [(keys, unique)]}
BEFORE = {
    "crawler_task": [((("job", 1), ("uri", 1)), True),
                     ((("job", 1), ("status", 1), ("retry_at", 1), ("seq", 1)), False),
                     ((("job", 1), ("status", 1), ("_id", 1)), False), ((("job", 1), ("_id", 1)), False)],
    "crawler_download_data": [((("task", 1), ("lease", 1)), False), ((("job", 1), ("_id", 1)), False)],
}


def _use_indexes(db, variant: str) -> None:
    """Replace the models' indexes of the collections in BEFORE by that set (``before``), or add
    crawler_task's unique (job, uri) to the models' (``uri``: the set before a URL's uniqueness
    moved to its key in crawler_task_key)."""
    if variant == "uri":
        db["crawler_task"].create_index([("job", 1), ("uri", 1)], unique=True)
    if variant != "before":
        return
    for name, indexes in BEFORE.items():
        db[name].drop_indexes()
        for keys, unique in indexes:
            db[name].create_index(list(keys), unique=unique)


def _top(client) -> dict:
    """Microseconds each collection's commands took so far (``top``)."""
    totals = client.admin.command("top")["totals"]
    return {ns: v["total"]["time"] for ns, v in totals.items() if isinstance(v, dict) and "total" in v}


def _write_pages(job, entries: list, body: int) -> None:
    """Each entry's pages stored as the writer stores them on the happy path (store_many)."""
    from common.store import attempts, counts, leases
    from common.store import tasks as store_tasks
    from common.store.clock import utcnow
    from common.store.models import FRESH, LIVE, SUCCESS
    from common.store.records import LeaseTask
    from slave.download.engines.base import Download

    page = Download(200, {"Content-Type": "text/html", "Content-Length": str(body)}, b"x" * body, "",
                    "127.0.0.1", {"User-Agent": "bench"}, b"", "utf-8")
    for n, docs in enumerate(entries):
        lease, at = f"bench-{n}", utcnow()
        attempts.insert_data([attempts.data_doc(job, None, LeaseTask(d["_id"], d["uri"]), lease, page, at)
                              for d in docs])
        attempts.insert_logs([attempts.log_doc(job, d["_id"], lease, None, 0, body, 5, None, at)
                              for d in docs])
        settled = store_tasks.settle(leases.settle_success([d["_id"] for d in docs], lease, FRESH, at))
        counts.move([(job, LIVE, SUCCESS, settled)])


def run_once(tasks: int, settled: int, batch: int, failures: bool, group: int | None = None,
             pages: bool = False, indexes: str = "models", body: int = 2400) -> dict:
    from services import MongoServer

    mongo = MongoServer()
    mongo.start()
    try:
        os.environ["DOWNCLUSTER_MONGO_URI"] = mongo.uri("bench_settle")
        os.environ["DOWNCLUSTER_MONGO_LOG_URI"] = mongo.uri("bench_settle_log")
        from common import config

        config.load()
        from bson import ObjectId

        from common.store import connection, leases
        from common.store import tasks as store_tasks
        from common.store.clock import utcnow
        from common.store.models import FAIL, FRESH, SUCCESS, CrawlerTask
        from common.store.records import Task

        if group:
            leases.SETTLE_GROUP = group
        connection.disconnect_mongo()
        connection.connect_mongo(ensure_indexes=True)
        coll = CrawlerTask._get_collection()
        _use_indexes(coll.database, indexes)
        job, now = ObjectId(), utcnow()
        docs = []
        for seq in range(1, settled + tasks + 1):
            d = Task(id=ObjectId(), job=job, uri=f"http://site{seq % 32}.example/page/{seq}", seq=seq,
                     add_datetime=now, last_update_datetime=now).to_doc()
            if seq <= settled:
                d.update(status=SUCCESS, download_times=1, data_lease=f"old{seq // batch}", retry_at=None,
                         failed_reason=None)
            docs.append(d)
        for i in range(0, len(docs), 5000):
            coll.insert_many(docs[i:i + 5000], ordered=False)
        fresh = [d["_id"] for d in docs[settled:]]
        entries = [fresh[i:i + batch] for i in range(0, len(fresh), batch)]
        pid = mongo.proc.pid  # type: ignore[attr-defined]
        if pages:
            client = coll.database.client
            top0, cpu0 = _top(client), _cpu(pid)
            _write_pages(job, [docs[settled:][i:i + batch] for i in range(0, tasks, batch)], body)
            cpu, top1 = _cpu(pid) - cpu0, _top(client)
            assert coll.count_documents({"job": job, "status": SUCCESS}) == tasks + settled
            by = {ns.split(".", 1)[1]: round((top1[ns] - top0.get(ns, 0)) / 1000 / tasks, 3)
                  for ns in top1 if top1[ns] - top0.get(ns, 0) > 0 and "crawler" in ns}
            return {"cpu_ms_per_task": 1000 * cpu / tasks, "wall_ms_per_task": 0.0, "by": by}
        changed, cpu0, t0 = 0, _cpu(pid), time.perf_counter()
        for n, ids in enumerate(entries):
            lease, at = f"bench-{n}", utcnow()
            if failures:
                ops = [leases.settle_failure(i, lease, FRESH, "HTTP 503", at + timedelta(minutes=5), at)
                       for i in ids]
            else:
                ops = leases.settle_success(ids, lease, FRESH, at)
            changed += store_tasks.settle(ops)
        wall, cpu = time.perf_counter() - t0, _cpu(pid) - cpu0
        want = FAIL if failures else SUCCESS
        assert changed == tasks, (changed, tasks)
        assert coll.count_documents({"job": job, "status": want}) == tasks + (0 if failures else settled)
        return {"cpu_ms_per_task": 1000 * cpu / tasks, "wall_ms_per_task": 1000 * wall / tasks}
    finally:
        from common.store import connection

        connection.disconnect_mongo()
        mongo.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=4096)
    ap.add_argument("--settled", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--failures", action="store_true")
    ap.add_argument("--groups", default="",
                    help="comma-separated SETTLE_GROUP values to compare, run alternately (A B B A ...); "
                         "default: the code's own")
    ap.add_argument("--pages", action="store_true",
                    help="the whole write of each page (data, log, settle) instead of the settle alone")
    ap.add_argument("--body", type=int, default=2400, help="--pages: bytes of each page's body")
    ap.add_argument("--indexes", default="models",
                    help="comma-separated index sets to compare, alternated: models, before, uri")
    args = ap.parse_args()
    groups = [int(g) for g in args.groups.split(",") if g] or [0]
    variants = [(g, ix) for g in groups for ix in args.indexes.split(",")]
    runs: dict[tuple, list[dict]] = {v: [] for v in variants}
    for rep in range(args.repeat):
        for g, ix in variants if rep % 2 == 0 else variants[::-1]:
            runs[g, ix].append(run_once(args.tasks, args.settled, args.batch, args.failures, g or None,
                                        args.pages, ix, args.body))
    what = "page write" if args.pages else "failure settle" if args.failures else "success settle"
    for (g, ix), rs in runs.items():
        cpu = [r["cpu_ms_per_task"] for r in rs]
        print(f"{what}, {args.tasks} tasks in entries of {args.batch}, group {g or 'default'}, indexes {ix}: "
              f"store CPU per task median {statistics.median(cpu):.3f} ms "
              f"(runs: {', '.join(f'{c:.3f}' for c in cpu)})"
              + ("" if args.pages else
                 f"; wall median {statistics.median(r['wall_ms_per_task'] for r in rs):.3f} ms"))
        if args.pages:
            names = sorted({n for r in rs for n in r["by"]})
            print("  time in each collection's commands per page, ms (top), median: " + ", ".join(
                f"{n} {statistics.median(r['by'].get(n, 0) for r in rs):.3f}" for n in names))


if __name__ == "__main__":
    main()
