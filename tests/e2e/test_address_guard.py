"""Where the cluster's own requests may go (common/netguard.py), with real receivers and a real
worker: webhooks go only to the address their check judged; the built-in engines refuse
loopback, link-local and the cluster's services at the first request and after every redirect,
unless the job says ``allow_private = true`` (the cluster's services stay refused even then)."""
from __future__ import annotations

from urllib.parse import quote

import pytest

from common import netguard
from common.config import load, settings
from common.errors import ValidationError
from common.notify import check_callback, deliver_due, queue_webhook
from common.store.models import CrawlerDownloadData, CrawlerTask, Export, Job, Notification
from master.dispatch.dispatcher import dispatch_once
from master.exports import service as exports
from tests.helpers import add_urls, burst_worker, register
from tests.receivers import WebhookReceiver


def _notification(url: str) -> Notification:
    return Notification.objects.get(target=url)


# --- webhooks -----------------------------------------------------------------------------

def test_a_backslash_or_userinfo_callback_is_refused_and_reaches_nothing(cluster, tmp_path):
    register(tmp_path, "j")
    with WebhookReceiver() as hook:
        port = hook.server.server_address[1]
        tricks = [f"http://127.0.0.1:{port}\\@8.8.8.8/", f"http://8.8.8.8@127.0.0.1:{port}/",
                  f"http://127.0.0.1:{port}/\\x", f"http://127.0.0.1:{port}/a b", f"http://127.0.0.1:{port}/\x00"]
        for allow in (False, True):  # refused as a URL, whatever the address rules
            load(flags=dict(settings.flags, WEBHOOK_ALLOW_PRIVATE=allow))
            for url in tricks:
                with pytest.raises(ValidationError, match="callback_url must be http"):
                    exports.request(cluster.redis, "j", "csv", callback_url=url)
        assert Export.objects.count() == 0
        for url in tricks:  # stored before this check existed: refused at delivery, for good
            queue_webhook(url, "export.succeeded", {"id": "x"})
        assert deliver_due() == 0
        assert hook.received == []
        for url in tricks:
            note = _notification(url)
            assert (
                note.state == "FAIL" and note.attempts == 1 and note.last_error.startswith("ValidationError")
            )


def test_a_private_callback_is_refused_unless_allowed_then_goes_to_the_judged_address(cluster):
    with WebhookReceiver() as hook:
        port = hook.server.server_address[1]
        by_name = f"http://localhost:{port}/hook?key=k"
        load(flags=dict(settings.flags, WEBHOOK_ALLOW_PRIVATE=False))
        for url in (hook.url, by_name, f"http://[::ffff:127.0.0.1]:{port}/", f"http://2130706433:{port}/"):
            with pytest.raises(ValidationError, match="is not a public address"):
                check_callback(url)
        queue_webhook(by_name, "export.succeeded", {"id": "a"})
        assert deliver_due() == 0 and hook.received == []
        assert _notification(by_name).state == "FAIL"

        load(flags=dict(settings.flags, WEBHOOK_ALLOW_PRIVATE=True))
        queue_webhook(by_name, "export.succeeded", {"id": "b"})
        assert deliver_due() == 1
        headers, body = hook.received[0]
        # connected to the address judged for "localhost", the name kept in the Host header
        assert headers["host"] == f"localhost:{port}" and body == b'{"id":"b"}'

        load(flags=dict(settings.flags, WEB_BIND=f"127.0.0.1:{port}"))  # the receiver is the cluster's web
        with pytest.raises(ValidationError, match="127.0.0.1 is not a public address"):
            check_callback(hook.url)
        queue_webhook(hook.url, "export.succeeded", {"id": "c"})
        assert deliver_due() == 0 and len(hook.received) == 1


# --- downloads ------------------------------------------------------------------------------

def _run(cluster) -> None:
    assert dispatch_once(cluster.redis).total > 0
    burst_worker(cluster)


def _reasons(name: str) -> dict[str, str]:
    """uri -> failed_reason of the job's tasks, each asserted final (FAIL, no retry due)."""
    out = {}
    for task in CrawlerTask.objects(job=Job.objects.get(name=name)):
        if task.status != "SUCCESS":
            assert task.status == "FAIL" and task.retry_at is None and task.download_times == 1, task.uri
            out[task.uri] = task.failed_reason
    return out


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["aiohttp", "requests"])
def test_builtin_engines_refuse_private_addresses_unless_the_job_allows(cluster, tmp_path, engine):
    port = cluster.site.rsplit(":", 1)[1]
    register(tmp_path, "strict", download_engine=engine, allow_private=False)
    register(tmp_path, "intranet", download_engine=engine, allow_private=True)
    urls = {f"{cluster.site}/page/1": "127.0.0.1 is a loopback address",
            f"http://localhost:{port}/page/2": "127.0.0.1 is a loopback address",
            "http://169.254.169.254/latest/meta-data/": "169.254.169.254 is a link-local address",
            f"http://0.0.0.0:{port}/page/3": "0.0.0.0 is an unspecified address"}
    add_urls("strict", list(urls))
    add_urls("intranet", [f"{cluster.site}/page/1", f"http://localhost:{port}/page/2"])
    _run(cluster)
    reasons = _reasons("strict")
    assert set(reasons) == set(urls)
    for url, why in urls.items():
        assert reasons[url] == f"refused: {why}" + ("" if "0.0.0.0" in why else
                                                     f" ({netguard.DOWNLOAD_HINT})"), url
    assert CrawlerDownloadData.objects(job=Job.objects.get(name="strict")).count() == 0
    assert _reasons("intranet") == {}  # ordinary (intranet) downloads still work
    assert CrawlerDownloadData.objects(job=Job.objects.get(name="intranet")).count() == 2


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["aiohttp", "requests"])
def test_the_clusters_services_stay_refused_at_every_hop_even_with_allow_private(
    cluster, tmp_path, monkeypatch, engine
):
    with WebhookReceiver() as web:  # stands in for the cluster's web: it must see no request
        bind = f"127.0.0.1:{web.server.server_address[1]}"
        monkeypatch.setenv("DOWNCLUSTER_WEB_BIND", bind)
        redis_port = cluster.redis.connection_pool.connection_kwargs["port"]
        register(tmp_path, "j", download_engine=engine, allow_private=True)
        redirect = f"{cluster.site}/redirect-to?url="
        urls = {f"http://{bind}/api": f"{bind} is a service of this cluster",
                redirect + quote(f"http://{bind}/x", safe=""): f"{bind} is a service of this cluster",
                redirect + quote(f"http://localhost:{redis_port}/", safe=""):
                    f"127.0.0.1:{redis_port} is a service of this cluster",
                f"http://127.0.0.1:{redis_port}/": f"127.0.0.1:{redis_port} is a service of this cluster"}
        add_urls("j", [*urls, f"{cluster.site}/page/5"])
        _run(cluster)
        assert web.received == []
    reasons = _reasons("j")
    assert reasons == {url: f"refused: {why}" for url, why in urls.items()}
    data = CrawlerDownloadData.objects(job=Job.objects.get(name="j"))
    assert [d.url for d in data] == [f"{cluster.site}/page/5"]
