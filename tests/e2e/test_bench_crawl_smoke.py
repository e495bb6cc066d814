"""The crawl phase of `make bench` (scripts/bench_crawl.py) at 100 pages, so it never rots: the
site's every page is reached from one seed, exactly once, and the figures are printed (no timing
targets asserted: the figures are the benchmark's to report)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = 100


@pytest.mark.slow
def test_bench_crawl_reaches_every_page_once_and_reports(tmp_path):
    out = tmp_path / "crawl.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_crawl.py"), "--pages", str(PAGES),
                           "--budget", "500", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    for run in (r["crawl"], r["fed"]):
        assert run["outcome"] == "complete"
        assert run["tasks"] == run["success"] == run["data_docs"] == PAGES
        # 100 pages may be stored in a write or two: no span for a steady rate (0.0), a whole-run one
        assert run["overall_pages_per_s"] > 0 and run["steady_pages_per_s"] >= 0
        assert run["store_cpu_ms_per_page"] > 0
    # page n links to 2n+1, 2n+2 and n+1 below PAGES (page 0: 1 and 2), PAGES - 1 of them new
    assert r["links_handed"] == sum(len({k for k in (2 * n + 1, 2 * n + 2, n + 1) if k < PAGES})
                                    for n in range(PAGES))
    memory = r["crawl"]["memory"]
    assert [p["share"] for p in memory["checkpoints"]] == [0.1, 0.25, 0.5, 0.75, 1.0]
    assert memory["largest_frontier"] > 0
    assert memory["peak_worker_mb"] > 0 and memory["peak_dispatcher_mb"] > 0
    assert {"dispatcher_flat", "worker_flat"} <= set(memory)
    for line in (f"crawled from one seed    complete: {PAGES} tasks, {PAGES} SUCCESS", "fed by task add",
                 "store CPU per found link", "dispatcher peak RSS", "worker peak RSS"):
        assert line in proc.stdout, proc.stdout
