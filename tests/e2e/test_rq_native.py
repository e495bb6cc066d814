"""rq's own tools see ``downcluster worker`` as an rq worker and its entries as rq jobs: with
``rq info`` (a subprocess), rq's API (``Worker.all``, the registries) and rq-dashboard (started on
loopback), while three entries run and after they drain (that nothing outside the rq adapter
spells an rq key or touches a private rq attribute is checked in tests/unit/test_rq_adapter.py)."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from rq import Queue, Worker
from rq.job import Job as RqJob
from rq.registry import FailedJobRegistry, StartedJobRegistry

from common.queue.names import worker_queue_names
from common.store.models import CrawlerLease
from master.dispatch.dispatcher import dispatch_once
from tests.helpers import add_urls, register, statuses, wait_for

BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def dashboard(cluster):
    """rq-dashboard on loopback, reading the test's Redis."""
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "rq-dashboard"), "--json", "--bind", "127.0.0.1", "--port", str(port)],
        env={**os.environ, "RQ_DASHBOARD_REDIS_URL": cluster.env["DOWNCLUSTER_REDIS_URL"]},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return get_json(base + "/0/data/queues.json") is not None
        except OSError:
            return False
    try:
        wait_for(up, 30, "rq-dashboard")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_rq_info_and_dashboard_see_the_worker_and_its_running_entries(cluster, tmp_path, dashboard):
    env = {
        **os.environ,
        **cluster.env,
        "DOWNCLUSTER_DISPATCH_BATCH_SIZE": "1",
        "DOWNCLUSTER_HEARTBEAT_INTERVAL": "1",
    }
    os.environ["DOWNCLUSTER_DISPATCH_BATCH_SIZE"] = "1"
    try:
        from common.config import load

        load()
        register(tmp_path, "seen", priority=5)
        add_urls("seen", [f"{cluster.site}/hold/4000?n={i}" for i in range(3)])
        assert dispatch_once(cluster.redis).total == 3
    finally:
        del os.environ["DOWNCLUSTER_DISPATCH_BATCH_SIZE"]
        load()
    worker_proc = subprocess.Popen([str(BIN / "downcluster"), "worker"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: CrawlerLease.objects(state="RUNNING").count() == 3, 60, "three running entries")
        redis = cluster.redis

        # rq's API: one worker, busy, on our queues, with three executions, one per entry
        workers = Worker.all(connection=redis)
        assert len(workers) == 1
        worker = workers[0]
        assert worker.get_state() == "busy"
        # generator runs first, then host queues first at each level, then exports
        ours = ["down_generate", *worker_queue_names("testhost"), "down_export"]
        assert worker.queue_names() == ours
        executions = worker.get_current_executions()
        entries = sorted(e.job_id for e in executions)
        assert len(entries) == 3 and all(e.startswith("dc-") for e in entries)
        started = StartedJobRegistry("down_low", connection=redis)
        assert sorted(started.get_job_ids()) == entries
        for entry in entries:
            job = RqJob.fetch(entry, connection=redis, serializer="json")
            assert (
                job.get_status() == "started"
                and job.worker_name == worker.name
                and job.started_at is not None
            )
            assert job.origin == "down_low" and job.func_name == "slave.worker.entries.run_batch"

        # rq info, as an operator runs it
        info = subprocess.run(
            [str(BIN / "rq"), "info", "--serializer", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "RQ_REDIS_URL": cluster.env["DOWNCLUSTER_REDIS_URL"]},
        )
        assert info.returncode == 0, info.stderr
        assert re.search(r"down_low\s+\|?\S*\s*0, 3 executing", info.stdout), info.stdout
        assert "1 workers" in info.stdout and worker.name in info.stdout
        assert re.search(re.escape(worker.name) + r".*: busy " + re.escape(", ".join(ours)), info.stdout), (
            info.stdout
        )

        # rq's API as a JSON-aware tool calls it: the worker's current work (rq-dashboard 0.9's
        # workers page calls Worker.all without a serializer, unpickles, and fails: not used here)
        current = Worker.all(connection=redis, serializer="json")[0].get_current_job()
        assert (
            current is not None
            and current.id in entries
            and current.func_name == "slave.worker.entries.run_batch"
        )
        # rq-dashboard (--json): each running entry's page and the started registry
        for entry in entries:
            page = get_json(dashboard + f"/0/data/job/{entry}.json")
            assert page["status"] == "started" and page["started_at"] and page["origin"] == "down_low"
        listed = get_json(dashboard + "/0/data/jobs/down_low/started/8/asc/1.json")
        assert sorted(j["id"] for j in listed["jobs"]) == entries

        # after the drain: what rq's own worker leaves for result_ttl=0 jobs
        wait_for(lambda: statuses("seen") == {"SUCCESS": 3}, 60, "the drain")
        wait_for(lambda: not started.get_job_ids(), 10, "the started registry to empty")
        assert not any(RqJob.exists(e, connection=redis) for e in entries)
        assert FailedJobRegistry("down_low", connection=redis).count == 0
        worker.refresh()
        assert worker.successful_job_count == 3 and worker.failed_job_count == 0
        wait_for(lambda: Worker.all(connection=redis)[0].get_state() == "idle", 10, "the worker to go idle")
    finally:
        os.killpg(worker_proc.pid, signal.SIGTERM)
        _, err = worker_proc.communicate(timeout=60)
    assert worker_proc.returncode == 0, err[-2000:]
    assert Worker.all(connection=cluster.redis) == []  # its death is registered


def test_a_plain_rq_worker_runs_the_same_entries(cluster, tmp_path):
    """The job function of the entries: rq's own worker runs them (and keeps its own books)."""
    register(tmp_path, "plain", priority=0)
    add_urls("plain", [f"{cluster.site}/page/{i}" for i in range(3)])
    dispatch_once(cluster.redis)
    from rq import SimpleWorker

    w = SimpleWorker(
        [Queue("down_high", connection=cluster.redis)], connection=cluster.redis, serializer="json"
    )
    assert w.work(burst=True)
    assert statuses("plain") == {"SUCCESS": 3}


def _plain_rq_worker(cluster, name: str) -> None:
    """rq's own worker as seed 003 starts it: no ``--serializer json`` (it unpickles)."""
    done = subprocess.run([str(BIN / "rq"), "worker", "--burst", "--name", name, "down_high"],
                          env={**os.environ, "RQ_REDIS_URL": cluster.env["DOWNCLUSTER_REDIS_URL"]},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_an_rq_worker_without_the_json_serializer_is_named_as_the_cause(cluster, tmp_path, monkeypatch):
    """A plain `rq worker` pops an entry and fails it unread (rq's failed registry, a
    DeserializationError): the defender gives the tasks back after ABSENCE_GRACE as for any lost
    entry, with the reason "start rq workers with `--serializer json`" (not "Redis flushed"),
    and names each such worker once in the alert log, however many entries it spoils."""
    from common.config import load
    from common.store.log_models import CrawlerDispatchAlertLog
    from common.store.models import CrawlerTask
    from master.dispatch.defender import recover

    monkeypatch.setenv("DOWNCLUSTER_ABSENCE_GRACE", "0")  # lost at the second look, whenever it is
    load()
    register(tmp_path, "unread", priority=0)
    for round_ in range(2):
        add_urls("unread", [f"{cluster.site}/page/{round_ * 10 + i}" for i in range(3)])
        assert dispatch_once(cluster.redis).total >= 3
        _plain_rq_worker(cluster, "pickling-worker")
        assert len(FailedJobRegistry("down_high", connection=cluster.redis)) >= 1
        assert recover(cluster.redis).requeued == 0  # first look: missing, not yet judged
        report = recover(cluster.redis)
        assert report.requeued >= 3 and statuses("unread") == {"LIVE": 3 * (round_ + 1)}, report
        reasons = {t.failed_reason for t in CrawlerTask.objects(status="LIVE")}
        assert reasons == {"sent again: queue entry failed unread by rq worker pickling-worker: start rq "
                           "workers with `--serializer json`"}, reasons
        assert FailedJobRegistry("down_high", connection=cluster.redis).count == 0  # the entry is gone
    alerts = [a.reason for a in CrawlerDispatchAlertLog.objects(type="unreadable_entry")]
    assert len(alerts) == 1 and "pickling-worker" in alerts[0] and "--serializer json" in alerts[0], alerts
    # back as for any lost entry: the next dispatch sends them, to a worker that reads JSON
    dispatch_once(cluster.redis)
    from rq import SimpleWorker

    SimpleWorker([Queue("down_high", connection=cluster.redis)], connection=cluster.redis,
                 serializer="json").work(burst=True)
    assert statuses("unread") == {"SUCCESS": 6}
