"""The first page of a status after a quiet stretch and a burst (docs/scale.md), in process.

One job: QUIET tasks made one a second over two days (SUCCESS and FAIL: 9 to 1), then BURST LIVE
tasks made in ten seconds (as an intake of a large list makes them), on a SecantusDB of its own
(``:memory:``), ``stats --recount`` done. Times what ``GET /jobs/{name}/tasks?status=LIVE``
calls (``master.views.task_page``): the first page read with no floor known (a store kept before
floors, or what the code before them always did), then the first page and the next, best and
worst of 3. Prints JSON.

    .venv/bin/python scripts/bench_burst.py [--quiet 200000] [--burst 60000]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]


def _fill(job_id, quiet: int, burst: int) -> None:
    from bench_scale import _oid
    from common.store.models import CrawlerTask, utcnow

    coll, now = CrawlerTask._get_collection(), utcnow()
    since = now - timedelta(days=2, minutes=10)
    step = timedelta(days=2) / quiet
    for first in range(0, quiet + burst, 20_000):
        docs = []
        for i in range(first, min(first + 20_000, quiet + burst)):
            live = i >= quiet
            at = now - timedelta(seconds=10) + (i - quiet) * timedelta(seconds=10) / burst if live \
                else since + step * i
            docs.append({"_id": _oid(at, i), "job": job_id, "uri": f"http://site{i % 32}.example/{i}",
                         "seq": i + 1, "status": "LIVE" if live else ("FAIL" if i % 10 == 0 else "SUCCESS"),
                         "download_times": 0 if live else 1, "recoveries": 0, "retry_at": None,
                         "host_name": "", "add_datetime": at, "last_update_datetime": at})
        coll.insert_many(docs, ordered=False)


def _best_worst(fn, runs: int = 3) -> list[float]:
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        took.append(time.perf_counter() - start)
    return [round(min(took), 3), round(max(took), 3)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quiet", type=int, default=200_000)
    ap.add_argument("--burst", type=int, default=60_000)
    args = ap.parse_args()
    from services import MongoServer, env_for

    with MongoServer(":memory:") as mongo:
        os.environ.update(env_for("redis://127.0.0.1:1/0", mongo.uri("burst"), mongo.uri("burst_log")))
        from common.config import load

        load()
        from common.store import counts
        from common.store.connection import connect_mongo
        from common.store.models import CrawlerTaskCount
        from master import views
        from master.registry import store, validate_manifest

        connect_mongo(ensure_indexes=True)
        job = store(validate_manifest({"name": "burst", "type": "none"}, ROOT))[0]
        start = time.perf_counter()
        _fill(job.id, args.quiet, args.burst)
        filled = round(time.perf_counter() - start, 1)
        counts.recount()
        CrawlerTaskCount._get_collection().update_one({"_id": job.id},
                                                      {"$unset": {"floor": "", "floor_ok": ""}})
        page = lambda after=None: views.task_page("burst", status="LIVE", after=after)  # noqa: E731
        start = time.perf_counter()
        first = page()
        cold = round(time.perf_counter() - start, 3)
        print(json.dumps({"quiet": args.quiet, "burst": args.burst, "fill_s": filled,
                          "first_page_no_floor_s": cold, "first_page_s": _best_worst(page),
                          "next_page_s": _best_worst(lambda: page(first["next"])),
                          "load": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
