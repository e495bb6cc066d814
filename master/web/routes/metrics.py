"""``GET /metrics``: the cluster in Prometheus's text format (the ``prometheus_client`` library),
read from Redis and MongoDB at each scrape, so every web process answers the same and nothing is
lost when one restarts (page counters live in Redis: ``common/metrics.py``).

Open to the networks in METRICS_ALLOW (default: this host only) and to any API token
(``Authorization: Bearer``, as Prometheus's ``authorization`` scrape setting sends it).
"""
from __future__ import annotations

import functools
import ipaddress

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from common.config import settings
from common.errors import ConfigError
from common.metrics import page_counters
from common.store import exports as export_store
from common.store.connection import redis_conn
from common.store.models import EXPORT_STATES, TASK_STATUSES
from master import access, views
from master.ops import stats
from master.web.errors import ApiError
from master.web.routes.api import bearer

router = APIRouter()


@functools.lru_cache(maxsize=4)
def networks(value: str) -> tuple:
    """METRICS_ALLOW parsed (ConfigError naming a bad entry: `downcluster web` checks it at start)."""
    out = []
    for net in filter(None, (n.strip() for n in value.split(","))):
        try:
            out.append(ipaddress.ip_network(net, strict=False))
        except ValueError:
            raise ConfigError(f"METRICS_ALLOW: {net[:60]!r} is not a network (like 10.0.0.0/8)") from None
    return tuple(out)


def _scope(request: Request) -> tuple[bool, set[str] | None]:
    """(allowed, the job names it may see: None for all). A METRICS_ALLOW network without a token
    sees everything (the operator's Prometheus); a token sees what its projects hold."""
    auth = request.headers.get("authorization")
    if auth is not None:
        try:
            return True, access.visible_job_names(bearer(auth))
        except ApiError:
            pass  # judged by its network alone
    host = request.client.host if request.client else ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    return address is not None and any(address in net for net in networks(settings.METRICS_ALLOW)), None


class Cluster:
    """A prometheus_client collector: every family computed when scraped."""

    def __init__(self, redis, names: set[str] | None = None) -> None:
        self.redis, self.names = redis, names  # names: the jobs shown (None: all)

    def collect(self):
        queues = stats.queue_stats(self.redis)
        depth = GaugeMetricFamily("downcluster_queue_depth", "Entries waiting in a queue", labels=["queue"])
        age = GaugeMetricFamily(
            "downcluster_queue_oldest_age_seconds",
            "Age of the oldest waiting entry (0: none)",
            labels=["queue"],
        )
        cap = GaugeMetricFamily("downcluster_queue_cap", "A queue's cap on entries", labels=["queue"])
        for q in queues:
            depth.add_metric([q["queue"]], q["depth"])
            age.add_metric([q["queue"]], q["oldest_age_s"] or 0)
            if q["cap"] is not None:
                cap.add_metric([q["queue"]], q["cap"])
        yield from (depth, age, cap)
        tasks = GaugeMetricFamily("downcluster_tasks", "Tasks by job and status", labels=["job", "status"])
        for row in stats.task_counts():
            if self.names is not None and row["job"] not in self.names:
                continue
            for status in TASK_STATUSES:
                tasks.add_metric([row["job"], status], row[status])
        yield tasks
        pages = CounterMetricFamily("downcluster_pages", "Pages stored or failed, by job and failure class",
                                    labels=["job", "outcome", "reason"])
        for job, outcome, klass, n in page_counters(self.redis):
            if self.names is not None and job not in self.names:
                continue
            pages.add_metric([job, outcome, klass], n)
        yield pages
        alive = views.workers(self.redis)
        yield GaugeMetricFamily(
            "downcluster_workers_alive", "Workers that announced themselves", value=len(alive)
        )
        yield GaugeMetricFamily("downcluster_downloads_in_flight", "Downloads in flight in all workers",
                                value=sum(w["inflight"] for w in alive))
        yield GaugeMetricFamily("downcluster_hosts_throttled", "Hosts at their limit or paused now",
                                value=len(stats.throttled(self.redis)))
        rate = stats.success_rate(self.redis)
        yield GaugeMetricFamily(
            "downcluster_success_rate_last_hour",
            "Share of downloads that succeeded (-1: none)",
            value=-1 if rate["rate"] is None else rate["rate"],
        )
        if self.names is not None:
            return  # the cluster's export counts are every project's: an admin's
        by_state = {**dict.fromkeys(EXPORT_STATES, 0), **export_store.by_state()}
        exports = GaugeMetricFamily("downcluster_exports", "Exports by state", labels=["state"])
        for state, n in by_state.items():
            exports.add_metric([state], n)
        yield exports


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    allowed, names = _scope(request)
    if not allowed:
        raise ApiError(401, "metrics are for METRICS_ALLOW networks or a Bearer token")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Cluster(redis_conn(), names))
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
