"""The benchmark's smoke mode, so `make bench` never rots (no timing assertions)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_smoke_measures_every_figure(tmp_path):
    out = tmp_path / "b.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--smoke", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["store"]["insert_docs_per_s"] > 0 and r["store"]["update_docs_per_s"] > 0
    assert r["dispatch"]["dispatch_tasks"] == 500 and r["dispatch"]["backlog_dispatch_tasks"] == 500
    assert r["dispatch"]["redis_key_bytes_per_task"] > 0
    for label in ("0ms", "100ms"):
        e2e = r[f"e2e_{label}"]
        assert e2e["complete"] and e2e["pages_per_s"] > 0 and e2e["worker_peak_rss_mb"] > 0
        assert r[f"baseline_{label}"]["pages_per_s"] > 0 and r[f"ratio_{label}"] > 0
