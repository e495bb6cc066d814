"""Pure functions: no services needed."""
from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest

from common.config import Settings
from common.errors import ConfigError, DownloadError, ValidationError
from common.queue.names import cap, queue_for_priority, queue_name, worker_queue_names
from common.secrets import redact, remember
from common.urls import check_url, strip_credentials
from common.store.leases import lease_verdict
from common.store.models import AGAIN, FRESH
from master.dispatch.dispatcher import JobWork, order_key, plan
from master.dispatch.selection import Picked, fresh_cursor, fresh_limit
from master.registry import check_python, validate_manifest, validate_settings
from common.queue.retry import next_retry_at

NOW = datetime(2026, 1, 1, 12, 0, 0)


@pytest.mark.parametrize("priority,queue", [(-1, "down_super"), (0, "down_high"), (1, "down_high"),
                                            (2, "down_mid"), (3, "down_mid"), (4, "down_low"), (5, "down_low")])
def test_priority_mapping(priority, queue):
    assert queue_for_priority(priority) == queue


@pytest.mark.parametrize("bad", [-2, 6, 100])
def test_priority_out_of_range(bad):
    with pytest.raises(ValueError):
        queue_for_priority(bad)


def test_worker_order_puts_host_queue_first_at_each_level():
    assert worker_queue_names() == ["down_super", "down_high", "down_mid", "down_low"]
    assert worker_queue_names("h1") == ["down_super@h1", "down_super", "down_high@h1", "down_high",
                                        "down_mid@h1", "down_mid", "down_low@h1", "down_low"]
    assert queue_name("down_low", "h1") == "down_low@h1"
    assert cap("down_low@h1") == cap("down_low") == 1000


def test_env_overrides_are_typed_and_local_file_is_below_env(tmp_path: Path):
    local = tmp_path / "local.py"
    local.write_text("Q_DOWN_LOW_LEN = 7\nDISPATCH_ORDER = 'host'\n")
    s = Settings(environ={"DOWNCLUSTER_SETTINGS": str(local), "DOWNCLUSTER_Q_DOWN_LOW_LEN": "50",
                          "DOWNCLUSTER_RETRY_BACKOFF_BASE": "0.5"})
    assert s.Q_DOWN_LOW_LEN == 50 and s.DISPATCH_ORDER == "host" and s.RETRY_BACKOFF_BASE == 0.5
    s.override(Q_DOWN_LOW_LEN=3)
    assert s.Q_DOWN_LOW_LEN == 3
    with pytest.raises(ConfigError, match="DOWNCLUSTER_Q_DOWN_LOW_LEN"):
        Settings(environ={"DOWNCLUSTER_Q_DOWN_LOW_LEN": "many"})


def _work(name: str, priority: int, n: int, again: int = 0, host: str = "") -> JobWork:
    job = {"_id": name, "name": name, "priority": priority, "host": host}
    return JobWork(job=job, dispatch_num=n + again, max_retry_times=5,
                   again=[Picked(f"{name}-a{i}", "") for i in range(again)],
                   fresh=[Picked(f"{name}-{i}", "", i + 1) for i in range(n)])


def _taken(work: JobWork, kind: str = FRESH) -> int:
    return sum(len(e.ids) for e in work.entries if e.kind == kind)


def test_plan_respects_queue_room_and_writes_alert():
    a, b = _work("a", -1, 120), _work("b", -1, 50)
    free = {"down_super": 3}
    alerts = plan([a, b], free, total=10_000, batch_size=50)
    assert _taken(a) == 120 and _taken(b) == 0  # 3 entries: 50+50+20
    assert [len(e.ids) for e in a.entries] == [50, 50, 20] and free["down_super"] == 0
    assert [(w.name, kind) for w, kind, _ in alerts] == [("b", "queue_full")]


def test_plan_respects_total_cap():
    a, b = _work("a", 0, 80), _work("b", 5, 80)
    alerts = plan([a, b], {"down_high": 100, "down_low": 100}, total=100, batch_size=10)
    assert _taken(a) == 80 and _taken(b) == 20 and b.fresh_taken == 20
    assert alerts[0][1] == "total_cap" and "60 of 80" in alerts[0][2]


def test_plan_with_batch_size_one_counts_tasks():
    a = _work("a", 5, 10)
    plan([a], {"down_low": 4}, total=100, batch_size=1)
    assert _taken(a) == 4 and a.fresh_taken == 4


