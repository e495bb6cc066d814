"""Running it for months: secrets kept from analysts (the control database), and what an
operator's tools read."""
from __future__ import annotations

import json

import pymongo

from common.store.control_models import ApiToken, ClusterSecret, WebSession
from master import tokens
from tests.helpers import add_urls, burst_worker, cli

SECRET_COLLECTIONS = {"cluster_secret", "api_token", "web_session"}


def test_analysts_databases_hold_no_secret_token_digest_or_session(cluster):
    from common.signing import export_url, key

    secret = tokens.create("ann", "analyst")
    digest = tokens.digest(secret)
    cookie, csrf = tokens.start_session(ApiToken.objects.get(name="ann"))
    link = export_url("6561d2f0a1b2c3d4e5f60718", 60)
    signing_key = key("SECRET_KEY").decode()
    assert "sig=" in link and len(signing_key) == 64
    client = pymongo.MongoClient(cluster.mongo_server.uri("admin"))
    try:
        for name in ("dc_test", "dc_test_log"):  # what analysts are given
            db = client[name]
            assert not SECRET_COLLECTIONS & set(db.list_collection_names()), name
            for collection in db.list_collection_names():
                for doc in db[collection].find():
                    text = json.dumps(doc, default=str)
                    for needle in (secret, digest, tokens.digest(cookie), csrf, signing_key):
                        assert needle not in text, (name, collection)
        control = client["dc_test_control"]  # the one they are never given
        assert SECRET_COLLECTIONS <= set(control.list_collection_names())
        assert control.api_token.find_one({"digest": digest})["name"] == "ann"
    finally:
        client.close()


def test_migrate_moves_an_earlier_clusters_secrets_out_of_the_source(cluster):
    client = pymongo.MongoClient(cluster.mongo_server.uri("admin"))
    try:
        source = client["dc_test"]  # as an earlier version left them
        source.cluster_secret.insert_one({"_id": "SECRET_KEY", "value": "ab" * 32})
        source.api_token.insert_one({"name": "old", "role": "admin", "digest": "cd" * 32})
        source.web_session.insert_one({"_id": "ef" * 32, "token": "cd" * 32, "csrf": "x", "expires_at": None})
        result = cli("migrate")
        assert result.exit_code == 0, result.output
        assert "moved 3 secrets, tokens and sessions" in result.output
        assert not SECRET_COLLECTIONS & set(source.list_collection_names())
        assert ClusterSecret.objects.get(id="SECRET_KEY").value == "ab" * 32
        assert ApiToken.objects.get(name="old").digest == "cd" * 32 and WebSession.objects.count() == 1
        again = cli("migrate")
        assert again.exit_code == 0 and "moved 0 secrets" in again.output
    finally:
        client.close()


# --- retention and archive -------------------------------------------------------------------

def _counts(job) -> dict:
    from common.store.log_models import CrawlerDownloadLog
    from common.store.models import CrawlerDownloadData, CrawlerTask

    db = CrawlerDownloadData._get_collection().database
    return {
        "data": CrawlerDownloadData.objects(job=job).count(),
        "tasks": CrawlerTask.objects(job=job).count(),
        "logs": CrawlerDownloadLog.objects(job=job).count(),
        "gridfs": db["crawler_download_data_fs.files"].count_documents({}),
    }


