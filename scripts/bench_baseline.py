"""The naive design, for comparison: one rq job per URL, requests.get, one insert per response."""
from __future__ import annotations

import os

import pymongo
import requests

_client = None


def fetch_and_store(url: str) -> None:
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), pymongo.MongoClient(os.environ["BENCH_BASELINE_MONGO"]))
    resp = requests.get(url, timeout=30)
    _client[1].get_default_database().baseline.insert_one(
        {"url": url, "status": resp.status_code, "headers": dict(resp.headers), "body": resp.content})
