"""The comparison's site for pages that answer after a delay: ``/page/<n>`` (scripts/sample_site.py's
~2 KB ``page_body(n)``, ``text/html; charset=utf-8``, each body built once) after ``--delay-ms``,
on an asyncio event loop (aiohttp), listening on 127.0.0.1 .. 127.0.0.<hosts>. With ``--tree N``
also ``/tree/<n>`` for n < N: a finite site of N linked pages (``tree_links``; every page reachable
from ``/tree/0``), the crawl phase's (scripts/bench_crawl.py; after ``--delay-ms`` too, for the
crawl comparison, scripts/bench_crawl_compare.py).

scripts/sample_site.py answers from one thread per connection and rebuilds each page: with 128
connections open at once, its own CPU competes with both crawlers on a 2-core host. Here a
waiting request costs a timer, not a thread, so the site takes the same small share of the
machine whichever crawler asks it. (Pages at 0 ms come from nginx: scripts/bench_compare.py.)

``GET /_inflight`` answers what the site saw since the last such request (and starts afresh):
the most requests it held at once and their time-weighted mean while any was held — what each
crawler really keeps in flight at the site, measured the same way for both.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from pathlib import Path

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sample_site import page_body  # noqa: E402


@functools.lru_cache(maxsize=200_000)
def _page(n: int) -> bytes:
    return page_body(n)


def tree_links(n: int, total: int) -> list[int]:
    """The pages ``/tree/<n>`` links to: 2n+1 and 2n+2 (a binary tree holding every page) and n+1
    (already found, mostly: work for the intake's dedup), those below ``total``, each once."""
    return sorted({m for m in (2 * n + 1, 2 * n + 2, n + 1) if m < total})


def tree_page(n: int, total: int) -> bytes:
    links = " ".join(f"<a href='/tree/{m}'>page {m}</a>" for m in tree_links(n, total))
    return page_body(n).replace(b"<body>", f"<body><p>{links}</p>".encode(), 1)


class Gauge:
    """Requests held at once: the peak, and the integral over time while any was held."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.now = self.peak = 0
        self.area = self.busy = 0.0
        self.since = time.monotonic()

    def move(self, by: int) -> None:
        t = time.monotonic()
        if self.now:
            self.area += self.now * (t - self.since)
            self.busy += t - self.since
        self.since, self.now = t, self.now + by
        self.peak = max(self.peak, self.now)

    def read(self) -> dict[str, float]:
        self.move(0)
        out = {"peak": self.peak, "mean_while_busy": round(self.area / self.busy, 1) if self.busy else 0.0}
        held = self.now
        self.reset()
        self.now = held
        return out


def app(delay_ms: int, tree: int = 0) -> web.Application:
    gauge = Gauge()

    async def page(request: web.Request) -> web.Response:
        gauge.move(1)
        try:
            if delay_ms:
                await asyncio.sleep(delay_ms / 1000)
            return web.Response(body=_page(int(request.match_info["n"])), content_type="text/html",
                                charset="utf-8")
        finally:
            gauge.move(-1)

    async def inflight(request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(gauge.read()), content_type="application/json")

    async def tree_node(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if n >= tree:
            raise web.HTTPNotFound()
        gauge.move(1)
        try:
            if delay_ms:  # the crawl comparison's tree at 100 ms (scripts/bench_crawl_compare.py)
                await asyncio.sleep(delay_ms / 1000)
            return web.Response(body=tree_page(n, tree), content_type="text/html", charset="utf-8")
        finally:
            gauge.move(-1)

    a = web.Application()
    a.router.add_get("/page/{n:[0-9]+}", page)
    a.router.add_get("/_inflight", inflight)
    if tree:
        a.router.add_get("/tree/{n:[0-9]+}", tree_node)
    return a


async def serve(port: int, delay_ms: int, hosts: int, tree: int = 0) -> None:
    runner = web.AppRunner(app(delay_ms, tree), access_log=None)
    await runner.setup()
    for i in range(1, hosts + 1):
        await web.TCPSite(runner, f"127.0.0.{i}", port, backlog=1024).start()
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--hosts", type=int, default=32)
    p.add_argument("--tree", type=int, default=0,
                   help="also serve /tree/<n>: a site of this many linked pages")
    a = p.parse_args()
    asyncio.run(serve(a.port, a.delay_ms, a.hosts, a.tree))


if __name__ == "__main__":
    main()
