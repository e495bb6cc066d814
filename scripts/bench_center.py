"""The general download center's pull, measured: ``python scripts/bench_center.py [--rows N]``
(part of ``make bench``; ``CENTER_BENCH_ARGS`` passes options).

A paging source (the center's source_url, ``step`` rows a page, keep-alive) serves N rows of five
columns from a thread of this process; a download task of ``source_url`` (step 5000) is delivered
as CSV and again as an xlsx with a two-level header template, and a real ``downcluster worker
--burst`` runs each one. Printed per format: rows/s over the attempt's own run (the export's
``started_at`` to ``finished_at``, as the worker stamped them), the whole worker process's wall
time, the file's size, and the worker's peak RSS (``ru_maxrss`` of the worker process, from
``wait4``). Targets (issue 39): CSV >= 10,000 rows/s, xlsx >= 3,000 rows/s, RSS <= 200 MB.
Everything it starts is stopped at the end; the store measured is its own, in memory.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
BIN = Path(sys.executable).parent

TEMPLATE = {"col": [
    {"title": "Order", "children": [{"title": "Id", "name": "id"}, {"title": "Customer", "name": "name"}]},
    {"title": "Detail", "children": [{"title": "Amount", "name": "amount", "format": "#,##0.00"},
                                     {"title": "City", "name": "city"}, {"title": "Date", "name": "date"}]}]}
TARGETS = {"csv": 10_000, "xlsx": 3_000}
RSS_TARGET_MB = 200


def _source(rows: int):
    """A seed-000 source of ``rows`` rows, served from a thread; (server, base URL)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the puller keeps one connection

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            q = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
            page, size = int(q["page"]), int(q["page_size"])
            start, end = page * size, min(rows, (page + 1) * size)
            data = [{"id": i, "name": f"customer {i % 9973}", "amount": (i % 100_000) / 100,
                     "city": f"city {i % 337}", "date": f"2026-11-{1 + i % 28:02d}"}
                    for i in range(start, end)]
            body = json.dumps({"status": 200, "msg": "", "data": {"data": data, "total": rows}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/orders"


def _run_worker(env: dict) -> tuple[float, int]:
    """One ``downcluster worker --burst`` to its end: (wall seconds, peak RSS in bytes)."""
    began = time.monotonic()
    proc = subprocess.Popen([str(BIN / "downcluster"), "worker", "--burst"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err_lines: list[bytes] = []
    reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    reader.join(5)
    if proc.returncode != 0:
        tail = b"".join(err_lines)[-1500:].decode(errors="replace")
        raise RuntimeError(f"worker exited {proc.returncode}: {tail}")
    return time.monotonic() - began, usage.ru_maxrss * 1024


def measure(rows: int, step: int, formats: list[str]) -> list[dict]:
    from services import MongoServer, RedisServer, env_for

    results = []
    with RedisServer() as redis_server, MongoServer(":memory:") as mongo:
        env = env_for(redis_server.url, mongo.uri("dc_center_bench"), mongo.uri("dc_center_bench_log"),
                      HOSTNAME="bench", SOURCE_ALLOW_PRIVATE="1")
        os.environ.update(env)
        from common.config import load

        load()
        from common.store.connection import connect_mongo, redis_conn
        from common.store.models import Export
        from master.center.service import deliver

        connect_mongo(ensure_indexes=True)
        from common.store import projects

        project = projects.default_id()  # a project of this fresh store for the bench's tasks
        server, url = _source(rows)
        try:
            for fmt in formats:
                params = {"project_id": project, "name": f"bench {fmt}", "source_url": url, "step": step,
                          "type": "excel" if fmt == "xlsx" else "csv", "max_exec_time": 24 * 3600}
                if fmt == "xlsx":
                    params |= {"template": json.dumps(TEMPLATE), "title": "Orders",
                               "header": {"Bench": "center"}}
                export = deliver(redis_conn(), params)
                wall, rss = _run_worker({**os.environ, **env})
                done = Export.objects.get(id=export.id)
                if done.state != "SUCCESS":
                    raise RuntimeError(f"{fmt} task ended {done.state}: {done.error}")
                spent = (done.finished_at - done.started_at).total_seconds()
                results.append({"format": fmt, "rows": done.rows_done, "seconds": round(spent, 2),
                                "rows_per_s": round(done.rows_done / spent), "worker_wall_s": round(wall, 2),
                                "bytes": done.bytes, "peak_rss_mb": round(rss / 2**20, 1),
                                "target_rows_per_s": TARGETS[fmt], "target_rss_mb": RSS_TARGET_MB})
        finally:
            server.shutdown()
            server.server_close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--step", type=int, default=5000)
    parser.add_argument("--formats", default="csv,xlsx")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    results = measure(args.rows, args.step, [f for f in args.formats.split(",") if f])
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"download center, source_url of {args.rows:,} rows, step {args.step} (one worker):")
    for r in results:
        ok = r["rows_per_s"] >= r["target_rows_per_s"] and r["peak_rss_mb"] <= r["target_rss_mb"]
        print(f"  {r['format']:<5} {r['rows']:>10,} rows in {r['seconds']:>7.2f} s = "
              f"{r['rows_per_s']:>8,} rows/s "
              f"(target {r['target_rows_per_s']:,}); worker peak RSS {r['peak_rss_mb']} MB "
              f"(target <= {r['target_rss_mb']}); file {r['bytes']:,} bytes; "
              f"worker wall {r['worker_wall_s']} s  {'ok' if ok else 'BELOW TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
