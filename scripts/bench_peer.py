"""The peer in `make bench`: scrapy-redis storing every page in MongoDB, as its users run it.

A ``RedisSpider`` takes URLs from a Redis list; each response becomes one item (url, status,
headers, raw body) written with one ``insert_one``, the MongoDB pipeline of Scrapy's own
documentation, which also stamps the page with the time it is stored (``stored_at``: the bench
reads its rates from these stamps after the run, as it reads ours from the data's
``add_datetime``). Run as ``scrapy runspider scripts/bench_peer.py`` with settings from the
environment (PEER_REDIS_URL, PEER_MONGO_URI, PEER_KEY, PEER_SCHEDULER, PEER_CONCURRENCY,
PEER_BATCH, PEER_PROGRESS); two processes share the Redis list.

Progress: ``Progress`` writes Scrapy's own ``item_scraped_count`` to the Redis hash
PEER_PROGRESS once a second (our worker's writer counts its stored pages in Redis the same way),
so the bench never reads the store while a run goes.
"""
from __future__ import annotations

import os
from datetime import datetime, timezone

import pymongo
import redis
from scrapy import signals
from scrapy_redis.spiders import RedisSpider
from twisted.internet import task

CONCURRENCY = int(os.environ.get("PEER_CONCURRENCY", "64"))
# what both peer spiders set alike (this one and bench_peer_crawl.py's): no robots, cookies or
# console, Scrapy's retries, every item through the MongoDB pipeline, progress counted in Redis
STORING = {
    "ROBOTSTXT_OBEY": False,
    "RETRY_ENABLED": True,
    "COOKIES_ENABLED": False,
    "TELNETCONSOLE_ENABLED": False,
    "LOG_LEVEL": "WARNING",
    "ITEM_PIPELINES": {f"{__name__}.MongoPipeline": 300},
    "EXTENSIONS": {f"{__name__}.Progress": 500},
    "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
}


class MongoPipeline:
    """Scrapy's documented MongoDB pipeline: one insert_one per item."""

    def open_spider(self, spider) -> None:
        self.client = pymongo.MongoClient(os.environ["PEER_MONGO_URI"])
        self.coll = self.client.get_default_database()["peer_pages"]

    def close_spider(self, spider) -> None:
        self.client.close()

    def process_item(self, item, spider):
        self.coll.insert_one({**item, "stored_at": datetime.now(timezone.utc)})
        return item


class Progress:
    """Scrapy's count of items stored, written to Redis once a second and when the spider closes."""

    def __init__(self, crawler) -> None:
        self.stats = crawler.stats
        self.redis = redis.Redis.from_url(os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0"))
        self.key = os.environ.get("PEER_PROGRESS", "peer:progress")
        self.loop = task.LoopingCall(self.publish)
        crawler.signals.connect(self.opened, signal=signals.spider_opened)
        crawler.signals.connect(self.closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler)

    def publish(self) -> None:
        self.redis.hset(self.key, str(os.getpid()), self.stats.get_value("item_scraped_count", 0))

    def opened(self, spider) -> None:
        self.loop.start(1.0)

    def closed(self, spider) -> None:
        if self.loop.running:
            self.loop.stop()
        self.publish()


class PeerSpider(RedisSpider):
    name = "peer"
    redis_key = os.environ.get("PEER_KEY", "peer:start_urls")
    custom_settings = {
        "REDIS_URL": os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0"),
        # PEER_SCHEDULER=redis: scrapy-redis's scheduler and dupefilter (requests through Redis);
        # =local: Scrapy's own in-process scheduler, URLs still taken from the Redis list
        **({"SCHEDULER": "scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
            "SCHEDULER_PERSIST": False} if os.environ.get("PEER_SCHEDULER", "redis") == "redis" else {}),
        "CONCURRENT_REQUESTS": CONCURRENCY,
        "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY,
        # URLs taken from the list each time the spider runs dry (scrapy-redis's default: the
        # concurrency); more keeps Scrapy's own scheduler fed between refills
        "REDIS_START_URLS_BATCH_SIZE": int(os.environ.get("PEER_BATCH", str(CONCURRENCY))),
        # PEER_BROAD=1 (Scrapy's scheduler only): the priority queue Scrapy's "Broad Crawls" page
        # recommends for many domains at once, which hands out requests by the domains' free slots
        **({"SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.DownloaderAwarePriorityQueue"}
           if os.environ.get("PEER_BROAD") == "1" and os.environ.get("PEER_SCHEDULER") == "local" else {}),
        **STORING,
    }

    def parse(self, response):
        yield {"url": response.url, "status": response.status,
               "headers": {k.decode(): b", ".join(v).decode("latin-1") for k, v in response.headers.items()},
               "body": response.body}
