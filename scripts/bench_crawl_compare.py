"""``make bench``'s crawl comparison (issue 54, part 1): our crawl job against the peer's crawl,
scrapy-redis's ``RedisCrawlSpider`` (scripts/bench_peer_crawl.py), each from one seed on the
same site, measured as the fed comparison is (scripts/bench_compare.py):

* a fresh store and Redis for each run, the seed in place (our job's one LIVE task, added by
  ``task add``'s intake; the peer's start URL in its Redis list), the processes started cold at
  t0: ours one ``downcluster worker`` and ``downcluster dispatch --loop --interval 1`` (the
  found links' wake-up queues them within about a second), the peer two spiders of 64 requests
  each (our per-host concurrency is the peer's total: 128) sharing scrapy-redis's scheduler and
  dupefilter in Redis;
* nothing reads the store while a run goes (progress from each side's page count in Redis, read
  every 0.5 s); the rates are read afterwards from the stored pages' stamps: the steady rate
  between the 5th and 95th percentile page, and the time from t0 to the last page;
* the store's CPU, write commands and bytes received per page and per link handed (every link of
  every page, known or new), each side's client CPU (its processes' trees, /proc) and their RSS
  as the frontier grows (sampled with each poll; the peak), Redis's memory at the end;
* runs alternate ours, peer, peer, ours, …

Sites: ``tree`` is scripts/bench_crawl.py's (page n links to 2n+1, 2n+2 and n+1 below N: each
page finds two new pages and one known), at 0 ms as static files from nginx (bench_site.py when
nginx is missing) and at 100 ms from bench_site.py; ``real`` is a documentation tree served by
nginx (Debian's Python docs, relative links), crawled from its index until neither side finds
more (each side's count of pages is reported: the two extractors differ — Scrapy's skips
images, archives and stylesheets by extension, ours reads frames and ``rel=next``). Scope: the
seed's site; depth 64 (the tree of 10,000 pages is 13 deep); our ``max_pages`` the tree's size.

``python scripts/bench_crawl_compare.py [--pages 10000] [--runs 3] [--sites tree_0ms,tree_100ms,real]``
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path[:0] = [p for p in (str(Path(__file__).resolve().parent),) if p not in sys.path]
from bench_common import (  # noqa: E402
    BIN,
    PEER_BIN,
    ROOT,
    Procs,
    compile_ours,
    cpu_tree,
    nginx_binary,
    peer_installed,
    stop_on_sigterm,
)

SITES = ("tree_0ms", "tree_100ms", "real")
PEER_PROCS, PEER_CONCURRENCY = 2, 64
DEPTH = 64
REAL_ROOT = "/usr/share/doc/python3.11/html"
REAL_STALL = 15.0   # the real site's runs end when no page is counted for this long (no known total)
TREE_STALL = 30.0


def rss_mb(root: int) -> float:
    from bench_crawl import rss_mb as tree_rss

    return tree_rss(root)


class CrawlCompare:
    """Symmetric crawl runs of ours and the peer on one Bench's services (scripts/bench.py)."""

    def __init__(self, bench, peer_procs: int = PEER_PROCS, peer_concurrency: int = PEER_CONCURRENCY,
                 peer_queue: str = "PriorityQueue", workers: int = 1) -> None:
        from bench_compare import Compare

        self.bench, self.cmp = bench, Compare(bench, peer_procs, peer_concurrency, scheduler="redis")
        self.peer_procs, self.peer_concurrency, self.peer_queue = peer_procs, peer_concurrency, peer_queue
        self.workers = workers  # our worker processes (1: what a 2-core host runs; more shows what binds us)

    def watch(self, progress, procs: list, total: int, timeout: float, stall: float) -> dict:
        """Poll ``progress()`` (a Redis read) until ``total`` pages (0: until it stalls), a stall or the
        timeout; each process's RSS sampled at each poll. Returns the outcome and the peaks."""
        from bench_compare import PROGRESS_POLL

        done, last, moved = 0, -1, time.monotonic()
        end, peak = time.monotonic() + timeout, [0.0] * len(procs)
        start_cpus: list[float] = []
        outcome = "timeout"
        while time.monotonic() < end:
            for i, p in enumerate(procs):
                if p.poll() is not None:
                    raise RuntimeError(f"{p.bench_name} exited {p.returncode}: "
                                       f"{self.bench.procs.tail(p.bench_name)}")
                peak[i] = max(peak[i], rss_mb(p.pid))
            done = progress()
            if done and not start_cpus:
                start_cpus = [*(cpu_tree(p.pid) for p in procs), done]
            if total and done >= total:
                outcome = "complete"
                break
            if done != last:
                last, moved = done, time.monotonic()
            elif done and time.monotonic() - moved > stall:
                outcome = "complete" if not total else f"stalled at {done}"
                break
            time.sleep(PROGRESS_POLL)
        return {"outcome": outcome, "counted": done, "start_cpus": start_cpus,
                "peak_rss_mb": [round(x, 1) for x in peak]}

    def finish(self, procs: list) -> tuple[dict, list[float]]:
        """The store's counters and each process's CPU, once the last writes have landed."""
        from bench_compare import SETTLE

        time.sleep(SETTLE)
        s1 = self.cmp.store()
        cpus = [cpu_tree(p.pid) for p in procs]
        return s1, cpus

    def figures(self, side: str, stamps: list[float], t0: float, s0: dict, s1: dict, cpus: list[float],
                watched: dict, held: int, links: int) -> dict:
        from bench_compare import client_after, steady

        pages = len(stamps)
        costs = self.cmp.costs(s0, s1, pages, held)
        per_link = {"store_cpu_ms_per_link": None, "store_write_ops_per_link": None,
                    "store_bytes_in_per_link": None}
        if links:  # the store's whole work over every link handed (known or new): the tree's only
            per_link = {f"{k}_per_link": round(costs[f"{k}_per_page"] * pages / links, 3)
                        for k in ("store_cpu_ms", "store_write_ops", "store_bytes_in")}
        redis_mb = round(int(self.bench.redis().info("memory")["used_memory"]) / 1e6, 1)
        return {"side": side, "pages_stored": pages, "outcome": watched["outcome"],
                "links_handed": links, **steady(stamps, t0), **costs, **per_link,
                "client_cpu_ms_per_page": round(1000 * sum(cpus) / max(1, pages), 3),
                "client_cpu_s": [round(c, 2) for c in cpus],
                **client_after(cpus, watched["start_cpus"], pages),
                "peak_rss_mb": watched["peak_rss_mb"], "redis_used_mb_at_end": redis_mb,
                "loadavg": round(os.getloadavg()[0], 1)}

    # our side
    def ours(self, label: str, seed: str, total: int, timeout: float, links_of) -> dict:
        from bench_compare import epoch
        from common.intake import add_tasks
        from common.metrics import PAGES
        from common.store.models import CrawlerDownloadData, CrawlerTask
        from master.registry import store, validate_manifest

        bench = self.bench
        bench.fresh_store()
        redis = bench.redis()
        name = f"crawl-{label}"
        manifest = {"name": name, "priority": 0, "type": "none",
                    "settings": {"dispatch_num": 1000, "download_engine": "aiohttp", "allow_private": True},
                    "follow": {"scope": "site", "max_depth": DEPTH, "max_pages": total or 100_000}}
        job = store(validate_manifest(manifest, ROOT))[0]
        if add_tasks(name, [seed]).added != 1:
            raise RuntimeError(f"the seed {seed} was not added")
        env = {**bench.env, "DOWNCLUSTER_HOST_CONCURRENCY": str(self.cmp.host_limit)}

        def progress() -> int:
            return sum(int(v) for k, v in redis.hgetall(PAGES).items()
                       if k.decode().startswith(f"{name}|") and "|not_modified|" not in k.decode())

        s0, t0 = self.cmp.store(), time.time()
        procs = [*(bench.procs.spawn([str(BIN / "downcluster"), "worker", "--logging-level", "WARNING"], env,
                                     f"crawl-worker-{label}-{i}") for i in range(self.workers)),
                 bench.procs.spawn([str(BIN / "downcluster"), "dispatch", "--loop", "--interval", "1"],
                                   env, f"crawl-dispatch-{label}")]
        try:
            watched = self.watch(progress, procs, total, timeout, TREE_STALL if total else REAL_STALL)
            s1, cpus = self.finish(procs)
        finally:
            bench.procs.stop(procs)
        docs = list(CrawlerDownloadData._get_collection().find({"job": job.id}, {"add_datetime": 1}))
        tasks = CrawlerTask._get_collection()
        uris = tasks.distinct("uri", {"job": job.id})
        out = self.figures("ours", [epoch(d["add_datetime"]) for d in docs], t0, s0, s1, cpus, watched,
                           self.cmp.data_size(["bench", "bench_log"]), links_of(len(docs)))
        out.update(tasks=tasks.count_documents({"job": job.id}), distinct_task_urls=len(uris),
                   worker_cpu_s=round(sum(cpus[:-1]), 2), dispatch_cpu_s=round(cpus[-1], 2))
        return out

    # the peer's side
    def peer(self, label: str, seed: str, total: int, timeout: float, links_of) -> dict:
        import pymongo

        from bench_compare import epoch

        bench = self.bench
        bench.fresh_store()
        redis = bench.redis()
        key, prog = f"peer:{label}:start_urls", f"peer:{label}:progress"
        redis.rpush(key, json.dumps({"url": seed}))
        origin = "/".join(seed.split("/")[:3])
        uri = bench.mongo.uri("peer")
        env = {**bench.env, "PEER_REDIS_URL": bench.redis_srv.url, "PEER_MONGO_URI": uri, "PEER_KEY": key,
               "PEER_CONCURRENCY": str(self.peer_concurrency), "PEER_PROGRESS": prog,
               "PEER_ALLOW": "^" + origin.replace(".", r"\.") + "/", "PEER_DEPTH": str(DEPTH),
               "PEER_QUEUE": self.peer_queue}

        def progress() -> int:
            return sum(int(v) for v in redis.hgetall(prog).values())

        spider = [str(PEER_BIN / "scrapy"), "runspider", str(ROOT / "scripts" / "bench_peer_crawl.py")]
        s0, t0 = self.cmp.store(), time.time()
        procs = [bench.procs.spawn(spider, env, f"crawl-peer-{label}-{i}") for i in range(self.peer_procs)]
        try:
            watched = self.watch(progress, procs, total, timeout, TREE_STALL if total else REAL_STALL)
            s1, cpus = self.finish(procs)
        finally:
            bench.procs.stop(procs)
        client = pymongo.MongoClient(uri)
        try:
            docs = list(client.get_default_database()["peer_pages"].find({}, {"stored_at": 1, "url": 1}))
        finally:
            client.close()
        out = self.figures("peer", [epoch(d["stored_at"]) for d in docs], t0, s0, s1, cpus, watched,
                           self.cmp.data_size(["peer"]), links_of(len(docs)))
        out.update(distinct_page_urls=len({d["url"] for d in docs}), queue=self.peer_queue,
                   processes=self.peer_procs, concurrent_requests=self.peer_concurrency)
        return out

    def pair(self, label: str, seed: str, total: int, runs: int, timeout, links_of) -> dict:
        from bench_compare import order, summarize

        out: dict = {"ours": [], "peer": [], "seed": seed, "pages": total,
                     "order": [s for s in order(runs) if self.peer_procs or s == "ours"]}
        for side in out["order"]:
            r = (self.ours if side == "ours" else self.peer)(label, seed, total, timeout(), links_of)
            out[side].append(r)
            print(f"    {side}: {r['pages_stored']} pages, {r['steady_pages_per_s']} pages/s steady, "
                  f"last page at {r['to_last_s']} s; store {r['store_cpu_ms_per_page']} ms CPU, "
                  f"{r['store_write_ops_per_page']} writes, {r['store_bytes_in_per_page']} B in a page; "
                  f"client CPU {r['client_cpu_ms_per_page']} ms a page (load {r['loadavg']})", flush=True)
        for r in out["ours"] + out["peer"]:
            r.setdefault("complete", r["outcome"] == "complete")
            r.setdefault("done", r["pages_stored"])
        out.update(summarize(out["ours"], out["peer"]))
        return out


