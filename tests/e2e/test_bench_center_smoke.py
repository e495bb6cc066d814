"""The download center's benchmark at a small scale, so its piece of `make bench` never rots (no
timing targets asserted: the figures are the benchmark's to report)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_center_measures_both_formats():
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_center.py"), "--rows", "12000",
                           "--step", "5000", "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    assert [r["format"] for r in results] == ["csv", "xlsx"]
    for r in results:
        assert r["rows"] == 12000 and r["rows_per_s"] > 0 and 0 < r["peak_rss_mb"] < 1000 and r["bytes"] > 0
