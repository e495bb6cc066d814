"""The export center: templates and files (openpyxl reads the xlsx), de-duplication, retries,
signed links served by `downcluster web`, webhooks to a real receiver, mails to a real SMTP
server (aiosmtpd), report mails, a worker killed mid-export."""
from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import requests
from bson import ObjectId

from common.config import load, settings
from common.errors import ValidationError
from common.store.clock import store_now, utcnow
from common.store.log_models import NotificationLog
from common.store.models import CrawlerDownloadData, CrawlerTask, Export, Job, Notification
from master.dispatch.dispatcher import dispatch_once
from master.exports import service as exports
from sample_site import page_body
from slave.exporter import run_export
from tests.helpers import TEMPLATE, add_urls, burst_worker, cli, register, wait_for
from tests.receivers import SmtpServer, WebhookReceiver
from tests.web_helpers import WebServer

BIN = Path(sys.executable).parent


# --- with the cluster ----------------------------------------------------------------------

def _job_with_pages(cluster, tmp_path, n=3, name="j", **kw):
    register(tmp_path, name, **kw)
    add_urls(name, [f"{cluster.site}/page/{i}" for i in range(n)])
    assert dispatch_once(cluster.redis).total == n
    burst_worker(cluster, "--no-exports")


def _file(export_id) -> bytes:
    from gridfs import GridFSBucket

    export = Export.objects.get(id=export_id)
    return (
        GridFSBucket(Export._get_collection().database, "export_fs")
        .open_download_stream(export.file_id)
        .read()
    )


def test_xlsx_with_template_has_merged_group_headers_and_typed_cells(cluster, tmp_path):
    import openpyxl

    _job_with_pages(cluster, tmp_path)
    got = exports.request(cluster.redis, "j", "xlsx", TEMPLATE)
    assert run_export(str(got.export.id), "w1") == "success"
    export = Export.objects.get(id=got.export.id)
    assert export.state == "SUCCESS" and export.rows_done == export.rows_total == 3 and export.bytes > 0
    book = openpyxl.load_workbook(io.BytesIO(_file(export.id)))
    sheet = book["pages"]
    assert {str(r) for r in sheet.merged_cells.ranges} == {"B1:C1"}
    assert [c.value for c in sheet[1]][:2] == ["Request", "Response"] and sheet["D1"].value == "Fetched"
    assert [c.value for c in sheet[2]] == ["URL", "Status", "Size", "At"]
    urls = {sheet.cell(row=r, column=1).value: r for r in range(3, 6)}
    row = urls[f"{cluster.site}/page/1"]
    assert sheet.cell(row=row, column=2).value == 200
    assert sheet.cell(row=row, column=3).value == len(page_body(1))
    stamp = sheet.cell(row=row, column=4)
    assert isinstance(stamp.value, datetime) and stamp.number_format == "yyyy-mm-dd hh:mm:ss"
    assert abs(stamp.value - utcnow()) < timedelta(minutes=5)


def test_csv_and_jsonl_default_and_template(cluster, tmp_path):
    _job_with_pages(cluster, tmp_path)
    csv_id = exports.request(cluster.redis, "j", "csv", TEMPLATE).export.id
    jsonl_id = exports.request(cluster.redis, "j", "jsonl").export.id
    for export_id in (csv_id, jsonl_id):
        assert run_export(str(export_id), "w1") == "success"
    rows = list(csv.reader(io.StringIO(_file(csv_id).decode())))
    assert rows[0] == ["URL", "Status", "Size", "At"] and len(rows) == 4  # one header row: the last
    records = [json.loads(line) for line in _file(jsonl_id).decode().splitlines()]
    assert len(records) == 3 and set(records[0]) == {
        "url",
        "status_code",
        "response_size",
        "body_text",
        "body_sha256",
        "encoding",
        "response_headers",
        "remote_ip",
        "hostname",
        "task",
        "add_datetime",
    }
    one = next(r for r in records if r["url"].endswith("/page/2"))
    assert one["encoding"] == "utf-8" and one["response_headers"]["Content-Type"].startswith("text/html")
    assert one["body_text"].encode() == page_body(2)
    assert one["body_sha256"] == hashlib.sha256(page_body(2)).hexdigest()


