"""Queues that stopped draining: a queue whose head entry has waited longer than
QUEUE_STALL_ALERT and has stayed its head for that long — no worker took from it (workers pop
the head, so a backlog they are eating keeps changing its head, however deep it is) — gets a
``queue_stall`` alert in ``crawler_dispatch_alert_log`` for each job with entries waiting in it;
the jobs' ``report_mails`` hear of it through the report mails' alert (at most one per job per
ALERT_MAIL_INTERVAL). One alert per queue per QUEUE_STALL_ALERT, however many dispatcher runs
see it. Run by every dispatcher run: each run notes each queue's head and since when it has been
seen there (``downcluster:stall:heads``)."""
from __future__ import annotations

import time

from bson import ObjectId
from redis import Redis

from common.config import settings
from common.queue.names import EXPORT_QUEUE
from common.queue.rqbridge import rq_queue
from common.store import logs, pages
from common.store.clock import utcnow
from common.store.connection import as_text
from master.ops.stats import queue_stats

HEADS = "downcluster:stall:heads"
QUIET_KEY = "downcluster:stall:"


def _unmoved_for(redis: Redis, queue: str, now: float) -> float:
    """Seconds the queue's head has been the same entry, as seen by these checks (0: it moved)."""
    ids = rq_queue(queue, redis).get_job_ids(0, 1)
    if not ids:
        redis.hdel(HEADS, queue)
        return 0.0
    seen = redis.hget(HEADS, queue)
    head, _, since = as_text(seen or b"").partition(" ")
    if head != ids[0]:
        redis.hset(HEADS, queue, f"{ids[0]} {now}")
        return 0.0
    return now - float(since)


def check_stalls(redis: Redis) -> list[str]:
    """The queues found stalled now (alerts written for them)."""
    limit = settings.QUEUE_STALL_ALERT
    if not limit:
        return []
    now, stamp = time.time(), utcnow()
    stalled = []
    for q in queue_stats(redis):
        if q["queue"] == EXPORT_QUEUE:
            continue
        unmoved = _unmoved_for(redis, q["queue"], now)
        if q["oldest_age_s"] is None or q["oldest_age_s"] <= limit or unmoved < limit:
            continue  # young, or workers are taking from it: a backlog, not a stall
        if not redis.set(QUIET_KEY + q["queue"], "1", nx=True, ex=int(limit)):
            continue  # already told within the period
        jobs: list[ObjectId | None] = [*pages.jobs_queued_in(q["queue"])]
        reason = (f"queue {q['queue']} has not drained: its oldest entry waited {q['oldest_age_s']:.0f} s "
                  f"(QUEUE_STALL_ALERT {limit} s) and no worker took from it; {q['depth']} entries wait")
        logs.add_alerts([(job, "queue_stall", reason) for job in jobs or [None]], stamp)
        stalled.append(q["queue"])
    return stalled
