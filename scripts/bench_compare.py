"""``make bench``'s comparison with the peer (scrapy-redis + Scrapy's MongoDB pipeline), measured
the same way for both sides (issue 40):

* nothing reads the store while a run goes: progress comes from a count each side keeps in Redis
  anyway (our writer's page counters, ``common.metrics``; the peer's ``item_scraped_count``,
  written once a second by scripts/bench_peer.py's ``Progress``), read every 0.5 s;
* each run starts on a fresh store with its work in place (our LIVE tasks; the peer's URLs in its
  Redis list) and its processes started cold at t0 (our worker and dispatcher loop; the peer's
  two spiders);
* the rates are read afterwards from the stored pages' own stamps (our data's ``add_datetime``,
  the peer's ``stored_at``, both taken just before the write): the steady rate between the
  5th and the 95th percentile page, and the time from t0 to the last page;
* the store's cost per page stored, for each side: SecantusDB's CPU (/proc), its write commands
  (serverStatus opcounters insert + update + delete: commands, whatever their documents), the
  bytes it received (the kernel's tcp_info of its connections: what the clients sent, mostly the
  documents) and the bytes it holds afterwards (dbStats ``dataSize`` + ``indexSize``);
* runs alternate ours, peer, peer, ours, ours, peer …, so both sides share a shared machine's
  drift; the median of each side is reported with the spread, and the ratio of each pair of runs.

The sites favour neither side: 0 ms pages (scripts/sample_site.py's ~2 KB ``page_body``) are
static files served by nginx as ``text/html``; 100 ms pages come from scripts/bench_site.py (an
event loop, bodies built once); real pages are a documentation tree from nginx with gzip.
Our per-host concurrency is the peer's total in flight (processes x CONCURRENT_REQUESTS).
"""
from __future__ import annotations

import json
import math
import re
import socket
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone

from bench_common import BIN, PEER_BIN, ROOT, SITE_HOSTS, cpu_tree, nginx_binary, spread

PROGRESS_POLL = 0.5      # seconds between reads of the Redis counters (never the store)
SETTLE = 1.0             # after the last page is counted: the last settles land, both sides
STALL = 20.0             # seconds without progress: the run is over, short


def order(runs: int) -> list[str]:
    """ours, peer, peer, ours, ours, peer, …: ``runs`` of each, alternated A B B A."""
    out: list[str] = []
    for i in range(runs):
        out += ["ours", "peer"] if i % 2 == 0 else ["peer", "ours"]
    return out


def steady(stamps: list[float], t0: float) -> dict:
    """The pages' store stamps (epoch seconds): the rate between the 5th and 95th percentile page,
    the time from ``t0`` to the first and to the last page."""
    if len(stamps) < 2:
        return {"steady_pages_per_s": 0.0, "to_last_s": None, "to_first_s": None}
    t = sorted(stamps)
    lo, hi = int(0.05 * (len(t) - 1)), int(math.ceil(0.95 * (len(t) - 1)))
    span = t[hi] - t[lo]
    return {"steady_pages_per_s": round((hi - lo) / span, 1) if span > 0 else 0.0,
            "to_first_s": round(t[0] - t0, 2), "to_last_s": round(t[-1] - t0, 2),
            "overall_pages_per_s": round(len(t) / (t[-1] - t0), 1) if t[-1] > t0 else 0.0}


def epoch(dt: datetime) -> float:
    return dt.replace(tzinfo=timezone.utc).timestamp() if dt.tzinfo is None else dt.timestamp()


def bytes_received(port: int) -> int:
    """Bytes the store's open TCP connections have received (the kernel's tcp_info, by ``ss``): what
    the clients sent it, mostly the documents written. /proc/<pid>/io does not count socket reads."""
    try:
        out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(int(x) for x in re.findall(r"bytes_received:(\d+)", out))


