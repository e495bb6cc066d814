"""`make bench`: downcluster against its peer (scrapy-redis + MongoDB) on the same store, plus
dispatch speed, the store's own ceiling, worker memory, CPU and downloads in flight, measured in
one run on this machine's own services.

It starts a private redis-server, a SecantusDB (``:memory:``, restarted empty for each phase)
and two loopback sample sites (no delay and 100 ms delay, each in its own process), then:

1. store ceiling: ``insert_many`` of ~2 KB documents, ``update_many`` over ``_id`` ranges (and
   ``$in`` lists) of 50, on a bare collection and on one with ``crawler_task``'s indexes;
2. dispatch: one ``dispatch_once()`` over 7,000 LIVE tasks of one job, and over a 100,000-task
   backlog (7,000 of them dispatched); the bulk insert time; Redis bytes per queued task; where
   the dispatcher's time goes (MongoDB time per command, from pymongo's command monitoring);
3. end to end: N pages of a built-in-engine job, LIVE -> SUCCESS (data, log and status stored),
   ``--workers`` ``downcluster worker`` processes (default 1: what a 2-core host should run)
   plus ``downcluster dispatch --loop --interval 0.2``, at 0 ms and 100 ms site latency; peak
   RSS per worker, CPU per page, peak downloads in flight, and how many cores each component
   (store, workers, dispatcher, site, Redis) kept busy;
4. the peer, measured as we are (scripts/bench_compare.py): scrapy-redis, 2 processes of a
   ``RedisSpider`` with Scrapy's own scheduler and CONCURRENT_REQUESTS 64, Scrapy's documented
   MongoDB pipeline (one ``insert_one`` per page: url, status, headers, raw body, its stamp),
   scripts/bench_peer.py; ours with HOST_CONCURRENCY 128 (the peer's total in flight); no read of
   the store during a run, rates from the stored pages' stamps afterwards (5th-95th percentile page;
   time to the last page), runs alternated A B B A, ``--runs`` each (default 3), median and spread,
   the store's CPU, write commands and bytes per page for each side; on one and 32 hosts at 0 ms
   (nginx, static pages) and 100 ms (scripts/bench_site.py), and real pages (nginx, gzip);
5. (``--with-baseline``) the naive design: one rq job per URL, 4 forking ``rq worker``
   processes, ``requests.get`` + one ``insert_one`` (``baseline_fetch_and_store`` below).

Prints a table (PASS/MISS against the targets) and writes JSON (default var/bench.json).
Every wait is bounded; every process it starts is stopped on the way out, also on errors.
``--smoke`` runs a few hundred pages (the test suite runs it so the script never rots).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

sys.path[:0] = [p for p in (str(Path(__file__).resolve().parent),) if p not in sys.path]
from bench_common import (  # noqa: E402  (scripts/ on the path first)
    BIN,
    CAP,
    PEER_BIN,
    ROOT,
    SITE_HOSTS,
    Procs,
    RssSampler,
    compile_ours,
    cpu_tree,
    nginx_binary,
    peer_installed,
    run_bounded,
    spread,
    stop_on_sigterm,
)

# Exports measured: every field flat in each format, and an Excel report (a
# title, summary and header/footer pairs, a three-level column tree, number formats; rows in
# task order, which costs the store a sort).
REPORT_TEMPLATE = json.dumps({
    "title": "bench report", "summary": "every row", "header": {"Job": "bench-export"},
    "footer": {"Checked by": ""},
    "col": [{"title": "Request", "children": [{"title": "URL", "name": "url"}]},
            {"title": "Response", "children": [
                {"title": "Status", "name": "status_code"},
                {"title": "Body", "children": [{"title": "Bytes", "name": "response_size", "format": "#,##0"},
                                               {"title": "Charset", "name": "encoding"},
                                               {"title": "Text", "name": "body_text"}]}]},
            {"title": "Fetched", "name": "add_datetime", "format": "yyyy-mm-dd hh:mm"}]})
EXPORT_VARIANTS = (("csv", "csv", ""), ("jsonl", "jsonl", ""), ("xlsx", "xlsx", ""),
                   ("xlsx_report", "xlsx", REPORT_TEMPLATE))
# issue 40: x2 the peer's steady rate; our client's CPU a page at most a quarter of Scrapy's
TARGETS = {"peer_ratio": 2.0, "client_cpu_share": 0.25, "worker_cpu_ms": 1.0, "inflight_100ms": 64,
           "dispatch_s": 1.0, "redis_bytes": 200, "rss_mb": 150}
# end-to-end runs at 0 ms with the etiquette at its defaults (on) and off, in the order they run
ETIQUETTE_ORDER = ("e2e_0ms", "e2e_0ms_plain", "e2e_0ms_plain_b", "e2e_0ms_b", "e2e_0ms_c", "e2e_0ms_plain_c")
ETIQUETTE_ON = ("e2e_0ms", "e2e_0ms_b", "e2e_0ms_c")
ETIQUETTE_OFF = ("e2e_0ms_plain", "e2e_0ms_plain_b", "e2e_0ms_plain_c")
E2E_DISPATCH_NUM = 1000   # the e2e job's dispatch_num: tasks per dispatcher run
PEER_PROCS = 2            # the peer's spider processes; ours per host = PEER_PROCS x its CONCURRENT_REQUESTS
Row = tuple[str, str, str, str]  # a line of the bench table: what, measured, target, verdict
COMPARISONS = ("one_0ms", "many_0ms", "one_100ms", "many_100ms", "real")
POLL = 0.1                # seconds between our own e2e runs' "done yet?" reads (the comparison reads none)


# --- the naive baseline's job function (imported by `rq worker` work-horses) ----------

def baseline_fetch_and_store(url: str) -> int:
    """The naive design: one rq job per URL, ``requests.get``, one ``insert_one`` per response.
    A forking worker runs each job in a fresh child, so the client is made per job."""
    import pymongo
    import requests

    resp = requests.get(url, timeout=30)
    client = pymongo.MongoClient(os.environ["BENCH_BASELINE_MONGO"])
    try:
        client.get_default_database()["pages"].insert_one(
            {"url": url, "status_code": resp.status_code, "headers": dict(resp.headers),
             "body": resp.content})
    finally:
        client.close()
    return resp.status_code


def start_site(procs: Procs, env: dict, delay_ms: int) -> str:
    """scripts/sample_site.py (start_site(delay_ms=...)) in its own process."""
    import socket

    from services import free_port

    port = free_port()
    procs.spawn([sys.executable, str(ROOT / "scripts" / "sample_site.py"), "--port", str(port),
                 "--delay-ms", str(delay_ms), "--hosts", str(SITE_HOSTS)], env, f"site-{delay_ms}ms")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("sample site did not start within 30 s")


REAL_KINDS = {".html", ".css", ".js", ".png", ".svg", ".txt", ".json", ".xml"}


def real_page_set(root: str, copies: int) -> dict | None:
    """The files of 10 KB-1 MB under ``root`` (a documentation tree), each ``copies`` times
    (``?copy=N``: distinct URLs, the same file), or None without nginx or the tree."""
    from urllib.parse import quote

    tree = Path(root)
    if nginx_binary() is None or not tree.is_dir():
        return None
    files = sorted(f for f in tree.rglob("*") if f.is_file() and f.suffix in REAL_KINDS
                   and 10_000 <= f.stat().st_size <= 1_000_000)
    if not files:
        return None
    paths = [quote(str(f.relative_to(tree))) + f"?copy={c}" for c in range(copies) for f in files]
    kinds: dict[str, int] = defaultdict(int)
    for f in files:
        kinds[f.suffix] += 1
    return {"root": str(tree), "files": len(files), "copies": copies, "paths": paths, "kinds": dict(kinds),
            "bytes": copies * sum(f.stat().st_size for f in files)}


def start_nginx(procs: Procs, root: str) -> str:
    """nginx (one worker process, gzip on as sites run it) serving ``root`` on a free loopback port."""
    import socket

    from services import free_port

    port, conf_dir = free_port(), procs.logdir / "nginx"
    conf_dir.mkdir(exist_ok=True)
    temp = " ".join(f"{k}_temp_path {conf_dir}/{k};"
                    for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (conf_dir / "nginx.conf").write_text(f"""