def test_retention_keeps_by_default_removes_by_job_override_and_ttl_indexes(cluster, tmp_path, monkeypatch):
    from datetime import timedelta

    from common.config import load, settings
    from common.store.clock import utcnow
    from common.store.log_models import CrawlerDispatchLog, NotificationLog
    from common.store.models import CrawlerDownloadSetting, Job, Notification
    from master.ops import retention
    from tests.integration.test_exports import _job_with_pages

    monkeypatch.setenv("DOWNCLUSTER_GRIDFS_THRESHOLD", "1000")  # the ~2 KB pages go to GridFS
    _job_with_pages(cluster, tmp_path, n=3, name="keep")
    _job_with_pages(cluster, tmp_path, n=3, name="short", data_retention_days=1, log_retention_days=1)
    keep, short = Job.objects.get(name="keep"), Job.objects.get(name="short")
    assert CrawlerDownloadSetting.objects.get(job=short).data_retention_days == 1
    before = {"keep": _counts(keep), "short": _counts(short)}
    assert before["keep"]["data"] == 3 and before["keep"]["gridfs"] == 6 and before["short"]["logs"] == 3
    done = Notification(channel="mail", target="a@example.org", event="job.report", state="SUCCESS")
    done.save()
    waiting = Notification(channel="mail", target="b@example.org", event="job.report")
    waiting.save()

    report = retention.enforce(now=utcnow() + timedelta(days=2))  # two days on
    assert report.finished and report.data == 3 and report.tasks == 3 and report.download_logs == 3
    assert _counts(short) == {"data": 0, "tasks": 0, "logs": 0, "gridfs": 3}  # the other job's 3 bodies stay
    from bson import ObjectId

    from common.store import counts
    # nothing of "short" is left below the cutoff (a day from now): its pages begin there now
    assert counts.span(short.id).first.generation_time.replace(tzinfo=None) > utcnow()
    assert counts.span(keep.id).first < ObjectId()
    assert _counts(keep) == {**before["keep"], "gridfs": 3}  # DATA_RETENTION_DAYS 0: for ever; logs: 90 days
    assert Notification.objects.count() == 2  # 30 days for delivered ones
    report = retention.enforce(now=utcnow() + timedelta(days=91))
    assert report.download_logs == 3 and report.notifications == 1 and _counts(keep)["data"] == 3
    assert [n.target for n in Notification.objects] == ["b@example.org"]

    for model in (CrawlerDispatchLog, NotificationLog):  # MongoDB expires these by itself
        ttl = [ix for ix in model._get_collection().list_indexes() if ix.get("expireAfterSeconds")]
        assert [(list(ix["key"]), ix["expireAfterSeconds"]) for ix in ttl] == [(["add_datetime"], 90 * 86400)]
    load(flags=dict(settings.flags, EVENT_LOG_RETENTION_DAYS=0))
    retention.ensure_ttl()
    assert not [ix for ix in NotificationLog._get_collection().list_indexes() if ix.get("expireAfterSeconds")]


def _stored_again(job) -> None:
    """Each page of ``job`` stored again, as a revisit does: its first version becomes an earlier
    one (in the task's ``history``, superseded) and a new document is its latest."""
    from common.store.models import CrawlerDownloadData, CrawlerTask

    data, tasks = CrawlerDownloadData._get_collection(), CrawlerTask._get_collection()
    for task in tasks.find({"job": job.id}):
        first = data.find_one({"task": task["_id"], "lease": task["data_lease"]})
        again = {k: v for k, v in first.items() if k not in ("_id", "response_body_gridfs")}
        data.insert_one({**again, "lease": f"again-{task['_id']}", "response_body": b"v2", "version": 2})
        tasks.update_one({"_id": task["_id"]}, {"$set": {"data_lease": f"again-{task['_id']}",
                                                         "history": [first["lease"]]}})
        data.update_one({"_id": first["_id"]}, {"$set": {"superseded": True}})


