"""`make demo` reports a failed step as one line: the step, what went wrong, where to look."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "scripts" / "demo.py"


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("demo_script", DEMO)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("failure", [
    RuntimeError("redis-server on port 1 did not start (exited 1); log var/redis.log:\n  bind: in use\n"),
    IndexError("list index out of range"),
    SystemExit("demo: `downcluster dispatch` exited 1"),
])
def test_a_failed_step_is_one_line_naming_it_and_where_to_look(demo, failure):
    with pytest.raises(demo.StepFailed) as info:
        with demo.step("start the services", "var/redis.log"):
            raise failure
    said = str(info.value)
    assert "\n" not in said and said.startswith("demo failed at step 'start the services': ")
    assert said.endswith("; look at var/redis.log") and " ".join(str(failure).split()) in said


def test_a_step_inside_a_step_is_reported_once(demo):
    with pytest.raises(demo.StepFailed) as info:
        with demo.step("outer", "a"):
            with demo.step("inner", "b"):
                raise ValueError("x")
    assert str(info.value) == "demo failed at step 'inner': x; look at b"


def test_main_prints_the_line_and_exits_1_without_a_traceback(demo, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(demo, "VAR", tmp_path / "var")  # never the checkout's var/

    def broken(*_a, **_k):
        raise RuntimeError("redis-server not found on PATH: install it")
    monkeypatch.setattr(demo, "RedisServer", broken)
    assert demo.main() == 1
    err = capsys.readouterr().err.strip()
    assert err == ("demo failed at step 'start the services': redis-server not found on PATH: install it; "
                   "look at redis-server and SecantusDB under var/ (`make services-check`)")
