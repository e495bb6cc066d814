"""Generators end to end: a real `downcluster worker` (and a plain `rq worker`) runs them in the
sandbox; their URLs go through intake and get downloaded from the local site; failing and
hanging generators are logged FAIL (the hanging one killed at the limit), add nothing and alert
the job's report_mails through a real SMTP server; bad lines are rejected by line number;
dispatcher processes racing over a due generator start one run."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from common.store.clock import store_now
from common.store.log_models import CrawlerGeneratorLog
from common.store.models import CrawlerGenerator, CrawlerTask, Job
from master.dispatch.dispatcher import dispatch_once
from tests.helpers import cli, statuses, wait_for, write_job

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
TIMEOUT = 3  # DOWNLOAD_TIMEOUT of the workers here: a generator's deadline too

PY_GEN = '''
def generate():
    return [f"{BASE}/page/{i}" for i in range(5)]
'''
SH_GEN = 'for i in 10 11 12; do echo "{BASE}/page/$i"; done'


@pytest.fixture
def worker(cluster):
    """A `downcluster worker` in the background for the test (ended by its pid)."""
    env = {**os.environ, **cluster.env, "DOWNCLUSTER_DOWNLOAD_TIMEOUT": str(TIMEOUT)}
    proc = subprocess.Popen([str(BIN / "downcluster"), "worker"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    yield proc
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def register_gen(tmp_path: Path, name: str, kind: str, code: str, schedule: str = "@every 2s", **settings):
    path = write_job(tmp_path, name, priority=0, **settings)
    code = code.replace('"', '\\"').replace("\n", "\\n")
    path.write_text(path.read_text() + f'\n[generator]\ntype = "{kind}"\nsource = "{code}"\n'
                                       f'schedule = "{schedule}"\n')
    result = cli("job", "register", str(path))
    assert result.exit_code == 0, result.output
    return Job.objects.get(name=name)


def runs(name: str, status: str | None = None) -> list:
    job = Job.objects.get(name=name)
    found = CrawlerGeneratorLog.objects(job=job, **({"status": status} if status else {}))
    return list(found.order_by("id"))


class Dispatcher:
    """Runs the dispatcher (and with it the generators chore) at most every ``every`` seconds
    while a condition is waited for."""

    def __init__(self, redis, every: float = 0.3) -> None:
        self.redis, self.every, self.last = redis, every, 0.0

    def __call__(self) -> None:
        if time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            dispatch_once(self.redis)


def test_scheduled_python_and_shell_generators_feed_downloads(cluster, tmp_path, worker):
    register_gen(tmp_path, "pygen", "python", PY_GEN.replace("{BASE}", cluster.site))
    register_gen(tmp_path, "shgen", "shell", SH_GEN.replace("{BASE}", cluster.site))
    for name in ("pygen", "shgen"):
        assert CrawlerGenerator.objects.get(job=Job.objects.get(name=name)).state == "test"
        assert cli("generator", "test", name).exit_code == 0
    dispatch = Dispatcher(cluster.redis)

    def done() -> bool:
        dispatch()
        return (statuses("pygen") == {"SUCCESS": 5} and statuses("shgen") == {"SUCCESS": 3}
                and len(runs("pygen", "SUCCESS")) >= 2)

    wait_for(done, timeout=120, what="generated URLs downloaded and a second scheduled run")
    first, second = runs("pygen", "SUCCESS")[:2]
    assert (first.added, first.duplicate, first.rejected, first.lines) == (5, 0, 0, 5)
    assert (second.added, second.duplicate) == (0, 5)  # the same URLs again: intake's dedup
    assert first.hostname == "testhost" and first.bytes > 0 and first.spend_time > 0
    assert first.trigger == "schedule" and first.started_at and first.finished_at
    sh = runs("shgen", "SUCCESS")[0]
    assert (sh.added, sh.lines) == (3, 3)
    assert CrawlerTask.objects(job=Job.objects.get(name="shgen")).count() == 3
    assert "on" in cli("generator", "show", "shgen").output
    assert cli("generator", "off", "pygen").exit_code == 0
    before = len(runs("pygen"))
    stop = time.monotonic() + 5  # off: no more runs however often dispatchers come
    while time.monotonic() < stop:
        dispatch()
        time.sleep(0.2)
    assert len(runs("pygen")) == before


def test_failing_and_hanging_generators_add_nothing_and_alert(cluster, tmp_path, worker):
    from common.config import load, settings
    from common.notify import deliver_due
    from master.ops import reports
    from tests.receivers import SmtpServer

    register_gen(tmp_path, "boom", "python",
                 f'def generate():\n    yield "{cluster.site}/page/1"\n'
                 '    raise RuntimeError("no feed today")\n',
                 report_mails="boom@example.org")
    register_gen(tmp_path, "hang", "shell", f'echo {cluster.site}/page/2; sleep 600',
                 report_mails="hang@example.org")
    register_gen(tmp_path, "bad", "shell",
                 f'printf "{cluster.site}/page/3\\nnot a url\\n\\nftp://x.org/f\\n{cluster.site}/page/4\\n"')
    started = time.monotonic()
    for name in ("boom", "hang", "bad"):  # by hand, whatever their state: through the queue
        result = cli("generator", "run", name)
        assert result.exit_code == 0, result.output
    wait_for(lambda: all(r.status != "RUNNING" for n in ("boom", "hang", "bad") for r in runs(n))
             and all(runs(n) for n in ("boom", "hang", "bad")), timeout=90, what="three runs ended")
    boom, hang, bad = runs("boom")[0], runs("hang")[0], runs("bad")[0]
    assert boom.status == "FAIL" and "RuntimeError: no feed today" in boom.failed_reason
    assert hang.status == "FAIL" and f"timed out after {TIMEOUT}s" in hang.failed_reason
    assert hang.spend_time < (TIMEOUT + 10) * 1e6 and time.monotonic() - started < 60  # killed at the limit
    for name in ("boom", "hang"):
        assert CrawlerTask.objects(job=Job.objects.get(name=name)).count() == 0  # nothing added
        assert CrawlerGenerator.objects.get(job=Job.objects.get(name=name)).running_run is None
    assert bad.status == "SUCCESS" and (bad.added, bad.rejected) == (2, 2)
    assert [e["line"] for e in bad.errors] == [2, 4]
    shown = cli("generator", "show", "bad").output
    assert "line 2:" in shown and "line 4:" in shown
    with SmtpServer() as smtp:
        load(flags=dict(settings.flags, SMTP_URL=smtp.url))
        assert reports.send_reports() == 2
        deliver_due()
        wait_for(lambda: len(smtp.messages) == 2, timeout=30, what="two alert mails")
        by_to = {m["To"]: m.get_payload(decode=True).decode() for m in smtp.messages}
        assert "no feed today" in by_to["boom@example.org"]
        assert f"timed out after {TIMEOUT}s" in by_to["hang@example.org"]
        assert reports.send_reports() == 0  # told once per ALERT_MAIL_INTERVAL


def test_racing_dispatchers_start_one_run_and_a_plain_rq_worker_runs_it(cluster, tmp_path):
    job = register_gen(tmp_path, "race", "shell", f"echo {cluster.site}/page/7", schedule="* * * * *")
    assert cli("generator", "test", "race").exit_code == 0
    CrawlerGenerator.objects(job=job).update_one(set__next_at=store_now() - timedelta(hours=5))  # an outage
    env = {**os.environ, **cluster.env}
    code = ("from common.store.connection import connect_mongo, redis_conn; connect_mongo(); "
            "from master.generators import tend; print(tend(redis_conn())['started'])")
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True,
                              cwd=str(Path(__file__).resolve().parents[2])) for _ in range(4)]
    started = [int(p.communicate(timeout=60)[0].strip().splitlines()[-1]) for p in procs]
    assert sorted(started) == [0, 0, 0, 1]  # five hours of missed minutes, four dispatchers: one run
    rq = subprocess.run([str(BIN / "rq"), "worker", "--serializer", "json", "--burst", "down_generate"],
                        env={**env, "RQ_REDIS_URL": cluster.env["DOWNCLUSTER_REDIS_URL"]},
                        capture_output=True, text=True, timeout=120)
    assert rq.returncode == 0, rq.stderr[-2000:]
    assert [(r.status, r.added) for r in runs("race")] == [("SUCCESS", 1)]
    assert statuses("race") == {"LIVE": 1}
