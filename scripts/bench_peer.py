"""The peer in `make bench`: scrapy-redis storing every page in MongoDB, as its users run it.

A ``RedisSpider`` takes URLs from a Redis list; each response becomes one item (url, status,
headers, raw body) written with one ``insert_one``, the MongoDB pipeline of Scrapy's own
documentation. Run as ``scrapy runspider scripts/bench_peer.py`` with settings from the
environment (PEER_REDIS_URL, PEER_MONGO_URI, PEER_KEY, PEER_SCHEDULER); two processes share the
Redis list.
"""
from __future__ import annotations

import os

import pymongo
from scrapy_redis.spiders import RedisSpider


class MongoPipeline:
    """Scrapy's documented MongoDB pipeline: one insert_one per item."""

    def open_spider(self, spider) -> None:
        self.client = pymongo.MongoClient(os.environ["PEER_MONGO_URI"])
        self.coll = self.client.get_default_database()["peer_pages"]

    def close_spider(self, spider) -> None:
        self.client.close()

    def process_item(self, item, spider):
        self.coll.insert_one(dict(item))
        return item


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
        "CONCURRENT_REQUESTS": 64,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 64,
        "REDIS_START_URLS_BATCH_SIZE": 64,
        "ROBOTSTXT_OBEY": False,
        "RETRY_ENABLED": True,
        "COOKIES_ENABLED": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "WARNING",
        "ITEM_PIPELINES": {f"{__name__}.MongoPipeline": 300},
        "REQUEST_FINGERPRINTER_IMPLEMENTATION": "2.7",
    }

    def parse(self, response):
        yield {"url": response.url, "status": response.status,
               "headers": {k.decode(): b", ".join(v).decode("latin-1") for k, v in response.headers.items()},
               "body": response.body}
