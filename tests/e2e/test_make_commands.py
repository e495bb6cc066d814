"""The README's two commands, run as a newcomer would: real subprocesses of make."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _make(*args: str, timeout: float) -> subprocess.CompletedProcess:
    # as a newcomer's shell runs it: not a sub-make of the `make test` running this suite (whose
    # MAKELEVEL and MAKEFLAGS would add "make[1]: Entering directory" lines and its flags)
    outer = {"MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOWNCLUSTER_") and k not in outer}
    return subprocess.run(["make", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_make_demo_runs_the_whole_cluster():
    proc = _make("demo", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "registered job demo-python" in out and "registered job demo-builtin" in out
    assert "down_super: 202 tasks" in out and "down_low: 202 tasks" in out
    assert "success rate" in out
    for name in ("demo-python", "demo-shell", "demo-builtin"):
        lines = (ROOT / "var" / "export" / f"{name}.jsonl").read_text().splitlines()
        assert len(lines) == 201, name  # 200 pages + the URL that failed once, then succeeded
    # what the run stored is what docs/schema.md says (the demo's store persists in var/mongo)
    import pymongo

    from services import MongoServer
    from tests.unit.test_schema_doc import stored_fields

    with MongoServer(storage=str(ROOT / "var" / "mongo")) as mongo:
        client = pymongo.MongoClient(mongo.uri("admin"))
        try:
            assert stored_fields(client, {"source": "downcluster", "log": "downcluster_log",
                                          "control": "downcluster_control"}) == []
        finally:
            client.close()


def test_make_test_is_lint_then_the_suite():
    """`make test` checks the services, lints, then runs pytest with PYTEST_ARGS. The suite runs
    inside `make test`, whose own lint ran just before it: here the chain is read from `make -n`,
    then run for real on one small file with lint taken as done (`-o lint`), so neither lint nor
    the unit tests run twice."""
    small = "PYTEST_ARGS=tests/unit/test_queue_names.py"
    plan = _make("-n", "test", small, timeout=60)
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
    steps = [line.split()[0:3] for line in plan.stdout.splitlines()
             if line.startswith(".venv/bin/") and not line.startswith(".venv/bin/pip")]
    assert steps == [[".venv/bin/ruff", "check", "."], [".venv/bin/mypy"],
                     [".venv/bin/mypy", "--strict", "--follow-imports=silent"],
                     [".venv/bin/python", "-m", "pytest"]], plan.stdout
    # on pytest-xdist workers, the tests that share the machine grouped (docs/testing.md)
    assert plan.stdout.splitlines()[-1] == (
        ".venv/bin/python -m pytest -q -n 3 --dist loadgroup tests/unit/test_queue_names.py")
    proc = _make("-o", "lint", "test", small, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "ruff" not in proc.stdout
