"""Private reach is an administrator's grant (invariant 17), tried as a tenant would take it.

A ``user`` token asks for ``allow_private`` in its job, or names a proxy on the worker's
loopback; a job stored by an earlier version asked for it without anyone granting it; a
rejected manifest names another project's job. Each must reach nothing and tell nothing."""
from __future__ import annotations

import http.server
import threading

import pytest

from common.config import load
from common.errors import DownloadError
from common.store.models import CrawlerDownloadData, CrawlerDownloadSetting, CrawlerTask, Job
from master.dispatch.dispatcher import dispatch_once
from slave.download.engines import http as engine
from slave.download.engines.base import Limits
from tests.helpers import add_urls, burst_worker, cli, register, write_job
from tests.integration.test_download_engines import _AioEngine
from tests.integration.test_web_api import new_token
from tests.web_helpers import WebServer

OPEN_MANIFEST = 'name = "{name}"\ntype = "none"\n[settings]\nallow_private = {flag}\n'


class Proxy:
    """A forward proxy on loopback that answers every request itself and records it: what a
    service on the worker's loopback that speaks HTTP proxying would give a job."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.seen.append(self.path)
                body = b"secret of the loopback"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy():
    p = Proxy()
    yield p
    p.close()


def _project(*flags: str) -> int:
    made = cli("project", "create", *flags)
    assert made.exit_code == 0, made.output
    return int(made.stdout.strip().splitlines()[-1])


def _setting(name: str) -> CrawlerDownloadSetting:
    return CrawlerDownloadSetting.objects.get(job=Job.objects.get(name=name))


def test_a_user_cannot_grant_itself_private_reach_at_registration_or_update(cluster, tmp_path):
    closed, opened = _project("closed"), _project("opened", "--allow-private")
    user, insider = new_token("mallory", "user", "closed"), new_token("ida", "user", "opened")
    with WebServer(cluster.env) as web:
        asked = web.call("POST", "/api/v1/jobs", user, json={
            "manifest": OPEN_MANIFEST.format(name="probe", flag="true"), "project": closed})
        assert asked.status_code == 403 and "administrator's grant" in asked.json()["error"]
        assert "\n" not in asked.json()["error"] and not Job.objects(name="probe")
        plain = web.call("POST", "/api/v1/jobs", user, json={
            "manifest": OPEN_MANIFEST.format(name="probe", flag="false"), "project": closed})
        assert plain.status_code == 201, plain.text
        again = web.call("POST", "/api/v1/jobs", user, json={
            "manifest": OPEN_MANIFEST.format(name="probe", flag="true") + "dispatch_num = 7\n"})
        assert again.status_code == 403
        kept = _setting("probe")  # the update stored nothing
        assert kept.allow_private is False and kept.dispatch_num != 7
        granted = web.call("POST", "/api/v1/jobs", insider, json={
            "manifest": OPEN_MANIFEST.format(name="intranet", flag="true"), "project": opened})
        assert granted.status_code == 201, granted.text
    assert _setting("intranet").private_grant == "project"
    result = cli("job", "register", str(write_job(tmp_path, "by-admin", allow_private=True)), "--project",
                 str(closed))
    assert result.exit_code == 0, result.output
    assert _setting("by-admin").private_grant == "admin"  # the operator at the master grants it


def test_a_job_stored_asking_without_a_grant_reaches_no_loopback_page(cluster, tmp_path):
    """As an earlier version stored it: ``allow_private`` set by the job's user, no grant. The
    worker fetches nothing private for it, and ``migrate`` names it and withdraws the flag."""
    register(tmp_path, "old", allow_private=False)
    CrawlerDownloadSetting.objects(job=Job.objects.get(name="old")).update_one(set__allow_private=True)
    add_urls("old", [f"{cluster.site}/page/1"])
    assert dispatch_once(cluster.redis).total == 1
    burst_worker(cluster, "--no-exports")
    task = CrawlerTask.objects.get(uri=f"{cluster.site}/page/1")
    assert task.status == "FAIL" and "127.0.0.1 is a loopback address" in task.failed_reason
    assert CrawlerDownloadData.objects.count() == 0  # nothing of the loopback page was stored
    migrated = cli("migrate")
    assert migrated.exit_code == 0 and "job old: allow_private withdrawn" in migrated.output
    assert _setting("old").allow_private is False
    assert "job old" not in cli("migrate").output  # a second run finds nothing


@pytest.mark.parametrize("kind", ["requests", "aiohttp"])
def test_a_private_proxy_needs_the_grant_the_job_has_not(cluster, proxy, kind, monkeypatch):
    aio = _AioEngine() if kind == "aiohttp" else None
    try:
        def get(**kw):
            if aio is not None:
                return aio("http://example.invalid/meta", timeout=10, proxy=proxy.url, **kw)
            return engine.fetch("http://example.invalid/meta", limits=Limits(timeout=10), proxy=proxy.url,
                                **kw)

        with pytest.raises(DownloadError) as refused:
            get(allow_private=False)
        assert "127.0.0.1 is a loopback address" in refused.value.reason
        assert "proxy on a private address" in refused.value.reason and proxy.seen == []
        for name in ("localhost", "2130706433", "[::ffff:127.0.0.1]"):  # any spelling of loopback
            spelled = proxy.url.replace("127.0.0.1", name)
            with pytest.raises(DownloadError):
                if aio is not None:
                    aio("http://example.invalid/", timeout=10, proxy=spelled, allow_private=False)
                else:
                    engine.fetch("http://example.invalid/", limits=Limits(timeout=10), proxy=spelled)
        assert proxy.seen == []
        assert get(allow_private=True).body == b"secret of the loopback"  # granted: it goes
        monkeypatch.setenv("DOWNCLUSTER_SANDBOX_ALLOW", proxy.url.split("//", 1)[1])
        load()  # the operator lists it as the boxes' proxy: every engine of the job may use it
        assert get(allow_private=False).body == b"secret of the loopback"
    finally:
        monkeypatch.delenv("DOWNCLUSTER_SANDBOX_ALLOW", raising=False)
        load()
        if aio is not None:
            aio.close()


def test_a_rejected_manifest_is_its_submitters_with_its_actor(cluster):
    _project("alpha"), _project("beta")
    alice, bob = new_token("alice", "user", "alpha"), new_token("bob", "user", "beta")
    with WebServer(cluster.env) as web:
        made = web.call("POST", "/api/v1/jobs", bob, json={"manifest": 'name = "beta-job"\ntype = "none"\n'})
        assert made.status_code == 201, made.text
        hostile = 'name = "beta-job"\ntype = "python"\n# <script>alert(1)</script>\n'
        refused = web.call("POST", "/api/v1/jobs", alice, json={"manifest": hostile, "code": "def x(:"})
        assert refused.status_code == 422
        seen_by_bob = web.call("GET", "/api/v1/logs/registration", bob).json()["logs"]
        seen_by_alice = web.call("GET", "/api/v1/logs/registration", alice).json()["logs"]
        assert seen_by_bob == []  # not written into the project whose job name it gave
        assert len(seen_by_alice) == 1 and seen_by_alice[0]["actor"] == "alice"
        assert seen_by_alice[0]["name"] == "beta-job"


def test_credentials_and_a_callers_rows_never_reach_the_access_log(cluster):
    admin = new_token("root", "admin")
    sig, rows = "5f1e-signature-value", '[{"name":"s3cret-row"}]'
    with WebServer(cluster.env) as web:
        web.call("GET", f"/files/exports/x?expires=1&sig={sig}")
        web.call("GET", "/v1/download/sync", admin, params={"source_data": rows, "Sig": sig, "ticket": sig})
        web.call("GET", f"/api/v1/jobs?token={sig}&TOKEN%20={sig}", admin)
        logged = web._read()
    assert "GET /files/exports/x?expires=1&sig=***" in logged  # the line is there, the value is not
    assert sig not in logged and "s3cret-row" not in logged