def test_archive_saves_then_removes_and_data_export_readers_read_it(cluster, tmp_path, monkeypatch):
    import base64
    import gzip
    from datetime import timedelta

    from common.store.clock import utcnow
    from common.store.models import CrawlerDownloadData, CrawlerTask, Job
    from sample_site import page_body
    from tests.integration.test_exports import _job_with_pages

    monkeypatch.setenv("DOWNCLUSTER_GRIDFS_THRESHOLD", "1000")
    _job_with_pages(cluster, tmp_path, n=3, name="old")
    job = Job.objects.get(name="old")
    _stored_again(job)
    before = _counts(job)
    later = (utcnow() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    nowhere = cli("archive", "old", "--before", later, "-o", str(tmp_path / "no" / "such" / "dir.jsonl.gz"))
    assert nowhere.exit_code != 0 and _counts(job) == before  # no complete archive: nothing removed
    assert cli("archive", "old", "--before", "yesterday").exit_code == 2
    out = tmp_path / "old.jsonl.gz"
    result = cli("archive", "old", "--before", later, "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "archived 3 data documents and 3 download logs" in result.output
    lines = [json.loads(line) for line in gzip.open(out, "rt", encoding="utf-8")]
    data = [r for r in lines if r["kind"] == "data"]
    assert len(data) == 3 and len([r for r in lines if r["kind"] == "download_log"]) == 3
    for record in data:  # the earlier versions, as `data export --format jsonl` writes them, byte-exact
        n = int(record["url"].rsplit("/", 1)[1])
        assert base64.b64decode(record["body_base64"]) == page_body(n) and record["task_id"]
    # each page's latest version stays, however old: the archive never removes a page
    assert _counts(job) == {"data": 3, "tasks": 3, "logs": 0, "gridfs": 0}
    for task in CrawlerTask.objects(job=job):
        kept = CrawlerDownloadData.objects(task=task.id, lease=task.data_lease).count()
        assert task.history == [] and kept == 1
    again = cli("archive", "old", "--before", later, "-o", str(out))
    assert again.exit_code == 2 and "exists" in again.output  # never overwritten


def test_archive_with_tasks_saves_pages_then_removes_them_with_their_tasks(cluster, tmp_path, monkeypatch):
    """`archive --with-tasks`: the final tasks changed before T go to the file with every version of
    their data (read back byte-exact), then leave MongoDB with their data, bodies, logs and keys;
    a task still to download stays, and no task is left naming data that is gone."""
    import base64
    import gzip
    from datetime import timedelta

    from common.store.clock import utcnow
    from common.store.models import CrawlerDownloadData, CrawlerTask, Job
    from sample_site import page_body
    from tests.integration.test_exports import _job_with_pages

    monkeypatch.setenv("DOWNCLUSTER_GRIDFS_THRESHOLD", "1000")  # the first versions' bodies in GridFS
    _job_with_pages(cluster, tmp_path, n=3, name="old")
    job = Job.objects.get(name="old")
    _stored_again(job)  # each page: an earlier version (page_body) and its latest (b"v2")
    add_urls("old", [f"{cluster.site}/page/9"])  # LIVE: not final, stays
    later = (utcnow() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = tmp_path / "old.jsonl.gz"
    result = cli("archive", "old", "--before", later, "--with-tasks", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert "archived 3 final tasks, 6 data documents and 3 download logs" in result.output
    lines = [json.loads(line) for line in gzip.open(out, "rt", encoding="utf-8")]
    tasks = {r["task_id"]: r for r in lines if r["kind"] == "task"}
    assert len(tasks) == 3 and {r["status"] for r in tasks.values()} == {"SUCCESS"}
    bodies: dict[str, list[bytes]] = {}
    for record in (r for r in lines if r["kind"] == "data"):
        bodies.setdefault(record["task_id"], []).append(base64.b64decode(record["body_base64"]))
    assert bodies.keys() == tasks.keys()
    for task_id, got in bodies.items():
        n = int(tasks[task_id]["uri"].rsplit("/", 1)[1])
        assert sorted(got) == sorted([page_body(n), b"v2"])  # both versions, byte-exact
    assert _counts(job) == {"data": 0, "tasks": 1, "logs": 0, "gridfs": 0}
    assert [t.status for t in CrawlerTask.objects(job=job)] == ["LIVE"]
    assert CrawlerDownloadData.objects.count() == 0  # no data without its task, no task naming gone data
    stats = cli("stats", "--json")
    row = next(r for r in json.loads(stats.output)["jobs"] if r["job"] == "old")
    assert row["SUCCESS"] == 0 and row["LIVE"] == 1, row
    assert "added 3" in add_urls("old", [f"{cluster.site}/page/{i}" for i in range(3)])  # their keys went too


# --- metrics, alerts, Sentry -------------------------------------------------------------------

def _samples(text: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_from_two_web_processes_token_or_network(cluster, tmp_path):
    from master.exports import service as exports
    from tests.integration.test_exports import _job_with_pages
    from tests.web_helpers import WebServer

    _job_with_pages(cluster, tmp_path, n=3)
    exports.request(cluster.redis, "j", "csv")
    token = tokens.create("prom", "admin")  # an operator's scraper (others see their projects' jobs)
    with WebServer(cluster.env) as local, WebServer(cluster.env, METRICS_ALLOW="10.0.0.0/8") as closed:
        assert closed.call("GET", "/metrics").status_code == 401
        seen = []
        for web, auth in ((local, None), (closed, token)):
            answer = web.call("GET", "/metrics", auth)
            assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
            seen.append(_samples(answer.text))
    ages = [{k: v for k, v in s.items() if k[0] == "downcluster_queue_oldest_age_seconds"} for s in seen]
    steady = [{k: v for k, v in s.items() if k[0] != "downcluster_queue_oldest_age_seconds"} for s in seen]
    assert steady[0] == steady[1] and ages[0].keys() == ages[1].keys()  # every web process: the same (Redis)
    got = seen[0]
    assert got[("downcluster_pages_total", (("job", "j"), ("outcome", "stored"), ("reason", "")))] == 3
    assert got[("downcluster_tasks", (("job", "j"), ("status", "SUCCESS")))] == 3
    assert got[("downcluster_queue_depth", (("queue", "down_export"),))] == 1
    assert got[("downcluster_exports", (("state", "PENDING"),))] == 1
    assert ("downcluster_workers_alive", ()) in got and ("downcluster_downloads_in_flight", ()) in got
    assert got[("downcluster_hosts_throttled", ())] == 0
    # the sample Grafana dashboard asks only for what a scrape holds
    import re
    from pathlib import Path

    dashboard = json.loads(
        (Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json").read_text()
    )
    used = {
        m
        for p in dashboard["panels"]
        for t in p["targets"]
        for m in re.findall(r"downcluster_\w+", t["expr"])
    }
    assert len(used) >= 8 and used <= {name for name, _ in got}


def test_a_stalled_queue_writes_an_alert_and_mails_the_job_once(cluster, tmp_path, monkeypatch):
    import time as clock

    from common.config import load, settings
    from common.notify import deliver_due
    from common.store.log_models import CrawlerDispatchAlertLog
    from master.dispatch.dispatcher import dispatch_once
    from master.ops import reports
    from master.ops.stalls import check_stalls
    from tests.helpers import add_urls, register
    from tests.receivers import SmtpServer

    register(tmp_path, "st", report_mails="ops@example.org")
    add_urls("st", [f"{cluster.site}/page/{i}" for i in range(3)])
    load(flags=dict(settings.flags, QUEUE_STALL_ALERT=1))
    dispatch_once(cluster.redis)  # entries wait; no worker runs (the run notes each queue's head)
    end, stalled = clock.monotonic() + 30, []
    with SmtpServer() as smtp:
        load(flags=dict(settings.flags, SMTP_URL=smtp.url))
        while clock.monotonic() < end and not stalled:  # until the head has waited, unmoved, past the limit
            stalled = check_stalls(cluster.redis)
            clock.sleep(0.1)
        assert stalled == ["down_low"]
        assert check_stalls(cluster.redis) == []  # told once per period
        alert = CrawlerDispatchAlertLog.objects.get(type="queue_stall")
        assert "down_low has not drained" in alert.reason and alert.content_bytes == len(
            alert.reason.encode()
        )
        assert reports.send_reports() == 1
        deliver_due()
        assert [m["To"] for m in smtp.messages] == ["ops@example.org"]
        assert "has not drained" in smtp.messages[0].get_payload(decode=True).decode()


def test_cli_processes_and_dispatcher_housekeeping_report_to_sentry_scrubbed(cluster, monkeypatch):
    import sentry_sdk

    from common.sentry import init_sentry
    from master.dispatch.dispatcher import dispatch_once
    from master.ops import reports, stats
    from tests.integration.test_sentry_scrubbing import PROXY, Recording, _leaks

    transport = Recording()
    init_sentry("", transport=transport)
    try:
        def broken(*a, **kw):
            raise RuntimeError(f"store said no via {PROXY}")

        monkeypatch.setattr(reports, "send_reports", broken)
        dispatch_once(cluster.redis)  # the run goes on; the failure is reported
        monkeypatch.setattr(stats, "collect", broken)
        try:
            cli("stats")
        except RuntimeError:
            pass
        sentry_sdk.flush()
        blob = json.dumps(transport.events(), default=str)
        assert blob.count("store said no") >= 2 and _leaks(blob) == []
    finally:
        sentry_sdk.init(dsn=None)


# --- administration ------------------------------------------------------------------------------

def test_a_disabled_language_refuses_jobs_and_fails_its_tasks(cluster, tmp_path):
    from common.store.models import CrawlerTask
    from master.dispatch.dispatcher import dispatch_once
    from tests.helpers import add_urls, register, write_job

    code = "def download(task):\n    return {'status_code': 200, 'headers': {}, 'body': b'ok'}\n"
    register(tmp_path, "py", kind="python", code=code)
    assert "python" in cli("type", "list").output
    result = cli("type", "disable", "python")
    assert result.exit_code == 0 and "1 job(s) use it" in result.output
    refused = cli("job", "register", str(write_job(tmp_path, "py2", kind="python", code=code)))
    assert refused.exit_code == 2 and "not supported" in refused.output
    add_urls("py", [f"{cluster.site}/page/1"])
    dispatch_once(cluster.redis)
    burst_worker(cluster, "--no-exports")
    task = CrawlerTask.objects.get()
    assert task.status == "FAIL" and task.retry_at is None and "python is disabled" in task.failed_reason
    assert cli("type", "disable", "cobol").exit_code == 2
    assert cli("type", "enable", "python").exit_code == 0
    assert cli("job", "register", str(write_job(tmp_path, "py2", kind="python", code=code))).exit_code == 0


def test_task_show_by_url_or_id_cli_and_api(cluster, tmp_path):
    from common.store.models import CrawlerTask
    from tests.integration.test_exports import _job_with_pages
    from tests.web_helpers import WebServer

    _job_with_pages(cluster, tmp_path, n=2)
    url = f"{cluster.site}/page/1"
    task = CrawlerTask.objects.get(uri=url)
    by_url = json.loads(cli("task", "show", "j", url, "--json").output)
    by_id = json.loads(cli("task", "show", "j", str(task.id), "--json").output)
    assert by_url == by_id and by_url["status"] == "SUCCESS" and by_url["attempts"] == 1
    assert by_url["data_id"] and [log["status"] for log in by_url["download_logs"]] == ["SUCCESS"]
    assert cli("task", "show", "j", "http://nowhere.example/").exit_code == 2
    from common.store.projects import default_id

    token = tokens.create("ann", "analyst", [default_id()])
    with WebServer(cluster.env) as web:
        assert web.call("GET", f"/api/v1/tasks/{task.id}", token).json() == by_id
        assert web.call("GET", "/api/v1/jobs/j/tasks/lookup", token, params={"url": url}).json() == by_id
        assert web.call("GET", "/api/v1/tasks/6561d2f0a1b2c3d4e5f60718", token).status_code == 404
        assert web.call("GET", "/api/v1/types", token).json()["types"][0]["language"] == "none"
        assert web.call("POST", "/api/v1/types/shell/disable", token).status_code == 403


def test_shell_downloaders_get_the_jobs_proxy_and_cookie_in_their_environment(cluster, tmp_path, caplog):
    from common.store.log_models import CrawlerDownloadLog
    from common.store.models import CrawlerDownloadData, CrawlerTask
    from master.dispatch.dispatcher import dispatch_once
    from tests.helpers import add_urls, register

    proxy, cookie = "http://alice:hunter2pw@127.0.0.1:9", "sid=cookie-secret-123"
    code = 'printf "%s|%s|%s|%s" "$DOWNLOAD_PROXY" "$DOWNLOAD_COOKIE" "$https_proxy" "$1"\n'
    register(tmp_path, "sh", kind="shell", code=code, proxy=proxy, cookie=cookie)
    failing = 'echo "proxy $DOWNLOAD_PROXY cookie $DOWNLOAD_COOKIE" >&2; exit 3\n'
    register(tmp_path, "shfail", kind="shell", code=failing, proxy=proxy, cookie=cookie, max_retry_times=1)
    add_urls("sh", ["http://example.invalid/a"])
    add_urls("shfail", ["http://example.invalid/b"])
    dispatch_once(cluster.redis)
    burst_worker(cluster, "--no-exports")
    data = CrawlerDownloadData.objects.get()
    assert bytes(data.response_body).decode() == f"{proxy}|{cookie}|{proxy}|http://example.invalid/a"
    failed = CrawlerTask.objects.get(uri="http://example.invalid/b")
    text = failed.failed_reason + CrawlerDownloadLog.objects.get(task=failed).failed_reason
    assert failed.status == "FAIL" and "hunter2pw" not in text and "cookie-secret-123" not in text



def test_a_deep_backlog_that_workers_take_from_is_not_a_stall(cluster, tmp_path, monkeypatch):
    import time as clock

    from rq import Queue

    from common.config import load, settings
    from master.dispatch.dispatcher import dispatch_once
    from master.ops import stats
    from master.ops.stalls import check_stalls
    from tests.helpers import add_urls, register

    register(tmp_path, "deep")
    add_urls("deep", [f"{cluster.site}/page/{i}" for i in range(3)])
    load(flags=dict(settings.flags, QUEUE_STALL_ALERT=1))
    load(flags=dict(settings.flags, DISPATCH_BATCH_SIZE=1))
    dispatch_once(cluster.redis)  # three entries; the run notes the head
    end = clock.monotonic() + 30
    while clock.monotonic() < end and not any(
        (q["oldest_age_s"] or 0) > 1.5 for q in stats.queue_stats(cluster.redis)
    ):
        clock.sleep(0.1)
    Queue("down_low", connection=cluster.redis).pop_job_id()  # a worker takes the head
    assert check_stalls(cluster.redis) == []  # old entries, but the queue moves


def test_a_bad_metrics_network_stops_the_web_at_start_with_one_line(cluster, monkeypatch):
    from common.config import load, settings

    load(flags=dict(settings.flags, METRICS_ALLOW="10.0.0.0/8,nonsense"))
    result = cli("web", "--bind", "127.0.0.1:1")
    assert result.exit_code == 2 and "METRICS_ALLOW: 'nonsense' is not a network" in result.output


def test_retention_and_archive_take_dates_beyond_what_an_objectid_holds(cluster, tmp_path):
    from common.store.models import CrawlerDownloadData, Job
    from master.ops import retention
    from tests.integration.test_exports import _job_with_pages

    _job_with_pages(
        cluster, tmp_path, n=2, name="century", data_retention_days=36_500, log_retention_days=36_500
    )
    report = retention.enforce()  # a cutoff in 1926: nothing is that old
    assert (
        report.finished
        and report.data == report.download_logs == 0
        and CrawlerDownloadData.objects.count() == 2
    )
    _stored_again(Job.objects.get(name="century"))
    result = cli(
        "archive", "century", "--before", "9999-12-31T23:59:59Z", "-o", str(tmp_path / "all.jsonl.gz")
    )
    assert result.exit_code == 0, result.output
    assert "archived 2 data documents" in result.output and CrawlerDownloadData.objects.count() == 2


def test_every_date_option_of_the_command_line_takes_a_plain_date_as_its_midnight_utc(cluster, tmp_path):
    from datetime import timedelta

    from common.store.clock import utcnow
    from common.store.log_models import CrawlerDownloadLog
    from tests.integration.test_exports import _job_with_pages

    _job_with_pages(cluster, tmp_path, n=2, name="dated")
    today = utcnow().date()
    tomorrow = today + timedelta(days=1)

    def exported(*options: str) -> int:
        result = cli("data", "export", "dated", "--format", "jsonl", *options)
        assert result.exit_code == 0, result.output
        return len(result.output.splitlines())

    assert exported("--since", today.isoformat()) == 2  # stored after today's midnight
    assert exported("--until", today.isoformat()) == 0
    assert exported("--since", f"{today.isoformat()}T00:00:00Z", "--until", tomorrow.isoformat()) == 2
    refusals = (("2026-13-01", "is not a date-time"), ("23.11.2026", "or 2026-11-01"),
                ("yesterday", "RFC 3339"))
    for bad, why in refusals:
        refused = cli("data", "export", "dated", "--since", bad)
        assert refused.exit_code == 2 and why in refused.output, refused.output
    archived = cli("archive", "dated", "--before", tomorrow.isoformat(), "-o", str(tmp_path / "a.jsonl.gz"))
    assert archived.exit_code == 0, archived.output
    assert "2 download logs" in archived.output and CrawlerDownloadLog.objects.count() == 0
    assert (tmp_path / "a.jsonl.gz").exists()
    plain = cli("archive", "dated", "--before", "2026-11-23", "-o", str(tmp_path / "b.jsonl.gz"))
    assert plain.exit_code == 0, plain.output


def test_stats_counts_a_page_out_for_a_revisit_once(cluster, tmp_path):
    from common.store import counts
    from common.store.clock import utcnow
    from common.store.models import CrawlerLease, CrawlerTask
    from master.dispatch.dispatcher import dispatch_once
    from master.ops import stats
    from tests.helpers import add_urls, register

    job = register(tmp_path, "again", revisit=3600.0, obey_robots=False)
    due = utcnow()
    CrawlerTask._get_collection().insert_many([
        {"job": job.id, "uri": f"{cluster.site}/page/{i}", "seq": i + 1, "status": "SUCCESS",
         "data_lease": f"l{i}", "retry_at": due, "download_times": 1, "add_datetime": due,
         "last_update_datetime": due} for i in range(3)])
    counts.recount()
    add_urls("again", [f"{cluster.site}/page/new"])  # a fresh one too: LIVE, and out once sent
    dispatch_once(cluster.redis)
    kinds = sorted(d["kind"] for d in CrawlerLease._get_collection().find({"job": job.id}))
    assert kinds == ["FRESH", "REVISIT"]
    row = {r["job"]: r for r in stats.task_counts()}["again"]
    assert (row["SUCCESS"], row["LIVE"], row["queued"], row["running"]) == (3, 1, 1, 0), row


def test_data_export_and_the_archive_write_a_document_alike_times_in_one_shape(cluster, tmp_path):
    import gzip
    import re
    from datetime import datetime

    from common.store.models import CrawlerDownloadData, Job
    from tests.integration.test_exports import _job_with_pages

    _job_with_pages(cluster, tmp_path, n=2, name="alike")
    job = Job.objects.get(name="alike")
    _stored_again(job)
    data = CrawlerDownloadData._get_collection()
    firsts = sorted(d["_id"] for d in data.find({"job": job.id, "superseded": True}))
    data.update_one({"_id": firsts[0]}, {"$set": {"add_datetime": datetime(2026, 11, 23, 8, 0, 5)}})
    data.update_one({"_id": firsts[1]}, {"$set": {"add_datetime": datetime(2026, 11, 23, 8, 0, 5, 120000)}})
    exported = cli("data", "export", "alike", "--format", "jsonl", "--versions", "all")
    assert exported.exit_code == 0, exported.output
    by_url = {}
    for line in exported.output.splitlines():
        record = json.loads(line)
        by_url.setdefault(record["url"], []).append(record)
    assert cli("archive", "alike", "--before", "2100-01-01", "-o", str(tmp_path / "a.gz")).exit_code == 0
    archived = [json.loads(line) for line in gzip.open(tmp_path / "a.gz", "rt", encoding="utf-8")]
    times = []
    for record in archived:
        times.append(record["add_datetime"])
        if record.pop("kind") == "data":  # the earlier version, as `data export` wrote it
            assert record == by_url[record["url"]][0]
    assert {"2026-11-23T08:00:05.000Z", "2026-11-23T08:00:05.120Z"} <= set(times)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", t) for t in times), times