def tree_links_of(total: int):
    def links(pages: int) -> int:
        from bench_crawl import links_handed

        return links_handed(total)
    return links


def real_links_of(pages: int) -> int:
    return 0  # not counted on the real site: the extractors differ (figures a page only)


def services(procs: Procs, budget: float):
    from bench import Bench

    args = SimpleNamespace(budget=budget, dispatch_tasks=1000)
    bench = Bench(args, procs)
    bench.start_services()
    return bench


def site_for(bench, label: str, pages: int) -> tuple[str, int]:
    """The seed and the pages to expect (0: unknown) of site ``label``."""
    from bench_compare import start_delay_site, start_page_nginx

    if label == "tree_0ms":
        base = (start_page_nginx(bench.procs, bench.env, pages, hosts=1, tree=True) if nginx_binary()
                else start_delay_site(bench.procs, bench.env, 0, hosts=1, tree=pages))
        return f"{base}/tree/0", pages
    if label == "tree_100ms":
        return f"{start_delay_site(bench.procs, bench.env, 100, hosts=1, tree=pages)}/tree/0", pages
    from bench import start_nginx

    if nginx_binary() is None or not Path(REAL_ROOT, "index.html").exists():
        raise FileNotFoundError(f"no nginx or no {REAL_ROOT}: `make bench-deps` installs nginx-light "
                                "and python3.11-doc")
    return f"{start_nginx(bench.procs, REAL_ROOT)}/index.html", 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=10000, help="pages of the tree (default 10,000)")
    p.add_argument("--runs", type=int, default=3, help="runs of each side per site, alternated (default 3)")
    p.add_argument("--sites", default=",".join(SITES), help=f"comma-separated, of {','.join(SITES)}")
    p.add_argument("--skip-peer", action="store_true", help="our side only")
    p.add_argument("--workers", type=int, default=1,
                   help="our worker processes (default 1, as the fed comparison: what a 2-core host runs)")
    p.add_argument("--peer-queue", default="PriorityQueue",
                   choices=("PriorityQueue", "FifoQueue", "LifoQueue"),
                   help="scrapy-redis's SCHEDULER_QUEUE_CLASS (default its own default, PriorityQueue)")
    p.add_argument("--budget", type=float, default=3 * 3600, help="seconds for the whole (default 3 h)")
    p.add_argument("--json", default=str(ROOT / "var" / "bench-crawl-compare.json"))
    a = p.parse_args(argv)
    stop_on_sigterm()
    compile_ours()
    logdir = Path(tempfile.mkdtemp(prefix="bench-crawl-cmp-"))
    procs = Procs(logdir)
    results: dict = {"pages": a.pages, "runs": a.runs, "errors": [], "loadavg_at_start":
                     round(os.getloadavg()[0], 1), "started_at":
                     time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    bench = None
    try:
        bench = services(procs, a.budget)
        if not a.skip_peer and not peer_installed():
            print(f"note: the peer's install ({PEER_BIN.parent}) is missing: `make bench` makes it; "
                  "our side only", file=sys.stderr)
            a.skip_peer = True
        cc = CrawlCompare(bench, 0 if a.skip_peer else PEER_PROCS, peer_queue=a.peer_queue, workers=a.workers)
        for label in a.sites.split(","):
            try:
                seed, total = site_for(bench, label, a.pages)
            except FileNotFoundError as exc:
                results["errors"].append(f"{label} skipped: {exc}")
                print(f"{label}: skipped: {exc}", flush=True)
                continue
            print(f"{label}: from {seed}, {a.runs} run(s) a side (logs in {logdir})", flush=True)
            links = tree_links_of(total) if total else real_links_of
            results[label] = cc.pair(label, seed, total, a.runs,
                                     lambda: max(60.0, bench.remaining() / 2), links)
            s = results[label]
            print(f"  {label}: steady medians ours {s['ours_summary']['steady_median']} | peer "
                  f"{s['peer_summary']['steady_median']} (x{s['ratio']}); last page ours "
                  f"{s['ours_summary']['to_last_median']} s | peer {s['peer_summary']['to_last_median']} s "
                  f"(x{s['to_last_ratio']})", flush=True)
    finally:
        procs.stop_all()
        if bench is not None:
            bench.stop_services()
    out = Path(a.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"figures in {out}")
    return 1 if [e for e in results["errors"] if "skipped" not in e] else 0


if __name__ == "__main__":
    sys.exit(main())
