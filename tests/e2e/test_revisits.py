"""Revisits end to end: a job with ``revisit`` visits its pages again with real workers against
the local site; conditional requests, 304s stored as logs only, versions named by their task,
history through the API and exports, adaptive intervals, a worker killed mid-revisit."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import sample_site
from common.config import settings
from common.store.clock import store_now
from common.store.log_models import CrawlerDownloadLog
from common.store.models import CrawlerDownloadData, CrawlerTask, Job
from master.dispatch.dispatcher import dispatch_once
from master.exports.dump import export
from tests.helpers import (
    add_urls,
    burst_worker,
    heartbeats_stale,
    register,
    statuses,
    wait_for,
)

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def keys(*modes: str) -> dict[str, str]:
    """A fresh page of the site per validator mode ("etag", "date", "none"): {mode: key}."""
    out = {}
    for mode in modes:
        key = f"{mode}-{uuid.uuid4().hex[:8]}"
        sample_site.VERSIONED[key] = [1, mode]
        out[mode] = key
    return out


def url(cluster, key: str) -> str:
    return f"{cluster.site}/versioned/{key}"


def task_of(key: str) -> CrawlerTask:
    return CrawlerTask.objects.get(uri__endswith=f"/versioned/{key}")


def due(name: str) -> bool:
    """Every SUCCESS task of the job is due for its revisit by the store's clock."""
    job = Job.objects.get(name=name)
    now = store_now()
    done = CrawlerTask.objects(job=job, status="SUCCESS")
    return all(t.retry_at is not None and t.retry_at <= now for t in done)


def visit_again(cluster, name: str) -> int:
    """Wait until the job's pages are due, dispatch them and run a worker to the end."""
    wait_for(lambda: due(name), what="the revisits to be due")
    sent = dispatch_once(cluster.redis).total
    burst_worker(cluster)
    return sent


def first_visit(cluster, tmp_path, name: str, modes: tuple[str, ...], **settings) -> dict[str, str]:
    """Register job ``name`` (``settings``), add a fresh page per validator mode, download them
    once with a real worker: {mode: key}."""
    register(tmp_path, name, **settings)
    pages = keys(*modes)
    add_urls(name, [url(cluster, k) for k in pages.values()])
    dispatch_once(cluster.redis)
    burst_worker(cluster)
    return pages


def exported(name: str, **flt) -> list[dict]:
    out = io.BytesIO()
    export(name, "jsonl", out, "", flt)
    return [json.loads(line) for line in out.getvalue().decode().splitlines()]


def test_revisits_store_new_versions_and_304s_as_logs(cluster, tmp_path):
    register(tmp_path, "rv", revisit=1.0)
    pages = keys("etag", "date", "none", "changing")
    sample_site.VERSIONED[pages["changing"]][1] = "etag"
    add_urls("rv", [url(cluster, k) for k in pages.values()])
    assert dispatch_once(cluster.redis).total == 4
    burst_worker(cluster)
    assert statuses("rv") == {"SUCCESS": 4}
    first = {m: task_of(k).data_lease for m, k in pages.items()}
    assert all(task_of(k).versions == 1 and task_of(k).retry_at for k in pages.values())

    sample_site.VERSIONED[pages["changing"]][0] = 2  # the page changes; the others do not
    assert visit_again(cluster, "rv") == 4
    assert statuses("rv") == {"SUCCESS": 4}
    for mode in ("etag", "date"):  # asked with their validators: answered 304, nothing stored
        assert sample_site.ANSWERS[pages[mode]] == [200, 304], mode
    assert sample_site.ANSWERS[pages["none"]] == [200, 200]  # no validators: the same body again
    assert sample_site.ANSWERS[pages["changing"]] == [200, 200]
    for mode in ("etag", "date", "none"):
        t = task_of(pages[mode])
        assert (t.versions, t.visits, t.not_modified, t.data_lease) == (1, 2, 1, first[mode]), mode
        assert CrawlerDownloadData.objects(task=t).count() == 1
        logs = CrawlerDownloadLog.objects(task=t).order_by("id")
        assert [log.status for log in logs] == ["SUCCESS", "SUCCESS"]
        assert logs[1].not_modified == ("same content" if mode == "none" else "HTTP 304")
    changed = task_of(pages["changing"])
    assert (changed.versions, changed.visits, changed.not_modified) == (2, 2, None)
    assert changed.data_lease != first["changing"] and changed.history == [first["changing"]]
    docs = list(CrawlerDownloadData.objects(task=changed).order_by("id"))
    assert [(d.version, bool(d.superseded)) for d in docs] == [(1, True), (2, False)]
    assert bytes(docs[1].response_body) == sample_site.versioned_body(pages["changing"], 2)
    assert CrawlerDownloadLog.objects(task=changed).order_by("-id").first().not_modified is None

    latest = exported("rv")
    assert len(latest) == 4 and {r["version"] for r in latest if r["url"].endswith(pages["changing"])} == {2}
    every = exported("rv", versions="all")
    assert len(every) == 5
    assert sorted(r["version"] for r in every if r["url"].endswith(pages["changing"])) == [1, 2]

    # a third visit: the changed page now answers 304 to its new validators
    assert visit_again(cluster, "rv") == 4
    assert sample_site.ANSWERS[pages["changing"]] == [200, 200, 304]
    assert CrawlerDownloadData.objects(job=Job.objects.get(name="rv")).count() == 5