worker_processes 1;
daemon off;
pid {conf_dir}/nginx.pid;
error_log {conf_dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    include /etc/nginx/mime.types;
    default_type application/octet-stream;
    access_log off;
    sendfile on;
    keepalive_requests 100000;
    gzip on;
    gzip_types text/css text/plain text/xml application/javascript application/json image/svg+xml;
    {temp}
    server {{ listen 127.0.0.1:{port}; root {root}; }}
}}
""")
    procs.spawn([nginx_binary(), "-c", str(conf_dir / "nginx.conf"), "-e", str(conf_dir / "error.log")],
                dict(os.environ), "nginx")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nginx did not start within 30 s: {procs.tail('nginx')}")


# --- MongoDB time per command (pymongo command monitoring, client side) -----------------------

class MongoTimer:
    """Client-observed time and count per MongoDB command in this process."""

    def __init__(self) -> None:
        from pymongo import monitoring

        timer = self

        class Listener(monitoring.CommandListener):
            def started(self, event) -> None:
                pass

            def succeeded(self, event) -> None:
                timer.add(event.command_name, event.duration_micros)

            def failed(self, event) -> None:
                timer.add(event.command_name, event.duration_micros)

        self.lock = threading.Lock()
        self.stats: dict[str, list] = defaultdict(lambda: [0, 0.0])
        monitoring.register(Listener())

    def add(self, name: str, micros: int) -> None:
        with self.lock:
            s = self.stats[name]
            s[0] += 1
            s[1] += micros / 1e6

    def reset(self) -> None:
        with self.lock:
            self.stats.clear()

    def summary(self) -> dict:
        with self.lock:
            return {k: {"calls": v[0], "seconds": round(v[1], 3)} for k, v in sorted(self.stats.items())}


# --- the bench -----------------------------------------------------------------------------

class Bench:
    def __init__(self, args, procs: Procs) -> None:
        self.args, self.procs = args, procs
        self.deadline = time.monotonic() + args.budget
        self.redis_srv = self.mongo = None
        self.env: dict = {}
        self.timer: MongoTimer | None = None

    # services
    def start_services(self) -> None:
        from services import MongoServer, RedisServer, env_for

        self.redis_srv = RedisServer()
        self.redis_srv.start()
        self.mongo = MongoServer(":memory:")
        self.mongo.start()
        n = self.args.dispatch_tasks
        extra = {"HOSTNAME": "bench", "MAX_TOTAL_DISPATCH_COUNT_ONCE": n}
        extra.update({f"Q_DOWN_{q}_LEN": CAP for q in ("SUPER", "HIGH", "MID", "LOW")})
        self.env = {**os.environ, **env_for(self.redis_srv.url, self.mongo.uri("bench"),
                                            self.mongo.uri("bench_log"), **extra)}
        os.environ.update(self.env)
        self.timer = MongoTimer()  # before the first client is made
        from common.config import load
        from common.store.connection import connect_mongo

        load()
        connect_mongo(ensure_indexes=True)

    def stop_services(self) -> None:
        for srv in (self.mongo, self.redis_srv):
            if srv is not None:
                try:
                    srv.stop()
                except Exception as exc:  # keep stopping the rest
                    print(f"  (stopping {type(srv).__name__}: {exc})", file=sys.stderr)

    def site_pids(self, label: str) -> list[int]:
        """The process ids of the sample site serving latency ``label``."""
        return [p.pid for p in self.procs.procs if getattr(p, "bench_name", "") in (f"site-{label}", label)]

    def fresh_store(self) -> None:
        """An empty SecantusDB and Redis: SecantusDB slows as its in-memory data grows."""
        from common.store.connection import connect_mongo, disconnect_mongo, redis_conn

        disconnect_mongo()
        self.mongo.restart()
        connect_mongo(ensure_indexes=True)
        redis_conn().flushall()

    def redis(self):
        from common.store.connection import redis_conn

        return redis_conn()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    # helpers
    def new_job(self, name: str, dispatch_num: int, priority: int = 0, engine: str = "aiohttp", **more):
        from master.registry import store, validate_manifest

        spec = validate_manifest({"name": name, "priority": priority, "type": "none",
                                  "settings": {"dispatch_num": dispatch_num, "download_engine": engine,
                                               "allow_private": True, **more}}, ROOT)  # the sites are local
        return store(spec)[0]

    def add_tasks_raw(self, job_id, base: str, count: int, prefix: str, hosts: int = 1,
                      urls: list[str] | None = None) -> float:
        """LIVE tasks as master/intake.py builds them (numbered from the job's counter, their keys
        first), raw insert_many in chunks of 5,000; returns the seconds taken. ``urls``: these, not pages."""
        from bson import ObjectId

        from common.store.clock import utcnow
        from common.store.models import LIVE, CrawlerTask, CrawlerTaskKey
        from common.store.tasks import key_of
        from master.intake import commit, reserve

        coll, keys, now = CrawlerTask._get_collection(), CrawlerTaskKey._get_collection(), utcnow()
        started = time.monotonic()
        for start in range(0, count, 5000):
            n = min(count, start + 5000) - start
            first = reserve(job_id, n)
            uris = (urls[start:start + n] if urls
                    else [f"{spread(base, start + i, hosts)}/{prefix}/{start + i}" for i in range(n)])
            docs = [{"_id": ObjectId(), "job": job_id, "uri": uri, "seq": first + i, "status": LIVE,
                     "download_times": 0, "recoveries": 0, "host_name": "", "add_datetime": now,
                     "last_update_datetime": now} for i, uri in enumerate(uris)]
            marks = [{"_id": key_of(job_id, d["uri"]), "task": d["_id"]} for d in docs]  # keys first
            run_bounded(lambda marks=marks: keys.insert_many(marks, ordered=False),
                        max(60.0, len(marks) / 50), "key insert")
            run_bounded(lambda docs=docs: coll.insert_many(docs, ordered=False), max(60.0, len(docs) / 50),
                        "task insert")
            commit(job_id, first, n)
        return time.monotonic() - started

    def cpu_snapshot(self, parts: dict[str, list[int]]) -> dict[str, float]:
        snap = {name: sum(cpu_tree(pid) for pid in pids) for name, pids in parts.items()}
        t = os.times()
        snap["bench"] = t.user + t.system
        return snap

    # 1. the store's ceiling
    def bench_store(self) -> dict:
        from bson import Binary

        from common.store.connection import mongo_client

        n = 2000 if self.args.smoke else 5000
        db = mongo_client()["bench_scratch"]
        docs = [{"i": i, "job": i % 7, "uri": f"http://x/{i}", "status": "LIVE", "lease": None,
                 "body": Binary(os.urandom(2048))} for i in range(n)]
        t0 = time.monotonic()
        for i in range(0, n, 500):
            db.bare.insert_many(docs[i:i + 500])
        insert_rate = n / (time.monotonic() - t0)

        def updates(coll, ids, use_in: bool) -> float:
            t0 = time.monotonic()
            for i in range(0, len(ids), 50):
                part = ids[i:i + 50]
                flt = {"_id": {"$in": part}} if use_in else {"_id": {"$gte": part[0], "$lte": part[-1]}}
                coll.update_many(flt, {"$set": {"status": "DISPATCH", "lease": uuid.uuid4().hex}})
            return len(ids) / (time.monotonic() - t0)

        m = min(n, 2000)
        ids = [d["_id"] for d in docs[:m]]
        range_rate = updates(db.bare, ids, False)
        in_rate = updates(db.bare, ids, True)
        t0 = time.monotonic()
        db.bare.update_many({"_id": {"$gte": ids[0], "$lte": ids[-1]}}, {"$set": {"status": "SUCCESS"}})
        one_range_rate = m / (time.monotonic() - t0)
        idx = db.indexed
        idx.create_index([("job", 1), ("uri", 1)], unique=True)
        idx.create_index([("job", 1), ("status", 1), ("retry_at", 1), ("seq", 1)])
        small = [{k: v for k, v in d.items() if k != "body"} for d in docs[:m]]
        idx.insert_many(small)
        indexed_rate = updates(idx, [d["_id"] for d in small], False)
        mongo_client().drop_database("bench_scratch")
        return {"docs": n, "insert_docs_per_s": round(insert_rate),
                "update_range50_docs_per_s": round(range_rate), "update_in50_docs_per_s": round(in_rate),
                f"update_one_range_of_{m}_docs_per_s": round(one_range_rate),
                "update_range50_task_indexes_docs_per_s": round(indexed_rate)}

    # 2. dispatch
    def one_dispatch(self, job_name: str, tasks: int, prefix: str, base: str) -> dict:
        from master.dispatch.dispatcher import dispatch_once

        self.fresh_store()
        redis = self.redis()
        job = self.new_job(job_name, self.args.dispatch_tasks)
        insert_s = self.add_tasks_raw(job.id, base, tasks, prefix)
        mem0 = redis.info("memory")["used_memory"]
        store_pid = self.mongo.proc.pid
        cpu0, self_cpu0 = cpu_tree(store_pid), time.process_time()
        self.timer.reset()
        t0 = time.monotonic()
        report = run_bounded(lambda: dispatch_once(redis, watchdog=False),
                             max(120.0, self.args.dispatch_tasks / 10), "dispatch_once")
        took = time.monotonic() - t0
        mongo = self.timer.summary()
        store_cpu, self_cpu = cpu_tree(store_pid) - cpu0, time.process_time() - self_cpu0
        mem1 = redis.info("memory")["used_memory"]
        key_bytes = sum(redis.memory_usage(k) or 0 for k in redis.scan_iter("rq:*", count=1000))
        total = report.total
        mongo_s = sum(v["seconds"] for v in mongo.values())
        return {"tasks": tasks, "insert_s": round(insert_s, 2), "insert_docs_per_s": round(tasks / insert_s),
                "dispatched": total, "entries": sum(report.entries.values()), "seconds": round(took, 3),
                "redis_bytes_per_task": round((mem1 - mem0) / max(1, total), 1),
                "redis_key_bytes_per_task": round(key_bytes / max(1, total), 1),
                "mongo_time_s": round(mongo_s, 3), "mongo_by_command": mongo,
                "store_cpu_s": round(store_cpu, 2), "dispatcher_cpu_s": round(self_cpu, 2)}

    def bench_dispatch(self, base: str) -> dict:
        n, backlog = self.args.dispatch_tasks, self.args.backlog
        live = self.one_dispatch("bench-dispatch", n, "d", base)
        print(f"  {n} LIVE: {live['seconds']} s ({live['dispatched']} dispatched), "
              f"insert {live['insert_s']} s", flush=True)
        big = self.one_dispatch("bench-backlog", backlog, "b", base)
        print(f"  {backlog} backlog: {big['seconds']} s ({big['dispatched']} dispatched), "
              f"insert {big['insert_s']} s", flush=True)
        return {"live": live, "backlog": big}

    # 3. end to end
    def bench_e2e(self, label: str, base: str, pages: int, timeout: float, engine: str = "aiohttp",
                  path: str = "page", hosts: int = SITE_HOSTS, etiquette: bool = True,
                  host_limit: int | None = None, urls: list[str] | None = None, page_bytes: int = 0,
                  at_once: bool = False) -> dict:
        """``etiquette`` False: per-host limits, robots.txt and coalescing off (HOST_CONCURRENCY=0,
        COALESCE_WINDOW=0, obey_robots false), the figure the defaults are compared with.
        ``host_limit``: HOST_CONCURRENCY for the comparison with the peer (its per-domain 64).
        ``urls``: crawl these (real pages; ``page_bytes`` their total size, for MB/s).
        ``at_once``: the first dispatcher run sends every task (as the peer's start pushes every
        URL to Redis), then the loop runs each second (retries, leases); otherwise 1,000 tasks a
        run every 0.2 s."""
        from common.store.log_models import CrawlerDownloadLog
        from common.store.models import SUCCESS, CrawlerDownloadData, CrawlerLease, CrawlerTask, Job

        phase_start = time.monotonic()
        self.fresh_store()
        redis = self.redis()
        pages = len(urls) if urls else pages
        job = self.new_job(f"bench-e2e-{engine}-{label}", pages if at_once else E2E_DISPATCH_NUM,
                           engine=engine, **({} if etiquette else {"obey_robots": False}))
        insert_s = self.add_tasks_raw(job.id, base, pages, path, hosts, urls)
        names = [f"worker-{label}-{i}" for i in range(self.args.workers)]
        env = self.env
        if not etiquette:
            env = {**env, "DOWNCLUSTER_HOST_CONCURRENCY": "0", "DOWNCLUSTER_COALESCE_WINDOW": "0"}
        if host_limit is not None:
            env = {**env, "DOWNCLUSTER_HOST_CONCURRENCY": str(host_limit)}
        workers = [self.procs.spawn([str(BIN / "downcluster"), "worker", "--logging-level", "WARNING"],
                                    env, n)
                   for n in names]
        sampler = RssSampler([w.pid for w in workers])
        site_pids = self.site_pids(label)
        loop = None
        parts = {"store": [self.mongo.proc.pid], "redis": [self.redis_srv.proc.pid], "site": site_pids,
                 "workers": [w.pid for w in workers]}
        jobs, leases = Job._get_collection(), CrawlerLease._get_collection()
        worker_keys = lambda: list(redis.scan_iter("downcluster:worker:*"))  # noqa: E731
        try:
            end = time.monotonic() + 60
            while len(worker_keys()) < len(workers):  # up and waiting: measure the pipeline, not start-up
                if time.monotonic() > end or any(w.poll() is not None for w in workers):
                    raise RuntimeError(f"workers did not start: {self.procs.tail(names[0])}")
                time.sleep(0.1)
            timeout = max(30.0, min(timeout, self.deadline - time.monotonic() - 20))
            sampler.start()
            cpu0 = self.cpu_snapshot(parts)
            t0 = time.monotonic()
            loop_env = self.env
            if at_once:
                loop_env = {**loop_env, "DOWNCLUSTER_MAX_TOTAL_DISPATCH_COUNT_ONCE": str(max(pages, 1))}
            loop = self.procs.spawn([str(BIN / "downcluster"), "dispatch", "--loop", "--interval",
                                     "1" if at_once else "0.2"], loop_env, f"dispatch-{label}")
            parts["dispatcher"] = [loop.pid]
            cpu0["dispatcher"] = 0.0
            t_done, next_print = None, t0 + 15
            while time.monotonic() - t0 < timeout:
                if loop.poll() is not None:
                    raise RuntimeError(f"dispatch --loop exited {loop.returncode}: "
                                       f"{self.procs.tail(loop.bench_name)}")
                # all sent and no entry left: an _id lookup and a collection count, every POLL s
                # (ours alone: the comparison with the peer reads no store while it runs, see
                # bench_compare.py; a find on crawler_lease would decode lease documents)
                if jobs.find_one({"_id": job.id}, {"seq_sent": 1})["seq_sent"] >= pages \
                        and leases.estimated_document_count() == 0:
                    t_done = time.monotonic()
                    break
                if time.monotonic() >= next_print:
                    print(f"    {time.monotonic() - t0:.0f} s ...", flush=True)
                    next_print += 15
                time.sleep(POLL)
            t_done = t_done or time.monotonic()
            elapsed = t_done - t0
            cpu1 = self.cpu_snapshot(parts)
            time.sleep(1.2)  # workers announce every second: let a short run's peak reach Redis
            peak_inflight = max((int(redis.hget(k, "peak_inflight") or 0) for k in worker_keys()), default=0)
        finally:
            peaks = sampler.stop() if sampler.is_alive() else sampler.peak
            self.procs.stop([p for p in (loop, *workers) if p is not None])
        coll = CrawlerTask._get_collection()
        done = coll.count_documents({"job": job.id, "status": SUCCESS})
        data_docs = CrawlerDownloadData._get_collection().count_documents({"job": job.id})
        log_docs = CrawlerDownloadLog._get_collection().count_documents({"job": job.id, "status": SUCCESS})
        cpu = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
        return {
            "workers": self.args.workers, "engine": engine, "latency": label, "pages": pages, "done": done,
            "complete": done >= pages, "seconds": round(elapsed, 2), "timeout_s": round(timeout),
            "pages_per_s": round(done / elapsed, 1), "insert_s": round(insert_s, 2),
            "dispatch_num": E2E_DISPATCH_NUM,
            "data_docs": data_docs, "success_log_docs": log_docs, "peak_inflight": peak_inflight,
            "worker_peak_rss_mb": round(max(peaks.values()), 1),
            "worker_peak_rss_mb_each": [round(v, 1) for v in peaks.values()],
            "worker_cpu_ms_per_page": round(1000 * cpu["workers"] / max(1, done), 3),
            "store_cpu_ms_per_page": round(1000 * cpu["store"] / max(1, done), 3),
            "all_cpu_ms_per_page": round(1000 * sum(cpu.values()) / max(1, done), 2),
            "cores_busy": {k: round(v / elapsed, 2) for k, v in sorted(cpu.items())},
            "phase_s": round(time.monotonic() - phase_start, 1), "hosts": 1 if urls else hosts,
            "host_limit": host_limit, **({"mb_per_s": round(page_bytes * done / pages / elapsed / 1e6, 1)}
                                         if page_bytes else {}),
        }

    def bench_exports(self, rows: int) -> dict:
        """One export of ``rows`` data documents (~0.5 KB bodies) in each format, every field (body
        text included), each run by a `downcluster worker --burst`: rows/s and the worker's peak
        RSS (bounded memory whatever the row count is the point)."""
        from bson import ObjectId

        from common.store.clock import utcnow
        from common.store.models import CrawlerDownloadData, CrawlerTask, Export
        from master.exports.service import request, tend

        self.fresh_store()
        job = self.new_job("bench-export", 100)
        coll = CrawlerDownloadData._get_collection()
        # ~0.5 KB bodies: the in-memory store's cache (WiredTiger) cannot hold 200,000 rows of 2 KB
        # plus a 0.4 GB file per format (WT_CACHE_FULL); the row count is what memory must not follow
        body = (b"<html><body>" + b"lorem ipsum dolor sit amet " * 18 + b"</body></html>")
        t0 = time.monotonic()
        tasks = CrawlerTask._get_collection()
        for start in range(0, rows, 5000):  # each row's task names it (readers show only named data)
            ids = [ObjectId() for _ in range(start, min(rows, start + 5000))]
            tasks.insert_many([{"_id": t, "job": job.id, "uri": f"http://127.0.0.1/export/{start + n}",
                                "status": "SUCCESS", "data_lease": "bench"} for n, t in enumerate(ids)],
                              ordered=False)
            coll.insert_many([{"_id": ObjectId(), "job": job.id, "task": t, "lease": "bench",
                               "url": f"http://127.0.0.1/export/{start + n}", "status_code": 200,
                               "response_body": body, "encoding": "utf-8", "hostname": "bench",
                               "remote_ip": "127.0.0.1", "add_datetime": utcnow()}
                              for n, t in enumerate(ids)], ordered=False)
        out = {"rows": rows, "body_bytes": len(body), "insert_s": round(time.monotonic() - t0, 1)}
        for key, fmt, template in EXPORT_VARIANTS:
            export = request(self.redis(), "bench-export", fmt, template).export
            worker = self.procs.spawn([str(BIN / "downcluster"), "worker", "--logging-level", "WARNING"],
                                      {**self.env, "DOWNCLUSTER_EXPORT_RETRY_DELAY": "1"}, f"export-{fmt}")
            sampler = RssSampler([worker.pid])
            sampler.start()
            end = time.monotonic() + max(60.0, self.remaining() - 60)
            try:  # what a dispatcher run does for exports (a failed attempt is sent again when due)
                while (Export.objects.get(id=export.id).state in ("PENDING", "RUNNING")
                       and time.monotonic() < end):
                    tend(self.redis())
                    time.sleep(1.0)
            finally:
                peaks = sampler.stop() if sampler.is_alive() else sampler.peak
                self.procs.stop([worker])
            done = Export.objects.get(id=export.id)
            if done.state != "SUCCESS":
                raise RuntimeError(f"{fmt} export ended {done.state}: {done.error}")
            from common.store.data import drop_export_file

            drop_export_file(done.file_id)  # the in-memory store keeps every file: ~0.4 GB each
            seconds = (done.finished_at - done.started_at).total_seconds()
            out[key] = {"seconds": round(seconds, 1), "rows_per_s": round(rows / seconds) if seconds else 0,
                        "attempts": done.attempts, "file_mb": round(done.bytes / 2**20, 1),
                        "worker_peak_rss_mb": round(max(peaks.values(), default=0), 1)}
            print(f"  {key}: {out[key]}", flush=True)
        return out

    # 5. the naive baseline
    def bench_baseline(self, label: str, base: str, pages: int, timeout: float) -> dict:
        import pymongo
        from rq import Queue, Worker
        from rq.registry import FailedJobRegistry

        self.fresh_store()
        redis = self.redis()
        uri = self.mongo.uri("baseline")
        env = {**self.env, "BENCH_BASELINE_MONGO": uri,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "scripts"),
                                                           self.env.get("PYTHONPATH")]))}
        qname = f"baseline_{label}"
        tag = uuid.uuid4().hex[:6]
        names = [f"baseline-{label}-{i}-{tag}" for i in range(4)]
        workers = [self.procs.spawn([str(BIN / "rq"), "worker", "-n", n, "-q", qname],
                                    {**env, "RQ_REDIS_URL": self.redis_srv.url}, n) for n in names]
        client = pymongo.MongoClient(uri)
        coll = client.get_default_database()["pages"]
        queue = Queue(qname, connection=redis)
        failed = FailedJobRegistry(queue=queue)
        sampler = RssSampler([w.pid for w in workers])
        try:
            end = time.monotonic() + 60
            while not {n for n in names} <= {w.name for w in Worker.all(connection=redis)}:
                if time.monotonic() > end or any(w.poll() is not None for w in workers):
                    raise RuntimeError(f"rq workers did not start: {self.procs.tail(names[0])}")
                time.sleep(0.1)
            timeout = max(30.0, min(timeout, self.deadline - time.monotonic() - 10))
            sampler.start()
            cpu0 = sum(cpu_tree(w.pid) for w in workers)
            t0 = time.monotonic()
            queue.enqueue_many([Queue.prepare_data("bench.baseline_fetch_and_store", (f"{base}/page/{i}",),
                                                   result_ttl=0, failure_ttl=3600) for i in range(pages)])
            stored = bad = 0
            while time.monotonic() - t0 < timeout:
                stored, bad = coll.count_documents({}), failed.count
                if stored + bad >= pages:
                    break
                time.sleep(0.1)
            elapsed = time.monotonic() - t0
            cpu = sum(cpu_tree(w.pid) for w in workers) - cpu0
        finally:
            peaks = sampler.stop() if sampler.is_alive() else sampler.peak
            self.procs.stop(workers)
            client.close()
        if bad:
            print(f"  baseline: {bad} jobs failed: {self.procs.tail(names[0], 600)}", flush=True)
        return {"pages": pages, "done": stored, "failed": bad, "complete": stored >= pages,
                "seconds": round(elapsed, 2), "pages_per_s": round(stored / elapsed, 2),
                "worker_peak_rss_mb": round(max(peaks.values()), 1),
                "worker_cpu_ms_per_page": round(1000 * cpu / max(1, stored), 2)}


# --- plan, report --------------------------------------------------------------------------

def bench_sandbox(runs: int) -> dict:
    """Milliseconds (median of ``runs``) of one python and one shell download through the
    sandbox (bubblewrap box, uid, wall), beside the floor: the same interpreter started bare,
    so the difference is the box's own cost."""
    import statistics

    from slave.download.engines import sandbox
    from slave.download.engines.base import Limits

    limits = Limits(timeout=30)

    def median_ms(fn) -> float:
        fn()  # the wall is built and the interpreter warm before timing
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return round(statistics.median(times) * 1000, 1)

    code = "def download(task):\n    return {'status_code': 200, 'body': 'x'}\n"
    return {"runs": runs,
            "python_ms": median_ms(lambda: sandbox.run_python(code, {"url": "u", "settings": {}}, limits)),
            "shell_ms": median_ms(lambda: sandbox.run_shell("printf x", "u", limits)),
            "bare_python_ms": median_ms(lambda: subprocess.run([sandbox.interpreter(), "-I", "-c", "pass"],
                                                               check=True)),
            "bare_shell_ms": median_ms(lambda: subprocess.run(["/bin/sh", "-c", "printf x"], check=True,
                                                              stdout=subprocess.DEVNULL))}