def test_retries_go_first_and_fresh_tasks_stop_at_the_first_that_does_not_fit():
    a = _work("a", 5, 30, again=5)
    a.fresh[3] = Picked("a-3", "h1", 4)  # bound for host h1, whose queue has no room
    plan([a], {"down_low": 10, "down_low@h1": 0}, total=100, batch_size=10)
    assert _taken(a, AGAIN) == 5 and a.fresh_taken == 3  # the cursor may pass seq 1..3 only
    assert fresh_cursor(a.fresh, 30, a.fresh_taken) == 3
    assert fresh_cursor(a.fresh, 30, len(a.fresh)) == 30


def test_fresh_limit_stops_below_intake_in_progress():
    now = NOW
    job = {"seq_next": 500, "intake": [{"seq": 301, "at": now}, {"seq": 101, "at": now - timedelta(hours=1)}]}
    assert fresh_limit(job, now) == 300  # the stale reservation (a dead intake) no longer holds it
    assert fresh_limit({"seq_next": 7}, now) == 7


def test_order_by_priority_host_or_both():
    jobs = [SimpleNamespace(name="x", priority=5, host=""), SimpleNamespace(name="y", priority=0, host="h2"),
            SimpleNamespace(name="z", priority=0, host="")]
    assert [j.name for j in sorted(jobs, key=lambda j: order_key(j, "priority"))] == ["y", "z", "x"]
    assert [j.name for j in sorted(jobs, key=lambda j: order_key(j, "host"))] == ["y", "z", "x"]
    jobs.append(SimpleNamespace(name="w", priority=5, host="h1"))
    assert [j.name for j in sorted(jobs, key=lambda j: order_key(j, "host"))] == ["w", "y", "z", "x"]
    assert [j.name for j in sorted(jobs, key=lambda j: order_key(j, "priority,host"))] == ["y", "z", "w", "x"]


@pytest.mark.parametrize("lease,in_queue,broken,attempt", [
    ({"state": "QUEUED"}, True, False, None),
    ({"state": "QUEUED", "created_at": NOW - timedelta(days=2)}, True, False, None),  # waiting is never death
    ({"state": "QUEUED"}, False, False, None),  # missing once: looked at again later
    ({"state": "QUEUED", "missing_at": NOW - timedelta(seconds=5)}, False, False, None),  # not for long enough
    ({"state": "QUEUED", "missing_at": NOW - timedelta(seconds=11)}, True, False, None),  # back in its queue
    ({"state": "QUEUED", "missing_at": NOW - timedelta(seconds=11)}, False, True, False),
    ({"state": "RUNNING", "started_at": NOW - timedelta(seconds=50), "beat_at": NOW - timedelta(seconds=3)}, False, False, None),
    ({"state": "RUNNING", "started_at": NOW - timedelta(seconds=50), "beat_at": NOW - timedelta(seconds=30)}, False, True, True),
    ({"state": "RUNNING", "started_at": NOW - timedelta(hours=2), "beat_at": NOW}, False, True, True),
    ({"state": "LOST", "lost_reason": "x", "started_at": NOW}, False, True, True),
])
def test_lease_verdict(lease, in_queue, broken, attempt):
    verdict = lease_verdict(lease, in_queue, NOW, 20, 3600, 10)
    assert (verdict is not None) == broken
    if broken:
        assert verdict[1] == attempt


def test_retry_backoff_jitter_retry_after_and_limits():
    rnd = random.Random(1)
    err = DownloadError("HTTP 503")
    delays = [(next_retry_at(err, n, 10, NOW, 2.0, 600.0, rnd) - NOW).total_seconds() for n in range(1, 6)]
    for n, d in enumerate(delays, 1):
        full = 2.0 * 2 ** (n - 1)
        assert full / 2 <= d <= full
    assert next_retry_at(err, 5, 5, NOW) is None  # retries exhausted
    assert next_retry_at(DownloadError("HTTP 404", retryable=False), 1, 5, NOW) is None
    later = next_retry_at(DownloadError("HTTP 429", retry_after=120), 1, 5, NOW, 2.0, 600.0)
    assert (later - NOW).total_seconds() >= 120
    capped = next_retry_at(DownloadError("HTTP 503", retry_after=10 ** 6), 1, 5, NOW, 2.0, 600.0)
    assert (capped - NOW).total_seconds() == 600


@pytest.mark.parametrize("url", ["http://example.com/a;b", "https://例え.jp/パス", "http://h/$(x)`y`",
                                 "http://127.0.0.1:8080/-rf"])
def test_check_url_accepts(url):
    assert check_url(url) == url


