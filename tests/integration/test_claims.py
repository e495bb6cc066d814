"""The one claim protocol (``common/store/claims.py``) as its newer users see it, driven step by
step on real services: a generator run's worker beats it and is given up when it stops (the run
FAIL, alerted, the late worker fenced out), the outbox takes a dead deliverer's claim back and
gives up at MAX_RECOVERIES, and a claim an earlier version held (``claimed_until``) is kept
until it lapses."""
from __future__ import annotations

from datetime import timedelta

from common.config import settings
from common.store import claims, notifications
from common.store import generators as store_generators
from common.store.clock import store_now, utcnow
from common.store.log_models import CrawlerDispatchAlertLog, CrawlerGeneratorLog
from common.store.models import CrawlerGenerator, Notification
from master import generators
from tests.integration.test_generators import _due_generator


def _silence(coll, doc_id, seconds: float) -> None:
    """The holder's last beat ``seconds`` ago (it stopped beating)."""
    coll.update_one({"_id": doc_id}, {"$set": {"beat_at": store_now() - timedelta(seconds=seconds)}})


def test_a_generator_run_is_beaten_and_given_up_when_its_worker_stops(cluster, tmp_path):
    _due_generator(tmp_path, cluster)
    assert generators.tend(cluster.redis)["started"] == 1
    run_id = CrawlerGeneratorLog.objects.get().run
    taken = store_generators.start_run(run_id, "h1", store_now())
    assert taken is not None and taken[1].beat_at is not None  # the worker's claim
    assert store_generators.start_run(run_id, "h2", store_now()) is None  # delivered twice: runs once
    gen_id = taken[1].id
    assert claims.beat(store_generators.RUN, [gen_id], run_id) == 1
    assert generators.tend(cluster.redis)["lost"] == 0  # beating: alive

    _silence(CrawlerGenerator._get_collection(), gen_id, settings.HEARTBEAT_TTL + 5)
    assert generators.tend(cluster.redis)["lost"] == 1
    log = CrawlerGeneratorLog.objects.get(run=run_id)
    assert log.status == "FAIL" and "no heartbeat" in log.failed_reason
    gen = CrawlerGenerator.objects.get(id=gen_id)
    assert gen.running_run is None and gen.recoveries == 1 and gen.last_status == "FAIL"
    assert CrawlerDispatchAlertLog.objects(type="generator_fail").count() == 1

    # the worker wakes up: it holds nothing, and its end changes nothing
    assert claims.beat(store_generators.RUN, [gen_id], run_id) == 0
    store_generators.end_run(run_id, gen.job.id, store_now(), status="SUCCESS")
    assert CrawlerGeneratorLog.objects.get(run=run_id).status == "FAIL"
    assert CrawlerGenerator.objects.get(id=gen_id).last_status == "FAIL"


def test_the_outbox_takes_a_dead_deliverers_claim_back_then_gives_up(cluster):
    notifications.add("webhook", "http://127.0.0.1:9/hook", "export.succeeded", "{}")
    coll = Notification._get_collection()
    for recovery in range(1, settings.MAX_RECOVERIES + 1):
        doc = notifications.claim(utcnow(), f"dead-{recovery}")
        assert doc is not None and doc.worker == f"dead-{recovery}" and doc.attempts == recovery
        assert notifications.claim(utcnow(), "other") is None  # held: one deliverer at a time
        assert notifications.recover(store_now()) == 0  # not yet lapsed
        _silence(coll, doc.id, notifications.HOLD + 5)
        assert notifications.recover(store_now()) == 1
        notifications.delivered(doc)  # the dead deliverer's late write: fenced out
        after = coll.find_one({"_id": doc.id})
        assert after["worker"] is None and after["recoveries"] == recovery
        assert after["state"] == ("FAIL" if recovery == settings.MAX_RECOVERIES else "PENDING")
    assert notifications.claim(utcnow(), "other") is None


def test_a_claim_of_an_earlier_version_is_held_until_it_lapses(cluster):
    coll = Notification._get_collection()
    now = utcnow()
    held, lapsed = (coll.insert_one({"kind": "webhook", "target": "http://127.0.0.1:9/x", "event": "e",
                                     "body": "{}", "state": "PENDING", "attempts": 1, "next_at": now,
                                     "claimed_until": until}).inserted_id
                    for until in (now + timedelta(seconds=60), now - timedelta(seconds=1)))
    assert notifications.upgrade_claims() == 2 and notifications.upgrade_claims() == 0
    assert notifications.claim(utcnow(), "new") is None  # both still held by the earlier version
    assert notifications.recover(store_now()) == 1  # the lapsed one only
    assert coll.find_one({"_id": lapsed})["worker"] is None
    assert coll.find_one({"_id": held})["worker"] == "earlier version"
    taken = notifications.claim(utcnow(), "new")
    assert taken is not None and taken.id == lapsed