def e2e_timeout(bench: Bench, pages: int, share: float) -> float:
    """At most max(120, N/20) s, and this phase's share of what is left of the time budget."""
    overhead = pages / 1500 + 15  # inserting the tasks (~1.5k docs/s), start-up and shutdown
    return max(30.0, min(max(120.0, pages / 20), bench.remaining() * share - overhead))


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def build_rows(r: dict) -> list[Row]:
    """The bench table's lines, for the figures a run has."""
    return _e2e_rows(r) + _comparison_rows(r) + _dispatch_rows(r) + _other_rows(r)


def _e2e_rows(r: dict) -> list[Row]:
    rows: list[Row] = []
    for label in ("0ms", "100ms"):
        e = r.get(f"e2e_{label}")
        if e:
            done = f"{e['done']:,}" if e["complete"] else f"PARTIAL {e['done']:,}/{e['pages']:,}"
            rows.append((f"downcluster e2e {label}, defaults, 32 hosts, {e['workers']} worker process(es)",
                         f"{e['pages_per_s']:,} pages/s ({done} in {e['seconds']} s)", "", ""))
            rows.append(("  worker CPU per page stored", f"{e['worker_cpu_ms_per_page']} ms",
                         f"<= {TARGETS['worker_cpu_ms']} ms",
                         verdict(e["worker_cpu_ms_per_page"] <= TARGETS["worker_cpu_ms"])))
            rows.append(("  store CPU per page", f"{e['store_cpu_ms_per_page']} ms", "", ""))
            target, judged = "", ""
            if label == "100ms":
                target = f">= {TARGETS['inflight_100ms']}"
                judged = verdict(e["peak_inflight"] >= TARGETS["inflight_100ms"])
            rows.append(("  peak downloads in flight per worker", f"{e['peak_inflight']}", target, judged))
            rows.append(("  worker peak RSS", f"{e['worker_peak_rss_mb']} MB", f"<= {TARGETS['rss_mb']} MB",
                         verdict(e["worker_peak_rss_mb"] <= TARGETS["rss_mb"])))
            rows.append(("  cores busy", " ".join(f"{k} {v}" for k, v in e["cores_busy"].items()), "", ""))
    return rows


