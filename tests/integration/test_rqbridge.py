"""The rq adapter is pinned to the rq it was written for: these fail when rq changes a format
that ``common/queue/rqbridge.py`` writes or reads below rq's public API."""
from __future__ import annotations

import json
import os
import zlib
from datetime import datetime, timezone

import pytest
import rq
from rq import Queue
from rq.job import Job, JobStatus

from common.queue import rqbridge
from common.queue.names import LOCK_KEY


def test_key_names_are_rqs_own(cluster):
    q = Queue("down_low", connection=cluster.redis)
    assert rqbridge.queue_key("down_low") == q.key
    assert rqbridge.queue_name_of(q.key) == "down_low"
    assert Job.key_for("dc-x") == Job("dc-x", connection=cluster.redis).key


def _push(cluster, queue: str, lease: str, cap: int = 10, token: str = "t", at_front: bool = False) -> int:
    cluster.redis.set(LOCK_KEY, "t")
    mapping = rqbridge.entry_mapping(rqbridge.rq_queue(queue, cluster.redis), lease, 300, 60, "job x1",
                                     datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc))
    return rqbridge.push_entry(cluster.redis, LOCK_KEY, queue, rqbridge.entry_id(lease), mapping, cap, token,
                               at_front=at_front)


def test_a_pushed_entry_is_an_rq_job_that_rq_reads(cluster):
    assert _push(cluster, "down_mid", "abc") == rqbridge.PUSHED
    q = Queue("down_mid", connection=cluster.redis)
    assert q.count == 1 and q.job_ids == ["dc-abc"]
    assert "down_mid" in [x.name for x in Queue.all(connection=cluster.redis)]  # rq's set of queues
    job = Job.fetch("dc-abc", connection=cluster.redis, serializer="json")
    assert job.func_name == rqbridge.DOWNLOAD_FUNCTION and list(job.args) == ["abc"]
    data = cluster.redis.hget(Job.key_for("dc-abc"), "data")
    assert json.loads(zlib.decompress(data)) == [
        rqbridge.DOWNLOAD_FUNCTION,
        None,
        ["abc"],
        {},
    ]  # JSON, not pickle
    assert job.origin == "down_mid" and job.get_status() == JobStatus.QUEUED
    assert job.meta == {"kind": "download"}  # the entry states its kind
    entry = rqbridge.fetch_entry(cluster.redis, "dc-abc")
    assert entry is not None and (entry.entry_kind, entry.ref) == (rqbridge.EntryKind.DOWNLOAD, "abc")
    assert job.enqueued_at == datetime(2026, 11, 23, 12, 0, tzinfo=timezone.utc).replace(
        tzinfo=job.enqueued_at.tzinfo
    )
    assert (
        job.timeout == 300 and job.result_ttl == 0 and job.failure_ttl == 60 and job.description == "job x1"
    )
    assert rqbridge.oldest_enqueued_at(cluster.redis, "down_mid").replace(tzinfo=None) == datetime(
        2026, 11, 23, 12, 0
    )


def test_the_push_holds_the_cap_and_the_lock(cluster):
    assert _push(cluster, "down_low", "a", cap=1) == rqbridge.PUSHED
    assert _push(cluster, "down_low", "b", cap=1) == rqbridge.FULL
    assert _push(cluster, "down_low", "c", cap=5, token="other") == rqbridge.NOT_OWNER
    assert Queue("down_low", connection=cluster.redis).job_ids == ["dc-a"]
    assert not Job.exists("dc-b", connection=cluster.redis) and not Job.exists(
        "dc-c", connection=cluster.redis
    )


def test_pop_is_strict_order_and_at_front_jumps_its_queue(cluster):
    _push(cluster, "down_low", "low")
    _push(cluster, "down_high", "high1")
    _push(cluster, "down_high", "high0", at_front=True)
    order = ["down_super", "down_high", "down_mid", "down_low"]
    got = [rqbridge.pop_entry(cluster.redis, order) for _ in range(4)]
    assert got == [("down_high", "dc-high0"), ("down_high", "dc-high1"), ("down_low", "dc-low"), None]


