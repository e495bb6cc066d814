"""The benchmark's smoke mode, so `make bench` never rots (no timing targets asserted)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@pytest.mark.slow
def test_bench_smoke_measures_every_figure(tmp_path):
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--smoke", "--json", str(out)],
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
        assert f"peer_{label}" not in r  # the smoke run skips the peer (scrapy is a bench extra)

    assert _positive(r["etiquette_ratio"]) and r["e2e_0ms_plain_b"]["complete"]
    assert r["exports"]["rows"] == 2000
    for fmt in ("csv", "jsonl", "xlsx"):
        for fig in ("rows_per_s", "seconds", "file_mb", "worker_peak_rss_mb"):
            assert _positive(r["exports"][fmt][fig]), (fmt, fig)
