"""The writer's helper thread in a process forked after its parent used it (an rq work-horse)."""
from __future__ import annotations

import os
import select
import signal

import pytest

from slave.worker import writer


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_gets_a_helper_of_its_own():
    assert writer._helper().submit(lambda: 1).result() == 1  # the parent's thread is started
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a pool whose thread was not inherited would wait forever
        try:
            os.write(write, str(writer._helper().submit(lambda: 2).result()).encode())
        finally:
            os._exit(0)
    os.close(write)
    ready, _, _ = select.select([read], [], [], 60)  # the child's answer (a hang: nothing in 60 s)
    got = os.read(read, 16) if ready else b""
    os.close(read)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert got == b"2", "the child's helper never answered"
    assert writer._helper().submit(lambda: 3).result() == 3  # the parent's still works