def _comparison_rows(r: dict) -> list[Row]:
    """Per comparison: each side's median steady rate with its runs, the ratio with each pair's, and
    each side's store cost per page (CPU, write commands, bytes received) and client CPU."""
    rows: list[Row] = []
    names = {"one_0ms": "one host, 0 ms", "many_0ms": "32 hosts, 0 ms", "one_100ms": "one host, 100 ms",
             "many_100ms": "32 hosts, 100 ms", "real": "real pages (nginx, gzip)"}
    for key in COMPARISONS:
        c = r.get(f"cmp_{key}")
        if not c:
            continue
        for side in ("ours", "peer"):
            s = c[f"{side}_summary"]
            if s["steady_median"] is None:
                continue
            runs = " / ".join(str(x) for x in s["steady_runs"])
            who = "downcluster" if side == "ours" else "  peer"
            rows.append((f"{names[key] if side == 'ours' else ''}{': ' if side == 'ours' else ''}{who}",
                         f"{s['steady_median']:,} pages/s steady ({runs}); last page {s['to_last_median']} s"
                         + ("" if s["complete"] else " PARTIAL"), "",
                         f"store/page: {s['store_cpu_ms_per_page']} ms CPU, {s['store_write_ops_per_page']} "
                         f"writes, {s['store_bytes_in_per_page']} B in; client CPU "
                         f"{s['client_cpu_ms_per_page']} ms"))
        if c.get("ratio"):
            met = c["ratio"] >= TARGETS["peer_ratio"] and c["ours_summary"]["complete"]
            rows.append(("  ours / peer, steady (each pair)", f"x{c['ratio']} ({c['ratio_pairs']})",
                         f">= x{TARGETS['peer_ratio']:g}", verdict(met)))
        for key, what in (("client_cpu_ms_per_page", "client CPU a page, ours / peer"),
                          ("client_cpu_ms_per_page_after", "the same once the processes are up")):
            ours_cpu, peer_cpu = (c[f"{side}_summary"].get(key) for side in ("ours", "peer"))
            if ours_cpu and peer_cpu:
                share = round(ours_cpu / peer_cpu, 3)
                target = TARGETS["client_cpu_share"]
                rows.append((f"  {what}", f"{share} ({ours_cpu} / {peer_cpu} ms)", f"<= {target:g}",
                             verdict(share <= target)))
    return rows


