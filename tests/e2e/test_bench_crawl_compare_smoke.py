"""The crawl comparison of `make bench` (scripts/bench_crawl_compare.py) on a tree of 120 pages
at 0 ms, one run a side, so it never rots: each side reaches every page once from the seed and
every figure is there (no timing asserted; the peer's side only when its own install, `make
bench`'s .venv-peer, is there)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER_VENV = ROOT / ".venv-peer"
PAGES = 120


@pytest.mark.slow
def test_bench_crawl_compare_reaches_every_page_once_on_each_side(tmp_path):
    out = tmp_path / "cc.json"
    peer = (PEER_VENV / "bin" / "scrapy").exists()  # the peer's own install, made by `make bench`
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_crawl_compare.py"), "--pages",
                           str(PAGES), "--runs", "1", "--sites", "tree_0ms", "--budget", "500",
                           "--json", str(out), *([] if peer else ["--skip-peer"])],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    c = json.loads(out.read_text())["tree_0ms"]
    sides = ["ours", "peer"] if peer else ["ours"]
    assert c["order"] == sides and c["pages"] == PAGES, c
    # page n links to 2n+1, 2n+2 and n+1 below PAGES: every link of every page, known or new
    links = sum(len({k for k in (2 * n + 1, 2 * n + 2, n + 1) if k < PAGES}) for n in range(PAGES))
    for side in sides:
        run = c[side][0]
        assert run["outcome"] == "complete" and run["pages_stored"] == PAGES, (side, run)
        assert run["links_handed"] == links
        # 120 pages may be stored in a write or two: no span for a steady rate (0.0 then)
        assert run["steady_pages_per_s"] >= 0 and run["overall_pages_per_s"] > 0, (side, run)
        for fig in ("to_last_s", "store_cpu_ms_per_page", "store_write_ops_per_page",
                    "store_bytes_in_per_page", "store_cpu_ms_per_link", "client_cpu_ms_per_page"):
            assert run[fig] > 0, (side, fig, run)
        assert all(mb > 0 for mb in run["peak_rss_mb"]), run
    ours = c["ours"][0]
    assert ours["tasks"] == ours["distinct_task_urls"] == PAGES, ours  # each URL one task
    if peer:
        assert c["peer"][0]["distinct_page_urls"] == PAGES
        assert c["peer"][0]["store_write_ops_per_page"] >= 1.0  # one insert_one a page
    assert "tree_0ms: steady medians" in proc.stdout, proc.stdout
