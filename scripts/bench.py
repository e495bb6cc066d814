"""`make bench`: dispatch speed, end-to-end throughput, the seed-design baseline and the
store's own ceiling, measured in one run on this machine's own services.

Starts a private redis-server, a SecantusDB (:memory:) and two loopback sample sites (no
delay, 100 ms delay) in their own processes; prints a table and writes JSON (var/bench.json).
`--smoke` runs a few hundred pages so the test suite keeps the script working.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from services import MongoServer, RedisServer, env_for, free_port  # noqa: E402

BIN = Path(sys.executable).parent
TICKS = os.sysconf("SC_CLK_TCK")


def start_site(delay_ms: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "sample_site.py"), "--port", str(port),
                             "--delay-ms", str(delay_ms)], stdout=subprocess.DEVNULL)
    import socket
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("sample site did not start")


def proc_tree(pid: int) -> list[int]:
    try:
        kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return [pid] + [q for k in kids for q in proc_tree(k)]


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process and its reaped children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICKS


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def add_tasks_raw(job_id, base: str, count: int, prefix: str = "page") -> float:
    """Bulk-insert LIVE tasks as `task add` does; return seconds."""
    from common.models import CrawlerTask, lower_live_from, utcnow

    coll, now, started = CrawlerTask._get_collection(), utcnow(), time.monotonic()
    for start in range(0, count, 5000):
        docs = [{"job": job_id, "uri": f"{base}/{prefix}/{i}", "status": "LIVE", "download_times": 0, "recoveries": 0,
                 "host_name": "", "add_datetime": now, "last_update_datetime": now}
                for i in range(start, min(count, start + 5000))]
        coll.insert_many(docs, ordered=False)
        lower_live_from(job_id, docs[0]["_id"])
    return time.monotonic() - started


def new_job(name: str, priority: int, dispatch_num: int):
    from master.registry import store, validate_manifest

    spec = validate_manifest({"name": name, "priority": priority, "settings": {"dispatch_num": dispatch_num}}, ROOT)
    return store(spec)


def bench_dispatch(redis, n: int, backlog: int, base: str) -> dict:
    from common.config import settings
    from common.models import CrawlerTask
    from master.dispatcher import dispatch_once
    from master.registry import set_status

    settings.override(MAX_TOTAL_DISPATCH_COUNT_ONCE=n)
    job = new_job("bench-dispatch", 0, n)
    insert_s = add_tasks_raw(job.id, base, n, "d")
    mem0 = redis.info("memory")["used_memory"]
    t0 = time.monotonic()
    report = dispatch_once(redis)
    took = time.monotonic() - t0
    per_task = (redis.info("memory")["used_memory"] - mem0) / max(1, report.total)
    keys = sum(redis.memory_usage(k) or 0 for k in redis.scan_iter("rq:*"))
    set_status("bench-dispatch", "OFF")
    CrawlerTask._get_collection().delete_many({"job": job.id})
    redis.flushall()
    big = new_job("bench-backlog", 0, n)
    backlog_insert_s = add_tasks_raw(big.id, base, backlog, "b")
    t0 = time.monotonic()
    report2 = dispatch_once(redis)
    took2 = time.monotonic() - t0
    set_status("bench-backlog", "OFF")
    CrawlerTask._get_collection().delete_many({"job": big.id})
    redis.flushall()
    settings.override(MAX_TOTAL_DISPATCH_COUNT_ONCE=7000)
    return {"dispatch_tasks": report.total, "dispatch_s": round(took, 3), "insert_s": round(insert_s, 2),
            "backlog": backlog, "backlog_dispatch_tasks": report2.total, "backlog_dispatch_s": round(took2, 3),
            "backlog_insert_s": round(backlog_insert_s, 2), "redis_bytes_per_task": round(per_task, 1),
            "redis_key_bytes_per_task": round(keys / max(1, report.total), 1)}


def bench_e2e(env: dict, base: str, pages: int, workers: int, label: str, timeout: float) -> dict:
    from common.models import SUCCESS, CrawlerTask

    job = new_job(f"bench-{label}", 0, 1000)
    add_tasks_raw(job.id, base, pages)
    coll = CrawlerTask._get_collection()
    procs = [subprocess.Popen([str(BIN / "downcluster"), "worker", "--logging-level", "WARNING"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(workers)]
    time.sleep(3)  # workers up and waiting: measure the pipeline, not interpreter start-up
    started = time.monotonic()
    loop = subprocess.Popen([str(BIN / "downcluster"), "dispatch", "--loop", "--interval", "0.2"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak_rss, done = 0.0, 0
    try:
        while time.monotonic() - started < timeout:
            time.sleep(4.0)  # counting is not free on SecantusDB: poll sparingly
            for p in procs:
                peak_rss = max([peak_rss] + [rss_mb(q) for q in proc_tree(p.pid)])
            done = coll.count_documents({"job": job.id, "status": SUCCESS})
            if done >= pages:
                break
        elapsed = time.monotonic() - started
        cpu = sum(cpu_seconds(q) for p in procs for q in proc_tree(p.pid))
    finally:
        for p in [loop, *procs]:
            p.terminate()
        for p in [loop, *procs]:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    return {"pages": done, "seconds": round(elapsed, 2), "pages_per_s": round(done / elapsed, 1),
            "worker_peak_rss_mb": round(peak_rss, 1), "cpu_ms_per_page": round(1000 * cpu / max(1, done), 2),
            "complete": done >= pages}


def bench_baseline(env: dict, redis_url: str, mongo_uri: str, base: str, pages: int, label: str) -> dict:
    import redis as redis_lib
    from rq import Queue

    conn = redis_lib.Redis.from_url(redis_url)
    queue = Queue(f"baseline_{label}", connection=conn)
    queue.enqueue_many([Queue.prepare_data("bench_baseline.fetch_and_store", (f"{base}/page/{i}",), result_ttl=0)
                        for i in range(pages)])
    benv = {**env, "PYTHONPATH": str(ROOT / "scripts"), "BENCH_BASELINE_MONGO": mongo_uri}
    started = time.monotonic()
    procs = [subprocess.Popen([str(BIN / "rq"), "worker", "-u", redis_url, "--burst", "-q", queue.name], env=benv,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(4)]
    for p in procs:
        p.wait(timeout=1800)
    elapsed = time.monotonic() - started
    return {"pages": pages, "seconds": round(elapsed, 2), "pages_per_s": round(pages / elapsed, 1)}


def bench_store(db) -> dict:
    from bson import Binary

    coll = db.bench_store
    docs = [{"i": i, "body": Binary(os.urandom(2048))} for i in range(5000)]
    t0 = time.monotonic()
    for i in range(0, len(docs), 500):
        coll.insert_many(docs[i:i + 500])
    inserts = len(docs) / (time.monotonic() - t0)
    ids = [d["_id"] for d in docs[:2000]]
    t0 = time.monotonic()
    for i in range(0, len(ids), 50):
        coll.update_many({"_id": {"$in": ids[i:i + 50]}}, {"$set": {"status": "SUCCESS"}})
    updates = len(ids) / (time.monotonic() - t0)
    coll.drop()
    return {"insert_docs_per_s": round(inserts), "update_docs_per_s": round(updates)}


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pages", type=int, default=20000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--json", default=str(ROOT / "var" / "bench.json"))
    args = parser.parse_args()
    pages, backlog, base_pages = (300, 2000, 40) if args.smoke else (args.pages, 100_000, 300)
    n_dispatch = 500 if args.smoke else 7000
    servers, sites = [], []
    try:
        redis_srv, mongo = RedisServer(), MongoServer(":memory:")
        for s in (redis_srv, mongo):
            s.start()
            servers.append(s)
        site0, base0 = start_site(0)
        site100, base100 = start_site(100)
        sites += [site0, site100]
        env = {**os.environ, **env_for(redis_srv.url, mongo.uri("bench"), mongo.uri("bench_log"), HOSTNAME="bench")}
        os.environ.update(env)
        from common.config import settings
        from common.connections import connect_mongo, disconnect_mongo, mongo_client, redis_conn

        settings.reload()

        def fresh_store() -> None:
            """Each phase on an empty store: SecantusDB slows as its in-memory data grows."""
            disconnect_mongo()
            mongo.restart()
            connect_mongo(ensure_indexes=True)

        connect_mongo(ensure_indexes=True)
        results: dict = {"mode": "smoke" if args.smoke else "full", "workers": args.workers}
        print("measuring the store's ceiling ...", flush=True)
        results["store"] = bench_store(mongo_client()["bench_scratch"])
        print("measuring dispatch ...", flush=True)
        results["dispatch"] = bench_dispatch(redis_conn(), n_dispatch, backlog, base0)
        print(f"  {results['store']}\n  {results['dispatch']}", flush=True)
        timeout = max(120.0, pages / 40)
        for label, base in (("0ms", base0), ("100ms", base100)):
            fresh_store()
            redis_conn().flushall()
            print(f"measuring end to end at {label} ({pages} pages, {args.workers} workers) ...", flush=True)
            results[f"e2e_{label}"] = bench_e2e(env, base, pages, args.workers, label, timeout)
            print(f"  {results[f'e2e_{label}']}", flush=True)
            if not args.skip_baseline:
                fresh_store()
                print(f"measuring the seed-design baseline at {label} ({base_pages} pages) ...", flush=True)
                results[f"baseline_{label}"] = bench_baseline(env, redis_srv.url, mongo.uri("baseline"), base,
                                                              base_pages, label)
                print(f"  {results[f'baseline_{label}']}", flush=True)
    finally:
        for p in sites:
            p.terminate()
        for s in reversed(servers):
            s.stop()
    report(results)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {args.json}")
    return 0


def report(r: dict) -> None:
    d = r["dispatch"]
    rows = [
        ("store: insert_many of 2 KB docs", f"{r['store']['insert_docs_per_s']} docs/s", "", ""),
        ("store: update_many by _id ($in 50)", f"{r['store']['update_docs_per_s']} docs/s", "", ""),
        (f"dispatch {d['dispatch_tasks']} LIVE tasks", f"{d['dispatch_s']} s", "<= 1 s", verdict(d["dispatch_s"] <= 1)),
        (f"dispatch {d['backlog_dispatch_tasks']} of a {d['backlog']} backlog", f"{d['backlog_dispatch_s']} s",
         "no slower", verdict(d["backlog_dispatch_s"] <= max(1.0, d["dispatch_s"] * 1.2))),
        ("Redis per queued task (INFO memory / keys)", f"{d['redis_bytes_per_task']} B / {d['redis_key_bytes_per_task']} B",
         "<= 200 B", verdict(d["redis_bytes_per_task"] <= 200)),
    ]
    for label, target in (("0ms", 1500), ("100ms", 1000)):
        e = r[f"e2e_{label}"]
        rows.append((f"end to end at {label} ({e['pages']} pages)", f"{e['pages_per_s']} pages/s", f">= {target}",
                     verdict(e["pages_per_s"] >= target)))
        rows.append(("  worker peak RSS / CPU per page", f"{e['worker_peak_rss_mb']} MB / {e['cpu_ms_per_page']} ms",
                     "<= 150 MB", verdict(e["worker_peak_rss_mb"] <= 150)))
        b = r.get(f"baseline_{label}")
        if b:
            ratio = e["pages_per_s"] / b["pages_per_s"]
            r[f"ratio_{label}"] = round(ratio, 1)
            rows.append((f"  seed-design baseline at {label}", f"{b['pages_per_s']} pages/s  (x{ratio:.1f})", ">= x50",
                         verdict(ratio >= 50)))
    width = max(len(x[0]) for x in rows) + 2
    print(f"\n{'figure':<{width}}{'measured':<32}{'target':<12}")
    for name, value, target, ok in rows:
        print(f"{name:<{width}}{value:<32}{target:<12}{ok}")


if __name__ == "__main__":
    sys.exit(main())