def test_identical_requests_are_deduplicated(cluster, tmp_path):
    register(tmp_path, "j")
    first = exports.request(cluster.redis, "j", "csv", TEMPLATE, {"status": [200]})
    again = exports.request(cluster.redis, "j", "csv", TEMPLATE.replace("\n", "\n\n"), {"status": ["200"]})
    assert not first.deduplicated and again.deduplicated and again.export.id == first.export.id
    other = exports.request(cluster.redis, "j", "csv", TEMPLATE, {"status": [404]})
    assert not other.deduplicated
    assert run_export(str(first.export.id), "w1") == "success"
    assert exports.request(
        cluster.redis, "j", "csv", TEMPLATE, {"status": [200]}
    ).deduplicated  # fresh SUCCESS
    load(flags=dict(settings.flags, EXPORT_DEDUP_WINDOW=0))
    assert not exports.request(cluster.redis, "j", "csv", TEMPLATE, {"status": [200]}).deduplicated
    assert Export.objects.count() == 3


def test_bad_requests_store_nothing(cluster, tmp_path):
    register(tmp_path, "j")
    for kw, why in [
        ({"fmt": "pdf"}, "format"),
        ({"template": "x = ["}, "TOML"),
        ({"callback_url": "ftp://x/"}, "http"),
        ({"callback_url": "http://127.0.0.1:9/x"}, "not a public address"),
        ({"mails": ["not-a-mail"]}, "e-mail"),
        ({"flt": {"status": ["teapot"]}}, "status"),
    ]:
        args = {"fmt": "csv", **kw}
        with pytest.raises(ValidationError) as err:
            exports.request(cluster.redis, "j", args.pop("fmt"), **args)
        assert why in str(err.value)
    assert Export.objects.count() == 0
    result = cli("export", "request", "nope", "--format", "csv")
    assert result.exit_code == 2 and "no job named" in result.output


