"""`make demo`: the whole cluster on this machine, on the embedded default services.

Starts its own redis-server, a SecantusDB on disk under ./var/ and a sample site on
loopback; registers four sample jobs (python, shell, built-in engine, browser engine on pages
built by JavaScript) at four priorities,
adds their URLs, dispatches, drains the queues with a `downcluster worker --burst`
process (one per two cores is the recommendation), prints `downcluster stats`, exports each job's data, then stops what it started.
Every step goes through the real `downcluster` command line. Each run starts from an empty
./var/ so it is repeatable.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from sample_site import start_site  # noqa: E402
from services import MongoServer, RedisServer, env_for  # noqa: E402

VAR = ROOT / "var"
JOBS = ROOT / "scripts" / "demo_jobs"
PAGES = 200
DOWNCLUSTER = str(Path(sys.executable).parent / "downcluster")


def run(args: list[str], env: dict, stdin: str | None = None, check: bool = True, quiet: bool = False) -> str:
    if not quiet:
        print("$ downcluster " + " ".join(args), flush=True)
    proc = subprocess.run([DOWNCLUSTER, *args], env=env, input=stdin, text=True, capture_output=True)
    out = (proc.stdout + proc.stderr).rstrip()
    if out and not quiet:
        print("  " + out.replace("\n", "\n  "), flush=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo: `downcluster {' '.join(args)}` exited {proc.returncode}")
    return proc.stdout


def main() -> int:
    started = time.monotonic()
    shutil.rmtree(VAR, ignore_errors=True)
    (VAR / "export").mkdir(parents=True)
    site, base = start_site()
    with RedisServer() as redis, MongoServer(storage=str(VAR / "mongo")) as mongo:
        env = {**os.environ, **env_for(redis.url, mongo.uri("downcluster"), mongo.uri("downcluster_log"),
                                       HOSTNAME="demo-host", RETRY_BACKOFF_BASE="0.2", DOWNLOAD_TIMEOUT="30")}
        print(f"services: redis {redis.url}, mongodb {mongo.uri('downcluster')}, sample site {base}\n")
        for manifest in ("python_job.toml", "shell_job.toml", "builtin_job.toml", "browser_job.toml"):
            run(["job", "register", str(JOBS / manifest)], env)
        run(["job", "list"], env)
        for offset, name in enumerate(("demo-python", "demo-shell", "demo-builtin")):
            urls = [f"{base}/page/{offset * PAGES + i}" for i in range(PAGES)]
            urls += [f"{base}/status/404", f"{base}/flaky/{name}/1", "ftp://not-http.example/x"]
            run(["task", "add", name, "-"], env, stdin="\n".join(urls) + "\n")
        run(["task", "add", "demo-browser", "-"], env, stdin="".join(f"{base}/js/render/{i}\n" for i in range(20)))
        for round_ in range(1, 8):
            run(["dispatch"], env)
            print("$ downcluster worker --burst", flush=True)
            workers = [subprocess.Popen([DOWNCLUSTER, "worker", "--burst", "--logging-level", "WARNING"], env=env)]
            for w in workers:
                w.wait(timeout=600)
            counts = json.loads(run(["stats", "--json"], env, quiet=True) or "{}")
            pending = sum(r["LIVE"] + r["DISPATCH"] for r in counts.get("jobs", []))
            retrying = sum(r["FAIL"] for r in counts.get("jobs", []))
            if pending == 0 and round_ > 1:
                break
            time.sleep(1.0 if retrying else 0.0)
        print()
        run(["stats"], env)
        for name in ("demo-python", "demo-shell", "demo-builtin", "demo-browser"):
            out = VAR / "export" / f"{name}.jsonl"
            run(["data", "export", name, "--format", "jsonl", "-o", str(out)], env)
        run(["data", "export", "demo-builtin", "--format", "csv", "-o", str(VAR / "export" / "demo-builtin.csv")], env)
        first = json.loads((VAR / "export" / "demo-browser.jsonl").read_text().splitlines()[0])
        print(f"\na page rendered by the browser engine, as stored: {first.get('body_text', '')[:120]}")
    site.shutdown()
    print(f"\nexports in {VAR / 'export'}; demo took {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
