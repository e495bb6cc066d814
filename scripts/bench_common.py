"""What the bench scripts share (scripts/bench.py, bench_scale.py, bench_compare.py): the paths,
the processes they start and stop, and what /proc says of them. Imported by each, importing none of
them (the bench and its scale phase used to import each other)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _p in (str(ROOT / "scripts"), str(ROOT)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

BIN = Path(sys.executable).parent
# the peer's own install (the Makefile's PEER_VENV): Scrapy's dependencies (pyOpenSSL, which pymongo
# loads at start when it can) stay out of ours, as for their users and ours
PEER_BIN = Path(os.environ.get("BENCH_PEER_VENV") or ROOT / ".venv-peer") / "bin"


def peer_installed() -> bool:
    """Whether the peer's install (scrapy and scrapy-redis) is there: ``make bench`` makes it."""
    return (PEER_BIN / "scrapy").exists()
TICKS = os.sysconf("SC_CLK_TCK")
CAP = 100_000              # queue caps (entries) during the bench: never the limit

# --- processes -----------------------------------------------------------------------------

def compile_ours() -> None:
    """Write our modules' bytecode now, as pip does for an installed package (the peer's modules were
    compiled when its install was made): with PYTHONDONTWRITEBYTECODE set, an editable install would
    compile every module again at each process's start, and the bench would count that as ours."""
    import compileall

    for name in ("common", "master", "slave"):
        compileall.compile_dir(str(ROOT / name), quiet=1)
    compileall.compile_file(str(ROOT / "settings.py"), quiet=1)


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, a CI timeout) unwinds like Ctrl-C, so the ``finally`` that stops the
    bench's processes runs: without it Python dies at once and leaves them running."""
    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)


class Procs:
    """Every process the bench starts, so all of them (and their children) can be stopped."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen] = []

    def spawn(self, args: list[str], env: dict, name: str) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "ab")
        try:
            proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            log.close()
        proc.bench_name = name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def stop(self, procs: list[subprocess.Popen], grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL whatever of each process tree is left after ``grace`` seconds."""
        trees = {p.pid: proc_tree(p.pid) for p in procs}
        for p in procs:
            if p.poll() is None:
                try:
                    p.terminate()
                except OSError:
                    pass
        end = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            for pid in set(trees[p.pid]) | set(proc_tree(p.pid)):
                if pid == p.pid and p.poll() is not None:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if p in self.procs:
                self.procs.remove(p)

    def stop_all(self) -> None:
        self.stop(list(self.procs), grace=3.0)

    def tail(self, name: str, chars: int = 1500) -> str:
        try:
            return (self.logdir / f"{name}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def proc_tree(pid: int) -> list[int]:
    """``pid`` and its living descendants."""
    try:
        kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []
    out = [pid]
    for kid in kids:
        out.extend(proc_tree(kid))
    return out


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def cpu_tree(pid: int) -> float:
    """CPU seconds (user + sys) of ``pid``, its reaped children and its living descendants."""
    total = 0.0
    for q in proc_tree(pid):
        f = _stat(q)
        if f:
            total += sum(int(f[i]) for i in (11, 12, 13, 14)) / TICKS  # utime stime cutime cstime
    return total


def hwm_mb(pid: int) -> float:
    """Peak resident set (VmHWM) of one process, MB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


class RssSampler(threading.Thread):
    """Samples VmHWM of each worker's process tree (the worker and its work-horses)."""

    def __init__(self, roots: list[int], interval: float = 0.25) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.roots, self.interval, self.peak = roots, interval, {r: 0.0 for r in roots}
        self.halt = threading.Event()

    def sample(self) -> None:
        for root in self.roots:
            for pid in proc_tree(root):
                self.peak[root] = max(self.peak[root], hwm_mb(pid))

    def run(self) -> None:
        while not self.halt.wait(self.interval):
            self.sample()

    def stop(self) -> dict[int, float]:
        self.halt.set()
        self.join(timeout=5)
        self.sample()
        return self.peak



SITE_HOSTS = 32  # the site listens on 127.0.0.1 .. 127.0.0.32: end-to-end pages spread over 32 hosts


def spread(base: str, i: int, hosts: int) -> str:
    """``base`` (http://127.0.0.1:PORT) on loopback address 1 + i % hosts."""
    return base.replace("127.0.0.1", f"127.0.0.{1 + i % hosts}", 1) if hosts > 1 else base



def nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)




def run_bounded(fn, timeout: float, what: str):
    """Run ``fn`` in a thread; raise TimeoutError if it takes longer than ``timeout``."""
    box: dict = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True, name=what)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"{what} did not finish within {timeout:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