def wait_port(host: str, port: int, what: str, procs, name: str) -> None:
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            socket.create_connection((host, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within 30 s: {procs.tail(name)}")


def start_page_nginx(procs, env: dict, pages: int, hosts: int = SITE_HOSTS, tree: bool = False) -> str:
    """nginx serving ``/page/<n>`` (n < ``pages``) as static ``text/html; charset=utf-8`` files on
    127.0.0.1 .. 127.0.0.<hosts>, gzip off (as the sample site): the 0 ms site of the comparison.
    ``tree``: ``/tree/<n>`` instead, bench_site.py's linked pages (the crawl comparison's 0 ms site)."""
    from bench_site import tree_page
    from sample_site import page_body
    from services import free_port

    if nginx_binary() is None:
        raise RuntimeError("no nginx: `make bench` installs nginx-light")
    kind = "tree" if tree else "page"
    root = procs.logdir / f"{kind}s"
    (root / kind).mkdir(parents=True, exist_ok=True)
    for d in (procs.logdir, root, root / kind):  # nginx's workers run as another user
        d.chmod(0o755)
    for n in range(pages):
        f = root / kind / str(n)
        if not f.exists():
            f.write_bytes(tree_page(n, pages) if tree else page_body(n))
    port, conf = free_port(), procs.logdir / f"nginx-{kind}s"
    conf.mkdir(exist_ok=True)
    temp = " ".join(f"{k}_temp_path {conf}/{k};"
                    for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    listen = " ".join(f"listen 127.0.0.{i}:{port};" for i in range(1, hosts + 1))
    (conf / "nginx.conf").write_text(f"""
worker_processes 1;
daemon off;
pid {conf}/nginx.pid;
error_log {conf}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    default_type text/html;
    charset utf-8;
    access_log off;
    sendfile on;
    keepalive_requests 100000;
    {temp}
    server {{ {listen} root {root}; }}
}}
""")
    procs.spawn([nginx_binary(), "-c", str(conf / "nginx.conf"), "-e", str(conf / "error.log")], env,
                f"site-{kind}s-0ms")
    wait_port("127.0.0.1", port, f"nginx ({kind}s)", procs, f"site-{kind}s-0ms")
    return f"http://127.0.0.1:{port}"


def start_delay_site(procs, env: dict, delay_ms: int, hosts: int = SITE_HOSTS, tree: int = 0) -> str:
    """scripts/bench_site.py: ``/page/<n>`` after ``delay_ms``, on an event loop (``tree``: also
    ``/tree/<n>`` for n below it, linked pages, after ``delay_ms`` as well)."""
    from services import free_port

    port = free_port()
    name = f"site-{'tree' if tree else 'page'}s-{delay_ms}ms"
    procs.spawn([sys.executable, str(ROOT / "scripts" / "bench_site.py"), "--port", str(port),
                 "--delay-ms", str(delay_ms), "--hosts", str(hosts), "--tree", str(tree)], env, name)
    wait_port("127.0.0.1", port, f"bench_site ({delay_ms} ms)", procs, name)
    return f"http://127.0.0.1:{port}"


def page_urls(base: str, pages: int, hosts: int) -> list[str]:
    return [f"{spread(base, n, hosts)}/page/{n}" for n in range(pages)]


TOP_OPS = ("total", "queries", "getmore", "insert", "update", "remove", "commands")  # top's kinds


class Compare:
    """Symmetric runs of ours and the peer on one Bench's services (scripts/bench.py's ``Bench``)."""

    def __init__(self, bench, peer_procs: int = 2, peer_concurrency: int = 64, peer_batch: int = 0,
                 scheduler: str = "local", workers: int = 1, peer_broad: bool = False) -> None:
        self.bench = bench
        self.peer_procs, self.peer_concurrency = peer_procs, peer_concurrency
        self.peer_batch = peer_batch or peer_concurrency
        self.scheduler, self.workers, self.peer_broad = scheduler, workers, peer_broad
        self.host_limit = peer_procs * peer_concurrency  # ours per host = the peer's total in flight

    # the store's counters
    def store(self) -> dict:
        from common.store.connection import mongo_client

        mongo = self.bench.mongo
        admin = mongo_client().admin
        ops = admin.command("serverStatus").get("opcounters", {})
        try:  # the store's own time per collection (mongod's ``top``)
            top = {f"top_{ns}{'' if op == 'total' else ':' + op}": t["time"]
                   for ns, v in admin.command("top")["totals"].items()
                   if isinstance(v, dict) and not ns.startswith(("admin.", "config.", "local."))
                   for op, t in v.items() if op in TOP_OPS and isinstance(t, dict)}
        except Exception:  # a store without ``top``: the figure is left out
            top = {}
        return {"cpu": cpu_tree(mongo.proc.pid), "bytes_in": bytes_received(mongo.port),
                **{f"op_{k}": int(v) for k, v in ops.items()}, **top}

    def data_size(self, dbs: list[str]) -> int:
        from common.store.connection import mongo_client

        total = 0
        for db in dbs:
            try:
                st = mongo_client()[db].command("dbStats")
                total += int(st.get("dataSize", 0)) + int(st.get("indexSize", 0))
            except Exception:  # a store without dbStats: the figure is left out
                return 0
        return total

    def costs(self, s0: dict, s1: dict, pages: int, held: int) -> dict:
        d = {k: s1.get(k, 0) - s0.get(k, 0) for k in s1}
        writes = d.get("op_insert", 0) + d.get("op_update", 0) + d.get("op_delete", 0)
        n = max(1, pages)
        return {"store_cpu_ms_per_page": round(1000 * d["cpu"] / n, 3),
                "store_write_ops_per_page": round(writes / n, 3),
                "store_commands_per_page": round(sum(v for k, v in d.items() if k.startswith("op_")) / n, 3),
                "store_bytes_in_per_page": round(d["bytes_in"] / n),
                "store_bytes_held_per_page": round(held / n) if held else None,
                "store_ops": {k[3:]: v for k, v in d.items() if k.startswith("op_")},
                # the store's time in each collection's commands, ms per page (``top``), and in
                # each kind of command of it ("crawler_task:update")
                "store_ms_per_page_by_collection": {k[4:]: round(v / 1000 / n, 3) for k, v in d.items()
                                                    if k.startswith("top_") and ":" not in k and v},
                "store_ms_per_page_by_command": {k[4:]: round(v / 1000 / n, 3) for k, v in d.items()
                                                 if k.startswith("top_") and ":" in k and v}}

    def wait(self, progress, pages: int, timeout: float, procs: list, first=None) -> tuple[int, bool]:
        """Poll ``progress()`` (a Redis read) until it reaches ``pages``, stalls or times out;
        ``first(done)`` is called at the first poll that counts a page."""
        done, last, last_t = 0, -1, time.monotonic()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.bench_name} exited {p.returncode}: "
                                       f"{self.bench.procs.tail(p.bench_name)}")
            done = progress()
            if done and first is not None:
                first, _ = None, first(done)
            if done >= pages:
                return done, True
            if done != last:
                last, last_t = done, time.monotonic()
            elif done and time.monotonic() - last_t > STALL:
                break
            time.sleep(PROGRESS_POLL)
        return done, False

    # one run of each side
    def ours(self, label: str, urls: list[str], timeout: float) -> dict:
        from common.metrics import PAGES
        from common.store.log_models import CrawlerDownloadLog
        from common.store.models import SUCCESS, CrawlerDownloadData, CrawlerTask

        bench = self.bench
        bench.fresh_store()
        redis = bench.redis()
        pages = len(urls)
        name = f"cmp-{label}"
        job = bench.new_job(name, pages)
        bench.add_tasks_raw(job.id, "", pages, "", urls=urls)
        env = {**bench.env, "DOWNCLUSTER_HOST_CONCURRENCY": str(self.host_limit),
               "DOWNCLUSTER_MAX_TOTAL_DISPATCH_COUNT_ONCE": str(pages)}

        def progress() -> int:
            return sum(int(v) for k, v in redis.hgetall(PAGES).items()
                       if k.decode().startswith(f"{name}|") and "|not_modified|" not in k.decode())

        s0 = self.store()
        t0 = time.time()
        procs = [bench.procs.spawn([str(BIN / "downcluster"), "worker", "--logging-level", "WARNING"], env,
                                   f"cmp-worker-{label}-{i}") for i in range(self.workers)]
        procs.append(bench.procs.spawn([str(BIN / "downcluster"), "dispatch", "--loop", "--interval", "1"],
                                       env, f"cmp-dispatch-{label}"))
        # each process's CPU seconds when the first pages are counted, then how many were
        start_cpus: list[float] = []
        try:
            counted, complete = self.wait(progress, pages, timeout, procs, lambda done: start_cpus.extend(
                [*(cpu_tree(p.pid) for p in procs), done]))
            time.sleep(SETTLE)
            s1 = self.store()
            cpus = [cpu_tree(p.pid) for p in procs]  # the workers', then the dispatcher's
            client_cpu = sum(cpus)
        finally:
            bench.procs.stop(procs)
        stamps = [epoch(d["add_datetime"]) for d in
                  CrawlerDownloadData._get_collection().find({"job": job.id}, {"add_datetime": 1})]
        done = CrawlerTask._get_collection().count_documents({"job": job.id, "status": SUCCESS})
        logs = CrawlerDownloadLog._get_collection().count_documents({"job": job.id})
        held = self.data_size(["bench", "bench_log"])
        return {"side": "ours", "pages": pages, "done": done, "data_docs": len(stamps), "log_docs": logs,
                "complete": complete and done >= pages, "host_limit": self.host_limit,
                **steady(stamps, t0), **self.costs(s0, s1, len(stamps), held),
                "client_cpu_ms_per_page": round(1000 * client_cpu / max(1, len(stamps)), 3),
                "worker_cpu_ms_per_page": round(1000 * sum(cpus[:-1]) / max(1, len(stamps)), 3),
                "dispatch_cpu_ms_per_page": round(1000 * cpus[-1] / max(1, len(stamps)), 3),
                **marginal(cpus, start_cpus, len(stamps)), **client_after(cpus, start_cpus, len(stamps))}

    def peer(self, label: str, urls: list[str], timeout: float) -> dict:
        import pymongo

        bench = self.bench
        bench.fresh_store()
        redis = bench.redis()
        pages, key, prog = len(urls), f"peer:{label}:start_urls", f"peer:{label}:progress"
        for i in range(0, pages, 1000):  # in place before the spiders start
            redis.rpush(key, *[json.dumps({"url": u}) for u in urls[i:i + 1000]])
        uri = bench.mongo.uri("peer")
        env = {**bench.env, "PEER_REDIS_URL": bench.redis_srv.url, "PEER_MONGO_URI": uri, "PEER_KEY": key,
               "PEER_SCHEDULER": self.scheduler, "PEER_CONCURRENCY": str(self.peer_concurrency),
               "PEER_BATCH": str(self.peer_batch), "PEER_PROGRESS": prog,
               "PEER_BROAD": "1" if self.peer_broad else "0"}

        def progress() -> int:
            return sum(int(v) for v in redis.hgetall(prog).values())

        spider = [str(PEER_BIN / "scrapy"), "runspider", str(ROOT / "scripts" / "bench_peer.py")]
        s0 = self.store()
        t0 = time.time()
        procs = [bench.procs.spawn(spider, env, f"cmp-peer-{label}-{i}") for i in range(self.peer_procs)]
        start_cpus: list[float] = []  # as ours: the spiders' CPU when the first pages are counted
        try:
            counted, complete = self.wait(progress, pages, timeout, procs, lambda done: start_cpus.extend(
                [*(cpu_tree(p.pid) for p in procs), done]))
            time.sleep(SETTLE)
            s1 = self.store()
            cpus = [cpu_tree(p.pid) for p in procs]
            client_cpu = sum(cpus)
        finally:
            bench.procs.stop(procs)
        client = pymongo.MongoClient(uri)
        try:
            stamps = [epoch(d["stored_at"]) for d in
                      client.get_default_database()["peer_pages"].find({}, {"stored_at": 1})]
        finally:
            client.close()
        held = self.data_size(["peer"])
        return {"side": "peer", "pages": pages, "done": len(stamps), "complete": len(stamps) >= pages,
                "scheduler": self.scheduler, "processes": self.peer_procs,
                "concurrent_requests": self.peer_concurrency, "batch": self.peer_batch,
                "broad": self.peer_broad,
                **steady(stamps, t0), **self.costs(s0, s1, len(stamps), held),
                "client_cpu_ms_per_page": round(1000 * client_cpu / max(1, len(stamps)), 3),
                **client_after(cpus, start_cpus, len(stamps))}

    def pair(self, label: str, urls: list[str], runs: int, timeout, page_bytes: int = 0) -> dict:
        """``runs`` of each side, alternated; ``timeout()``: seconds one run may take, asked each time."""
        out: dict = {"ours": [], "peer": [], "pages": len(urls),
                     "order": [s for s in order(runs) if self.peer_procs or s == "ours"]}
        origin = urls[0].split("/page/")[0]
        for side in out["order"]:
            site_inflight(origin)  # starts the site's gauge afresh
            r = (self.ours if side == "ours" else self.peer)(label, urls, timeout())
            seen = site_inflight(origin)
            if seen is not None:
                r["site_inflight"] = seen
            if page_bytes:
                r["mb_per_s"] = round(r["steady_pages_per_s"] * page_bytes / len(urls) / 1e6, 1)
            out[side].append(r)
            held = (f"; at the site {seen['peak']} at most, {seen['mean_while_busy']} on average"
                    if seen is not None else "")
            print(f"    {side}: {r['steady_pages_per_s']} pages/s steady, last page at {r['to_last_s']} s, "
                  f"{r['done']}/{r['pages']}; store {r['store_cpu_ms_per_page']} ms CPU, "
                  f"{r['store_write_ops_per_page']} writes, {r['store_bytes_in_per_page']} B in per page"
                  f"{held}",
                  flush=True)
        out.update(summarize(out["ours"], out["peer"]))
        return out


def site_inflight(origin: str) -> dict | None:
    """What scripts/bench_site.py saw since it was last asked: the most requests it held at once
    and their mean while any was held (None from a site without the gauge: nginx)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"{origin}/_inflight", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def marginal(cpus: list[float], start: list[float], pages: int) -> dict:
    """The workers' and the dispatcher's CPU seconds at the first counted pages, and their CPU a
    page after them (ms): what a page costs once the processes are up."""
    if not start or pages <= start[-1]:
        return {}
    n = pages - start[-1]
    return {"worker_cpu_s_at_first_pages": round(sum(start[:-2]), 3),
            "dispatch_cpu_s_at_first_pages": round(start[-2], 3), "pages_at_first": start[-1],
            "worker_cpu_ms_per_page_after": round(1000 * (sum(cpus[:-1]) - sum(start[:-2])) / n, 3),
            "dispatch_cpu_ms_per_page_after": round(1000 * (cpus[-1] - start[-2]) / n, 3)}


def client_after(cpus: list[float], start: list[float], pages: int) -> dict:
    """The client's CPU a page once its processes are up, measured alike for both sides: every
    client process's CPU from the first poll that counts a page to the end, over the pages
    counted after that poll (``start``: each process's CPU then, and the pages counted)."""
    if not start or pages <= start[-1]:
        return {}
    after = sum(cpus) - sum(start[:-1])
    return {"client_cpu_ms_per_page_after": round(1000 * after / (pages - start[-1]), 3)}


def _med(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(vals), 3) if vals else None


def summarize(ours: list[dict], peer: list[dict]) -> dict:
    """Each side's median and range; the ratio of the medians and of each pair of runs."""
    s: dict = {}
    for side, runs in (("ours", ours), ("peer", peer)):
        rates = [r["steady_pages_per_s"] for r in runs]
        s[side + "_summary"] = {
            "steady_median": _med(runs, "steady_pages_per_s"), "steady_runs": rates,
            "to_last_median": _med(runs, "to_last_s"), "to_last_runs": [r["to_last_s"] for r in runs],
            **{k: _med(runs, k) for k in ("store_cpu_ms_per_page", "store_write_ops_per_page",
                                          "store_commands_per_page", "store_bytes_in_per_page",
                                          "store_bytes_held_per_page", "client_cpu_ms_per_page",
                                          "client_cpu_ms_per_page_after")},
            "complete": all(r["complete"] for r in runs)}
    pairs = [round(a["steady_pages_per_s"] / b["steady_pages_per_s"], 2)
             for a, b in zip(ours, peer) if b["steady_pages_per_s"]]
    mo, mp = s["ours_summary"]["steady_median"], s["peer_summary"]["steady_median"]
    s["ratio"] = round(mo / mp, 2) if mo and mp else None
    s["ratio_pairs"] = pairs
    lo, lp = s["ours_summary"]["to_last_median"], s["peer_summary"]["to_last_median"]
    s["to_last_ratio"] = round(lp / lo, 2) if lo and lp else None  # > 1: our last page came sooner
    return s
