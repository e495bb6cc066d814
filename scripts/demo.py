"""`make demo`: the whole cluster on this machine, on the embedded default services.

Starts its own redis-server, a SecantusDB on disk under ./var/ and a sample site on
loopback; registers four sample jobs (python, shell, built-in engine, browser engine on pages
built by JavaScript) at four priorities, adds their URLs, dispatches, drains the queues with a
`downcluster worker --burst` process (one per two cores is the recommendation), prints
`downcluster stats`, exports each job's data, then stops what it started.
Every step goes through the real `downcluster` command line. Each run starts from an empty
./var/ so it is repeatable.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from sample_site import start_site  # noqa: E402
from services import MongoServer, RedisServer, env_for, free_port  # noqa: E402

VAR = ROOT / "var"
JOBS = ROOT / "scripts" / "demo_jobs"
PAGES = 200
DOWNCLUSTER = str(Path(sys.executable).parent / "downcluster")
BURST_WORKER = [DOWNCLUSTER, "worker", "--burst", "--logging-level", "WARNING"]


class StepFailed(Exception):
    """A demo step failed: its one line says which and where to look."""


@contextmanager
def step(name: str, look: str):
    """Run one step of the demo; any failure in it becomes StepFailed, one line naming the step,
    what went wrong and where to look (``main`` prints it instead of a traceback)."""
    try:
        yield
    except StepFailed:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - every failure of a step is reported the same way
        what = " ".join(str(exc).split()) or type(exc).__name__
        raise StepFailed(f"demo failed at step '{name}': {what}; look at {look}") from None


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


def serve_console(env: dict, started: float, port: int, export_id: str) -> None:
    """Start `downcluster web`, fetch the export through its signed link, print the console's URL
    and an admin token; on a terminal keep it up until Ctrl-C, otherwise stop it (so `make demo`
    in CI exits 0)."""
    import urllib.request

    created = run(["token", "create", "demo-admin", "--role", "admin"], env, quiet=True)
    token = created.strip().splitlines()[-1]
    bind = f"127.0.0.1:{port}"
    print(f"$ downcluster web --bind {bind}", flush=True)
    web = subprocess.Popen([DOWNCLUSTER, "web", "--bind", bind], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not port_answers(port) and time.monotonic() < deadline and web.poll() is None:
            time.sleep(0.1)
        if web.poll() is not None or not port_answers(port):
            raise SystemExit("demo: downcluster web did not start")
        url = run(["export", "url", export_id], env, quiet=True).strip().splitlines()[-1]
        with urllib.request.urlopen(url, timeout=30) as resp:
            got = resp.read()
        (VAR / "export" / f"demo-builtin-{export_id}.xlsx").write_bytes(got)
        print(f"\nthe xlsx export, signed link: {url}\n"
              f"  fetched {len(got)} bytes -> var/export/demo-builtin-{export_id}.xlsx")
        sync = urllib.request.Request(f"http://{bind}/api/v1/jobs/demo-builtin/export?format=csv&status=200",
                                      headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(sync, timeout=60) as resp:
            (VAR / "export" / "demo-builtin-sync.csv").write_bytes(resp.read())
            print("a synchronous download (GET /api/v1/jobs/demo-builtin/export?format=csv&status=200): "
                  f"{resp.status}, {resp.headers['X-Export-Rows']} rows -> var/export/demo-builtin-sync.csv")
        print(f"\nconsole: http://{bind}/   (API under http://{bind}/api/v1)\nadmin token: {token}")
        print(f"demo took {time.monotonic() - started:.1f}s")
        if sys.stdin.isatty() and sys.stdout.isatty():
            print("the console stays up until Ctrl-C", flush=True)
            try:
                web.wait()
            except KeyboardInterrupt:
                print()
        else:
            print("(no terminal: the console is stopped now)")
    finally:
        web.terminate()
        web.wait(timeout=10)


def retries_left(uri: str) -> int:
    """Failed tasks that will be tried again (a final FAIL, like a 404, has no retry_at)."""
    import pymongo

    client = pymongo.MongoClient(uri)
    try:
        return client.get_default_database()["crawler_task"].count_documents(
            {"status": "FAIL", "retry_at": {"$ne": None}})
    finally:
        client.close()


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def port_answers(port: int) -> bool:
    return not port_free(port)


WORKER_LOG = "the worker's log above"


def crawl(env: dict, base: str, mongo_uri: str) -> None:
    """Register the four jobs, add their URLs, and dispatch and drain until nothing is due."""
    with step("register the jobs", f"the manifests in {JOBS}"):
        for manifest in ("python_job.toml", "shell_job.toml", "builtin_job.toml", "browser_job.toml"):
            run(["job", "register", str(JOBS / manifest)], env)
        run(["job", "list"], env)
    with step("add the URLs", "the lines `task add` rejected above"):
        for offset, name in enumerate(("demo-python", "demo-shell", "demo-builtin")):
            urls = [f"{base}/page/{offset * PAGES + i}" for i in range(PAGES)]
            urls += [f"{base}/status/404", f"{base}/flaky/{name}/1", "ftp://not-http.example/x"]
            run(["task", "add", name, "-"], env, stdin="\n".join(urls) + "\n")
        rendered = "".join(f"{base}/js/render/{i}\n" for i in range(20))
        run(["task", "add", "demo-browser", "-"], env, stdin=rendered)
    with step("dispatch and download", WORKER_LOG):
        for round_ in range(1, 40):  # pages handed back by a busy host or failed once are due again soon
            run(["dispatch"], env)
            print("$ downcluster worker --burst", flush=True)
            subprocess.run(BURST_WORKER, env=env, timeout=600)
            counts = json.loads(run(["stats", "--json"], env, quiet=True) or "{}")
            pending = sum(r["LIVE"] + r["DISPATCH"] for r in counts.get("jobs", []))
            retrying = retries_left(mongo_uri)  # FAIL with retry_at: due again later
            if pending == 0 and retrying == 0 and round_ > 1:
                break
            time.sleep(1.0 if retrying or pending else 0.0)
    print()
    run(["stats"], env)


def export(env: dict) -> None:
    """Each job's data to var/export, and one page the browser rendered."""
    with step("export the data", "`downcluster stats` above"):
        for name in ("demo-python", "demo-shell", "demo-builtin", "demo-browser"):
            out = VAR / "export" / f"{name}.jsonl"
            run(["data", "export", name, "--format", "jsonl", "-o", str(out)], env)
        csv_out = VAR / "export" / "demo-builtin.csv"
        run(["data", "export", "demo-builtin", "--format", "csv", "-o", str(csv_out)], env)
    with step("the browser engine's pages",
              f"`downcluster job show demo-browser` (its last failures) and {WORKER_LOG}"):
        rendered = (VAR / "export" / "demo-browser.jsonl").read_text().splitlines()
        if not rendered:
            raise RuntimeError("no page of demo-browser was stored")
        first = json.loads(rendered[0])
    print(f"\na page rendered by the browser engine, as stored: {first.get('body_text', '')[:120]}")