def test_waiting_entries_and_deletion(cluster):
    _push(cluster, "down_low", "w1")
    _push(cluster, "down_low@alpha", "w2")
    assert rqbridge.entries_waiting(cluster.redis, ["down_low", "down_low@alpha"]) == {"dc-w1", "dc-w2"}
    rqbridge.delete_entry(cluster.redis, "dc-w1")
    assert not rqbridge.entry_exists(cluster.redis, "dc-w1")
    assert Queue("down_low", connection=cluster.redis).count == 0


class _Mark:
    """A pickle payload that would leave a file behind if anything unpickled it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("entry", ["dc-planted", "dcx-planted", "os-getcwd"])
def test_a_planted_pickle_entry_is_refused_unread(cluster, tmp_path, entry):
    """An entry written by someone who reached Redis, with pickled data and meta that would run
    code: fetched as ours it is refused (ForeignEntry), nothing is unpickled."""
    mark = tmp_path / "mark"
    planted = rq.Queue("down_low", connection=cluster.redis).enqueue_call(
        "os.getcwd", args=(_Mark(str(mark)),), job_id=entry, meta={"x": _Mark(str(mark))})
    assert planted.id == entry and cluster.redis.hget(Job.key_for(entry), "meta").startswith(
        b"\x80"
    )  # pickle
    with pytest.raises(rqbridge.ForeignEntry):
        rqbridge.fetch_entry(cluster.redis, entry)
    assert rqbridge.oldest_enqueued_at(cluster.redis, "down_low") is not None  # read as text only
    rqbridge.delete_entry(cluster.redis, entry)  # refuses to read it, so leaves it
    assert not mark.exists()


@pytest.mark.parametrize("func,entry,arg", [("slave.jobs.run_batch", "dc-old", "old"),
                                            ("slave.jobs.run_export", "dcx-old", "old")])
def test_an_entry_queued_before_the_rooms_layout_still_runs(cluster, func, entry, arg):
    """Entries queued by a version whose functions lived in slave/jobs.py are ours: fetched, not
    refused (an export entry refused would stay PENDING), and rq can still import their function."""
    from rq.serializers import JSONSerializer

    rq.Queue("down_low", connection=cluster.redis, serializer=JSONSerializer).enqueue_call(
        func, args=(arg,), job_id=entry)
    got = rqbridge.fetch_entry(cluster.redis, entry)
    assert got is not None and list(got.job.args) == [arg] and got.ref == arg
    kinds = rqbridge.EntryKind
    assert got.entry_kind == (kinds.DOWNLOAD if entry.startswith("dc-") else kinds.EXPORT)


def test_generator_and_export_entries_state_their_kind(cluster):
    rqbridge.push_generate(cluster.redis, "down_generate", "run1", 60)
    rqbridge.push_export(cluster.redis, "down_export", "exp1", 60)
    got = [rqbridge.fetch_entry(cluster.redis, e) for e in ("dcg-run1", "dcx-exp1")]
    # rq's meta may carry more (Sentry's trace headers once an earlier test started Sentry)
    assert [(e.entry_kind, e.ref, e.job.meta["kind"]) for e in got if e] == [
        (rqbridge.EntryKind.GENERATE, "run1", "generate"),
        (rqbridge.EntryKind.EXPORT, "exp1", "export"),
    ]


@pytest.mark.parametrize("func,entry,meta", [
    (rqbridge.DOWNLOAD_FUNCTION, "dcx-x", {"kind": "download"}),  # a kind its id does not allow
    (rqbridge.EXPORT_FUNCTION, "dc-x", {}),                         # an old entry: the same, derived
    (rqbridge.DOWNLOAD_FUNCTION, "dc-x", {"kind": "export"}),       # a kind its function is not
    (rqbridge.DOWNLOAD_FUNCTION, "dc-x", {"kind": "mine"}),         # no kind of ours
])
def test_an_entry_whose_kind_id_and_call_disagree_is_refused(cluster, func, entry, meta):
    rqbridge.rq_queue("down_low", cluster.redis).enqueue_call(func, args=("x",), job_id=entry, meta=meta)
    with pytest.raises(rqbridge.ForeignEntry):
        rqbridge.fetch_entry(cluster.redis, entry)
    assert callable(Job.fetch(entry, connection=cluster.redis, serializer="json").func)
