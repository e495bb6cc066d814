"""Intake's cost on the store alone (issue 40, part 3): a SecantusDB of its own, one job with
``--settled`` tasks already stored, then, through the real intake functions called directly:
``task add`` of ``--urls`` new URLs (``common.intake.add_tasks``), the same again (every one a
duplicate), the links found on ``--pages`` pages of ``--links`` new URLs each
(``common.intake.add_found``, as the worker's writer adds them), and the same links again. Prints
for each the store process's CPU (utime + stime of ``/proc/<pid>/stat``) and the wall time per
URL; ``--repeat`` runs, medians. ``--root``: the checkout whose code runs (another branch's, to
compare with the same script).

    .venv/bin/python scripts/bench_intake.py --repeat 3
    .venv/bin/python scripts/bench_intake.py --root /work/main --repeat 3
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_once(urls: int, pages: int, links: int, settled: int) -> dict[str, tuple[float, float]]:
    from services import MongoServer

    mongo = MongoServer()
    mongo.start()
    try:
        os.environ["DOWNCLUSTER_MONGO_URI"] = mongo.uri("bench_intake")
        os.environ["DOWNCLUSTER_MONGO_LOG_URI"] = mongo.uri("bench_intake_log")
        from common.config import load

        load()
        from bson import ObjectId

        from common.intake import add_found, add_tasks
        from common.jobsettings import Follow
        from common.store import connection
        from common.store.models import Job, collection, utcnow

        connection.disconnect_mongo()
        connection.connect_mongo(ensure_indexes=True)
        job_id = ObjectId()
        collection(Job).insert_one({"_id": job_id, "name": "bench", "status": "ON", "priority": 5, "host": "",
                                    "seq_next": 0, "seq_sent": 0, "intake": [], "add_datetime": utcnow()})
        if settled:
            add_tasks("bench", (f"http://old{i % 32}.example/page/{i}" for i in range(settled)))
        pid = mongo.proc.pid  # type: ignore[attr-defined]
        follow = Follow(scope="site", max_depth=100, max_pages=10**9)
        new = [f"http://site{i % 32}.example/new/{i}" for i in range(urls)]
        found = [(ObjectId(), f"http://site{p % 32}.example/p/{p}",
                  [f"http://site{p % 32}.example/found/{p}/{n}" for n in range(links)]) for p in range(pages)]
        steps = [("task add, new", urls, True, lambda: add_tasks("bench", new)),
                 ("task add, known", urls, False, lambda: add_tasks("bench", new)),
                 ("found links, new", pages * links, True, lambda: add_found(job_id, follow, found)),
                 ("found links, known", pages * links, False, lambda: add_found(job_id, follow, found))]
        out = {}
        for name, n, fresh, step in steps:
            cpu0, t0 = _cpu(pid), time.perf_counter()
            report = step()
            out[name] = (1000 * (_cpu(pid) - cpu0) / n, 1000 * (time.perf_counter() - t0) / n)
            assert (report.added, report.duplicate) == ((n, 0) if fresh else (0, n)), (name, report)
        return out
    finally:
        from common.store import connection

        connection.disconnect_mongo()
        mongo.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urls", type=int, default=10_000)
    ap.add_argument("--pages", type=int, default=100)
    ap.add_argument("--links", type=int, default=100)
    ap.add_argument("--settled", type=int, default=20_000, help="tasks the job has before")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--root", default=str(HERE.parent), help="the checkout whose code runs")
    args = ap.parse_args()
    sys.path[:0] = [args.root, str(HERE)]
    runs = [run_once(args.urls, args.pages, args.links, args.settled) for _ in range(args.repeat)]
    print(f"code of {args.root}; {args.settled} tasks stored before")
    for name in runs[0]:
        cpu = [r[name][0] for r in runs]
        wall = [r[name][1] for r in runs]
        print(f"  {name}: store CPU a URL median {statistics.median(cpu):.3f} ms "
              f"(runs {', '.join(f'{c:.3f}' for c in cpu)}); wall {statistics.median(wall):.3f} ms")


if __name__ == "__main__":
    main()
