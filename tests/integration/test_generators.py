"""Generators on real services, in-process: registration checks, the dry run (prints, stores no
task and no run), states test -> on -> off and back to test on a change, and the scheduling chore
(claims by compare-and-set: racing dispatchers start one run, missed runs collapse into one, a
run still under way is not started again)."""
from __future__ import annotations

import json
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from common.queue.names import GENERATE_QUEUE
from common.queue.rqbridge import queue_key
from common.store.clock import store_now
from common.store.log_models import CrawlerGeneratorLog, CrawlerRegistrationErrorLog
from common.store.models import CrawlerGenerator, CrawlerTask, Job
from master import generators
from tests.helpers import add_urls, cli, write_job

PY_GEN = '''
def generate():
    for i in range(5):
        yield f"{BASE}/page/{i}"
    yield ("{BASE}/page/99", "hostb")
    yield "https://example.org/file"
    yield "not a url"
'''
SH_GEN = 'for i in 1 2 3; do echo "{BASE}/page/$i"; done\n'


def manifest(tmp_path: Path, name: str, table: str, **settings) -> Path:
    path = write_job(tmp_path, name, **settings)
    path.write_text(path.read_text() + "\n[generator]\n" + table)
    return path


def python_table(tmp_path: Path, code: str, schedule: str = "*/5 * * * *", extra: str = "") -> str:
    (tmp_path / "gen.py").write_text(code)
    return f'type = "python"\ncode = "gen.py"\nschedule = "{schedule}"\n{extra}'


def register_gen(tmp_path: Path, name: str, table: str) -> None:
    result = cli("job", "register", str(manifest(tmp_path, name, table)))
    assert result.exit_code == 0, result.output
    assert "generator:" in result.output


@pytest.mark.parametrize("table, why", [
    ('type = "python"\nsource = "def generate():\\n    return []\\n"\nschedule = "61 * * * *"\n',
     "not a 5-field cron expression"),
    ('type = "python"\nsource = "def generate():\\n    return []\\n"\nschedule = "* * *"\n',
     "not a 5-field cron expression"),
    ('type = "python"\nsource = "def generate():\\n    return []\\n"\nschedule = "@every 0s"\n', "@every N"),
    ('type = "python"\nsource = "def generate(:\\n"\nschedule = "* * * * *"\n', "does not parse"),
    ('type = "python"\nsource = "def produce():\\n    return []\\n"\nschedule = "* * * * *"\n',
     "no top-level function generate()"),
    ('type = "python"\nsource = "def generate(x):\\n    return []\\n"\nschedule = "* * * * *"\n',
     "must take no arguments"),
    ('type = "shell"\nsource = "  \\n"\nschedule = "* * * * *"\n', "is empty"),
    ('type = "perl"\nsource = "x"\nschedule = "* * * * *"\n', "python or shell"),
    ('type = "shell"\nsource = "echo"\nschedule = "* * * * *"\nschemes = ["gopher"]\n', "only, not"),
    ('type = "shell"\nsource = "echo"\nschedule = "* * * * *"\nwhen = 1\n', "unknown generator key"),
    ('type = "shell"\nsource = "echo"\ncode = "x.sh"\nschedule = "* * * * *"\n', "exactly one of"),
])
def test_registration_refuses_a_bad_generator_and_stores_nothing(cluster, tmp_path, table, why):
    result = cli("job", "register", str(manifest(tmp_path, "g", table)))
    assert result.exit_code == 2 and why in result.output, result.output
    assert Job.objects.count() == 0 and CrawlerGenerator.objects.count() == 0
    assert why in CrawlerRegistrationErrorLog.objects.get(name="g").reason


