"""Test-only: this process dies by SIGKILL, as a crash or the OOM killer ends it, right after
the function ``DOWNCLUSTER_TEST_KILL_AFTER`` names (``module:function``, called through its
module) first returns a true value: a fault injected at an exact point of a real worker
(``common.intake:add_found``: a page's links handed over, its task not settled yet;
``common.store.tasks:settle``: the first settles of a write applied, nothing after them).

Put this directory first on PYTHONPATH (as tests/clockskew).
"""
import functools
import importlib
import os
import signal

_at = os.environ.get("DOWNCLUSTER_TEST_KILL_AFTER")

if _at:
    _module, _, _name = _at.partition(":")
    _mod = importlib.import_module(_module)
    _real = getattr(_mod, _name)

    @functools.wraps(_real)
    def _then_die(*args, **kwargs):
        result = _real(*args, **kwargs)
        if result:
            os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(_mod, _name, _then_die)