@pytest.mark.parametrize("url,why", [("ftp://h/x", "scheme"), ("file:///etc/passwd", "scheme"),
                                     ("http://h/a\nb", "whitespace"), ("-rf", "scheme"), ("http:///x", "host"),
                                     ("http://h/" + "a" * 9000, "longer"), ("http://h:99999/", "malformed")])
def test_check_url_rejects(url, why):
    with pytest.raises(ValidationError, match=why):
        check_url(url)


def test_secrets_are_redacted():
    remember("s3cr3t-cookie")
    text = "fail via http://user:pw@proxy:3128 with Cookie: a=b and s3cr3t-cookie; Authorization: Bearer xyz"
    out = redact(text)
    assert "pw" not in out and "s3cr3t-cookie" not in out and "xyz" not in out and "a=b" not in out
    assert strip_credentials("http://u:p@h/x") == "http://***@h/x"


@pytest.mark.parametrize("code,why", [
    ("def download(:\n", "does not parse"), ("x = 1\n", "no top-level"), ("def download():\n  pass\n", "argument"),
    ("class A:\n  def download(self, t): pass\n", "no top-level"),
])
def test_python_code_checked_without_running(code, why):
    with pytest.raises(ValidationError, match=why):
        check_python(code)
    check_python("import os\nos._exit(1)\ndef download(task):\n    return {}\n")  # parsed, never run


@pytest.mark.parametrize("settings_,why", [
    ({"dispatch_num": 0}, "dispatch_num"), ({"dispatch_num": "10"}, "dispatch_num"),
    ({"max_retry_times": -1}, "max_retry_times"), ({"proxy": "not a url"}, "proxy"),
    ({"proxy": "ftp://h:1"}, "proxy"), ({"prior": 3}, "prior"), ({"download_engine": "curl"}, "download_engine"),
    ({"report_mails": "nobody"}, "report_mails"), ({"bogus": 1}, "unknown"), ({"cookie": "a\nb"}, "cookie"),
    ({"headers": {"X": 1}}, "headers"),
])
def test_bad_settings_rejected(settings_, why):
    with pytest.raises(ValidationError, match=why):
        validate_settings(settings_)


def test_manifest_validation(tmp_path: Path):
    (tmp_path / "d.py").write_text("def download(task):\n    return {}\n")
    (tmp_path / "empty.sh").write_text("  \n")
    spec = validate_manifest({"name": "n", "priority": -1, "type": "python", "code": "d.py",
                              "settings": {"proxy": "http://u:p@proxy:3128"}}, tmp_path)
    assert spec.priority == -1 and "download" in spec.code
    for data, why in [({"name": "bad name!"}, "name"), ({"name": "n", "priority": True}, "priority"),
                      ({"name": "n", "type": "java"}, "type"), ({"name": "n", "type": "shell", "code": "empty.sh"}, "empty"),
                      ({"name": "n", "type": "python", "code": "missing.py"}, "cannot read"),
                      ({"name": "n", "type": "python"}, "needs code"), ({"name": "n", "extra": 1}, "unknown")]:
        with pytest.raises(ValidationError, match=why):
            validate_manifest(data, tmp_path)


def test_foreign_queues_sit_between_host_and_shared_queues():
    from common.queue.names import base_of, queue_name

    assert queue_name("down_mid", foreign=True) == "down_mid#foreign" and base_of("down_mid#foreign") == "down_mid"
    assert queue_name("down_mid", "h1", foreign=True) == "down_mid@h1"  # a host is more specific
    assert worker_queue_names("h1", foreign=True)[:4] == ["down_super@h1", "down_super#foreign", "down_super",
                                                          "down_high@h1"]
    assert "down_low#foreign" not in worker_queue_names("h1")


def test_the_job_settings_model_mirrors_the_one_declaration():
    from mongoengine import BooleanField, DictField, FloatField, IntField, StringField

    from common.jobsettings import SETTINGS
    from common.store.models import CrawlerDownloadSetting

    kinds = {int: IntField, float: FloatField, bool: BooleanField, str: StringField, dict: DictField}
    fields = CrawlerDownloadSetting._fields
    declared = {s.name for s in SETTINGS}
    assert declared <= set(fields)
    assert set(fields) - declared == {"id", "job", "add_datetime", "last_update_datetime"}
    for s in SETTINGS:
        field = fields[s.name]
        assert isinstance(field, kinds[s.kind]), s.name
        if s.kind in (int, float):
            assert (field.min_value, field.max_value) == (s.low, s.high), s.name