def test_dry_run_prints_what_intake_would_do_and_stores_nothing(cluster, tmp_path):
    register_gen(tmp_path, "g", python_table(tmp_path, PY_GEN.replace("{BASE}", cluster.site),
                                             extra='schemes = ["http"]\n'))
    add_urls("g", [f"{cluster.site}/page/0"])  # already known: a duplicate
    assert CrawlerGenerator.objects.get().state == "test"
    result = cli("generator", "test", "g", "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert got["passed"] and got["state"] == "on" and got["state_before"] == "test"
    assert (got["added"], got["duplicate"], got["rejected"]) == (5, 1, 2)
    assert [e["line"] for e in got["errors"]] == [7, 8]
    assert "scheme 'https' is not one the generator may emit (http)" == got["errors"][0]["reason"]
    assert got["first"][-1] == {"url": f"{cluster.site}/page/99", "host": "hostb"}
    assert CrawlerTask.objects.count() == 1  # only the one added by hand
    assert CrawlerGeneratorLog.objects.count() == 0
    assert cluster.redis.llen(queue_key(GENERATE_QUEUE)) == 0
    text = cli("generator", "test", "g", "--limit", "2")
    assert text.exit_code == 0
    assert text.stdout.splitlines()[:2] == [f"{cluster.site}/page/1", f"{cluster.site}/page/2"]
    assert "line 7: scheme 'https'" in text.stderr and "would add 5, duplicate 1, rejected 2" in text.stdout


def test_a_failing_dry_run_fails_and_keeps_the_state(cluster, tmp_path):
    register_gen(tmp_path, "g", 'type = "shell"\nsource = "echo nope >&2; exit 3"\nschedule = "@every 5s"\n')
    result = cli("generator", "test", "g")
    assert result.exit_code == 1 and "exit status 3: nope" in result.stderr
    assert CrawlerGenerator.objects.get().state == "test"
    assert cli("generator", "on", "g").exit_code == 2


def test_states_test_on_off_and_a_change_goes_back_to_test(cluster, tmp_path):
    table = 'type = "shell"\nsource = "echo {BASE}/page/1"\nschedule = "@every 5s"\n'.replace(
        "{BASE}", cluster.site)
    register_gen(tmp_path, "g", table)
    refused = cli("generator", "on", "g")
    assert refused.exit_code == 2 and "generator test g" in refused.output
    assert cli("generator", "test", "g").exit_code == 0
    shown = json.loads(cli("generator", "show", "g", "--json").output)
    assert shown["state"] == "on" and shown["tested"] and shown["next_at"]
    assert cli("generator", "off", "g").exit_code == 0
    assert CrawlerGenerator.objects.get().state == "off"
    assert cli("generator", "on", "g").exit_code == 0  # the same code passed its dry run
    register_gen(tmp_path, "g", table)  # unchanged: stays on
    assert CrawlerGenerator.objects.get().state == "on"
    register_gen(tmp_path, "g", table.replace("@every 5s", "@every 6s"))  # changed: test again
    gen = CrawlerGenerator.objects.get()
    assert gen.state == "test" and gen.next_at is None
    assert cli("generator", "on", "g").exit_code == 2
    assert "state test" in cli("job", "show", "g").output
    result = cli("job", "register", str(write_job(tmp_path, "g")))  # no [generator] any more
    assert result.exit_code == 0 and CrawlerGenerator.objects.count() == 0


def _due_generator(tmp_path, cluster, name: str = "g") -> None:
    table = f'type = "shell"\nsource = "echo {cluster.site}/page/1"\nschedule = "* * * * *"\n'
    register_gen(tmp_path, name, table)
    assert cli("generator", "test", name).exit_code == 0
    job = Job.objects.get(name=name)
    CrawlerGenerator.objects(job=job).update_one(set__next_at=store_now() - timedelta(days=3))  # an outage


def test_racing_dispatchers_start_one_run_and_missed_runs_collapse(cluster, tmp_path):
    _due_generator(tmp_path, cluster)
    barrier, results = threading.Barrier(8), []

    def dispatcher():
        barrier.wait()
        results.append(generators.tend(cluster.redis))

    threads = [threading.Thread(target=dispatcher) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r["started"] for r in results) == 1  # three days of missed minutes: one run
    assert cluster.redis.llen(queue_key(GENERATE_QUEUE)) == 1
    gen = CrawlerGenerator.objects.get()
    assert gen.next_at > store_now() - timedelta(seconds=5) and gen.running_run
    log = CrawlerGeneratorLog.objects.get()
    assert log.status == "RUNNING" and log.run == gen.running_run and log.trigger == "schedule"
    assert generators.tend(cluster.redis) == {"started": 0, "skipped": 0, "lost": 0}  # not due again yet
    # due again while the run is still under way: not started twice, logged SKIPPED
    CrawlerGenerator.objects(id=gen.id).update_one(set__next_at=store_now() - timedelta(seconds=1))
    assert generators.tend(cluster.redis)["skipped"] == 1
    assert cluster.redis.llen(queue_key(GENERATE_QUEUE)) == 1
    assert CrawlerGeneratorLog.objects(status="SKIPPED").count() == 1
    shown = generators.show("g")
    assert [r["status"] for r in shown["runs"]] == ["SKIPPED", "RUNNING"]


def test_a_run_whose_worker_vanished_is_given_up(cluster, tmp_path, monkeypatch):
    _due_generator(tmp_path, cluster)
    assert generators.tend(cluster.redis)["started"] == 1
    monkeypatch.setattr(generators, "stale_after", lambda: 0.0)
    got = generators.tend(cluster.redis)
    assert got["lost"] == 1
    log = CrawlerGeneratorLog.objects.get(status="FAIL")
    assert "still under way" in log.failed_reason
    assert CrawlerGenerator.objects.get().running_run is None


def test_run_now_goes_through_the_queue_once(cluster, tmp_path):
    register_gen(tmp_path, "g", 'type = "shell"\nsource = "echo x"\nschedule = "@every 5s"\n')
    result = cli("generator", "run", "g")
    assert result.exit_code == 0 and GENERATE_QUEUE in result.output
    assert cli("generator", "run", "g").exit_code == 2  # one under way
    assert cluster.redis.llen(queue_key(GENERATE_QUEUE)) == 1
    assert CrawlerGeneratorLog.objects.get().trigger == "manual"


def test_a_generator_of_a_job_that_is_off_never_runs(cluster, tmp_path):
    from slave.generate import run

    _due_generator(tmp_path, cluster)
    queued = generators.run_now("g", cluster.redis)["run"]  # queued while the job is ON
    assert cli("job", "disable", "g").exit_code == 0
    assert run(queued) == {"skipped": 1}  # its worker meets it after the job was turned off
    log = CrawlerGeneratorLog.objects.get(run=queued)
    assert log.status == "SKIPPED" and "OFF" in log.failed_reason
    assert CrawlerTask.objects.count() == 0 and CrawlerGenerator.objects.get().running_run is None
    assert generators.tend(cluster.redis) == {"started": 0, "skipped": 0, "lost": 0}  # due, but OFF
    refused = cli("generator", "run", "g")
    assert refused.exit_code == 2 and "OFF" in refused.output
    assert cluster.redis.llen(queue_key(GENERATE_QUEUE)) == 1  # only the entry queued while ON
    assert cli("job", "enable", "g").exit_code == 0
    assert generators.tend(cluster.redis)["started"] == 1  # the times it missed: one run
