"""The settle's cost on the store alone (issue 40): a SecantusDB of its own, ``--tasks`` fresh
tasks of one job (plus ``--settled`` already SUCCESS, so the indexes are not empty), leased in
entries of ``--batch`` and settled entry by entry through the real store functions
(``leases.settle_success`` in one ``tasks.settle`` bulk write, as the writer does on the happy
path). Prints the store process's CPU (utime + stime of ``/proc/<pid>/stat``) per settled task,
and the wall time. ``--failures``: settle every task as a failure instead (``settle_failure``,
one UpdateOne each, with a retry time). Repeat with ``--repeat``; the median is printed.

    .venv/bin/python scripts/bench_settle.py --tasks 4096 --batch 64 --repeat 3
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


def run_once(tasks: int, settled: int, batch: int, failures: bool, group: int | None = None) -> dict:
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
        from common.store.models import FAIL, FRESH, SUCCESS, CrawlerTask, utcnow
        from common.store.records import Task

        if group:
            leases.SETTLE_GROUP = group
        connection.disconnect_mongo()
        connection.connect_mongo(ensure_indexes=True)
        coll = CrawlerTask._get_collection()
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
    args = ap.parse_args()
    groups = [int(g) for g in args.groups.split(",") if g] or [0]
    runs: dict[int, list[dict]] = {g: [] for g in groups}
    for rep in range(args.repeat):
        for g in groups if rep % 2 == 0 else groups[::-1]:
            runs[g].append(run_once(args.tasks, args.settled, args.batch, args.failures, g or None))
    what = "failure" if args.failures else "success"
    for g, rs in runs.items():
        cpu = [r["cpu_ms_per_task"] for r in rs]
        print(f"{what} settle, {args.tasks} tasks in entries of {args.batch}, group {g or 'default'}: "
              f"store CPU per task median {statistics.median(cpu):.3f} ms "
              f"(runs: {', '.join(f'{c:.3f}' for c in cpu)}); wall median "
              f"{statistics.median(r['wall_ms_per_task'] for r in rs):.3f} ms")


if __name__ == "__main__":
    main()
