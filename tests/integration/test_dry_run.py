"""A job's dry run on one URL (``dry_run_job``): a real worker runs the job's engine on the URL
with the walls a task has and answers through Redis; nothing is stored (no task, data, log,
lease, count); the roles and projects rules of changing a job hold."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from common.store.log_models import CrawlerDownloadLog
from common.store.models import CrawlerDownloadData, CrawlerLease, CrawlerTask, CrawlerTaskCount
from tests.helpers import burst_worker, cli, register, write_job
from tests.integration.test_web_api import new_token
from tests.web_helpers import WebServer

SHELL = 'printf "shell saw %s" "$1"\n'


def _stored() -> dict[str, int]:
    return {m.__name__: m._get_collection().count_documents({})
            for m in (CrawlerTask, CrawlerDownloadData, CrawlerDownloadLog, CrawlerLease, CrawlerTaskCount)}


def _ask(web, token: str, job: str, url: str) -> str:
    queued = web.call("POST", f"/api/v1/jobs/{job}/dry-run", token, json={"url": url})
    assert queued.status_code == 202, queued.text
    assert queued.json()["state"] == "queued" and queued.json()["url"] == url
    return queued.json()["id"]


def test_a_dry_run_fetches_through_a_worker_and_stores_nothing(cluster, tmp_path, monkeypatch):
    register(tmp_path, "dry", obey_robots=False)
    register(tmp_path, "walled", allow_private=False)  # the default project does not reach loopback
    register(tmp_path, "tiny", obey_robots=False)
    before = _stored()
    site = cluster.site
    user, analyst = new_token("u", "user", "default"), new_token("a", "analyst", "default")
    with WebServer(cluster.env) as web:
        jobs = {"page": "dry", "500": "dry", "private": "walled", "big": "tiny"}
        asked = {
            "page": _ask(web, user, "dry", f"{site}/page/7"),
            "500": _ask(web, user, "dry", f"{site}/status/500"),
            "private": _ask(web, user, "walled", f"{site}/page/8"),
            "big": _ask(web, user, "tiny", f"{site}/bytes/100000"),
        }
        running = web.call("GET", f"/api/v1/jobs/dry/dry-run/{asked['page']}", user)
        assert running.status_code == 202 and running.json()["state"] == "queued"
        monkeypatch.setenv("DOWNCLUSTER_DOWNLOAD_MAXSIZE", "4096")  # the worker's size limit
        burst_worker(cluster, "--no-exports")  # a real worker takes the entries from down_super
        monkeypatch.delenv("DOWNCLUSTER_DOWNLOAD_MAXSIZE")
        got = {k: web.call("GET", f"/api/v1/jobs/{jobs[k]}/dry-run/{ref}", user, params={"wait": 5})
               for k, ref in asked.items()}
        assert {k: r.status_code for k, r in got.items()} == dict.fromkeys(asked, 200), {
            k: r.text for k, r in got.items()}
        page = got["page"].json()
        assert page["state"] == "done" and "error" not in page
        assert page["response"]["status_code"] == 200 and "page 7" in page["response"]["body"]
        assert page["response"]["headers"]["Content-Type"].startswith("text/html")
        assert got["500"].json()["error"].startswith("HTTP 500")
        private = got["private"].json()["error"]
        assert "refused" in private and "\n" not in private
        big = got["big"].json()
        assert "response" not in big and "4096" in big["error"], big
        # a request waiting for the answer gets it when the worker has written it
        done = web.call("POST", "/api/v1/jobs/dry/dry-run", user, json={"url": f"{site}/page/9"})
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(web.call, "GET", f"/api/v1/jobs/dry/dry-run/{done.json()['id']}", user,
                                  params={"wait": 50})
            burst_worker(cluster, "--no-exports")
            again = waiting.result()
        assert again.status_code == 200 and "page 9" in again.json()["response"]["body"]
        # roles and projects: an analyst may not; another job's id, a bad URL, an unknown id
        refused = web.call("POST", "/api/v1/jobs/dry/dry-run", analyst, json={"url": f"{site}/page/1"})
        assert refused.status_code == 403
        assert web.call("GET", f"/api/v1/jobs/dry/dry-run/{asked['page']}", analyst).status_code == 403
        assert web.call("GET", f"/api/v1/jobs/walled/dry-run/{asked['page']}", user).status_code == 404
        assert web.call("GET", f"/api/v1/jobs/dry/dry-run/{'0' * 32}", user).status_code == 404
        bad = web.call("POST", "/api/v1/jobs/dry/dry-run", user, json={"url": "ftp://x/"})
        assert bad.status_code == 422 and "\n" not in bad.json()["error"]
    assert _stored() == before  # no task, data, log, lease or count of any of it


def test_a_dry_run_of_a_shell_job_runs_in_the_sandbox(cluster, tmp_path):
    manifest = write_job(tmp_path, "sh", kind="shell", code=SHELL, obey_robots=False)
    result = cli("job", "register", str(manifest))
    assert result.exit_code == 0, result.output
    admin = new_token("root", "admin")
    with WebServer(cluster.env) as web:
        ref = _ask(web, admin, "sh", "https://example.invalid/a?b=1")
        burst_worker(cluster, "--no-exports")
        got = web.call("GET", f"/api/v1/jobs/sh/dry-run/{ref}", admin, params={"wait": 5}).json()
    assert got["state"] == "done", got
    assert got["response"]["body"] == "shell saw https://example.invalid/a?b=1", got
    assert CrawlerTask._get_collection().count_documents({}) == 0


def test_waiting_for_dry_runs_holds_at_most_a_few_of_the_webs_threads(cluster, tmp_path, monkeypatch):
    """Each waiting request holds a thread of the web and a Redis connection: past WAITERS_MAX of
    them at once, a request is answered at once (``queued``) instead of waiting."""
    from common import dryrun
    from common.store import jobs
    from common.store.connection import redis_conn
    from master import dryrun as master_dryrun

    register(tmp_path, "dry", obey_robots=False)
    job = jobs.named("dry")
    ref = master_dryrun.start(redis_conn(), job, f"{cluster.site}/page/1")  # no worker: unanswered
    waited: list[float] = []
    monkeypatch.setattr(dryrun, "wait", lambda redis, ref, timeout: waited.append(timeout))
    held = [master_dryrun._waiters.acquire(blocking=False) for _ in range(master_dryrun.WAITERS_MAX)]
    assert all(held)
    try:
        shown = master_dryrun.show(redis_conn(), job, ref, 30)
    finally:
        for _ in held:
            master_dryrun._waiters.release()
    assert shown["state"] == "queued" and waited == []
    assert master_dryrun.show(redis_conn(), job, ref, 30)["state"] == "queued" and waited == [30]