def export_center(env: dict, started: float) -> None:
    """An xlsx report requested, run by a worker, fetched through the web's signed link."""
    port = 8080 if port_free(8080) else free_port()
    env["DOWNCLUSTER_WEB_BIND"] = f"127.0.0.1:{port}"  # signed links are built on it
    with step("the xlsx export", f"`downcluster export list` and {WORKER_LOG}"):
        export_id = run(["export", "request", "demo-builtin", "--format", "xlsx", "--template",
                         str(JOBS / "report_template.json"), "--status", "200"], env).strip().splitlines()[-1]
        print("$ downcluster worker --burst   (the export runs on a worker)", flush=True)
        subprocess.run(BURST_WORKER, env=env, check=True, timeout=300)
        run(["export", "show", export_id], env)
    with step("the web console", "`downcluster web --bind 127.0.0.1:PORT` run by hand"):
        serve_console(env, started, port, export_id)


def main() -> int:
    started = time.monotonic()
    shutil.rmtree(VAR, ignore_errors=True)
    (VAR / "export").mkdir(parents=True)
    site, base = start_site()
    try:
        with ExitStack() as services:
            with step("start the services", "redis-server and SecantusDB under var/ (`make services-check`)"):
                redis = services.enter_context(RedisServer())
                mongo = services.enter_context(MongoServer(storage=str(VAR / "mongo")))
            env = {**os.environ, **env_for(redis.url, mongo.uri("downcluster"), mongo.uri("downcluster_log"),
                                           HOSTNAME="demo-host", RETRY_BACKOFF_BASE="0.2",
                                           DOWNLOAD_TIMEOUT="30")}
            print(f"services: redis 127.0.0.1:{redis.port} (with a password), "
                  f"mongodb {mongo.uri('downcluster')}, sample site {base}\n")
            crawl(env, base, mongo.uri("downcluster"))
            export(env)
            export_center(env, started)
    except StepFailed as exc:
        print(f"\n{exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        site.shutdown()
    print(f"\nexports in {VAR / 'export'}; demo took {time.monotonic() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