def test_adaptive_interval_grows_while_unchanged_and_shrinks_on_change(cluster, tmp_path):
    page = first_visit(cluster, tmp_path, "ad", ("etag",), revisit=1.0, revisit_max=4.0)["etag"]
    seen = [task_of(page).revisit_every]
    for _ in range(3):  # unchanged: 1 -> 2 -> 4 -> 4 (the ceiling)
        visit_again(cluster, "ad")
        seen.append(task_of(page).revisit_every)
    assert seen == [1.0, 2.0, 4.0, 4.0]
    sample_site.VERSIONED[page][0] = 2
    visit_again(cluster, "ad")
    t = task_of(page)
    assert (t.revisit_every, t.versions) == (2.0, 2)  # changed: halved
    assert (t.retry_at - t.last_update_datetime).total_seconds() == pytest.approx(2.0, abs=0.01)


PYTHON_CONDITIONAL = '''
import urllib.error
import urllib.request

def download(task):
    prev = task["previous"]
    request = urllib.request.Request(task["url"], headers=(prev or {}).get("headers") or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return {"status_code": resp.status, "headers": dict(resp.headers.items()), "body": resp.read()}
    except urllib.error.HTTPError as exc:
        if exc.code == 304 and prev and prev["version"] == 1 and prev["etag"]:
            return {"status_code": 304}
        raise
'''


def test_python_downloader_gets_the_previous_version_and_may_answer_not_modified(cluster, tmp_path):
    page = first_visit(cluster, tmp_path, "pyrv", ("etag",), kind="python", code=PYTHON_CONDITIONAL,
                       revisit=1.0)["etag"]
    visit_again(cluster, "pyrv")
    t = task_of(page)
    assert sample_site.ANSWERS[page] == [200, 304]
    assert (t.status, t.versions, t.visits, t.not_modified) == ("SUCCESS", 1, 2, 1)
    assert CrawlerDownloadLog.objects(task=t).order_by("-id").first().not_modified == "HTTP 304"




def test_worker_killed_mid_revisit_loses_nothing_and_stores_one_version(fast_recovery, tmp_path):
    cluster = fast_recovery
    pages = first_visit(cluster, tmp_path, "kv", ("etag", "none"), revisit=1.0)
    before = task_of(pages["etag"]).data_lease
    for k in pages.values():
        sample_site.VERSIONED[k][0] = 2
    sample_site.HANG_NEXT.add(pages["etag"])
    wait_for(lambda: due("kv"), what="the revisits to be due")
    assert dispatch_once(cluster.redis).total == 2
    worker = subprocess.Popen([str(BIN / "downcluster"), "worker"], env={**os.environ, **cluster.env},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: sample_site.ANSWERS.get(pages["etag"], [])[-1:] == [0],
                 what="the revisit to hang at the site")
        wait_for(lambda: task_of(pages["none"]).versions == 2, what="the other page's new version")
        os.killpg(worker.pid, signal.SIGKILL)
    finally:
        worker.kill()
        worker.wait()
    hung = task_of(pages["etag"])  # sent without a write: still its latest version to readers
    assert (hung.status, hung.data_lease, hung.versions) == ("SUCCESS", before, 1)
    wait_for(lambda: heartbeats_stale(settings.HEARTBEAT_TTL), what="the killed worker to be judged dead")
    assert dispatch_once(cluster.redis).recovered == 1
    # (killed maybe between the other page's settle and its marks: the release marks it again)
    assert len(exported("kv")) == 2 and len(exported("kv", versions="all")) == 3
    burst_worker(cluster)
    t = task_of(pages["etag"])
    assert (t.status, t.versions, t.recoveries, t.history) == ("SUCCESS", 2, 1, [before])
    docs = list(CrawlerDownloadData.objects(task=t).order_by("id"))
    assert [d.version for d in docs] == [1, 2] and docs[1].lease == t.data_lease
    assert statuses("kv") == {"SUCCESS": 2}
    assert len(exported("kv", versions="all")) == 4 and len(exported("kv")) == 2