def _dispatch_rows(r: dict) -> list[Row]:
    rows: list[Row] = []
    d = r.get("dispatch")
    if d:
        lv, bl = d["live"], d["backlog"]
        rows.append((f"dispatch {lv['dispatched']:,} of {lv['tasks']:,} LIVE", f"{lv['seconds']} s",
                     f"<= {TARGETS['dispatch_s']:g} s", verdict(lv["seconds"] <= TARGETS["dispatch_s"])))
        rows.append((f"dispatch {bl['dispatched']:,} of a {bl['tasks']:,} backlog", f"{bl['seconds']} s",
                     f"<= {TARGETS['dispatch_s']:g} s", verdict(bl["seconds"] <= TARGETS["dispatch_s"])))
        for key, v in (("live", lv), ("backlog", bl)):
            top = sorted(v["mongo_by_command"].items(), key=lambda kv: -kv[1]["seconds"])[:3]
            rows.append((f"  {key}: MongoDB time / store CPU",
                         f"{v['mongo_time_s']} s / {v['store_cpu_s']} s",
                         "", ", ".join(f"{k} {c['calls']}x {c['seconds']}s" for k, c in top)))
        rows.append(("Redis per queued task (INFO / key sizes)",
                     f"{lv['redis_bytes_per_task']} B / {lv['redis_key_bytes_per_task']} B",
                     f"<= {TARGETS['redis_bytes']} B",
                     verdict(0 < lv["redis_bytes_per_task"] <= TARGETS["redis_bytes"])))
    return rows


