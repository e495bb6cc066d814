"""``downcluster stats``: queue depths and ages (the download queues and ``down_export``), task
counts per job, recent success rate; each look at the queues is remembered for the console's chart."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from redis import Redis

from common.metrics import pages_in, sample_depths
from common.queue.names import EXPORT_QUEUE, QUEUE_NAMES, base_of, cap
from common.queue.rqbridge import depths_and_oldest, our_queues
from common.sitelimits import throttled
from common.store import counts as tallies
from common.store import jobs, leases
from common.store.models import QUEUED, TASK_STATUSES

COLUMNS = (*TASK_STATUSES, "queued", "running")  # per job: tasks by status, and of LIVE and DISPATCH
                                                 # tasks, those out in entries


def queue_stats(redis: Redis) -> list[dict[str, Any]]:
    names = our_queues(redis)
    order = {name: i for i, name in enumerate(QUEUE_NAMES)}
    now = datetime.now(timezone.utc)
    rows: list[dict[str, Any]] = []
    listed = [*sorted(names, key=lambda n: (order[base_of(n)], n)), EXPORT_QUEUE]
    for name, (depth, stamp) in zip(listed, depths_and_oldest(redis, listed)):
        age = round((now - stamp).total_seconds(), 1) if stamp else None
        rows.append({"queue": name, "depth": depth, "cap": None if name == EXPORT_QUEUE else cap(name),
                     "oldest_age_s": age})
    sample_depths(redis, {r["queue"]: r["depth"] for r in rows})
    return rows


def task_counts() -> list[dict[str, Any]]:
    names = jobs.names()
    counts: dict[Any, dict[str, int]] = {job: {**dict.fromkeys(COLUMNS, 0), **c}
                                         for job, c in tallies.of_jobs().items() if any(c.values())}
    # where the tasks sent out are: waiting in a queue or being downloaded (a fresh task keeps
    # status LIVE until it is settled; these columns say it is out); a page out for a revisit
    # keeps SUCCESS, and is counted there only
    for (job, state), n in leases.tasks_out().items():
        c = counts.setdefault(job, dict.fromkeys(COLUMNS, 0))
        c["queued" if state == QUEUED else "running"] += n
    return [{"job": names.get(job, str(job)), **c}
            for job, c in sorted(counts.items(), key=lambda kv: names.get(kv[0], ""))]


def success_rate(redis: Redis, hours: float = 1.0) -> dict[str, Any]:
    """Pages stored and failed in the last ``hours`` (the workers' per-minute counters in Redis,
    common/metrics.py: no read of the download logs, however many the store holds)."""
    success, fail = pages_in(redis, max(1, round(hours * 60)))
    total = success + fail
    return {"window_hours": hours, "success": success, "fail": fail,
            "rate": round(success / total, 4) if total else None}


def collect(redis: Redis) -> dict[str, Any]:
    return {"queues": queue_stats(redis), "jobs": task_counts(), "last_hour": success_rate(redis),
            "throttled_hosts": throttled(redis)}


def render(stats: dict[str, Any]) -> str:
    lines = [f"{'queue':<28}{'depth':>8}{'cap':>8}{'oldest(s)':>12}"]
    for q in stats["queues"]:
        age = "-" if q["oldest_age_s"] is None else f"{q['oldest_age_s']:.1f}"
        lines.append(f"{q['queue']:<28}{q['depth']:>8}{'-' if q['cap'] is None else q['cap']:>8}{age:>12}")
    lines.append("")
    lines.append(f"{'job':<24}" + "".join(f"{s:>10}" for s in COLUMNS))
    for row in stats["jobs"]:
        lines.append(f"{row['job']:<24}" + "".join(f"{row[s]:>10}" for s in COLUMNS))
    rate = stats["last_hour"]
    shown = "-" if rate["rate"] is None else f"{rate['rate'] * 100:.1f}%"
    lines.append("")
    lines.append(f"last hour: {rate['success']} succeeded, {rate['fail']} failed, success rate {shown}")
    hosts = stats.get("throttled_hosts") or []
    lines.append("")
    lines.append("hosts throttled now: " + ("none" if not hosts else ""))
    for h in hosts:
        why = f"paused {h['paused_s']:.1f}s more (Retry-After)" if h.get("paused_s") else "at its limit"
        lines.append(f"  {h['host']:<40}{h['in_flight']:>4} in flight, {why}")
    return "\n".join(lines)
