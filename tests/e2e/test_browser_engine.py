"""The browser engine (headless Chromium over DevTools) on pages of the sample site built by
JavaScript, and `prior` (urgency, foreign) end to end. Debian's chromium is installed by the
Makefile; nothing is downloaded at run time."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.errors import DownloadError
from common.store.models import CrawlerDownloadData, CrawlerTask
from master.dispatch.dispatcher import dispatch_once
from sample_site import page_body
from slave.download.engines import browser, chromium
from slave.download.engines.base import Limits
from tests.helpers import add_urls, cli, register, sent, statuses, write_job

pytestmark = pytest.mark.skipif(chromium.chromium_path() is None,
                                reason="chromium is not installed (make test installs it as root)")
BIN = Path(sys.executable).parent


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pool = chromium.Pool(size=1, max_pages=50, memory_mb=256)

    def fetch(self, url: str, timeout: float = 20, **kw):
        kw.setdefault("allow_private", True)  # the sample site is on loopback
        coro = browser.fetch(url, limits=Limits(timeout=timeout), pool=self.pool, idle_max=2.0, **kw)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout + 30)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.pool.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture(scope="module")
def chrome():
    c = _Loop()
    yield c
    c.close()


def _fail(fn, *args, **kw) -> DownloadError:
    with pytest.raises(DownloadError) as info:
        fn(*args, **kw)
    return info.value


def test_the_dom_after_scripts_is_the_body(site, chrome):
    got = chrome.fetch(f"{site}/js/render/7")
    assert got.status_code == 200 and got.remote_ip == "127.0.0.1"
    assert b"rendered by javascript 7" in got.body and b"loading" not in got.body
    assert got.headers["Content-Type"].startswith("text/html") and got.encoding == "utf-8"


def test_download_js_string_result_is_the_body(site, chrome):
    js = ("document.getElementById('more').click();\n"
          "await new Promise(r => setTimeout(r, 50));\n"
          "return JSON.stringify([...document.querySelectorAll('li')].map(li => li.textContent));")
    assert chrome.fetch(f"{site}/js/button", js=js).body == b'["first","second"]'
    other = chrome.fetch(f"{site}/js/button", js="return 42;")  # not a string: the DOM
    assert b"<li>first</li>" in other.body


def test_dialogs_are_dismissed_not_waited_for(site, chrome):
    assert b"after the dialogs" in chrome.fetch(f"{site}/js/alert").body


def test_status_and_script_errors_are_classified(site, chrome):
    err = _fail(chrome.fetch, f"{site}/status/404")
    assert err.reason == "HTTP 404" and not err.retryable
    err = _fail(chrome.fetch, f"{site}/js/render/1", js="throw new Error('no such button');")
    assert err.reason.startswith("download_js error") and "no such button" in err.reason and not err.retryable
    err = _fail(chrome.fetch, "file:///etc/passwd")
    assert err.reason.startswith("invalid URL") and not err.retryable


def test_file_urls_are_refused(site, chrome):
    err = _fail(chrome.fetch, f"{site}/redirect-file")
    assert err.reason.startswith("redirect to unsupported scheme") and not err.retryable
    got = chrome.fetch(f"{site}/js/to-file")  # a script's navigation to file:// does not happen
    assert b"root:" not in got.body and b"location.href" in got.body


@pytest.mark.slow
def test_a_page_that_never_loads_is_killed_and_the_next_page_is_fine(site, chrome):
    start = time.monotonic()
    err = _fail(chrome.fetch, f"{site}/js/never-loads", timeout=3)
    assert err.reason == "timeout after 3.0s" and err.retryable
    assert time.monotonic() - start < 20  # the 3 s deadline with slack; unbounded, the page never loads
    assert b"rendered by javascript 2" in chrome.fetch(f"{site}/js/render/2").body


@pytest.mark.slow
def test_a_page_that_allocates_without_end_is_killed(site, chrome):
    err = _fail(chrome.fetch, f"{site}/js/oom", timeout=30)
    assert err.retryable and ("crashed" in err.reason or "timeout" in err.reason)
    assert b"rendered by javascript 3" in chrome.fetch(f"{site}/js/render/3").body


def test_cookie_and_headers_reach_the_site_and_contexts_do_not_share_cookies(site, chrome):
    import json

    got = chrome.fetch(f"{site}/headers", cookie="sid=br0wser-cookie", headers={"X-Job": "js"})
    seen = json.loads(got.body.decode().split("<pre", 1)[-1].split(">", 1)[1].split("</pre>")[0]) \
        if b"<pre" in got.body else {}
    assert seen.get("Cookie") == "sid=br0wser-cookie" and seen.get("X-Job") == "js"
    assert got.request_headers["Cookie"] == "***"
    again = chrome.fetch(f"{site}/headers")
    assert b"br0wser-cookie" not in again.body


def test_registration_of_download_js(cluster, tmp_path):
    ok = tmp_path / "br.toml"
    ok.write_text(
        'name = "br"\ntype = "none"\n[settings]\ndownload_engine = "browser"\n'
        'download_js = """\nwindow.scrollTo(0, document.body.scrollHeight);\nreturn document.title;\n"""\n'
    )
    result = cli("job", "register", str(ok))
    assert result.exit_code == 0, result.output
    assert "download_js: " in cli("job", "show", "br").output
    for bad, why in ((dict(download_js="return 1;"), "needs download_engine"),
                     (dict(download_engine="browser", download_js="   "), "empty")):
        result = cli("job", "register", str(write_job(tmp_path, "br2", **bad)))
        assert result.exit_code == 2 and why in result.output


@pytest.mark.slow
def test_browser_job_end_to_end(cluster, tmp_path):
    register(tmp_path, "rendered", priority=1, download_engine="browser")
    add_urls("rendered", [f"{cluster.site}/js/render/{i}" for i in range(4)])
    dispatch_once(cluster.redis)
    proc = subprocess.run([str(BIN / "downcluster"), "worker", "--burst"], env={**os.environ, **cluster.env},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert statuses("rendered") == {"SUCCESS": 4}
    for doc in CrawlerDownloadData.objects:
        n = doc.url.rsplit("/", 1)[1]
        assert f"rendered by javascript {n}".encode() in bytes(doc.response_body)


# --- prior -------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_urgent_entries_run_before_normal_ones_queued_earlier(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("DOWNCLUSTER_DISPATCH_BATCH_SIZE", "1")
    cluster.env["DOWNCLUSTER_DISPATCH_BATCH_SIZE"] = "1"
    from common.config import load
    load()
    register(tmp_path, "normal", priority=5)
    add_urls("normal", [f"{cluster.site}/page/{i}" for i in range(5)])
    dispatch_once(cluster.redis)
    register(tmp_path, "urgent", priority=4, prior=1)  # same queue (down_low), queued later
    add_urls("urgent", [f"{cluster.site}/page/100"])
    dispatch_once(cluster.redis)
    proc = subprocess.run([str(BIN / "downcluster"), "worker", "--burst", "--simple", "--max-jobs", "1"],
                          env={**os.environ, **cluster.env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert statuses("urgent") == {"SUCCESS": 1} and statuses("normal") == {"LIVE": 5} and sent("normal") == 5


@pytest.mark.slow
def test_foreign_entries_are_taken_only_by_foreign_workers(cluster, tmp_path):
    register(tmp_path, "abroad", priority=2, prior=2)
    add_urls("abroad", [f"{cluster.site}/page/{i}" for i in range(3)])
    report = dispatch_once(cluster.redis)
    assert dict(report.tasks) == {"down_mid#foreign": 3}
    env = {**os.environ, **cluster.env}
    plain = subprocess.run(
        [str(BIN / "downcluster"), "worker", "--burst"], env=env, capture_output=True, text=True, timeout=120
    )
    assert plain.returncode == 0 and statuses("abroad") == {"LIVE": 3} and sent("abroad") == 3
    foreign = subprocess.run([str(BIN / "downcluster"), "worker", "--burst", "--foreign"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert foreign.returncode == 0, foreign.stderr[-2000:]
    assert statuses("abroad") == {"SUCCESS": 3}
    assert "foreign" in cli("job", "show", "abroad").output
    assert all(t.status == "SUCCESS" for t in CrawlerTask.objects)


@pytest.mark.slow
def test_a_browser_is_restarted_after_max_pages(site):
    c = _Loop()
    c.pool.max_pages = 2
    try:
        pids = []
        for n in range(3):
            c.fetch(f"{site}/js/render/{n}")
            pids.append(c.pool.idle(True)[0].proc.pid)
        assert pids[0] == pids[1] != pids[2]
    finally:
        c.close()


def test_the_browser_reaches_no_private_address_unless_allowed_and_never_the_clusters(cluster, chrome):
    from common.config import load, settings
    from tests.receivers import WebhookReceiver

    site = cluster.site
    refused = _fail(chrome.fetch, f"{site}/js/render/1", allow_private=False)
    assert (
        refused.reason
        == "refused: 127.0.0.1 is a loopback address (private reach is an administrator's grant: "
           "allow_private in a project opened to it)"
    )
    assert not refused.retryable
    with WebhookReceiver() as web:  # stands in for the cluster's web: it must see no request
        bind = f"127.0.0.1:{web.server.server_address[1]}"
        load(flags=dict(settings.flags, WEB_BIND=bind))
        redirected = _fail(chrome.fetch, f"{site}/redirect-to?url=http://{bind}/x")
        assert (
            redirected.reason == f"refused: {bind} is a service of this cluster" and not redirected.retryable
        )
        js = (
            f"try {{ await fetch('http://{bind}/api'); return 'reached'; }} catch (e) {{ return 'blocked'; }}"
        )
        got = chrome.fetch(f"{site}/js/render/2", js=js)  # a page's own request to the service
        assert got.body == b"blocked"
        assert web.received == []
    assert b"rendered by javascript 3" in chrome.fetch(f"{site}/js/render/3").body  # allowed: still works
    # a script's own request that may go is answered while the script runs (it used to wait in Fetch)
    assert chrome.fetch(
        f"{site}/js/render/4", js="return await (await fetch('/page/1')).text();"
    ).body == page_body(1)
