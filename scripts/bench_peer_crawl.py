"""The peer's crawl in `make bench` (scripts/bench_crawl_compare.py): scrapy-redis as its users
crawl a site, every page stored in MongoDB.

A ``RedisCrawlSpider`` takes its seed from a Redis list and follows the links Scrapy's
``LinkExtractor`` finds on every page (the seed's included), within the seed's site
(PEER_ALLOW: a pattern the links must match) and ``DEPTH_LIMIT`` (PEER_DEPTH); scrapy-redis's
scheduler keeps the requests in Redis, shared by the processes, and its ``RFPDupeFilter`` the
fingerprints of the requests seen (a Redis set): a link found again is dropped there. Each page
becomes one item (url, status, headers, raw body, depth) written by the MongoDB pipeline of Scrapy's
documentation, one ``insert_one``, stamped ``stored_at`` (scripts/bench_peer.py's, as its progress
in Redis). Run as ``scrapy runspider scripts/bench_peer_crawl.py``; settings from the environment as
bench_peer.py's, plus PEER_ALLOW, PEER_DEPTH and PEER_QUEUE (scrapy-redis's queue class: its
default ``PriorityQueue``, a sorted set, or ``FifoQueue``, a list).
"""
from __future__ import annotations

import os

from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import Rule
from scrapy_redis.spiders import RedisCrawlSpider

from bench_peer import CONCURRENCY, STORING


class PeerCrawlSpider(RedisCrawlSpider):
    name = "peer_crawl"
    redis_key = os.environ.get("PEER_KEY", "peer:start_urls")
    rules = (Rule(LinkExtractor(allow=(os.environ.get("PEER_ALLOW", ""),)), callback="parse_page",
                  follow=True),)
    custom_settings = {
        "REDIS_URL": os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        "SCHEDULER_QUEUE_CLASS": f"scrapy_redis.queue.{os.environ.get('PEER_QUEUE', 'PriorityQueue')}",
        "SCHEDULER_PERSIST": True,  # one process closing must not flush the others' queue
        "DEPTH_LIMIT": int(os.environ.get("PEER_DEPTH", "64")),
        "CONCURRENT_REQUESTS": CONCURRENCY,
        "CONCURRENT_REQUESTS_PER_DOMAIN": CONCURRENCY,
        "REDIS_START_URLS_BATCH_SIZE": int(os.environ.get("PEER_BATCH", str(CONCURRENCY))),
        **STORING,
    }

    def parse_start_url(self, response, **kwargs):
        return self.parse_page(response)  # the seed is a page of the crawl, as ours stores it

    def parse_page(self, response):
        yield {"url": response.url, "status": response.status, "depth": response.meta.get("depth", 0),
               "headers": {k.decode(): b", ".join(v).decode("latin-1") for k, v in response.headers.items()},
               "body": response.body}