def test_failed_attempts_are_retried_then_fail_with_a_signed_webhook(cluster, tmp_path):
    load(flags=dict(settings.flags, EXPORT_MAX_RETRIES=2, EXPORT_RETRY_DELAY=0, WEBHOOK_ALLOW_PRIVATE=True,
                    WEBHOOK_SECRET="whsec"))
    register(tmp_path, "j")
    with WebhookReceiver() as hook:
        export_id = str(exports.request(cluster.redis, "j", "csv", callback_url=hook.url).export.id)
        Job.objects(name="j").delete()  # the job vanished: every attempt fails
        assert run_export(export_id, "w1") == "retry"
        assert Export.objects.get(id=export_id).state == "PENDING"
        cluster.redis.delete("rq:queue:down_export", "rq:job:dcx-" + export_id)  # as if the entry were lost
        assert exports.tend(cluster.redis).sent == 1  # due again: sent again
        assert cluster.redis.lrange("rq:queue:down_export", 0, -1) == [b"dcx-" + export_id.encode()]
        assert run_export(export_id, "w1") == "failed"
        export = Export.objects.get(id=export_id)
        assert export.state == "FAIL" and export.attempts == 2 and "no longer exists" in export.error
        assert len(hook.received) == 1
        headers, body = hook.received[0]
        payload = json.loads(body)
        assert payload == {
            "event": "export.failed",
            "id": export_id,
            "job": "j",
            "state": "FAIL",
            "rows": 0,
            "url": None,
        }
        assert headers["x-downcluster-event"] == "export.failed"
        t, v1 = (part.split("=", 1)[1] for part in headers["x-downcluster-signature"].split(","))
        assert hmac.compare_digest(
            v1, hmac.new(b"whsec", f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        )
        assert abs(int(t) - time.time()) < 60


def test_webhook_retries_after_500s_and_gives_up_on_a_dead_receiver(cluster, tmp_path):
    from common.notify import deliver_due, queue_webhook

    load(flags=dict(settings.flags, WEBHOOK_ALLOW_PRIVATE=True, WEBHOOK_MAX_ATTEMPTS=3))
    with WebhookReceiver([500, 503]) as hook:
        queue_webhook(hook.url, "export.succeeded", {"id": "x"})
        for _ in range(3):
            deliver_due()
            Notification._get_collection().update_many(
                {}, {"$set": {"next_at": utcnow()}}
            )  # skip the backoff wait
        assert len(hook.received) == 3
    logs = [(entry.status, entry.error) for entry in NotificationLog.objects.order_by("add_datetime")]
    assert [s for s, _ in logs] == ["FAIL", "FAIL", "SENT"] and "HTTP 500" in logs[0][1]
    assert all("receiver-secret" not in (entry.target or "") for entry in NotificationLog.objects)
    assert Notification.objects.get().state == "SUCCESS"
    first = NotificationLog.objects.order_by("add_datetime").first()
    assert first.target.startswith("http://127.0.0.1:") and first.target.endswith("/hook")

    Notification.objects.delete()
    NotificationLog.objects.delete()
    queue_webhook(hook.url, "export.succeeded", {"id": "y"})  # the receiver is shut down now
    for _ in range(5):
        deliver_due()
        Notification._get_collection().update_many({"state": "PENDING"}, {"$set": {"next_at": utcnow()}})
    assert Notification.objects.get().state == "FAIL" and NotificationLog.objects.count() == 3
    first_delay = None
    queue_webhook(hook.url, "export.succeeded", {"id": "z"})
    deliver_due()
    pending = Notification.objects.get(state="PENDING")
    first_delay = (pending.next_at - utcnow()).total_seconds()
    assert 0 < first_delay <= 60  # the first retry within a minute


def test_export_mail_and_signed_link_served_by_web(cluster, tmp_path):
    with SmtpServer() as smtp:
        env = {**cluster.env, "DOWNCLUSTER_SMTP_URL": smtp.url, "DOWNCLUSTER_SECRET_KEY": "s3cret",
               "DOWNCLUSTER_MAIL_FROM": "dc@example.org"}
        load(flags=dict(settings.flags, SMTP_URL=smtp.url, SECRET_KEY="s3cret", MAIL_FROM="dc@example.org"))
        _job_with_pages(cluster, tmp_path, cookie="sid=do-not-leak")
        with WebServer(env) as web:
            load(flags=dict(settings.flags, WEB_BIND=f"127.0.0.1:{web.port}"))
            export_id = str(exports.request(cluster.redis, "j", "csv", mails=["ann@example.org"]).export.id)
            assert run_export(export_id, "w1") == "success"
            assert len(smtp.messages) == 1
            msg = smtp.messages[0]
            assert (
                msg["To"] == "ann@example.org"
                and msg["From"] == "dc@example.org"
                and "SUCCESS" in msg["Subject"]
            )
            text = msg.get_payload(decode=True).decode()
            assert "do-not-leak" not in text and "Rows: 3" in text
            url = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Download"))
            got = requests.get(url, timeout=10)
            assert got.status_code == 200 and got.content == _file(export_id)
            assert f'filename="j-{export_id}.csv"' in got.headers["content-disposition"]
            assert requests.get(url.replace("sig=", "sig=0"), timeout=10).status_code == 403
            assert requests.get(url[:-1] + ("0" if url[-1] != "0" else "1"), timeout=10).status_code == 403
            assert requests.get(url.replace(export_id, str(ObjectId())), timeout=10).status_code == 403
            short = cli("export", "url", export_id, "--ttl", "1").stdout.strip().splitlines()[-1]
            wait_for(lambda: requests.get(short, timeout=10).status_code == 410, what="a 1 s link to expire")
            Export._get_collection().update_one(
                {"_id": ObjectId(export_id)}, {"$set": {"expires_at": utcnow()}}
            )
            assert exports.tend(cluster.redis).expired == 1
            assert requests.get(url, timeout=10).status_code == 410
            db = Export._get_collection().database
            assert (
                db["export_fs.files"].count_documents({}) == 0
                and db["export_fs.chunks"].count_documents({}) == 0
            )
            other = str(exports.request(cluster.redis, "j", "jsonl").export.id)
            cli("export", "cancel", other)
            from common.signing import export_url

            assert requests.get(export_url(other), timeout=10).status_code == 410


def test_api_exports_for_analysts(cluster, tmp_path):
    from tests.integration.test_web_api import new_token

    register(tmp_path, "j")
    token = new_token("ann", "analyst")
    with WebServer(cluster.env) as web:
        r = web.call(
            "POST",
            "/api/v1/exports",
            token,
            json={"job": "j", "format": "xlsx", "template": TEMPLATE, "filter": {"status": [200]}},
        )
        assert r.status_code == 202 and r.json()["deduplicated"] is False and r.json()["state"] == "PENDING"
        again = web.call(
            "POST",
            "/api/v1/exports",
            token,
            json={"job": "j", "format": "xlsx", "template": TEMPLATE, "filter": {"status": [200.0]}},
        ).json()
        assert (
            again["deduplicated"] is True and again["id"] == r.json()["id"]
        )  # JSON's 200.0 is the integer 200
        as_text = web.call("POST", "/api/v1/exports", token, json={"job": "j", "format": "xlsx",
                                                                   "filter": {"status": ["200"]}})
        assert as_text.status_code == 422  # the description says integer
        assert run_export(r.json()["id"], "w1") == "success"
        shown = web.call("GET", f"/api/v1/exports/{r.json()['id']}", token).json()
        assert shown["state"] == "SUCCESS" and shown["rows_done"] == 0 and shown["url"].startswith("http://")
        assert {"id", "state", "rows_done", "rows_total", "bytes", "url", "error"} <= set(shown)
        bad = web.call(
            "POST",
            "/api/v1/exports",
            token,
            json={"job": "j", "format": "csv", "template": "[[columns]]\nfield='x'\n"},
        )
        assert bad.status_code == 422 and "unknown field" in bad.json()["error"]
        assert (
            web.call("POST", "/api/v1/exports", token, json={"job": {"$ne": ""}, "format": "csv"}).status_code
            == 422
        )
        assert web.call("GET", "/api/v1/exports/nope", token).status_code == 422  # not an id
        assert web.call("GET", "/api/v1/exports/6561d2f0a1b2c3d4e5f60718", token).status_code == 404
        assert web.call("GET", "/api/v1/exports", token).json()["exports"][0]["id"] == r.json()["id"]
    assert Export.objects.count() == 1


def test_report_mails_summary_once_per_drain_and_rate_limited_alerts(cluster, tmp_path):
    with SmtpServer() as smtp:
        load(flags=dict(settings.flags, SMTP_URL=smtp.url))
        register(tmp_path, "j", report_mails="ops@example.org", cookie="sid=do-not-leak")
        add_urls("j", [f"{cluster.site}/page/1", f"{cluster.site}/status/404"])
        dispatch_once(cluster.redis)
        assert smtp.messages == []  # not drained yet
        worker = subprocess.run(
            [str(BIN / "downcluster"), "worker", "--burst", "--no-exports"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **cluster.env},
        )
        assert worker.returncode == 0
        dispatch_once(cluster.redis)
        assert [m["Subject"] for m in smtp.messages] == ["downcluster: job j drained, success 50.0%"]
        text = smtp.messages[0].get_payload(decode=True).decode()
        assert "SUCCESS  1" in text and "FAIL     1" in text and "404" in text and "Time span" in text
        assert "do-not-leak" not in text
        dispatch_once(cluster.redis)
        assert len(smtp.messages) == 1  # once per drain
        task = CrawlerTask.objects(uri=f"{cluster.site}/status/404").get()
        CrawlerTask._get_collection().update_one(
            {"_id": task.id}, {"$set": {"status": "DEAD", "last_update_datetime": utcnow()}}
        )
        dispatch_once(cluster.redis)
        subjects = [m["Subject"] for m in smtp.messages]
        assert "downcluster alert: job j" in subjects
        alert_count = subjects.count("downcluster alert: job j")
        CrawlerTask._get_collection().update_one(
            {"_id": task.id}, {"$set": {"last_update_datetime": utcnow()}}
        )
        dispatch_once(cluster.redis)
        assert [m["Subject"] for m in smtp.messages].count(
            "downcluster alert: job j"
        ) == alert_count  # within the hour


@pytest.mark.slow
def test_a_worker_killed_mid_export_is_recovered_and_succeeds_once(cluster, tmp_path):
    register(tmp_path, "big")
    job = Job.objects.get(name="big")
    body = b"<p>" + b"x" * 4000 + b"</p>"
    tasks = [
        {
            "_id": ObjectId(),
            "job": job.id,
            "uri": f"http://127.0.0.1/{i}",
            "status": "SUCCESS",
            "data_lease": "l",
        }
        for i in range(20000)
    ]
    docs = [{"_id": ObjectId(), "job": job.id, "task": t["_id"], "lease": "l", "url": t["uri"],
             "status_code": 200, "response_body": body, "encoding": "utf-8", "add_datetime": utcnow()}
            for t in tasks]
    for i in range(0, len(docs), 5000):
        CrawlerTask._get_collection().insert_many(tasks[i:i + 5000])
        CrawlerDownloadData._get_collection().insert_many(docs[i:i + 5000])
    export_id = str(exports.request(cluster.redis, "big", "csv").export.id)
    env = {
        **os.environ,
        **cluster.env,
        "DOWNCLUSTER_HEARTBEAT_INTERVAL": "1",
        "DOWNCLUSTER_HEARTBEAT_TTL": "3",
    }
    worker = subprocess.Popen([str(BIN / "downcluster"), "worker"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(
            lambda: (Export.objects.get(id=export_id).rows_done or 0) >= 5000, what="the export to start"
        )
        # rq sees the export lane's work as it sees downloads: an execution of the worker
        from rq import Worker
        from rq.job import Job as RqJob
        from rq.registry import StartedJobRegistry

        assert StartedJobRegistry("down_export", connection=cluster.redis).get_job_ids() == [
            "dcx-" + export_id
        ]
        (rq_worker,) = Worker.all(connection=cluster.redis)
        entry = RqJob.fetch("dcx-" + export_id, connection=cluster.redis)
        assert entry.get_status() == "started" and entry.worker_name == rq_worker.name
        assert "down_export" in rq_worker.queue_names()
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
    first = Export.objects.get(id=export_id)
    db = Export._get_collection().database
    assert (
        first.state == "RUNNING" and db["export_fs.chunks"].count_documents({"files_id": first.file_id}) > 0
    )
    assert db["export_fs.files"].count_documents({}) == 0  # a partial upload: chunks without a file
    load(flags=dict(settings.flags, HEARTBEAT_TTL=3))
    wait_for(lambda: store_now() - Export.objects.get(id=export_id).beat_at > timedelta(seconds=3),
             what="the dead worker's last beat to be older than HEARTBEAT_TTL")
    dispatch_once(cluster.redis)  # the defender's share: recovered, partial chunks removed, sent again
    again = Export.objects.get(id=export_id)
    assert again.state == "PENDING" and again.recoveries == 1
    assert db["export_fs.chunks"].count_documents({}) == 0
    rerun = subprocess.run(
        [str(BIN / "downcluster"), "worker", "--burst"], env=env, capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    done = Export.objects.get(id=export_id)
    assert done.state == "SUCCESS" and done.rows_done == 20000 and done.attempts == 2
    files = list(db["export_fs.files"].find())
    assert len(files) == 1 and files[0]["_id"] == done.file_id
    assert db["export_fs.chunks"].count_documents({"files_id": {"$ne": done.file_id}}) == 0
    lines = _file(export_id).decode().splitlines()
    assert len(lines) == 20001 and len({row.split(",")[0] for row in lines[1:]}) == 20000
