"""Intake's cost on the store alone (issue 40, part 3): a SecantusDB of its own, one job with
``--settled`` tasks already stored, then, through the real intake functions called directly:
``task add`` of ``--urls`` new URLs (``common.intake.add_tasks``), the same again (every one a
duplicate), the links found on ``--pages`` pages of ``--links`` new URLs each
(``common.intake.add_found``, as the worker's writer adds them), and the same links again. Prints
for each the store process's CPU (utime + stime of ``/proc/<pid>/stat``) and the wall time per
URL; ``--repeat`` runs, medians. ``--root``: the checkout whose code runs (another branch's, to
compare with the same script).

Then a crawl's mix (issue 54, ``--tree`` pages): a binary tree whose page n links to 2n+1 and
2n+2 (new) and to n+1 and n-1 (known, mostly), its pages handed over in breadth-first order in
writes of ``--write`` pages, as the worker's writer hands them (``add_found``, the page's task
stored first); the store's CPU and its own time by collection and command (``top``) per found
link handed. A Redis of its own is there for both sides (intake's filter of known URLs uses it
where the code has one).

    .venv/bin/python scripts/bench_intake.py --repeat 3
    .venv/bin/python scripts/bench_intake.py --root /work/main --repeat 3
"""
from __future__ import annotations

import argparse
import inspect
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


OPS = ("queries", "getmore", "insert", "update", "remove", "commands")  # top's kinds (no locks)


def _top(client) -> dict[str, int]:
    """The store's own time (µs) by "collection:command" (mongod's ``top``), where it has one."""
    try:
        totals = client.admin.command("top")["totals"]
    except Exception:  # a store without ``top``
        return {}
    return {f"{ns.split('.', 1)[1]}:{op}": t["time"] for ns, v in totals.items()
            if isinstance(v, dict) and ns.startswith("bench_intake.")
            for op, t in v.items() if isinstance(t, dict) and op in OPS}


def crawl_mix(job_id, follow, tree: int, write: int, pid: int) -> dict:
    """``tree`` pages of the binary tree handed over breadth first, ``write`` pages a call."""
    from bson import ObjectId

    from common.intake import add_found
    from common.store.clock import utcnow
    from common.store.connection import collection, mongo_client
    from common.store.models import CrawlerTask, Job

    ids = {0: ObjectId()}
    collection(Job).insert_one({"_id": job_id, "name": "tree", "status": "ON", "priority": 5, "host": "",
                                "seq_next": 0, "seq_sent": 0, "intake": [], "add_datetime": utcnow()})
    collection(CrawlerTask).insert_one({"_id": ids[0], "job": job_id, "uri": "http://tree.example/t/0",
                                        "seq": 0, "status": "SUCCESS", "add_datetime": utcnow()})
    cpu, wall, links, by_cmd = 0.0, 0.0, 0, {}
    number = {i: n for n, i in ids.items()}

    def carried(pages: list) -> dict:  # the pages' depths, as their leases carry them (where they do)
        if "carried" not in inspect.signature(add_found).parameters:
            return {}
        number.update({i: n for n, i in ids.items()})
        return {"carried": {i: (number[i] + 1).bit_length() - 1 for i, _, _ in pages}}

    n = 0
    while n < tree:
        wanted = [f"http://tree.example/t/{m}" for m in range(n, min(tree, n + write)) if m not in ids]
        for d in collection(CrawlerTask).find({"job": job_id, "uri": {"$in": wanted}}, {"uri": 1}):
            ids[int(d["uri"].rsplit("/", 1)[1])] = d["_id"]  # (the bench's read, not counted)
        pages = []
        while n < tree and n in ids and len(pages) < write:  # the pages found so far, in order
            found = [f"http://tree.example/t/{m}" for m in (2 * n + 1, 2 * n + 2, n + 1, n - 1)
                     if 0 <= m < tree]
            pages.append((ids[n], f"http://tree.example/t/{n}", found))
            links, n = links + len(found), n + 1
        top0, cpu0, t0 = _top(mongo_client()), _cpu(pid), time.perf_counter()
        add_found(job_id, follow, pages, **carried(pages))
        cpu, wall = cpu + _cpu(pid) - cpu0, wall + time.perf_counter() - t0
        for k, v in _top(mongo_client()).items():
            by_cmd[k] = by_cmd.get(k, 0) + v - top0.get(k, 0)
    return {"links": links, "cpu_ms": 1000 * cpu / links, "wall_ms": 1000 * wall / links,
            "by_command": {k: round(v / 1000 / links, 4) for k, v in by_cmd.items() if v}}


def run_once(urls: int, pages: int, links: int, settled: int, tree: int, write: int) -> dict:
    from services import MongoServer, RedisServer

    mongo, redis = MongoServer(), RedisServer()
    mongo.start()
    redis.start()
    try:
        os.environ["DOWNCLUSTER_REDIS_URL"] = redis.url
        os.environ["DOWNCLUSTER_MONGO_URI"] = mongo.uri("bench_intake")
        os.environ["DOWNCLUSTER_MONGO_LOG_URI"] = mongo.uri("bench_intake_log")
        from common.config import load

        load()
        from bson import ObjectId

        from common.intake import add_found, add_tasks
        from common.jobsettings import Follow
        from common.store import connection
        from common.store.clock import utcnow
        from common.store.connection import collection
        from common.store.models import Job

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
        out: dict = {}
        if tree:
            out["crawl"] = crawl_mix(ObjectId(), follow, tree, write, pid)
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
        redis.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--urls", type=int, default=10_000)
    ap.add_argument("--pages", type=int, default=100)
    ap.add_argument("--links", type=int, default=100)
    ap.add_argument("--settled", type=int, default=20_000, help="tasks the job has before")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tree", type=int, default=4000, help="pages of the crawl's mix (0: none)")
    ap.add_argument("--write", type=int, default=64, help="pages a hand-over in the crawl's mix")
    ap.add_argument("--root", default=str(HERE.parent), help="the checkout whose code runs")
    args = ap.parse_args()
    sys.path[:0] = [args.root, str(HERE)]
    runs = [run_once(args.urls, args.pages, args.links, args.settled, args.tree, args.write)
            for _ in range(args.repeat)]
    print(f"code of {args.root}; {args.settled} tasks stored before")
    if args.tree:
        print_crawl([r["crawl"] for r in runs], args.tree, args.write)
    for name in (k for k in runs[0] if k != "crawl"):
        cpu = [r[name][0] for r in runs]
        wall = [r[name][1] for r in runs]
        print(f"  {name}: store CPU a URL median {statistics.median(cpu):.3f} ms "
              f"(runs {', '.join(f'{c:.3f}' for c in cpu)}); wall {statistics.median(wall):.3f} ms")


def print_crawl(runs: list[dict], tree: int, write: int) -> None:
    cpu = [r["cpu_ms"] for r in runs]
    each = ", ".join(f"{c:.3f}" for c in cpu)
    print(f"  crawl mix, {tree} pages in writes of {write}, {runs[0]['links']} links handed: store CPU "
          f"a found link median {statistics.median(cpu):.3f} ms (runs {each}); "
          f"wall {statistics.median(r['wall_ms'] for r in runs):.3f} ms")
    for k in sorted({k for r in runs for k in r["by_command"]}):
        print(f"    top {k}: {statistics.median(r['by_command'].get(k, 0) for r in runs):.4f} ms a link")


if __name__ == "__main__":
    main()