def _other_rows(r: dict) -> list[Row]:
    rows: list[Row] = []
    br = r.get("browser_0ms")
    if br:
        done = f"{br['done']:,}" if br["complete"] else f"PARTIAL {br['done']:,}/{br['pages']:,}"
        rows.append(("browser engine, pages built by JavaScript (a figure)",
                     f"{br['pages_per_s']:,} pages/s ({done} in {br['seconds']} s)", "", ""))
    if r.get("etiquette_ratio"):
        runs = lambda keys: " / ".join(str(r[k]["pages_per_s"]) for k in keys if r.get(k))  # noqa: E731
        rows.append(("e2e 0ms, 32 hosts: etiquette at its defaults (runs)",
                     f"{runs(ETIQUETTE_ON)} pages/s", "", ""))
        rows.append(("  etiquette off: no host limits, robots, coalescing (runs)",
                     f"{runs(ETIQUETTE_OFF)} pages/s", "", ""))
        rows.append(("  with the defaults / without (sum of runs)", f"x{r['etiquette_ratio']}", ">= x0.95",
                     verdict(r["etiquette_ratio"] >= 0.95)))
    x = r.get("exports")
    if x:
        for key, _, _ in EXPORT_VARIANTS:
            f = x.get(key)
            if f:
                rows.append((f"export {x['rows']:,} rows as {key.replace('_', ' ')}",
                             f"{f['rows_per_s']:,} rows/s ({f['seconds']} s, {f['file_mb']} MB)", "", ""))
                rss_ok = f["worker_peak_rss_mb"] <= TARGETS["rss_mb"]
                rows.append(("  worker peak RSS", f"{f['worker_peak_rss_mb']} MB",
                             f"<= {TARGETS['rss_mb']} MB", verdict(rss_ok)))
    if r.get("scale"):
        import bench_scale

        rows += bench_scale.rows(r["scale"])
    s_ = r.get("store")
    if s_:
        rows.append(("store: insert_many of ~2 KB docs", f"{s_['insert_docs_per_s']:,} docs/s", "", ""))
        rows.append(("store: update_many $in 50, bare / task indexes",
                     f"{s_['update_in50_docs_per_s']:,} / "
                     f"{s_['update_range50_task_indexes_docs_per_s']:,} docs/s", "", ""))
    for label in ("0ms", "100ms"):
        b = r.get(f"baseline_{label}")
        if b:
            rows.append((f"naive baseline {label}",
                         f"{b['pages_per_s']} pages/s ({b['done']} in {b['seconds']} s)",
                         "", f"downcluster x{r.get(f'ratio_{label}', '?')}"))
    return rows


def print_table(r: dict) -> None:
    rows = build_rows(r)
    if not rows:
        return
    w0 = max(len(x[0]) for x in rows) + 2
    w1 = max(len(x[1]) for x in rows) + 2
    print(f"\n{'figure':<{w0}}{'measured':<{w1}}{'target':<20}")
    for name, value, target, ok in rows:
        print(f"{name:<{w0}}{value:<{w1}}{target:<20}{ok}")


