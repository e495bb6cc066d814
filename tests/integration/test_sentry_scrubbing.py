"""Exceptions reach Sentry (sentry-sdk's RQ integration, a local recording transport) with
proxy credentials, cookies and authorization scrubbed; failure reasons and logs too."""
from __future__ import annotations

import json
import logging

import sentry_sdk
from rq import Queue, SimpleWorker
from sentry_sdk.transport import Transport

from common.secrets import install_logging_filter, remember
from common.sentry import init_sentry
from common.store.log_models import CrawlerDownloadLog
from common.store.models import CrawlerTask
from master.dispatch.dispatcher import dispatch_once
from tests.helpers import add_urls, register

PROXY = "http://alice:hunter2pw@127.0.0.1:9"
COOKIE = "sid=cookie-secret-123"


class Recording(Transport):
    def __init__(self, options=None):
        super().__init__(options)
        self.envelopes = []

    def capture_envelope(self, envelope):
        self.envelopes.append(envelope)

    def events(self) -> list[dict]:
        return [item.payload.json for env in self.envelopes for item in env.items if item.payload.json]


def _leaks(text: str) -> list[str]:
    return [s for s in ("hunter2pw", "cookie-secret-123", "tok-abcdef") if s in text]


def test_rq_exception_reaches_sentry_scrubbed(cluster):
    transport = Recording()
    remember(COOKIE)
    init_sentry("", transport=transport)
    try:
        queue = Queue("down_high", connection=cluster.redis)
        queue.enqueue("tests.sentry_target.boom", PROXY, COOKIE)
        SimpleWorker([queue], connection=cluster.redis).work(burst=True)
        sentry_sdk.flush()
        events = transport.events()
        assert events, "no event reached the transport"
        blob = json.dumps(events, default=str)
        assert "RuntimeError" in blob and "boom" in blob
        assert _leaks(blob) == []
    finally:
        sentry_sdk.init(dsn=None)


def test_failed_reason_and_logs_hide_proxy_credentials(cluster, tmp_path, caplog):
    install_logging_filter()
    register(tmp_path, "px", priority=0, proxy=PROXY, cookie=COOKIE, max_retry_times=1)
    add_urls("px", [f"{cluster.site}/page/1"])
    dispatch_once(cluster.redis)
    with caplog.at_level(logging.DEBUG):
        SimpleWorker(
            [Queue("down_high", connection=cluster.redis)], connection=cluster.redis, serializer="json"
        ).work(burst=True)
        logging.getLogger("x").warning("proxy was %s", PROXY)
    task = CrawlerTask.objects.get()
    assert task.status == "FAIL" and task.failed_reason
    log = CrawlerDownloadLog.objects.get(task=task)
    assert _leaks(task.failed_reason + log.failed_reason) == []
    assert _leaks(caplog.text) == []


def test_a_failing_entry_reaches_sentry_once(cluster, tmp_path, monkeypatch):
    """Issue 13, item 15: the job function does not capture what rq's integration captures."""
    from slave.worker import runner
    from tests.helpers import register as register_job

    def broken(lease):
        raise RuntimeError("entry exploded")

    transport = Recording()
    init_sentry("", transport=transport)
    try:
        register_job(tmp_path, "once", priority=0)
        add_urls("once", ["http://127.0.0.1:9/x"])
        dispatch_once(cluster.redis)
        monkeypatch.setattr(runner.leases, "lease_tasks", broken)
        SimpleWorker(
            [Queue("down_high", connection=cluster.redis)], connection=cluster.redis, serializer="json"
        ).work(burst=True)
        sentry_sdk.flush()
        hits = [e for e in transport.events() if "entry exploded" in json.dumps(e, default=str)]
        assert len(hits) == 1
    finally:
        sentry_sdk.init(dsn=None)


def test_a_jobs_custom_headers_are_remembered_as_secrets_by_the_worker(cluster, tmp_path):
    """An X-Api-Key of a job's settings is masked wherever it may show once a worker has read the
    job (logs, reasons, Sentry events all go through ``redact``); a standard header is not."""
    from common.secrets import redact
    from slave.worker.context import load_context

    manifest = tmp_path / "hdrs.toml"
    manifest.write_text('name = "hdrs"\ntype = "none"\n[settings.headers]\n'
                        '"X-Api-Key" = "k3y-only-in-settings"\n"Accept-Language" = "zh-CN"\n')
    from common.store.models import Job
    from master.registry import register as register_manifest

    register_manifest(manifest)
    job = Job.objects.get(name="hdrs")
    assert load_context(job.id) is not None
    assert redact("failed: k3y-only-in-settings; lang zh-CN") == "failed: ***; lang zh-CN"
