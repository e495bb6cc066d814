"""Small helpers shared by the tests."""
from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from common.cli import main
from common.store.clock import store_now
from common.store.models import CrawlerLease, CrawlerTask, Job

# An export template of the first form: header paths grouped by their common prefixes.
TEMPLATE = '''
sheet = "pages"
[[columns]]
header = ["Request", "URL"]
field = "url"
[[columns]]
header = ["Response", "Status"]
field = "status_code"
[[columns]]
header = ["Response", "Size"]
field = "response_size"
[[columns]]
header = ["Fetched", "At"]
field = "add_datetime"
format = "yyyy-mm-dd hh:mm:ss"
'''


def clock_skew(seconds: float) -> dict[str, str]:
    """Environment that runs a Python process with its wall clock ``seconds`` off (tests/clockskew)."""
    return {
        "PYTHONPATH": str(Path(__file__).parent / "clockskew"),
        "DOWNCLUSTER_TEST_CLOCK_SKEW": str(seconds),
    }


def cli(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def write_job(tmp_path: Path, name: str, priority: int = 5, kind: str = "none", code: str = "",
              host: str = "", **settings) -> Path:
    """A manifest; the job may reach loopback (the sample site) unless ``settings`` say."""
    settings.setdefault("allow_private", True)
    lines = [f'name = "{name}"', f"priority = {priority}", f'type = "{kind}"']
    if host:
        lines.append(f'host = "{host}"')
    if kind != "none":
        suffix = "py" if kind == "python" else "sh"
        (tmp_path / f"{name}.{suffix}").write_text(code)
        lines.append(f'code = "{name}.{suffix}"')
    if settings:
        lines.append("[settings]")
        for key, value in settings.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            else:
                lines.append(f"{key} = {value!r}" if not isinstance(value, str) else f'{key} = "{value}"')
    manifest = tmp_path / f"{name}.toml"
    manifest.write_text("\n".join(lines) + "\n")
    return manifest


def register(tmp_path: Path, name: str, **kw) -> Job:
    result = cli("job", "register", str(write_job(tmp_path, name, **kw)))
    assert result.exit_code == 0, result.output
    return Job.objects.get(name=name)


def add_urls(name: str, urls: list[str]) -> str:
    result = cli("task", "add", name, "-", input="\n".join(urls) + "\n")
    assert result.exit_code == 0, result.output
    return result.output


def statuses(name: str) -> dict[str, int]:
    job = Job.objects.get(name=name)
    out: dict[str, int] = {}
    for t in CrawlerTask.objects(job=job).only("status"):
        out[t.status] = out.get(t.status, 0) + 1
    return out


def sent(name: str) -> int:
    """Tasks of job ``name`` out in queue entries (waiting or running): a fresh task keeps
    status LIVE while it is out, and its entry's lease lists it."""
    from common.store.models import CrawlerLease

    job = Job.objects.get(name=name)
    return sum(len(doc["ids"]) for doc in CrawlerLease._get_collection().find(
        {"job": job.id, "state": {"$in": ["QUEUED", "RUNNING"]}}, {"ids": 1}))


def burst_worker(cluster, *extra: str) -> None:
    """Run `downcluster worker --burst EXTRA...` to the end against ``cluster`` (a subprocess)."""
    import os
    import subprocess
    import sys

    done = subprocess.run([str(Path(sys.executable).parent / "downcluster"), "worker", "--burst", *extra],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **cluster.env})
    assert done.returncode == 0, done.stderr[-2000:]


def store_outcomes(ctx, lease: str, attempt_kind: str, outcomes: list, now) -> dict:
    """Store one entry's outcomes as the worker's writer does (``store_many`` of one part)."""
    from slave.worker import writer

    return writer.store_many([writer.Part(ctx, lease, attempt_kind, outcomes)], now)[0]


def wait_for(predicate, timeout: float = 60.0, what="condition"):
    """``predicate()``'s first truthy value, asked every 0.05 s; AssertionError naming ``what``
    (a text, or a function that makes one then) after ``timeout`` seconds. A generous timeout
    costs nothing when the event comes."""
    end = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > end:
            what = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def heartbeats_stale(ttl: float) -> bool:
    """No RUNNING lease showed life (``beat_at``, else ``started_at``) in the last ``ttl`` seconds
    of the store's clock: the defender now judges every running entry's worker dead."""
    fresh = store_now() - timedelta(seconds=ttl)
    return not any((lease.get("beat_at") or lease.get("started_at") or fresh) >= fresh
                   for lease in CrawlerLease._get_collection().find({"state": "RUNNING"},
                                                                    {"beat_at": 1, "started_at": 1}))


# a killed worker judged dead within seconds (the ``fast_recovery`` fixture of tests/conftest.py)
FAST_RECOVERY = {"DOWNCLUSTER_HEARTBEAT_INTERVAL": "1", "DOWNCLUSTER_HEARTBEAT_TTL": "3",
                 "DOWNCLUSTER_ABSENCE_GRACE": "0"}


def with_settings(cluster, monkeypatch, values: dict[str, str]):
    """``cluster`` with the DOWNCLUSTER_* ``values`` set here (settings reloaded) and for the
    processes it starts (``cluster.env``), undone after the test."""
    from common.config import load

    for key, value in values.items():
        monkeypatch.setenv(key, value)
        cluster.env[key] = value
    load()
    return cluster
