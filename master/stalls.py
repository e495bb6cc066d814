"""Queues that stopped draining: a queue whose oldest entry has waited longer than
QUEUE_STALL_ALERT while no worker took an entry from it in that time (a backlog that workers are
eating is not a stall) gets a ``queue_stall`` alert in ``crawler_dispatch_alert_log`` for each
job with entries waiting in it; the jobs' ``report_mails`` hear of it through the report mails'
alert (at most one per job per ALERT_MAIL_INTERVAL). One alert per queue per QUEUE_STALL_ALERT,
however many dispatcher runs see it. Run by every dispatcher run."""
from __future__ import annotations

from datetime import timedelta

from redis import Redis

from common.config import settings
from common.models import QUEUED, CrawlerDispatchAlertLog, CrawlerLease, utcnow
from common.queues import EXPORT_QUEUE
from master.stats import queue_stats

QUIET_KEY = "downcluster:stall:"


def check_stalls(redis: Redis) -> list[str]:
    """The queues found stalled now (alerts written for them)."""
    limit = settings.QUEUE_STALL_ALERT
    if not limit:
        return []
    now = utcnow()
    since = now - timedelta(seconds=limit)
    leases = CrawlerLease._get_collection()
    stalled = []
    for q in queue_stats(redis):
        if q["queue"] == EXPORT_QUEUE or q["oldest_age_s"] is None or q["oldest_age_s"] <= limit:
            continue
        if leases.find_one({"queue": q["queue"], "started_at": {"$gte": since}}, {"_id": 1}):
            continue  # workers are taking from it: a backlog, not a stall
        if not redis.set(QUIET_KEY + q["queue"], "1", nx=True, ex=int(limit)):
            continue  # already told within the period
        jobs = leases.distinct("job", {"queue": q["queue"], "state": QUEUED})
        reason = (f"queue {q['queue']} has not drained: its oldest entry waited {q['oldest_age_s']:.0f} s "
                  f"(QUEUE_STALL_ALERT {limit} s) and no worker took from it; {q['depth']} entries wait")
        CrawlerDispatchAlertLog._get_collection().insert_many([
            {"job": job, "type": "queue_stall", "reason": reason, "content_bytes": len(reason.encode()),
             "hostname": settings.HOSTNAME, "add_datetime": now} for job in jobs] or [
            {"job": None, "type": "queue_stall", "reason": reason, "content_bytes": len(reason.encode()),
             "hostname": settings.HOSTNAME, "add_datetime": now}])
        stalled.append(q["queue"])
    return stalled
