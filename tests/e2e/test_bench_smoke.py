"""The benchmark's smoke mode, so `make bench` never rots (no timing targets asserted)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = 150  # end-to-end pages of each run (the script's --smoke says 300; fewer prove as much)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@pytest.mark.slow
def test_bench_smoke_measures_every_figure(tmp_path):
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--smoke", "--json", str(out),
                           "--pages", str(PAGES), "--scale", "5000"],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["mode"] == "smoke" and r["errors"] == []

    store = r["store"]
    for key in ("insert_docs_per_s", "update_range50_docs_per_s", "update_in50_docs_per_s",
                "update_range50_task_indexes_docs_per_s"):
        assert _positive(store[key]), key

    for kind in ("live", "backlog"):
        d = r["dispatch"][kind]
        assert d["dispatched"] == 500, (kind, d)
        for key in ("seconds", "insert_s", "insert_docs_per_s", "mongo_time_s"):
            assert _positive(d[key]), (kind, key)
    assert r["dispatch"]["backlog"]["tasks"] == 2000
    assert _positive(r["dispatch"]["live"]["redis_bytes_per_task"])
    assert _positive(r["dispatch"]["live"]["redis_key_bytes_per_task"])

    for label in ("0ms", "100ms"):
        e = r[f"e2e_{label}"]
        assert e["complete"] and e["done"] == e["pages"], (label, e)
        assert e["data_docs"] == e["pages"] and e["success_log_docs"] == e["pages"], (label, e)
        for fig in ("pages_per_s", "seconds", "worker_peak_rss_mb", "worker_cpu_ms_per_page",
                    "store_cpu_ms_per_page", "all_cpu_ms_per_page", "peak_inflight"):
            assert _positive(e[fig]), (label, fig)
        assert _positive(e["cores_busy"]["store"]) and _positive(e["cores_busy"]["workers"]), (label, e)

    # the comparison, measured alike for both sides: one run a side on one host at 0 ms (the peer's
    # only when its own install, `make bench`'s .venv-peer, is there); rates from the stored pages' stamps
    c = r["cmp_one_0ms"]
    sides = ["ours", "peer"] if c["peer"] else ["ours"]
    assert c["order"] == sides and len(c["ours"]) == 1, c
    for side in sides:
        run = c[side][0]
        assert run["complete"] and run["done"] == run["pages"] == PAGES, (side, run)
        for fig in ("overall_pages_per_s", "to_last_s", "store_cpu_ms_per_page", "store_write_ops_per_page",
                    "store_bytes_in_per_page", "client_cpu_ms_per_page"):
            assert _positive(run[fig]), (side, fig, run)
        # 150 pages may land in a write or two (an entry stores 50 at once): then no span between the
        # 5th and 95th percentile page gives a steady rate (0.0); the whole-run rate above always exists
        assert run["steady_pages_per_s"] >= 0, (side, run)
        assert run["to_first_s"] <= run["to_last_s"], run
    ours = c["ours"][0]
    assert ours["data_docs"] == ours["log_docs"] == PAGES, ours
    # our writes are batched (an entry of 50 pages: data, logs, settle, lease): far below one a page
    assert ours["store_write_ops_per_page"] < 0.5, ours
    if c["peer"]:
        assert c["peer"][0]["store_write_ops_per_page"] >= 1.0  # Scrapy's pipeline: one insert_one a page
        if all(c[side][0]["steady_pages_per_s"] for side in sides):
            assert _positive(c["ratio"]) and len(c["ratio_pairs"]) == 1, c

    assert _positive(r["etiquette_ratio"]) and r["e2e_0ms_plain_b"]["complete"]
    assert r["exports"]["rows"] == 2000
    for fmt in ("csv", "jsonl", "xlsx"):
        for fig in ("rows_per_s", "seconds", "file_mb", "worker_peak_rss_mb"):
            assert _positive(r["exports"][fmt][fig]), (fmt, fig)