# --- main ----------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=None,
                   help="end-to-end pages, ours and the peer's (default 10000; --smoke 300)")
    p.add_argument("--smoke", action="store_true",
                   help="a few hundred pages, quick (the test suite runs it): one comparison run a side "
                        "on one host at 0 ms, the peer's only when its own install (.venv-peer) is there")
    p.add_argument("--json", default=str(ROOT / "var" / "bench.json"), help="where to write the figures")
    p.add_argument("--workers", type=int, default=1,
                   help="downcluster worker processes (default 1: what a 2-core host should run)")
    p.add_argument("--skip-peer", action="store_true", help="no comparison with scrapy-redis")
    p.add_argument("--runs", type=int, default=None,
                   help="runs of each side per comparison, alternated A B B A (default 3; smoke 1)")
    p.add_argument("--comparisons", default=",".join(COMPARISONS),
                   help=f"which comparisons, comma-separated (default all: {','.join(COMPARISONS)})")
    p.add_argument("--peer-concurrency", type=int, default=64,
                   help="the peer's CONCURRENT_REQUESTS (and per domain) in each of its "
                        f"{PEER_PROCS} processes; ours per host is {PEER_PROCS} x this (default 64)")
    p.add_argument("--peer-batch", type=int, default=0,
                   help="the peer's REDIS_START_URLS_BATCH_SIZE (default: its concurrency)")
    p.add_argument("--peer-broad", action="store_true",
                   help="the peer with Scrapy's DownloaderAwarePriorityQueue (its 'Broad Crawls' advice)")
    p.add_argument("--peer-scheduler", choices=("local", "redis"), default="local",
                   help="local: Scrapy's own scheduler (the stronger; default), redis: scrapy-redis's")
    p.add_argument("--with-baseline", action="store_true", help="also run the naive baseline")
    p.add_argument("--skip-exports", action="store_true", help="do not measure the 200,000-row exports")
    p.add_argument("--exports-only", action="store_true", help="only measure the exports")
    p.add_argument("--skip-browser", action="store_true",
                   help="do not measure the browser engine (skipped in --smoke)")
    p.add_argument("--browser-pages", type=int, default=150,
                   help="pages for the browser engine figure (default 150)")
    p.add_argument("--baseline-pages", type=int, default=None,
                   help="pages of the baseline (default 500; smoke 50)")
    p.add_argument("--compare-only", action="store_true",
                   help="only the comparisons with the peer (one host, 32 hosts, real pages)")
    p.add_argument("--real-pages", default="/usr/share/doc/python3.11/html",
                   help="a documentation tree served by nginx for the real-page comparison "
                        "(files of 10 KB-1 MB)")
    p.add_argument("--real-copies", type=int, default=3,
                   help="each real page crawled this many times (distinct URLs)")
    p.add_argument("--scale", type=int, default=None,
                   help="tasks in the scale phase's store (default 1,000,000; smoke 20,000; "
                        "0: no scale phase)")
    p.add_argument("--scale-only", action="store_true", help="only the scale phase")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds the whole run may take; e2e waits shrink to fit (default 4200: the "
                        "comparisons are 30 runs; smoke 420)")
    a = p.parse_args(argv)
    a.pages = a.pages or (300 if a.smoke else 10000)
    a.baseline_pages = a.baseline_pages or (50 if a.smoke else 500)
    a.budget = a.budget or (420.0 if a.smoke else 4200.0)
    a.compare = a.smoke or not a.skip_peer
    if not a.skip_peer and not peer_installed():
        print(f"note: the peer's install ({PEER_BIN.parent}) is missing: `make bench` makes it; "
              "our side only", file=sys.stderr)
        a.skip_peer = True
    a.runs = a.runs or (1 if a.smoke else 3)
    a.comparisons = ("one_0ms",) if a.smoke else tuple(a.comparisons.split(","))
    a.dispatch_tasks, a.backlog = (500, 2000) if a.smoke else (7000, 100_000)
    a.export_rows = 2000 if a.smoke else 200_000
    a.scale = (20_000 if a.smoke else 1_000_000) if a.scale is None else a.scale
    if a.scale_only:
        a.exports_only = False
        a.compare_only = a.skip_exports = a.skip_browser = a.skip_peer = True
        a.compare = False
    return a


