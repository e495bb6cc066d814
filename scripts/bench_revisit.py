"""A day of a revisited site, simulated at speed: ``python scripts/bench_revisit.py [--pages N]``
(``make bench BENCH_ARGS=--revisit-day`` runs it too).

One "hour" lasts ``--hour`` seconds. The site holds N pages of ~``--size`` bytes: a tenth change
every hour, a fifth once a day (at noon), the rest never; a third of them send an ETag, a third a
Last-Modified, a third no validator. A job revisits them adaptively between one hour and a day
while a real ``downcluster worker`` downloads and a dispatcher runs as cron would (every
``--hour`` / 4 seconds here: every quarter of an hour). Prints visits, 304s, same-body visits,
versions stored, and the bytes the site sent and the store kept against a crawl that fetches every
page whole at each visit, then removes everything it started.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]


def simulate(pages: int, hour: float, size: int) -> dict:
    import sample_site
    from services import MongoServer, RedisServer, env_for

    with RedisServer() as redis_server, MongoServer(":memory:") as mongo:
        env = env_for(redis_server.url, mongo.uri("dc_revisit"), mongo.uri("dc_revisit_log"),
                      HOSTNAME="bench", DISPATCH_LOCK_TTL=30)
        os.environ.update(env)
        server, base = sample_site.start_site()
        try:
            return _day(env, base, pages, hour, size, sample_site)
        finally:
            server.shutdown()


def _day(env: dict, base: str, pages: int, hour: float, size: int, site) -> dict:
    import redis as redis_lib

    from common.config import load
    from common.store.connection import connect_mongo
    from common.store.log_models import CrawlerDownloadLog
    from common.store.models import CrawlerDownloadData, CrawlerTask
    from master.dispatch.dispatcher import dispatch_once
    from master.intake import add_tasks
    from master.registry import register

    load()
    connect_mongo(ensure_indexes=True)
    keys = [f"p{i}" for i in range(pages)]
    for i, key in enumerate(keys):
        site.VERSIONED[key] = [1, ("etag", "date", "none")[i % 3], size]
    with tempfile.TemporaryDirectory() as tmp:
        manifest = Path(tmp) / "day.toml"
        manifest.write_text('name = "day"\npriority = 5\ntype = "none"\n[settings]\nallow_private = true\n'
                            f"dispatch_num = 100000\nrevisit = {hour}\nrevisit_max = {24 * hour}\n")
        register(manifest)
    add_tasks("day", [f"{base}/versioned/{k}" for k in keys])
    redis = redis_lib.Redis.from_url(env["DOWNCLUSTER_REDIS_URL"])
    worker = subprocess.Popen([str(Path(sys.executable).parent / "downcluster"), "worker"],
                              env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()

    def the_world() -> None:  # hourly pages change every hour, daily ones at noon
        for h in range(1, 24):
            if stop.wait(hour):
                return
            for i, key in enumerate(keys):
                if i % 10 == 0 or (h == 12 and i % 10 in (1, 2)):
                    site.VERSIONED[key][0] += 1

    world = threading.Thread(target=the_world, daemon=True)
    start = time.monotonic()
    world.start()
    try:
        while time.monotonic() - start < 24 * hour:
            dispatch_once(redis)
            time.sleep(hour / 4)
    finally:
        stop.set()
        worker.terminate()
        worker.wait(timeout=60)
    logs = list(CrawlerDownloadLog._get_collection().find({}, {"not_modified": 1, "response_size": 1,
                                                              "status": 1}))
    answers = [a for k in keys for a in site.ANSWERS.get(k, [])]
    data = list(CrawlerDownloadData._get_collection().find({}, {"response_body": 1}))
    visits = sum(1 for log in logs if log["status"] == "SUCCESS")
    sent = sum(log.get("response_size", 0) for log in logs)
    tasks = list(CrawlerTask._get_collection().find({}, {"revisit_every": 1, "versions": 1}))
    return {
        "pages": pages, "hour_s": hour, "page_bytes": size, "visits": visits,
        "answered_304": answers.count(304),
        "same_body": sum(1 for log in logs if log.get("not_modified") == "same content"),
        "versions_stored": len(data), "failed": sum(1 for log in logs if log["status"] == "FAIL"),
        "bytes_sent_by_site": sent, "bytes_if_fetched_whole": visits * size,
        "bytes_stored": sum(len(d.get("response_body") or b"") for d in data),
        "bytes_stored_if_every_visit": visits * size,
        "interval_hours_end": {cls: sorted({round(t.get("revisit_every", 0) / hour, 2) for t in tasks[i::10]})
                               for cls, i in (("hourly", 0), ("daily", 1), ("static", 3))},
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=300)
    p.add_argument("--hour", type=float, default=2.0, help="seconds one simulated hour lasts")
    p.add_argument("--size", type=int, default=20_000, help="bytes of a page")
    a = p.parse_args(argv)
    print(json.dumps(simulate(a.pages, a.hour, a.size), indent=2))


if __name__ == "__main__":
    main()
