"""The project runs wherever it is installed: a git clone of this checkout's HEAD under /tmp, in a
directory with a space, with a venv of its own there (the boxes mount a private /tmp, so an
install under it is hidden unless the box mounts it: ``sandbox.box_argv``). A worker started
from that venv renders a browser job's pages and runs a python downloader's; a box that cannot
start says why (bubblewrap's own words) in the task's reason and the worker's log.

The venv is made without pip (seconds, not minutes) from this interpreter, and one ``.pth`` file
lends it this checkout's installed packages, the clone's code first on its path. A second, bare
venv there is made from the system's python3 (readable by every user, as on a newcomer's
machine): as SANDBOX_PYTHON, both boxes run it from under /tmp."""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from common.errors import DownloadError
from master.dispatch.dispatcher import dispatch_once
from slave.download.engines import chromium, sandbox, wall
from slave.download.engines.base import Limits
from tests.helpers import add_urls, register, statuses

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(chromium.chromium_path() is None or wall.check() is not None,
                       reason="needs chromium, bubblewrap, nftables and root (make test installs them)"),
    pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python3"),
]
DOWNLOADER = '''
import urllib.request

def download(task):
    with urllib.request.urlopen(task["url"], timeout=30) as resp:
        return {"status_code": resp.status, "headers": {}, "body": resp.read()}
'''


@pytest.fixture(scope="module")
def newcomer():
    """(the clone, its venv's bin, a bare venv's python) under /tmp, in a directory with a space in
    its name."""
    top = Path(tempfile.mkdtemp(prefix="downcluster newcomer ", dir="/tmp"))
    top.chmod(0o755)  # as a checkout made by hand: every user may enter it
    try:
        clone, venv, bare = top / "src", top / "venv", top / "bare venv"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
        base = getattr(sys, "_base_executable", sys.executable)
        for python, made in ((base, venv), (str(SYSTEM_PYTHON), bare)):
            subprocess.run([python, "-m", "venv", "--without-pip", str(made)], check=True, timeout=120)
        site = subprocess.run([str(venv / "bin" / "python"), "-c",
                               "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        Path(site, "newcomer.pth").write_text(f"{clone}\n{sysconfig.get_paths()['purelib']}\n")
        where = subprocess.run([str(venv / "bin" / "python"), "-c", "import slave; print(slave.__file__)"],
                               capture_output=True, text=True, check=True, cwd="/").stdout
        assert where.startswith(str(clone)), where  # the clone's code, not this checkout's
        yield clone, venv / "bin", str(bare / "bin" / "python")
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("own_python", [False, True], ids=["worker's python", "SANDBOX_PYTHON under /tmp"])
def test_a_worker_from_a_venv_under_tmp_renders_browser_pages_and_runs_python_downloaders(
        cluster, tmp_path, newcomer, own_python):
    clone, bin_dir, bare = newcomer
    register(tmp_path, "rendered", priority=1, download_engine="browser")
    register(tmp_path, "scripted", priority=1, kind="python", code=DOWNLOADER)
    add_urls("rendered", [f"{cluster.site}/js/render/{i}" for i in range(3)])
    add_urls("scripted", [f"{cluster.site}/page/{i}" for i in range(3)])
    dispatch_once(cluster.redis)
    env = {**os.environ, **cluster.env}
    env.pop("PYTHONPATH", None)
    if own_python:
        env["DOWNCLUSTER_SANDBOX_PYTHON"] = bare
    downcluster = [str(bin_dir / "python"), "-c", "import sys; from common.cli import main; sys.exit(main())"]
    proc = subprocess.run([*downcluster, "worker", "--burst"], env=env, cwd=str(clone),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from common.store.models import CrawlerTask

    failed = [t.failed_reason for t in CrawlerTask.objects(status__ne="SUCCESS")]
    assert statuses("rendered") == {"SUCCESS": 3} and statuses("scripted") == {"SUCCESS": 3}, failed


def test_the_boxes_mount_an_install_under_tmp_read_only(newcomer):
    """Pure: what ``box_argv`` adds for an interpreter under /tmp, and nothing for one elsewhere."""
    venv = str(Path(newcomer[2]).parent.parent)
    argv = sandbox.box_argv(5, 6, 1024, newcomer[2])
    assert ["--ro-bind", venv, venv] == argv[argv.index(venv) - 1:argv.index(venv) + 2]
    assert argv.index(venv) > argv.index("/tmp")  # after the private /tmp, so it shows through
    assert sandbox.install_mounts("/usr/bin/python3") == []


def test_a_box_that_cannot_start_says_why(monkeypatch, site, caplog):
    """A python box and a browser whose interpreter is missing fail with bubblewrap's own line
    (not "chromium did not start" alone), also in the worker's log."""
    import asyncio

    monkeypatch.setattr(sandbox, "_interpreter", "/nonexistent dir/python")
    caplog.set_level(logging.WARNING)
    with pytest.raises(DownloadError) as info:
        sandbox.run_python(DOWNLOADER, {"url": f"{site}/page/1", "settings": {"allow_private": True}},
                           Limits(timeout=30))
    assert "the sandbox did not start: bwrap: execvp /nonexistent dir/python" in info.value.reason
    with pytest.raises(DownloadError) as info:
        asyncio.run(chromium.Browser(256).start())
    assert info.value.reason.startswith("browser engine: chromium did not start: ")
    assert "execvp /nonexistent dir/python: No such file or directory" in info.value.reason
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("chromium did not start" in m and "execvp" in m for m in logged), logged
    assert any(m.startswith("sandbox did not start: bwrap: execvp") for m in logged), logged
