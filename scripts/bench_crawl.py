"""``make bench``'s crawl phase (issue 42, part 5): a finite site of N linked pages crawled to
completion from one seed, against the same N pages fed by ``task add``.

``python scripts/bench_crawl.py [--pages N]`` (default 1,000,000; ``CRAWL_BENCH_ARGS`` in ``make
bench``; ``--pages 300`` in ``make test``). It starts a private redis-server, a SecantusDB (in
memory up to 200,000 pages, else in a directory under var/: an in-memory store must fit its
cache), and scripts/bench_site.py with ``--tree N`` on one host: page n links to 2n+1, 2n+2 and
n+1 below N, so every page is reachable from ``/tree/0`` and the frontier (the job's LIVE and
DISPATCH tasks) grows to about N/2 and drains. Then, on an emptied store each time:

1. crawl: a job with ``[follow]`` (scope site, max_depth 64, max_pages N) seeded with
   ``/tree/0`` by ``task add``;
2. fed: the same job settings without ``[follow]``, the N URLs added by ``task add``'s intake
   (``common.intake.add_tasks``) before the run;

each run by one ``downcluster worker`` (HOST_CONCURRENCY 128: one site) and ``downcluster
dispatch --loop --interval 0.2`` (dispatch_num 1,000; the cluster's queue caps) until all N tasks
are settled. Progress is read from the job's kept counts (``crawler_task_count``: one document
read each 0.5 s, never a count of the tasks). Measured:

* pages/s: steady rate between the 5th and the 95th percentile page, from the stored data's
  ``add_datetime`` read after the run (bench_compare.steady), and the time to the last page;
* the store's CPU (its process, from /proc) per page, and per found link: the crawl's store CPU
  less the fed run's (its run and its intake) over the links the crawl's pages hand to intake
  (every link of every page: ``tree_links``, new or already known);
* the RSS of the dispatcher and of the worker (its process tree, summed), sampled each 0.5 s with
  the frontier's size; reported at 10, 25, 50, 75 and 100 % of the pages, and whether the peak
  after the frontier's largest size stayed within 10 % of the peak at 10 % of the pages (flat).

Every wait is bounded (``--budget`` seconds for the whole; a run without progress for 60 s ends
short and says so); every process it starts is stopped on the way out.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [p for p in (str(Path(__file__).resolve().parent),) if p not in sys.path]
from bench_common import BIN, ROOT, Procs, compile_ours, cpu_tree, proc_tree, stop_on_sigterm  # noqa: E402  (scripts/ first)

MEMORY_MAX = 200_000      # pages: above, the store keeps its data in a directory
DISPATCH_NUM = 1000       # the job's tasks per dispatcher run (as the e2e bench's)
POLL = 0.5                # seconds between reads of the job's counts (and RSS samples)
STALL = 60.0              # seconds without a settled task: the run ends short
CHECKPOINTS = (0.10, 0.25, 0.50, 0.75, 1.00)
FLAT = 1.10               # the peak may grow by 10 % past the first checkpoint and still be flat
SETTLED = ("SUCCESS", "FAIL", "CANCEL", "DEAD")


def rss_mb(root: int) -> float:
    """The resident set (VmRSS) of ``root`` and its descendants, summed, MB."""
    total = 0
    for pid in proc_tree(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            pass
    return total / 1024


def links_handed(pages: int) -> int:
    """The links the crawl's pages hand to intake, known or new (each page's own, once)."""
    from bench_site import tree_links

    return sum(len(tree_links(n, pages)) for n in range(pages))


class CrawlBench:
    def __init__(self, pages: int, budget: float, procs: Procs) -> None:
        self.pages, self.procs = pages, procs
        self.deadline = time.monotonic() + budget
        self.redis_srv = self.mongo = None
        self.disk: str | None = None
        self.env: dict = {}
        self.site = ""

    def start(self) -> None:
        from services import MongoServer, RedisServer, env_for, free_port

        if self.pages > MEMORY_MAX:
            (ROOT / "var").mkdir(exist_ok=True)
            self.disk = tempfile.mkdtemp(prefix="bench-crawl-", dir=ROOT / "var")
        self.redis_srv = RedisServer()
        self.redis_srv.start()
        self.mongo = MongoServer(self.disk or ":memory:")
        self.mongo.start()
        self.env = {**os.environ, **env_for(self.redis_srv.url, self.mongo.uri("bench"),
                                            self.mongo.uri("bench_log"), HOSTNAME="bench",
                                            HOST_CONCURRENCY=128)}
        os.environ.update(self.env)
        port = free_port()
        self.procs.spawn([sys.executable, str(ROOT / "scripts" / "bench_site.py"), "--port", str(port),
                          "--hosts", "1", "--tree", str(self.pages)], self.env, "site")
        end = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > end:
                    raise RuntimeError(f"the site did not start: {self.procs.tail('site')}") from None
                time.sleep(0.05)
        self.site = f"http://127.0.0.1:{port}"
        from common.config import load
        from common.store.connection import connect_mongo

        load()
        connect_mongo(ensure_indexes=True)

    def stop(self) -> None:
        from common.store.connection import disconnect_mongo

        disconnect_mongo()
        for srv in (self.mongo, self.redis_srv):
            if srv is not None:
                srv.stop()
        if self.disk:
            shutil.rmtree(self.disk, ignore_errors=True)

    def fresh(self) -> None:
        """An empty store and Redis."""
        from common.store.connection import connect_mongo, disconnect_mongo, redis_conn

        disconnect_mongo()
        self.mongo.stop()
        if self.disk:
            shutil.rmtree(self.disk, ignore_errors=True)
            os.makedirs(self.disk)
        self.mongo.start()
        connect_mongo(ensure_indexes=True)
        redis_conn().flushall()

    def job(self, name: str, follow: bool):
        from master.registry import store, validate_manifest

        manifest = {"name": name, "priority": 0, "type": "none",
                    "settings": {"dispatch_num": DISPATCH_NUM, "download_engine": "aiohttp",
                                 "allow_private": True}}  # the site is local
        if follow:
            manifest["follow"] = {"scope": "site", "max_depth": 64, "max_pages": self.pages}
        return store(validate_manifest(manifest, ROOT))[0]

    def run(self, label: str, follow: bool) -> dict:
        from bench_compare import epoch, steady
        from common.intake import add_tasks
        from common.store.connection import redis_conn
        from common.store.models import SUCCESS, CrawlerDownloadData, CrawlerTask, CrawlerTaskCount

        self.fresh()
        job = self.job(f"bench-crawl-{label}", follow)
        store_pid = self.mongo.proc.pid
        urls = [f"{self.site}/tree/{n}" for n in (range(self.pages) if not follow else range(1))]
        cpu_in, t_in = cpu_tree(store_pid), time.monotonic()
        report = add_tasks(job.name, urls)
        intake = {"seconds": round(time.monotonic() - t_in, 2), "store_cpu_s": cpu_tree(store_pid) - cpu_in}
        if report.added != len(urls):
            raise RuntimeError(f"task add took {report.added} of {len(urls)} URLs")
        redis = redis_conn()
        worker = self.procs.spawn([str(BIN / "downcluster"), "worker", "--logging-level", "WARNING"],
                                  self.env, f"worker-{label}")
        end = time.monotonic() + 60
        while not any(redis.scan_iter("downcluster:worker:*")):  # up and waiting
            if time.monotonic() > end or worker.poll() is not None:
                raise RuntimeError(f"the worker did not start: {self.procs.tail(worker.bench_name)}")
            time.sleep(0.1)
        loop = None
        samples: list[dict] = []
        counts = CrawlerTaskCount._get_collection()
        try:
            cpu0 = {"store": cpu_tree(store_pid), "worker": cpu_tree(worker.pid)}
            t0, start = time.time(), time.monotonic()
            loop = self.procs.spawn([str(BIN / "downcluster"), "dispatch", "--loop", "--interval", "0.2"],
                                    self.env, f"dispatch-{label}")
            settled, moved, next_print, outcome = 0, time.monotonic(), start + 15, "timeout"
            while time.monotonic() < self.deadline:
                if loop.poll() is not None or worker.poll() is not None:
                    raise RuntimeError(f"a process exited: {self.procs.tail(loop.bench_name)}"
                                       f"{self.procs.tail(worker.bench_name)}")
                c = counts.find_one({"_id": job.id}) or {}
                now_settled = sum(int(c.get(s) or 0) for s in SETTLED)
                frontier = int(c.get("LIVE") or 0) + int(c.get("DISPATCH") or 0)
                samples.append({"s": round(time.monotonic() - start, 1), "settled": now_settled,
                                "frontier": frontier, "dispatcher_mb": rss_mb(loop.pid),
                                "worker_mb": rss_mb(worker.pid)})
                if now_settled != settled:
                    settled, moved = now_settled, time.monotonic()
                if settled >= self.pages and frontier == 0:
                    outcome = "complete"
                    break
                if time.monotonic() - moved > STALL:
                    outcome = f"stalled at {settled:,} settled, {frontier:,} in the frontier"
                    break
                if time.monotonic() >= next_print:
                    print(f"    {label}: {time.monotonic() - start:.0f} s, {settled:,} settled, "
                          f"frontier {frontier:,}; RSS dispatcher {samples[-1]['dispatcher_mb']:.1f} MB, "
                          f"worker {samples[-1]['worker_mb']:.1f} MB", flush=True)
                    next_print += 15
                time.sleep(POLL)
            elapsed = time.monotonic() - start
            cpu = {"store": cpu_tree(store_pid) - cpu0["store"],
                   "worker": cpu_tree(worker.pid) - cpu0["worker"]}
        finally:
            self.procs.stop([p for p in (loop, worker) if p is not None])
        tasks = CrawlerTask._get_collection()
        total = tasks.count_documents({"job": job.id})
        success = tasks.count_documents({"job": job.id, "status": SUCCESS})
        stamps = [epoch(d["add_datetime"]) for d in
                  CrawlerDownloadData._get_collection().find({"job": job.id}, {"add_datetime": 1})]
        return {"label": label, "follow": follow, "pages": self.pages, "outcome": outcome, "tasks": total,
                "success": success, "data_docs": len(stamps), "seconds": round(elapsed, 1),
                **steady(stamps, t0), "intake_s": intake["seconds"],
                "intake_store_cpu_s": round(intake["store_cpu_s"], 2),
                "store_cpu_s": round(cpu["store"], 2), "worker_cpu_s": round(cpu["worker"], 2),
                "store_cpu_ms_per_page": round(1000 * cpu["store"] / max(1, success), 3),
                "worker_cpu_ms_per_page": round(1000 * cpu["worker"] / max(1, success), 3),
                "memory": memory(samples, self.pages)}


def memory(samples: list[dict], pages: int) -> dict:
    """The RSS at each checkpoint (the first sample at or past that share of pages settled), with
    the peak so far and the frontier then; flat or not."""
    points, peak = [], {"dispatcher_mb": 0.0, "worker_mb": 0.0}
    marks = iter(CHECKPOINTS)
    mark = next(marks)
    for s in samples:
        for k in peak:
            peak[k] = max(peak[k], s[k])
        while mark is not None and s["settled"] >= mark * pages:
            points.append({"share": mark, "settled": s["settled"], "frontier": s["frontier"], "s": s["s"],
                           **{k: round(s[k], 1) for k in peak},
                           **{f"peak_{k}": round(peak[k], 1) for k in peak}})
            mark = next(marks, None)
    out: dict = {"checkpoints": points, "largest_frontier": max((s["frontier"] for s in samples), default=0),
                 **{f"peak_{k}": round(v, 1) for k, v in peak.items()}}
    if len(points) >= 2:
        for k in peak:
            first, last = points[0][f"peak_{k}"], points[-1][f"peak_{k}"]
            out[f"{k.split('_')[0]}_flat"] = last <= FLAT * first
    return out


def summary(crawl: dict, fed: dict, links: int) -> dict:
    extra = crawl["store_cpu_s"] - fed["store_cpu_s"] - fed["intake_store_cpu_s"]
    return {"pages": crawl["pages"], "links_handed": links,
            "crawl_over_fed": round(crawl["steady_pages_per_s"] / fed["steady_pages_per_s"], 2)
            if fed["steady_pages_per_s"] else None,
            "store_cpu_ms_per_found_link": round(1000 * extra / max(1, links), 3),
            "crawl": crawl, "fed": fed}


def print_report(r: dict) -> None:
    c, f = r["crawl"], r.get("fed")
    print(f"\ncrawl of a site of {r['pages']:,} linked pages (one host, one worker; "
          f"{r['links_handed']:,} links handed to intake):")
    for x, what in ((c, "crawled from one seed"), *(((f, "fed by task add"),) if f else ())):
        print(f"  {what:24} {x['outcome']}: {x['tasks']:,} tasks, {x['success']:,} SUCCESS; "
              f"steady {x['steady_pages_per_s']} pages/s (5th-95th percentile page), last page at "
              f"{x['to_last_s']} s; store CPU {x['store_cpu_ms_per_page']} ms/page, worker CPU "
              f"{x['worker_cpu_ms_per_page']} ms/page")
    if f:
        print(f"  crawled / fed: x{r['crawl_over_fed']}; fed's intake: {f['intake_s']} s, store CPU "
              f"{f['intake_store_cpu_s']} s")
        print(f"  store CPU per found link (crawl's store CPU less the fed run's and its intake's): "
              f"{r['store_cpu_ms_per_found_link']} ms")
    m = c["memory"]
    print(f"  memory during the crawl (largest frontier {m['largest_frontier']:,} tasks):")
    for p in m["checkpoints"]:
        print(f"    {p['share']:>4.0%} of pages ({p['s']} s, frontier {p['frontier']:,}): dispatcher "
              f"{p['dispatcher_mb']} MB (peak {p['peak_dispatcher_mb']}), worker {p['worker_mb']} MB "
              f"(peak {p['peak_worker_mb']})")
    for k in ("dispatcher", "worker"):
        if f"{k}_flat" in m:
            verdict = "flat" if m[f"{k}_flat"] else "GREW"
            first = m["checkpoints"][0][f"peak_{k}_mb"]
            print(f"  {k} peak RSS {m[f'peak_{k}_mb']} MB, {first} MB at 10 % of the pages: {verdict} "
                  f"(flat: within {FLAT - 1:.0%})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=1_000_000, help="pages of the site (default 1,000,000)")
    p.add_argument("--budget", type=float, default=6 * 3600, help="seconds for the whole (default 6 h)")
    p.add_argument("--json", default="", help="also write the figures to this file")
    p.add_argument("--crawl-only", action="store_true",
                   help="the crawl alone (its rates and memory), not the fed run of the same URLs")
    a = p.parse_args(argv)
    if a.pages < 2:
        p.error("--pages must be at least 2")
    stop_on_sigterm()
    compile_ours()
    logdir = Path(tempfile.mkdtemp(prefix="bench-crawl-logs-"))
    procs = Procs(logdir)
    bench = CrawlBench(a.pages, a.budget, procs)
    try:
        bench.start()
        print(f"crawl phase: {a.pages:,} pages (logs in {logdir})", flush=True)
        crawl = bench.run("crawl", follow=True)
        if a.json:  # the crawl's figures kept even if the fed run does not finish
            Path(a.json).write_text(json.dumps({"pages": a.pages, "crawl": crawl}, indent=2))
        fed = None if a.crawl_only else bench.run("fed", follow=False)
    finally:
        procs.stop_all()
        bench.stop()
    links = links_handed(a.pages)
    result = summary(crawl, fed, links) if fed else {"pages": a.pages, "links_handed": links, "crawl": crawl}
    print_report(result)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2))
    return 0 if crawl["outcome"] == (fed or crawl)["outcome"] == "complete" else 1


if __name__ == "__main__":
    sys.exit(main())