def test_history_through_the_api_and_retention_of_old_versions(cluster, tmp_path):
    from datetime import timedelta

    from master.ops import retention
    from tests.web_helpers import WebServer

    page = first_visit(cluster, tmp_path, "hist", ("etag",), revisit=1.0, data_retention_days=1)["etag"]
    for version in (2, 3):
        sample_site.VERSIONED[page][0] = version
        visit_again(cluster, "hist")
    t = task_of(page)
    assert t.versions == 3 and len(t.history) == 2
    token = __import__("tests.helpers", fromlist=["cli"]).cli("token", "create", "an", "--role", "analyst",
                                                                   "--project", "default")
    bearer = token.stdout.strip().splitlines()[-1]
    with WebServer(cluster.env) as web:
        shown = web.call("GET", f"/api/v1/tasks/{t.id}", bearer).json()
        assert [(v["version"], v["latest"]) for v in shown["versions"]] == [(1, False), (2, False), (3, True)]
        assert shown["visits"] == 3 and shown["data_id"] == shown["versions"][-1]["data_id"]
        first = web.call("GET", f"/api/v1/data/{shown['versions'][0]['data_id']}/body", bearer)
        assert first.status_code == 200 and first.content == sample_site.versioned_body(page, 1)
        latest = web.call("GET", "/api/v1/jobs/hist/data", bearer).json()["data"]
        every = web.call("GET", "/api/v1/jobs/hist/data?versions=all", bearer).json()["data"]
        assert [d["version"] for d in latest] == [3] and [d["version"] for d in every] == [1, 2, 3]
        assert web.call("GET", "/api/v1/jobs/hist/data?versions=some", bearer).status_code == 422
        sync = web.call("GET", "/api/v1/jobs/hist/export?format=jsonl&versions=all", bearer)
        assert sync.status_code == 200 and len(sync.text.splitlines()) == 3

    # two days on: the data retention (1 day) removes the earlier versions, never the latest
    report = retention.enforce(now=store_now() + timedelta(days=2))
    t = task_of(page)
    assert report.data == 2 and t.history == [] and t.status == "SUCCESS"
    docs = list(CrawlerDownloadData.objects(task=t))
    assert [(d.version, d.lease) for d in docs] == [(3, t.data_lease)]


def test_turning_revisits_on_makes_the_stored_pages_due_once(cluster, tmp_path):
    pages = first_visit(cluster, tmp_path, "late", ("etag", "none"), priority=5)
    assert all(task_of(k).retry_at is None for k in pages.values())
    register(tmp_path, "late", priority=5, revisit=3600.0)  # the same job, now with revisits
    assert not due("late")  # the registration returned at once: the "revisits" chore's work
    assert dispatch_once(cluster.redis).total == 0  # its chores make them due
    assert visit_again(cluster, "late") == 2
    # stored before revisits: no validators known, the whole page comes; its body is the same
    assert sample_site.ANSWERS[pages["etag"]] == [200, 200]
    for key in pages.values():
        t = task_of(key)
        assert (t.status, t.versions, t.not_modified, t.revisit_every) == ("SUCCESS", None, 1, 3600.0)
        assert t.digest and CrawlerDownloadData.objects(task=t).count() == 1
    assert task_of(pages["etag"]).etag == f'"{pages["etag"]}-v1"'  # learnt: the next visit asks with it
    register(tmp_path, "late", priority=5, revisit=3600.0)  # registering again changes nothing
    assert dispatch_once(cluster.redis).total == 0  # next visits are an hour away


def test_the_requests_engine_asks_conditionally_too(cluster, tmp_path):
    pages = first_visit(cluster, tmp_path, "req", ("etag", "date"), revisit=1.0, download_engine="requests")
    visit_again(cluster, "req")
    for key in pages.values():
        assert sample_site.ANSWERS[key] == [200, 304]
        assert task_of(key).not_modified == 1
