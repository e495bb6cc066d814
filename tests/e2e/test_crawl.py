"""Crawls end to end: a following job fed one seed, run by the dispatcher and real `downcluster
worker` processes round after round until nothing is left, against sites started here (the
sample site's endless binary tree ``/links/<n>``, and a site of this module's own: a page with
links out of scope, a redirect off the site, an endless calendar, a page of 100,000 links, a
page that changes) and a python downloader returning a million links."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from common.config import settings
from common.queue.wake import wake
from common.store import counts
from common.store.models import CrawlerTask, Job
from master.dispatch.dispatcher import dispatch_once
from tests.helpers import add_urls, burst_worker, cli, heartbeats_stale, wait_for, write_job

pytestmark = pytest.mark.slow
CHANGING = {"version": 1}  # what /changing links to (a page that changes between visits)
REQUESTED: list[str] = []  # the paths the site was asked for


class Site(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _html(self, body: str, status: int = 200, location: str = "") -> None:
        data = f"<html><body>{body}</body></html>".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        port = self.server.server_address[1]
        path = self.path
        REQUESTED.append(path)
        if path == "/start":
            self._html(f"<a href='/a'>a</a> <a href='http://localhost:{port}/other'>other site</a> "
                       "<a href='/private/secret'>denied</a> <a href='/redirect'>off the site</a> "
                       "<a href='javascript:alert(1)'>js</a> <a href='mailto:x@y.z'>mail</a> "
                       "<a href='file:///etc/passwd'>file</a> <a href='/" + "x" * 3000 + "'>long</a>")
        elif path == "/redirect":
            self._html("", 302, f"http://localhost:{port}/landing")
        elif path == "/landing":  # reached through the redirect: its relative links lead off the site
            self._html("<a href='/after-redirect'>after</a>")
        elif path.startswith("/calendar/"):  # an endless calendar: each month links to its neighbours
            month = int(path.rsplit("/", 1)[1])
            self._html(f"<a href='/calendar/{month - 1}'>prev</a> <a href='/calendar/{month + 1}'>next</a>")
        elif path == "/many":
            self._html("".join(f"<a href='/item/{i}'>{i}</a>" for i in range(100_000)))
        elif path == "/changing":
            self._html(f"<a href='/version/{CHANGING['version']}'>now</a>")
        elif path == "/robots.txt":
            data = b"User-agent: *\nDisallow: /robots-denied\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif path == "/polite":
            self._html("<a href='/robots-denied'>denied by robots.txt</a> <a href='/allowed'>allowed</a>")
        else:
            self._html("no links")


@pytest.fixture(scope="module")
def own_site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def following(tmp_path, name: str, follow: str, **settings) -> Job:
    manifest = write_job(tmp_path, name, **settings)
    manifest.write_text(manifest.read_text() + "[follow]\n" + follow)
    result = cli("job", "register", str(manifest))
    assert result.exit_code == 0, result.output
    return Job.objects.get(name=name)


def crawl(cluster, name: str, seed: str) -> dict[str, dict]:
    """Add ``seed`` and run dispatcher and worker rounds until the job has nothing left to do;
    its tasks by URL."""
    add_urls(name, [seed])
    return crawled(cluster, name)


def crawled(cluster, name: str) -> dict[str, dict]:
    """Run dispatcher and worker rounds until the job has nothing left to do; its tasks by URL."""
    job = Job.objects.get(name=name)
    for _ in range(200):
        if not CrawlerTask.objects(job=job, status__in=["LIVE", "DISPATCH"]).count():
            break
        wait_for(lambda: dispatch_once(cluster.redis).total, what="tasks to send")  # (a handed-back one: due)
        burst_worker(cluster)
    else:
        raise AssertionError("the crawl did not end")
    return {d["uri"]: d for d in CrawlerTask._get_collection().find({"job": job.id})}


def tree_links(n: int) -> set[int]:
    """The pages /links/<n> links to (``sample_site.linked_page``)."""
    return {2 * n + 1, 2 * n + 2, n + 1}


def check_lineage(tasks: dict[str, dict], max_depth: int) -> None:
    """Every found task was found on a page of the crawl that links to it, one level deeper."""
    by_id = {t["_id"]: t for t in tasks.values()}
    for t in tasks.values():
        assert t["status"] == "SUCCESS", t
        if t.get("parent") is None:
            assert t.get("depth") is None  # the seed
            continue
        parent = by_id[t["parent"]]
        assert t["depth"] == (parent.get("depth") or 0) + 1 <= max_depth
        assert int(t["uri"].rsplit("/", 1)[1]) in tree_links(int(parent["uri"].rsplit("/", 1)[1]))


def test_a_crawl_within_max_depth_reaches_exactly_the_pages_that_deep(cluster, tmp_path):
    following(tmp_path, "tree", "max_depth = 2\n")
    tasks = crawl(cluster, "tree", cluster.site + "/links/0")
    # depth 1: 1 and 2; depth 2: their links 3, 4, 5, 6 (fragments dropped; mailto: and javascript: not)
    assert sorted(tasks) == sorted(f"{cluster.site}/links/{n}" for n in range(7))
    check_lineage(tasks, 2)
    assert {t.get("depth") or 0 for t in tasks.values()} == {0, 1, 2}
    shown = cli("task", "show", "tree", cluster.site + "/links/5").output
    assert "depth: 2\n" in shown and f"parent: {tasks[cluster.site + '/links/2']['_id']}\n" in shown
    api = cli("task", "show", "tree", cluster.site + "/links/0", "--json").output
    assert '"depth": 0' in api and '"parent": null' in api


def test_an_endless_tree_stops_at_max_pages(cluster, tmp_path):
    following(tmp_path, "pages", "max_depth = 10000\nmax_pages = 20\n")
    tasks = crawl(cluster, "pages", cluster.site + "/links/0")
    assert len(tasks) == 20  # one worker process: one writer, the cap exact
    check_lineage(tasks, 10000)


KILLPOINT = Path(__file__).resolve().parents[1] / "killpoint"


@pytest.mark.parametrize("follow, pages", [("max_depth = 2\n", 7), ("max_depth = 10000\nmax_pages = 3\n", 3)])
@pytest.mark.parametrize("kill_after", ["common.intake:add_found", "common.store.tasks:settle"])
def test_a_worker_killed_around_its_settle_loses_no_link(fast_recovery, tmp_path, kill_after, follow, pages):
    """A real worker SIGKILLed right after it handed the seed's links to intake (its task not
    settled yet), or right after its settle: the links are tasks either way; the recovered seed
    runs again and offers them again, known by then; the crawl ends with exactly its pages, each
    found once, at its depth, within max_pages, and the job's kept counts hold every task."""
    cluster = fast_recovery
    job = following(tmp_path, "killed", follow)
    seed = cluster.site + "/links/0"
    add_urls("killed", [seed])
    assert dispatch_once(cluster.redis).total == 1
    env = {**os.environ, **cluster.env, "PYTHONPATH": str(KILLPOINT),
           "DOWNCLUSTER_TEST_KILL_AFTER": kill_after}
    died = subprocess.run([str(Path(sys.executable).parent / "downcluster"), "worker", "--burst"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    at_death = {d["uri"]: d for d in CrawlerTask._get_collection().find({"job": job.id})}
    assert sorted(at_death) == sorted(f"{cluster.site}/links/{n}" for n in range(3))  # the seed's links
    assert at_death[seed]["status"] == ("SUCCESS" if kill_after.endswith(":settle") else "LIVE")
    wait_for(lambda: heartbeats_stale(settings.HEARTBEAT_TTL), what="the killed worker to be judged dead")
    tasks = crawled(cluster, "killed")
    assert len(tasks) == pages
    check_lineage(tasks, 10000)
    assert tasks[seed]["recoveries"] == (0 if kill_after.endswith(":settle") else 1)
    kept = counts.of_jobs([job.id])[job.id]
    assert sum(kept.values()) == pages  # (killed after its settle, before its counts' move: seed LIVE)
    if kill_after.endswith(":add_found"):
        assert kept["SUCCESS"] == pages


def test_out_of_scope_denied_and_other_schemes_are_never_tasks(cluster, tmp_path, own_site):
    following(tmp_path, "scope", "deny = ['/private/']\n")
    REQUESTED.clear()
    tasks = crawl(cluster, "scope", own_site + "/start")
    # not: another host name, a denied path, javascript:, mailto:, file:, a URL over 2048 characters
    assert sorted(tasks) == [own_site + p for p in ("/a", "/redirect", "/start")]
    assert {u[len(own_site):]: t["status"] for u, t in tasks.items()} == {
        "/a": "SUCCESS", "/start": "SUCCESS", "/redirect": "FAIL"}
    # a redirect off the site is not followed: its page fails for good, saying where it led and why
    off = f"http://localhost:{own_site.rsplit(':', 1)[1]}/landing"
    redirect = tasks[own_site + "/redirect"]
    why = f"redirect out of the job's scope to {off}: another site than 127.0.0.1"
    assert redirect["failed_reason"] == why
    assert redirect.get("retry_at") is None and redirect["download_times"] == 1
    assert "/landing" not in REQUESTED and "/redirect" in REQUESTED
    shown = cli("task", "show", "scope", own_site + "/redirect").output
    assert "status: FAIL\n" in shown and "redirect out of the job's scope" in shown


def test_robots_txt_holds_for_found_urls(cluster, tmp_path, own_site):
    following(tmp_path, "polite", "max_depth = 1\n")
    REQUESTED.clear()
    tasks = crawl(cluster, "polite", own_site + "/polite")
    assert {u[len(own_site):]: t["status"] for u, t in tasks.items()} == {
        "/polite": "SUCCESS", "/allowed": "SUCCESS", "/robots-denied": "FAIL"}
    assert tasks[own_site + "/robots-denied"]["failed_reason"] == "robots.txt disallows"
    assert "/robots-denied" not in REQUESTED and "/allowed" in REQUESTED and "/robots.txt" in REQUESTED


@pytest.mark.parametrize("follow,months", [
    ("max_depth = 5\n", range(-5, 6)),  # the seed's month and 5 each way
    ("max_depth = 10000\nmax_pages = 8\n", None),
])
def test_an_endless_calendar_stops_at_the_caps(cluster, tmp_path, own_site, follow, months):
    following(tmp_path, "calendar", follow)
    tasks = crawl(cluster, "calendar", own_site + "/calendar/0")
    if months is not None:
        assert sorted(tasks) == sorted(f"{own_site}/calendar/{m}" for m in months)
        assert max(t.get("depth") or 0 for t in tasks.values()) == 5
    else:
        assert len(tasks) == 8


def test_a_page_of_100000_links_adds_the_cap_and_logs_the_excess_once(cluster, tmp_path, own_site):
    following(tmp_path, "many", "links_per_page = 50\nmax_depth = 1\n")
    add_urls("many", [own_site + "/many"])
    assert dispatch_once(cluster.redis).total == 1
    done = subprocess.run([str(Path(sys.executable).parent / "downcluster"), "worker", "--burst"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **cluster.env})
    assert done.returncode == 0, done.stderr[-2000:]
    tasks = {d["uri"] for d in CrawlerTask._get_collection().find({})}
    assert tasks == {own_site + "/many"} | {f"{own_site}/item/{i}" for i in range(50)}
    assert done.stderr.count("50 links taken, 99950 over the cap") == 1, done.stderr[-2000:]


MILLION = """
import urllib.request

def download(task):
    with urllib.request.urlopen(task["url"], timeout=10) as resp:
        page = {"status_code": resp.status, "headers": dict(resp.headers.items()), "body": resp.read()}
    if task["url"].endswith("/a"):
        page["links"] = ["/item/%d" % i for i in range(1_000_000)]
    return page
"""


def test_a_python_downloader_returning_a_million_links_adds_the_cap(cluster, tmp_path, own_site):
    following(tmp_path, "million", "links_per_page = 30\nmax_depth = 1\n", kind="python", code=MILLION)
    tasks = crawl(cluster, "million", own_site + "/a")
    assert sorted(tasks) == sorted([own_site + "/a"] + [f"{own_site}/item/{i}" for i in range(30)])
    assert all(t["status"] == "SUCCESS" for t in tasks.values())


def test_a_revisited_pages_new_links_are_followed(cluster, tmp_path, own_site):
    following(tmp_path, "changes", "max_depth = 1\n", revisit=1.0)
    CHANGING["version"] = 1
    add_urls("changes", [own_site + "/changing"])
    dispatch_once(cluster.redis)
    burst_worker(cluster)
    job = Job.objects.get(name="changes")
    assert CrawlerTask.objects(job=job, uri=own_site + "/version/1").count() == 1
    CHANGING["version"] = 2
    wait_for(lambda: CrawlerTask.objects(job=job, uri=own_site + "/version/2").count()
             or (dispatch_once(cluster.redis).total and burst_worker(cluster)),
             what="the revisit's new link")
    found, page = (CrawlerTask.objects.get(job=job, uri=own_site + p) for p in ("/version/2", "/changing"))
    assert found.depth == 1 and found.parent == page.id


def _start(cluster, log: Path, *args: str) -> subprocess.Popen:
    """``downcluster ARGS`` in the background, its stderr to file ``log`` (kept under pytest's
    basetemp to read after a failure; a pipe nobody reads would stop the process at 64 KB)."""
    with log.open("ab") as err:
        return subprocess.Popen([str(Path(sys.executable).parent / "downcluster"), *args],
                                env={**os.environ, **cluster.env}, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        p.wait(timeout=30)


def _stand_in_for_the_schedule(cluster) -> bool:
    """A page that failed or was handed back (a loaded machine: a timeout, a site slot waited too
    long) waits, by design, for the dispatcher's next scheduled run: a year or ten minutes away
    here. Only for those this wakes the dispatcher, as that run would; found links never need it
    (they are new tasks, never failed nor handed back). Always False: the wait goes on."""
    waiting = CrawlerTask.objects(status="FAIL").count() + CrawlerTask.objects(status="LIVE",
                                                                                 failed_reason__ne=None).count()
    if waiting:
        wake(cluster.redis)
    return False


def _pages() -> dict[int, dict]:
    """{n: task} of the crawl of /links/<n>."""
    return {int(d["uri"].rsplit("/", 1)[1]): d for d in CrawlerTask._get_collection().find({})}


def _crawled_to(max_depth: int) -> bool:
    """Every task stored, and every link of every page above ``max_depth`` a task: the crawl is
    over and lost no link. Which pages it holds depends on the order pages are stored in: a URL
    keeps the depth of its first offer (docs/crawling.md), so a page first found through a
    ``rel=next`` link one level deeper than the tree's may take its links past ``max_depth``."""
    pages = _pages()
    return all(t["status"] == "SUCCESS" for t in pages.values()) and all(
        k in pages for n, t in pages.items() if (t.get("depth") or 0) < max_depth for k in tree_links(n))


def _state(tmp_path: Path) -> str:
    """The tasks' statuses, the links not stored and the processes' last lines, for a failure."""
    pages, statuses = _pages(), {}
    for t in pages.values():
        statuses[t["status"]] = statuses.get(t["status"], 0) + 1
    linked = {k for n, t in pages.items() if (t.get("depth") or 0) < 6 for k in tree_links(n)}
    lost = sorted(linked - set(pages))
    tails = {log.name: log.read_text(errors="replace")[-1500:] for log in sorted(tmp_path.glob("*.log"))}
    return f"statuses {statuses}; links not stored {lost}; logs {tails}"


@pytest.mark.parametrize("dispatcher", ["loop", "scheduler"])
def test_a_deep_crawl_goes_a_level_deeper_without_waiting_for_the_dispatchers_schedule(cluster, tmp_path,
                                                                                      dispatcher):
    """Issue 54: found links are sent when their page is stored, not at the dispatcher's next
    scheduled run. A crawl of depth 6 (up to 127 pages) ends under a dispatcher whose next
    scheduled run is ten minutes away (a loop of --interval 600, or the cron scheduler with a
    yearly schedule after one run by hand): each level's links wake it (``common.queue.wake``)."""
    following(tmp_path, "deep", "max_depth = 6\n", dispatch_num=1000)
    add_urls("deep", [cluster.site + "/links/0"])
    if dispatcher == "loop":
        procs = [_start(cluster, tmp_path / "dispatcher.log", "dispatch", "--loop", "--interval", "600")]
    else:
        assert dispatch_once(cluster.redis).total == 1  # the cron's first run
        procs = [_start(cluster, tmp_path / "dispatcher.log", "scheduler", "--cron", "0 0 1 1 *",
                        "--interval", "600")]
    procs.append(_start(cluster, tmp_path / "worker.log", "worker", "--no-exports"))
    try:
        wait_for(lambda: _crawled_to(6) or _stand_in_for_the_schedule(cluster),
                 120, lambda: f"the crawl to its depth ({_state(tmp_path)})")
    finally:
        _stop(procs)
    tasks = {d["uri"]: d for d in CrawlerTask._get_collection().find({})}
    assert set(tasks) <= {f"{cluster.site}/links/{n}" for n in range(127)}
    assert max(t.get("depth") or 0 for t in tasks.values()) == 6  # six levels, each sent on a wake-up
    check_lineage(tasks, 6)