class Run:
    """One bench run's phases, in order; each phase's figures (or its failure) go to ``results``."""

    def __init__(self, args, bench: Bench, results: dict) -> None:
        self.args, self.bench, self.results = args, bench, results
        self.sites: dict[str, str] = {}

    def phase(self, key: str, title: str, fn):
        print(f"{title} ...", flush=True)
        t0 = time.monotonic()
        try:
            self.results[key] = fn()
        except Exception as exc:
            self.results["errors"].append(f"{key}: {type(exc).__name__}: {exc}")
            print(f"  FAILED: {type(exc).__name__}: {exc}", flush=True)
            return None
        print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)
        return self.results[key]

    def compare(self, key: str, title: str, urls: list[str], page_bytes: int = 0) -> None:
        """Ours and the peer, measured alike (scripts/bench_compare.py), ``args.runs`` runs each."""
        import bench_compare

        args, bench = self.args, self.bench
        cmp = bench_compare.Compare(bench, peer_procs=0 if args.skip_peer else PEER_PROCS,
                                    peer_concurrency=args.peer_concurrency, peer_batch=args.peer_batch,
                                    scheduler=args.peer_scheduler, workers=args.workers,
                                    peer_broad=args.peer_broad)

        def timeout() -> float:  # taken when each run starts, from the budget left then
            return max(30.0, min(max(120.0, len(urls) / 20), bench.remaining() - 30))

        who = "downcluster" + ("" if args.skip_peer else
                               f" and scrapy-redis ({args.peer_scheduler} scheduler, "
                               f"{PEER_PROCS} x {args.peer_concurrency})")
        got = self.phase(f"cmp_{key}", f"{who}, alternated, {args.runs} run(s) each: {title}",
                         lambda: cmp.pair(key, urls, args.runs, timeout, page_bytes))
        if got and got.get("ratio"):
            print(f"  steady pages/s, medians: ours {got['ours_summary']['steady_median']} | peer "
                  f"{got['peer_summary']['steady_median']}: x{got['ratio']} (pairs {got['ratio_pairs']})",
                  flush=True)

    def compare_site(self, label: str) -> str:
        """The comparison's site at ``label`` (started once): nginx's static pages at 0 ms (the
        smoke run, which may lack nginx, uses bench_site.py), bench_site.py at 100 ms."""
        import bench_compare

        if label not in self.sites:
            bench = self.bench
            if label == "0ms" and not self.args.smoke:
                self.sites[label] = bench_compare.start_page_nginx(bench.procs, bench.env, self.args.pages)
            else:
                self.sites[label] = bench_compare.start_delay_site(bench.procs, bench.env,
                                                                   0 if label == "0ms" else 100)
        return self.sites[label]

    def all(self) -> None:
        """Every phase ``args`` asks for."""
        args, bench = self.args, self.bench
        bench.start_services()
        base: dict[str, str] = {}
        if not args.exports_only:  # everything but the exports
            base = {"0ms": "", "100ms": ""}  # the comparison starts its own sites
            if not args.compare_only:
                base = {"0ms": start_site(bench.procs, bench.env, 0),
                        "100ms": start_site(bench.procs, bench.env, 100)}
            if not args.compare_only:
                self.phase("store", "store ceiling (SecantusDB)", bench.bench_store)
                self.phase("dispatch", f"dispatch: {args.dispatch_tasks:,} LIVE, then "
                           f"{args.dispatch_tasks:,} of a {args.backlog:,} backlog",
                           lambda: bench.bench_dispatch(base["0ms"]))
            for label in ("0ms", "100ms"):
                self.latency(label, base[label])
            if args.compare and not args.smoke and "real" in args.comparisons:
                self.real_pages()
        if args.scale and not args.exports_only:
            import bench_scale

            self.phase("scale", f"scale: a store of {args.scale:,} tasks with their data and logs; pages, "
                       "counts, dispatch and chores", lambda: bench_scale.run(bench, args.scale))
        if not args.exports_only and not args.compare_only:
            self.phase("sandbox", "python and shell downloads through the sandbox (box, uid, wall) "
                       "vs a bare process", lambda: bench_sandbox(20 if args.smoke else 200))
            if self.results.get("sandbox"):
                print("  python {python_ms} ms (bare {bare_python_ms}), shell {shell_ms} ms "
                      "(bare {bare_shell_ms})".format(**self.results["sandbox"]), flush=True)
        if args.exports_only or (not args.skip_exports and not args.compare_only):
            self.phase("exports", f"exports: {args.export_rows:,} rows in csv, jsonl and xlsx, "
                       "each on a worker", lambda: bench.bench_exports(args.export_rows))
        if not (args.smoke or args.skip_browser or args.compare_only or args.exports_only):
            self.phase("browser_0ms", f"browser engine (headless Chromium) at 0ms: {args.browser_pages} "
                       "pages built by JavaScript, 1 worker",
                       lambda: bench.bench_e2e("0ms", base["0ms"], args.browser_pages,
                                               e2e_timeout(bench, args.browser_pages, 1.0),
                                               engine="browser", path="js/render"))

    def latency(self, label: str, site: str) -> None:
        """The phases against the sample site ``site``, which answers after ``label``."""
        args, bench = self.args, self.bench
        left = 4 - (0 if label == "0ms" else 2)
        if not args.compare_only:
            self.phase(f"e2e_{label}", f"downcluster end to end at {label}: {args.pages:,} pages, "
                       f"{args.workers} worker process(es), dispatch --loop",
                       lambda: bench.bench_e2e(label, site, args.pages,
                                               e2e_timeout(bench, args.pages, 1 / left)))
        e = self.results.get(f"e2e_{label}")
        if e:
            print(f"  {e['pages_per_s']} pages/s, {e['done']}/{e['pages']} in {e['seconds']} s, "
                  f"cores busy {e['cores_busy']}", flush=True)
        if label == "0ms" and not args.compare_only:
            self.etiquette_runs(label, site, 1 / (left + 1))
        if args.compare:
            import bench_compare

            for name, hosts in (("one", 1), ("many", SITE_HOSTS)):
                if f"{name}_{label}" in args.comparisons:
                    urls = bench_compare.page_urls(self.compare_site(label), args.pages, hosts)
                    self.compare(f"{name}_{label}", f"{args.pages:,} pages at {label} on {hosts} host(s)",
                                 urls)
        if args.with_baseline:
            self.phase(f"baseline_{label}",
                       f"naive baseline at {label} ({args.baseline_pages} pages, 4 rq workers)",
                       lambda: bench.bench_baseline(label, site, args.baseline_pages,
                                                    max(60.0, args.baseline_pages / 2)))

    def etiquette_runs(self, label: str, site: str, share: float) -> None:
        """The end-to-end run again with the etiquette off, off, on, on, off (on ran first): runs of
        one setting differ by several % on a shared machine and drift; this order cancels a steady
        drift out of the ratio. ``share``: each run's share of the time left."""
        args, bench = self.args, self.bench
        for key in ETIQUETTE_ORDER[1:]:
            on = key in ETIQUETTE_ON
            self.phase(key, f"the same {'with' if on else 'without'} etiquette (host limits, robots.txt, "
                       f"coalescing): {args.pages:,} pages",
                       lambda on=on: bench.bench_e2e(label, site, args.pages,
                                                     e2e_timeout(bench, args.pages, share), etiquette=on))
            if self.results.get(key):
                print(f"  {self.results[key]['pages_per_s']} pages/s", flush=True)

    def real_pages(self) -> None:
        """Ours and the peer on a documentation tree served by nginx, when both are installed."""
        args, bench = self.args, self.bench
        docs = real_page_set(args.real_pages, args.real_copies)
        if docs is None:
            self.results["errors"].append(f"real pages skipped: no nginx or no documentation tree "
                                          f"({args.real_pages}); `make bench` installs nginx-light and "
                                          "python3.11-doc")
            return
        site = start_nginx(bench.procs, docs["root"])
        urls = [f"{site}/{rel}" for rel in docs["paths"]]
        self.results["real_pages"] = {k: v for k, v in docs.items() if k != "paths"}
        self.compare("real", f"real pages: {len(urls):,} files of {docs['root']} "
                     f"({docs['bytes'] / 1e6:.0f} MB) from nginx with gzip", urls, docs["bytes"])


def add_ratios(results: dict) -> None:
    """The ratios between the figures of a finished run: etiquette on / off, ours / the peer's,
    ours / the baseline's."""
    on = [results[k]["pages_per_s"] for k in ETIQUETTE_ON if results.get(k)]
    off = [results[k]["pages_per_s"] for k in ETIQUETTE_OFF if results.get(k)]
    if on and off and len(on) == len(off) and sum(off) > 0:
        results["etiquette_ratio"] = round(sum(on) / sum(off), 3)
    for label in ("0ms", "100ms"):
        e, b = results.get(f"e2e_{label}"), results.get(f"baseline_{label}")
        if e and b and b["pages_per_s"] > 0:
            results[f"ratio_{label}"] = round(e["pages_per_s"] / b["pages_per_s"], 1)


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    results: dict = {"mode": "smoke" if args.smoke else "full", "pages": args.pages, "workers": args.workers,
                     "budget_s": args.budget, "host_cpus": os.cpu_count(),
                     "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "loadavg_at_start": os.getloadavg()[0], "errors": []}
    if os.getloadavg()[0] > 0.5 * (os.cpu_count() or 1):
        print(f"note: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs: other work on this "
              "host will lower the figures", flush=True)
    logdir = Path(tempfile.mkdtemp(prefix="dc-bench-"))
    procs = Procs(logdir)
    bench = Bench(args, procs)

    stop_on_sigterm()
    compile_ours()
    try:
        Run(args, bench, results).all()
    except KeyboardInterrupt as exc:
        results["errors"].append(f"interrupted: {exc}")
        print(f"interrupted: {exc}", flush=True)
    except Exception as exc:
        results["errors"].append(f"{type(exc).__name__}: {exc}")
        print(f"FAILED: {type(exc).__name__}: {exc}", flush=True)
    finally:
        procs.stop_all()
        bench.stop_services()
    add_ratios(results)
    results["duration_s"] = round(time.monotonic() - started, 1)
    results["loadavg_at_end"] = os.getloadavg()[0]
    print_table(results)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"\n{results['mode']} run took {results['duration_s']} s; figures in {out}; "
          f"process logs in {logdir}")
    errors = [e for e in results["errors"] if "skipped" not in e]
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
