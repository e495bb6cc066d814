"""End to end with real `rq worker` / `downcluster worker` processes, for all downloader types."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.store.clock import store_now
from common.store.log_models import CrawlerDownloadLog
from common.store.models import CrawlerDownloadData, CrawlerLease, CrawlerTask, Job
from master.dispatch.dispatcher import dispatch_once
from sample_site import page_body
from tests.helpers import add_urls, register, sent, statuses, wait_for

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
QUEUES = ["down_super", "down_high", "down_mid", "down_low"]

PYTHON_DOWNLOADER = '''
import urllib.request

def download(task):
    assert task["attempt"] >= 1 and task["job"] and task["task_id"] and "settings" in task
    with urllib.request.urlopen(task["url"], timeout=10) as resp:
        return {"status_code": resp.status, "headers": dict(resp.headers.items()), "body": resp.read()}
'''
SHELL_DOWNLOADER = 'exec curl -sS --fail --max-time 10 -- "$1"\n'


def rq_worker(cluster, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, **cluster.env, "RQ_REDIS_URL": cluster.env["DOWNCLUSTER_REDIS_URL"]}  # never in argv
    return subprocess.run([str(BIN / "rq"), "worker", "--serializer", "json", "--burst",
                           *extra, *([] if any(q.startswith("down") for q in extra) else QUEUES)],
                          env=env, capture_output=True, text=True, timeout=timeout)


def dc_worker(cluster, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, **cluster.env}
    return subprocess.run([str(BIN / "downcluster"), "worker", "--burst", *extra], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _body(doc) -> bytes:
    return bytes(doc.response_body)


def test_three_downloader_types_store_byte_exact_data(cluster, tmp_path):
    register(
        tmp_path, "py", priority=-1, kind="python", code=PYTHON_DOWNLOADER, allow_private=True
    )  # the site is on loopback
    register(tmp_path, "sh", priority=2, kind="shell", code=SHELL_DOWNLOADER, allow_private=True)
    register(tmp_path, "eng", priority=5, cookie="sid=topsecret")
    for offset, name in enumerate(("py", "sh", "eng")):
        add_urls(name, [f"{cluster.site}/page/{offset * 100 + i}" for i in range(20)])
    assert dispatch_once(cluster.redis).total == 60
    proc = rq_worker(cluster)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("py", "sh", "eng"):
        assert statuses(name) == {"SUCCESS": 20}, name
        job = Job.objects.get(name=name)
        docs = list(CrawlerDownloadData.objects(job=job))
        assert len(docs) == 20
        for doc in docs:
            n = int(doc.url.rsplit("/", 1)[1])
            assert _body(doc) == page_body(n)
            assert doc.hostname == "testhost" and doc.lease
        logs = CrawlerDownloadLog.objects(job=job)
        assert logs.count() == 20 and all(log.status == "SUCCESS" and log.spend_time > 0 for log in logs)
        assert all(log.response_size == len(page_body(0)) or log.response_size > 1000 for log in logs)
    eng = CrawlerDownloadData.objects(job=Job.objects.get(name="eng")).first()
    assert eng.status_code == 200 and "topsecret" not in str(eng.requests_headers)
    assert eng.remote_ip in ("127.0.0.1", "")


@pytest.mark.parametrize("way", ["downcluster worker", "--classic", "--simple", "rq worker"])
def test_every_way_to_run_an_entry_runs_it_alike(cluster, tmp_path, way):
    """The ways docs/entries.md keeps (the event loop, rq's Worker and SimpleWorker, a plain rq
    worker) all run an entry through ``Runner.run_entry``: the same pages, the same documents,
    the lease finished, a failure settled the same."""
    register(tmp_path, "alike", priority=2)
    add_urls("alike", [f"{cluster.site}/page/{i}" for i in range(3)] + [f"{cluster.site}/no-such-page"])
    assert dispatch_once(cluster.redis).total == 4
    proc = rq_worker(cluster) if way == "rq worker" else dc_worker(
        cluster, "--no-exports", *([way] if way.startswith("--") else []))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert statuses("alike") == {"SUCCESS": 3, "FAIL": 1}
    docs = CrawlerDownloadData.objects(job=Job.objects.get(name="alike"))
    assert sorted(_body(d) for d in docs) == sorted(page_body(i) for i in range(3))
    failed = CrawlerTask.objects.get(uri=f"{cluster.site}/no-such-page")
    assert failed.failed_reason == "HTTP 404"
    assert CrawlerLease.objects(state="RUNNING").count() == 0


def test_failing_url_ends_fail_after_max_retry_times(cluster, tmp_path, monkeypatch):
    cluster.env["DOWNCLUSTER_RETRY_BACKOFF_BASE"] = "0.01"
    register(tmp_path, "bad", priority=0, max_retry_times=3)
    add_urls("bad", [f"{cluster.site}/status/500", f"{cluster.site}/status/404"])
    for _ in range(6):
        dispatch_once(cluster.redis)
        rq_worker(cluster)
        wait_for(lambda: not CrawlerTask.objects(retry_at__gt=store_now()).count(),
                 what="the retries to be due")
    t500 = CrawlerTask.objects.get(uri=f"{cluster.site}/status/500")
    t404 = CrawlerTask.objects.get(uri=f"{cluster.site}/status/404")
    assert (t500.status, t500.download_times, t500.retry_at) == ("FAIL", 3, None)
    assert (t404.status, t404.download_times, t404.retry_at) == ("FAIL", 1, None)  # 404 is not retried
    assert CrawlerDownloadLog.objects(task=t500, status="FAIL").count() == 3
    assert "HTTP 500" in CrawlerDownloadLog.objects(task=t500).first().failed_reason
    assert CrawlerDownloadData.objects.count() == 0


def test_host_targeted_tasks_taken_only_by_that_host(cluster, tmp_path):
    register(tmp_path, "pinned", priority=3, host="alpha")
    add_urls("pinned", [f"{cluster.site}/page/{i}" for i in range(5)])
    dispatch_once(cluster.redis)
    assert dc_worker(cluster, "--host", "beta").returncode == 0
    assert statuses("pinned") == {"LIVE": 5} and sent("pinned") == 5  # still waiting in alpha's queue
    assert dc_worker(cluster, "--host", "alpha").returncode == 0
    assert statuses("pinned") == {"SUCCESS": 5}
    assert {d.hostname for d in CrawlerDownloadData.objects} == {"alpha"}


@pytest.mark.parametrize("given", ["machine", "settings file"])
def test_a_worker_reads_the_host_queues_of_the_name_it_registers_with(cluster, tmp_path, given):
    """No DOWNCLUSTER_HOSTNAME and no --host: the name comes from the machine (or a settings file)."""
    import socket

    env = {k: v for k, v in {**os.environ, **cluster.env}.items() if k != "DOWNCLUSTER_HOSTNAME"}
    name = socket.gethostname()
    if given == "settings file":
        name = "gamma"
        (tmp_path / "local.py").write_text('HOSTNAME = "gamma"\n')
        env["DOWNCLUSTER_SETTINGS"] = str(tmp_path / "local.py")
    register(tmp_path, "pinned", host=name)
    add_urls("pinned", [f"{cluster.site}/page/{i}" for i in range(3)])
    dispatch_once(cluster.redis)
    done = subprocess.run([str(BIN / "downcluster"), "worker", "--burst", "--no-exports"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert statuses("pinned") == {"SUCCESS": 3}
    assert {d.hostname for d in CrawlerDownloadData.objects} == {name}
    assert {log.downloads_hostname for log in CrawlerDownloadLog.objects} == {name}


def test_super_entry_enqueued_after_low_ones_runs_first(cluster, tmp_path):
    register(tmp_path, "low", priority=5, dispatch_num=10)
    add_urls("low", [f"{cluster.site}/page/{i}" for i in range(10)])
    cluster.env["DOWNCLUSTER_DISPATCH_BATCH_SIZE"] = "1"
    os.environ["DOWNCLUSTER_DISPATCH_BATCH_SIZE"] = "1"
    try:
        from common.config import load
        load()
        dispatch_once(cluster.redis)
        register(tmp_path, "urgent", priority=-1)
        add_urls("urgent", [f"{cluster.site}/page/999"])
        dispatch_once(cluster.redis)
    finally:
        del os.environ["DOWNCLUSTER_DISPATCH_BATCH_SIZE"]
    proc = rq_worker(cluster, "--max-jobs", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert statuses("urgent") == {"SUCCESS": 1}
    assert statuses("low") == {"LIVE": 10} and sent("low") == 10  # all ten still queued


def test_cancelled_dispatched_task_is_not_stored(cluster, tmp_path):
    slow = ('import time, urllib.request\ndef download(task):\n'
            '    body = urllib.request.urlopen(task["url"]).read()\n'
            '    time.sleep(3)\n    return {"status_code": 200, "headers": {}, "body": body}\n')
    register(tmp_path, "cx", priority=0, kind="python", code=slow, allow_private=True)
    paths = [f"/page/{i}?cancelled-mid-download" for i in range(3)]  # as the site counts them
    add_urls("cx", [cluster.site + path for path in paths])
    dispatch_once(cluster.redis)
    env = {**os.environ, **cluster.env, "RQ_REDIS_URL": cluster.env["DOWNCLUSTER_REDIS_URL"]}
    worker = subprocess.Popen([str(BIN / "rq"), "worker", "--serializer", "json", "--burst", *QUEUES],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from sample_site import TRAFFIC
    from tests.helpers import cli

    # the three downloads have fetched their pages and sleep 3 s before they return
    wait_for(lambda: all(TRAFFIC.hits.get(path) for path in paths), what="the three downloads to start")
    assert "cancelled 3 tasks" in cli("task", "cancel", "cx").output
    worker.wait(timeout=60)
    assert statuses("cx") == {"CANCEL": 3}
    # the downloads did finish and were logged (the cancel hit the writer), yet nothing is stored
    assert CrawlerDownloadLog.objects(status="SUCCESS").count() == 3
    assert CrawlerDownloadData.objects.count() == 0


def test_body_over_16_mib_goes_to_gridfs_byte_exact(cluster, tmp_path):
    from master.exports.dump import rows
    from sample_site import bytes_body

    size = 17 * 1024 * 1024
    register(tmp_path, "big", priority=0)
    add_urls("big", [f"{cluster.site}/bytes/{size}"])
    dispatch_once(cluster.redis)
    proc = rq_worker(cluster)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert statuses("big") == {"SUCCESS": 1}
    doc = CrawlerDownloadData.objects.get()
    assert doc.response_body is None and doc.response_body_gridfs is not None
    [(meta, body)] = list(rows("big"))
    assert body == bytes_body(size)


def test_foreign_rq_job_on_our_queue_is_kept_not_spun(cluster, tmp_path):
    """Another function enqueued on down_low goes to rq's failed registry (requeueable for a
    plain rq worker); the worker neither loops on it nor loses it, and drains our entries."""
    from rq import Queue
    from rq.registry import FailedJobRegistry

    register(tmp_path, "mix", priority=5)
    add_urls("mix", [f"{cluster.site}/page/{i}" for i in range(3)])
    foreign = Queue("down_low", connection=cluster.redis).enqueue("os.getcwd")
    dispatch_once(cluster.redis)
    proc = dc_worker(cluster, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert statuses("mix") == {"SUCCESS": 3}
    assert foreign.id in FailedJobRegistry("down_low", connection=cluster.redis).get_job_ids()


def test_worker_memory_stays_bounded_with_large_bodies(cluster, tmp_path):
    """Issue 13, item 14: 60 bodies of 8 MiB (480 MiB) through one worker holding at most two
    large bodies at once (WORKER_LARGE_BODIES): its peak RSS stays far below the bodies' sum
    (it would hold an entry's 50 bodies, 400 MiB, if an entry were stored at its end)."""
    from sample_site import bytes_body

    size, count = 8 * 1024 * 1024, 60
    register(tmp_path, "big8", priority=0)
    add_urls("big8", [f"{cluster.site}/bytes/{size + i}" for i in range(count)])
    dispatch_once(cluster.redis)
    # a fixed mmap threshold: freed large bodies go back to the system, so RSS shows what is held
    env = {
        **os.environ,
        **cluster.env,
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "DOWNCLUSTER_WORKER_LARGE_BODIES": "2",
        "DOWNCLUSTER_STORE_FLUSH_BYTES": str(size),
        "DOWNCLUSTER_HOST_WAIT_MAX": "600",
    }  # on a loaded machine pages waiting for a slot are not handed back
    wrapper = ("import resource, subprocess, sys\n"
               "p = subprocess.run(sys.argv[1:])\n"
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)\n"
               "sys.exit(p.returncode)\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            wrapper,
            str(BIN / "downcluster"),
            "worker",
            "--burst",
            "--logging-level",
            "WARNING",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak_mb = int(proc.stdout.strip().splitlines()[-1])
    left = [(t.uri, t.status, t.failed_reason) for t in CrawlerTask.objects(status__ne="SUCCESS")]
    noted = [line for line in proc.stderr.splitlines() if " WARNING " in line or " ERROR " in line]
    assert statuses("big8") == {"SUCCESS": count}, (
        left,
        noted[-20:],
    )  # the worker's own word on what it left
    doc = CrawlerDownloadData.objects(url=f"{cluster.site}/bytes/{size + 7}").get()
    assert bytes(doc.response_body) == bytes_body(size + 7)
    assert peak_mb < 240, f"worker peak RSS {peak_mb} MB for {count * 8} MiB of bodies"
