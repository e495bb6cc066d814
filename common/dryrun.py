"""A job's dry run on one URL: what its engine would fetch, stored nowhere but here, in Redis.

The master writes the request (``ask``: the job and the URL) under a fresh id and queues an entry
of kind ``dry_run`` on ``down_super`` (``common.queue.rqbridge.push_dry_run``); a worker runs
the job's engine pipeline on the URL with every wall a task has (``slave/worker/dryrun.py``) and
writes the result here (``answer``): a key the API reads while it lives (``result``) and a list
the asking request waits on (``wait``, a blocking pop with a bounded timeout). Both, and the
request, expire after ``TTL`` seconds. No task, data, log, lease or count is written for it.
"""
from __future__ import annotations

import json
import time
from typing import Any

from redis import Redis

TTL = 600          # seconds a dry run's request and result live in Redis
BODY_CHARS = 20_000  # the body's text shown, at most (the rest is cut; ``truncated`` says so)
HEADER_CHARS = 2_000  # one header's value, at most
PREFIX = "downcluster:dry-run:"
WAIT_SLICE = 2.0  # seconds of one blocking pop


def _key(ref: str, part: str = "") -> str:
    return f"{PREFIX}{ref}{part}"


def ask(redis: Redis, ref: str, job_id: str, url: str) -> None:
    """Record dry run ``ref`` of job ``job_id`` on ``url`` (before its entry is queued)."""
    redis.set(_key(ref), json.dumps({"job": job_id, "url": url}), ex=TTL)


def asked(redis: Redis, ref: str) -> dict[str, str] | None:
    """The request of dry run ``ref`` ({"job", "url"}), or None when it expired or never was."""
    raw = redis.get(_key(ref))
    return json.loads(raw) if raw else None


def answer(redis: Redis, ref: str, result: dict[str, Any]) -> None:
    """Store the result of dry run ``ref`` and wake whoever waits for it."""
    text = json.dumps(result)
    pipe = redis.pipeline(transaction=True)
    pipe.set(_key(ref, ":result"), text, ex=TTL)
    pipe.rpush(_key(ref, ":done"), "1")
    pipe.expire(_key(ref, ":done"), TTL)
    pipe.execute()


def result(redis: Redis, ref: str) -> dict[str, Any] | None:
    """The result of dry run ``ref``, or None while it runs (or when it expired)."""
    raw = redis.get(_key(ref, ":result"))
    return json.loads(raw) if raw else None


def wait(redis: Redis, ref: str, timeout: float) -> dict[str, Any] | None:
    """The result of dry run ``ref``, waiting up to ``timeout`` seconds for it to come."""
    end = time.monotonic() + timeout
    found = result(redis, ref)
    while found is None:
        left = end - time.monotonic()
        if left < 0.01:  # (a BLPOP timeout of 0 would wait for ever)
            return None
        # in slices: one BLPOP never outlasts the client's socket timeout
        if redis.blpop([_key(ref, ":done")], timeout=min(left, WAIT_SLICE)):
            redis.rpush(_key(ref, ":done"), "1")  # for any other request waiting on it
        found = result(redis, ref)
    return found
