"""A URL is a task of its job once, by its key in ``crawler_task_key`` (issue 40, part 3): intake
inserts the keys first, then the tasks of the keys it won; racing intakes (threads, processes)
add each URL once; a key whose task never came is taken over once stale; removals take the
keys after the tasks; ``migrate`` makes the keys of a store written before them."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

from bson import ObjectId

from common.store import counts, known, pages
from common.store import tasks as task_store
from common.store.clock import utcnow
from common.store.connection import connect_mongo, disconnect_mongo
from common.store.models import SUCCESS, CrawlerTask, CrawlerTaskKey, Job
from common.store.upgrade import retired_left
from master import intake
from tests.helpers import add_urls, register, statuses


def _keys(job_id) -> dict[str, ObjectId]:
    """{URL: the task its key names} of the job."""
    prefix = str(job_id)
    return {k["_id"][len(prefix):]: k["task"] for k in CrawlerTaskKey._get_collection().find()
            if k["_id"].startswith(prefix)}


def _tasks(job_id) -> dict[str, list[ObjectId]]:
    """{URL: the ids of its tasks} of the job."""
    out: dict[str, list[ObjectId]] = {}
    for d in CrawlerTask._get_collection().find({"job": job_id}, {"uri": 1}):
        out.setdefault(d["uri"], []).append(d["_id"])
    return out


def _each_once(job_id, urls) -> None:
    """Every URL of ``urls`` is one task of the job, named by its key; no other task or key;
    the kept counts agree."""
    tasks, keys = _tasks(job_id), _keys(job_id)
    assert sorted(tasks) == sorted(urls) and all(len(ids) == 1 for ids in tasks.values())
    assert keys == {u: ids[0] for u, ids in tasks.items()}
    assert sum(counts.of_jobs([job_id])[job_id].values()) == len(urls)


def _old_id() -> ObjectId:
    """A task id made longer than INTAKE_STALE ago (an intake that died then)."""
    return ObjectId.from_datetime(utcnow() - task_store.INTAKE_STALE - timedelta(minutes=1))


def test_intake_writes_a_key_per_url_and_reads_by_url_through_them(cluster, tmp_path):
    job = register(tmp_path, "k1")
    urls = [f"http://127.0.0.1:1/p{i}" for i in range(30)]
    add_urls("k1", urls[:20])
    assert "added 10, duplicate 20" in add_urls("k1", urls)  # ten new, twenty the job has
    _each_once(job.id, urls)
    assert task_store.known_uris(job.id, [*urls[:5], "http://127.0.0.1:1/none"]) == set(urls[:5])
    found = pages.task(job.id, None, urls[7])
    assert found is not None and found.uri == urls[7] and found.id == _keys(job.id)[urls[7]]
    assert pages.task(job.id, None, "http://127.0.0.1:1/none") is None
    other = register(tmp_path, "k2")  # another job's keys are its own
    assert task_store.known_uris(other.id, urls) == set()
    assert pages.task(other.id, None, urls[7]) is None


def test_a_url_twice_in_one_insert_is_one_task_named_by_its_key(cluster, tmp_path):
    """``insert_numbered`` called with a URL twice (its callers dedup; the store holds anyway)."""
    job = register(tmp_path, "k3")
    urls = ["http://127.0.0.1:1/a", "http://127.0.0.1:1/b", "http://127.0.0.1:1/a"]
    first = task_store.reserve(job.id, len(urls))
    new = [task_store.NewTask(u) for u in urls]
    assert task_store.insert_numbered(job.id, new, first, utcnow()) == (2, 1)
    task_store.commit(job.id, first, len(urls))
    _each_once(job.id, urls[:2])


def test_intakes_of_the_same_urls_in_threads_add_each_once(cluster, tmp_path):
    job = register(tmp_path, "race")
    urls = [f"http://127.0.0.1:1/r{i}" for i in range(400)]
    reports, errors = [], []

    def run(part: list[str]) -> None:
        try:
            reports.append(intake.add_tasks("race", part))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    parts = [urls[i::2] + urls[:200] for i in range(2)] + [urls[::-1], urls]  # overlapping, orders differ
    threads = [threading.Thread(target=run, args=(p,)) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.added for r in reports) == len(urls)
    assert sum(r.added + r.duplicate for r in reports) == sum(len(p) for p in parts)
    _each_once(job.id, urls)


def test_intakes_of_the_same_urls_in_two_processes_add_each_once(cluster, tmp_path):
    job = register(tmp_path, "procs")
    urls = [f"http://127.0.0.1:1/q{i}" for i in range(1500)]
    lists = [urls, urls[::-1]]
    files = []
    for n, part in enumerate(lists):
        f = tmp_path / f"urls{n}.txt"
        f.write_text("\n".join(part) + "\n")
        files.append(f)
    env = {**os.environ, **cluster.env}
    exe = str(Path(sys.executable).parent / "downcluster")
    procs = [subprocess.Popen([exe, "task", "add", "procs", str(f)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for f in files]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    _each_once(job.id, urls)


def test_a_key_without_its_task_is_taken_over_once_stale(cluster, tmp_path):
    """An intake that died between its key and its task: a young key refuses the URL (its intake
    may be inserting), a stale one is taken over and the URL added."""
    job = register(tmp_path, "dead")
    url, young = "http://127.0.0.1:1/died", "http://127.0.0.1:1/young"
    keys = CrawlerTaskKey._get_collection()
    keys.insert_one({"_id": task_store.key_of(job.id, url), "task": _old_id()})
    keys.insert_one({"_id": task_store.key_of(job.id, young), "task": ObjectId()})
    assert task_store.known_uris(job.id, [url, young]) == set()  # no task behind either key
    report = intake.add_tasks("dead", [url, young])
    assert (report.added, report.duplicate) == (1, 1)
    assert list(_tasks(job.id)) == [url] and _keys(job.id)[url] == _tasks(job.id)[url][0]
    assert intake.add_tasks("dead", [url]).duplicate == 1  # taken once: now it is the job's


def test_a_stalled_intakes_late_task_loses_to_the_key_taken_over(cluster, tmp_path, monkeypatch):
    """Intake A stalls between its key and its task past INTAKE_STALE (here 0: every key is
    stale, every intake slow); B takes the key over and adds the URL. A's late task, whichever
    side finds it, is removed: the URL stays one task, the one its key names."""
    monkeypatch.setattr(task_store, "INTAKE_STALE", timedelta(0))
    job = register(tmp_path, "stall")
    url = "http://127.0.0.1:1/stalled"
    real_insert_keys = task_store._insert_keys
    took: list[tuple] = []

    def a_stalls(job_id, keys, now):  # A has its key; B runs before A's task insert
        won = real_insert_keys(job_id, keys, now)
        monkeypatch.setattr(task_store, "_insert_keys", real_insert_keys)
        took.append(intake.add_tasks("stall", [url]).added)
        return won

    monkeypatch.setattr(task_store, "_insert_keys", a_stalls)
    report = intake.add_tasks("stall", [url])
    assert took == [1] and (report.added, report.duplicate) == (0, 1)  # A's task removed: its key is B's
    _each_once(job.id, [url])

    # the other side: A's task lands after B took the key over and before B's check of it
    url2 = "http://127.0.0.1:1/late"
    stale = _old_id()
    CrawlerTaskKey._get_collection().insert_one({"_id": task_store.key_of(job.id, url2), "task": stale})
    real_stale = task_store._stale_keys

    def a_lands(job_id, keys, now):
        taken = real_stale(job_id, keys, now)
        CrawlerTask._get_collection().insert_one(
            {"_id": stale, "job": job_id, "uri": url2, "seq": 0, "status": "LIVE", "download_times": 0})
        counts.move([(job_id, None, "LIVE", 1)])
        return taken

    monkeypatch.setattr(task_store, "_stale_keys", a_lands)
    assert intake.add_tasks("stall", [url2]).added == 1
    _each_once(job.id, [url, url2])
    assert stale not in _tasks(job.id)[url2]


def test_retention_removes_the_keys_of_the_tasks_it_removes(cluster, tmp_path):
    from master.ops import retention
    from tests.integration.test_exports import _job_with_pages

    _job_with_pages(cluster, tmp_path, n=3, name="short", data_retention_days=1)
    job = Job.objects.get(name="short")
    urls = list(_tasks(job.id))
    assert sorted(_keys(job.id)) == sorted(urls) and statuses("short") == {SUCCESS: 3}
    report = retention.enforce(now=utcnow() + timedelta(days=2))
    assert report.tasks == 3 and _tasks(job.id) == {} and _keys(job.id) == {}
    assert intake.add_tasks("short", urls).added == 3  # the job may have them again
    _each_once(job.id, urls)


def test_known_urls_are_refused_by_the_filter_in_redis_before_mongodb(cluster, tmp_path, monkeypatch):
    """Issue 54: a found URL the job has is refused by the filter in Redis
    (``common.store.known``) without a read of MongoDB; with Redis flushed, MongoDB (the truth)
    refuses it and the filter is rebuilt from that read; a URL in neither is added. URLs given
    (``task add``) neither read nor fill it."""
    import common.intake
    from common.jobsettings import Follow

    job = register(tmp_path, "filt")
    seed = "http://127.0.0.1:1/"
    intake.add_tasks("filt", [seed])
    page, follow = _tasks(job.id)[seed][0], Follow(max_depth=10, max_pages=1000)
    urls = [f"http://127.0.0.1:1/{i}" for i in range(50)]

    def found(links: list[str]):
        return common.intake.add_found(job.id, follow, [(page, seed, links)])

    assert found(urls).added == 50
    asked: list[list[str]] = []
    real = common.intake.known_uris
    monkeypatch.setattr(common.intake, "known_uris", lambda j, u: asked.append(u) or real(j, u))
    assert found(urls).duplicate == 50 and asked == []
    assert intake.add_tasks("filt", urls).duplicate == 50 and sorted(asked.pop()) == sorted(urls)
    cluster.redis.flushall()
    assert found(urls).duplicate == 50 and sorted(asked[0]) == sorted(urls)
    new = "http://127.0.0.1:1/new"
    assert found([*urls, new]).added == 1 and asked[1] == [new]  # rebuilt
    _each_once(job.id, [seed, *urls, new])
    known.forget(job.id)  # what retention does around a removal: a new generation, empty
    assert found(urls).duplicate == 50 and sorted(asked[2]) == sorted(urls)


def test_migrate_makes_the_keys_of_a_store_written_before_them(cluster, tmp_path, monkeypatch, caplog):
    """A store of the version before: tasks with no keys, a unique (job, uri). Until ``migrate``
    runs, processes say so and no URL is added twice (the old index refuses it, the key written
    for it is removed); ``migrate`` makes every key in batches, then drops the index."""
    from master.ops import migrate as migrate_mod

    job = register(tmp_path, "old")
    urls = [f"http://127.0.0.1:1/o{i}" for i in range(25)]
    add_urls("old", urls)
    tasks = CrawlerTask._get_collection()
    tasks.create_index([("job", 1), ("uri", 1)], unique=True)
    CrawlerTaskKey._get_collection().delete_many({})  # as the version before wrote them
    assert retired_left() == ["crawler_task (job, uri)"]
    disconnect_mongo()
    with caplog.at_level(logging.WARNING, logger="common.store.connection"):
        connect_mongo(ensure_indexes=True)  # as every process starts
    assert "an index of an earlier version, crawler_task (job, uri): run `downcluster migrate`" in caplog.text
    report = intake.add_tasks("old", [*urls[:3], "http://127.0.0.1:1/new"])
    assert (report.added, report.duplicate) == (1, 3)
    assert sorted(_keys(job.id)) == ["http://127.0.0.1:1/new"]  # the refused ones' keys removed
    monkeypatch.setattr(task_store.build_keys, "__defaults__", (7,))  # batches of 7
    got = migrate_mod.migrate()
    assert got.keys_made == 25 and got.indexes_retired == 1 and retired_left() == []
    assert not any(list(ix["key"]) == ["job", "uri"] for ix in CrawlerTask._get_collection().list_indexes())
    _each_once(job.id, [*urls, "http://127.0.0.1:1/new"])
    assert intake.add_tasks("old", urls).duplicate == 25
    again = migrate_mod.migrate()
    assert (again.keys_made, again.indexes_retired) == (0, 0)  # idempotent
    caplog.clear()
    disconnect_mongo()
    with caplog.at_level(logging.WARNING, logger="common.store.connection"):
        connect_mongo(ensure_indexes=True)
    assert "earlier version" not in caplog.text
