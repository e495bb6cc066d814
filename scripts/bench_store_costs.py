"""What one document costs the embedded store (SecantusDB), measured alone: the figures behind
"what binds our crawl" in docs/benchmarks.md (issue 54). A SecantusDB of its own (in memory);
``--tasks`` documents shaped as ``crawler_task``'s, then, for each index set, the store process's
CPU (utime + stime of ``/proc/<pid>/stat``) per document:

* ``insert``: the tasks inserted, 100 a command;
* ``settle``: each task settled as the worker's writer settles it (an UpdateMany of 16 ids with the
  fresh guard, 8 a bulk write: ``common.store.leases.settle_success``);
* ``find by _id``: the tasks read by ``_id`` with the guard, 40 a query (``leases.held_of``).

Index sets: ``ours`` (crawler_task's three secondary indexes), ``two``, ``one``, ``none``.

    .venv/bin/python scripts/bench_store_costs.py [--tasks 8000]
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

from bson import ObjectId
from pymongo import MongoClient, UpdateMany

INDEXES = {
    "ours": [[("job", 1), ("status", 1), ("retry_at", 1), ("seq", 1)],
             [("job", 1), ("status", 1), ("_id", 1)], [("job", 1), ("_id", 1)]],
    "two": [[("job", 1), ("status", 1), ("_id", 1)], [("job", 1), ("_id", 1)]],
    "one": [[("job", 1), ("_id", 1)]],
    "none": [],
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(client: MongoClient, pid: int, name: str, indexes: list, n: int) -> dict[str, float]:
    coll = client.costs[name]
    for keys in indexes:
        coll.create_index(keys)
    job, now = ObjectId(), datetime.now(timezone.utc)
    docs = [{"_id": ObjectId(), "job": job, "uri": f"http://127.0.0.1:1/tree/{i}", "seq": i, "status": "LIVE",
             "retry_at": None, "download_times": 0, "recoveries": 0, "host_name": "127.0.0.1",
             "add_datetime": now, "last_update_datetime": now, "depth": 3, "parent": ObjectId()}
            for i in range(n)]
    ids = [d["_id"] for d in docs]
    out: dict[str, float] = {}
    c0 = _cpu(pid)
    for i in range(0, n, 100):
        coll.insert_many(docs[i:i + 100], ordered=False)
    out["insert"] = _cpu(pid) - c0
    c0 = _cpu(pid)
    for i in range(0, n, 40):
        list(coll.find({"_id": {"$in": ids[i:i + 40]}, "status": "LIVE", "retry_at": None}, {"_id": 1}))
    out["find by _id"] = _cpu(pid) - c0
    change = {"$set": {"status": "SUCCESS", "data_lease": "L" * 30, "failed_reason": None, "retry_at": None,
                       "last_update_datetime": now}, "$inc": {"download_times": 1}, "$unset": {"lease": ""}}
    ops = [UpdateMany({"_id": {"$in": ids[i:i + 16]}, "status": "LIVE", "retry_at": None}, change)
           for i in range(0, n, 16)]
    c0 = _cpu(pid)
    for i in range(0, len(ops), 8):
        coll.bulk_write(ops[i:i + 8], ordered=False)
    out["settle"] = _cpu(pid) - c0
    if coll.count_documents({"job": job, "status": "SUCCESS"}) != n:
        raise RuntimeError(f"{name}: not every task was settled")
    return {k: round(1000 * v / n, 3) for k, v in out.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=8000, help="documents per index set (default 8,000)")
    a = p.parse_args()
    port = _port()
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen([sys.executable, "-m", "secantus", "--port", str(port), "--storage-path",
                                   ":memory:", "--standalone"], stdout=log, stderr=log)
        try:
            client = MongoClient(port=port, serverSelectionTimeoutMS=30000)
            client.admin.command("ping")
            print(f"store CPU a document, ms ({a.tasks:,} tasks shaped as crawler_task's, "
                  "SecantusDB in memory)")
            for name, indexes in INDEXES.items():
                started = time.monotonic()
                got = measure(client, server.pid, name, indexes, a.tasks)
                costs = ", ".join(f"{k} {v}" for k, v in got.items())
                print(f"  {name:5} ({len(indexes)} secondary): {costs}  [{time.monotonic() - started:.0f} s]",
                      flush=True)
        finally:
            server.terminate()
            server.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
