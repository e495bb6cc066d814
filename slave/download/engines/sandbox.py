"""Running untrusted python and shell downloaders in a box the kernel keeps.

Each download runs ``sandbox_main`` under bubblewrap: a pid namespace (everything the downloader
starts, ``setsid()`` and double forks included, dies with it, and the worker dying kills it:
``--die-with-parent``), private ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run`` (size-capped
tmpfs, gone with the task: the host's sockets under ``/run`` are not there), the host's files
read-only, no capabilities, ``no_new_privs``, no unix sockets and no io_uring (``seccomp``); a
uid of its own whose sockets the network wall (``wall``) keeps away from the cluster's services; resource
limits, capped output and a total deadline. The worker can be neither hung nor flooded nor
reached. Where bubblewrap, nftables or root are missing, python and shell downloads fail with one
line saying what to install: never a weaker box.
"""
from __future__ import annotations

import json
import logging
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TypeGuard

from common.errors import DownloadError
from common.secrets import redact
from slave.download.engines import seccomp, wall
from slave.download.engines.base import Download, Limits
from slave.download.engines.charset import body_encoding
from slave.download.engines.sandbox_main import (
    FRAME_OVERHEAD,
    MAX_LINK_LENGTH,
    MAX_LINKS,
    decode_frame,
)

__all__ = ["run_generator", "run_python", "run_shell"]

logger = logging.getLogger(__name__)
SANDBOX_MAIN = str(Path(__file__).resolve().with_name("sandbox_main.py"))
RESOURCE_SIGNALS: dict[int, str] = {signal.SIGXCPU: "CPU limit", signal.SIGXFSZ: "file size limit"}


class _Outcome:
    """What a finished sandbox process left behind."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = b""
        self.returncode: int | None = None
        self.timed_out = False
        self.overflow = False
        self.reported = False  # sandbox_main reported the downloader's exit (the box started)


BASE_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
MAIN_INSIDE = "/tmp/.downcluster/sandbox_main.py"   # where the box sees ``script()``


def _environment(extra: dict[str, str]) -> dict[str, str]:
    """The downloader's whole environment (sandbox_main sets exactly this; nothing of the
    worker's, nor what a library may add to a child's environment, gets through)."""
    return {**BASE_ENV, "HOME": "/tmp", "TMPDIR": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", **extra}


def readable_by_all(path: str) -> bool:
    """Whether any user can reach ``path``: o+x on every ancestor, o+r on the path itself."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & stat.S_IROTH:
            return False
        while True:
            if not os.stat(path).st_mode & stat.S_IXOTH:
                return False
            parent = os.path.dirname(path)
            if parent == path:
                return True
            path = parent
    except OSError:
        return False


_interpreter: str | None = None
_script: str | None = None


def script() -> str:
    """A copy of ``sandbox_main.py`` every user can read (the repository may be root-only),
    made once per process (again if something removed it)."""
    global _script
    if _script is None or not os.path.exists(_script):
        where = tempfile.mkdtemp(prefix="downcluster-sandbox-main-")
        os.chmod(where, 0o755)
        path = os.path.join(where, "sandbox_main.py")
        shutil.copyfile(SANDBOX_MAIN, path)
        os.chmod(path, 0o644)
        _script = path
    return _script


def interpreter() -> str:
    """The python the sandbox runs under. As root the sandbox gives up root for good, so the
    interpreter and its standard library must be readable by every user: this worker's own if
    they are, else the system's ``python3`` (downloader code may then import its standard
    library and what is installed system-wide). SANDBOX_PYTHON names one explicitly."""
    global _interpreter
    if _interpreter is None:
        from common.config import settings

        chosen = settings.SANDBOX_PYTHON
        if not chosen:
            chosen = sys.executable
            if os.geteuid() == 0 and not (readable_by_all(sys.executable)
                                          and readable_by_all(sysconfig.get_paths()["stdlib"])):
                chosen = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
        _interpreter = chosen
    return _interpreter


PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")  # empty in the box; /var/run leads to /run


def _under_private(path: str) -> bool:
    """Strictly below a private directory (never one of them whole: the box's /tmp stays its own)."""
    return any(path.startswith(d + "/") for d in PRIVATE_DIRS)


def install_mounts(python: str) -> list[tuple[str, str]]:
    """(host path, path in the box) of the install ``python`` runs from that the box's private
    directories would hide (a venv or an interpreter under /tmp): its prefix (the directory
    above its ``bin``) as named and as resolved, and this process's venv and base prefixes when
    ``python`` is ours."""
    found = python if os.sep in python else shutil.which(python)
    if found is None:
        return []
    named = os.path.abspath(found)
    prefixes = {os.path.dirname(os.path.dirname(p)) for p in (named, os.path.realpath(named))}
    if os.path.realpath(named) == os.path.realpath(sys.executable):
        prefixes |= {sys.prefix, sys.base_prefix}
    mounts = set()
    for prefix in prefixes:
        real = os.path.realpath(prefix)
        if os.path.isdir(real):
            mounts |= {(real, path) for path in (prefix, real) if _under_private(path)}
    return sorted(mounts)


def box_argv(info_fd: int, seccomp_fd: int, size_bytes: int, python: str) -> list[str]:
    """bubblewrap's options for a box (a downloader's or a browser's), the one description of
    what every box mounts: the host read-only, private size-capped ``PRIVATE_DIRS``, and the
    install of ``python`` (the box's interpreter) read-only where those would hide it, so a
    project installed anywhere (a venv under /tmp, a path with spaces) runs. The command
    follows, after ``--``."""
    argv = ["bwrap", "--die-with-parent", "--new-session",
            "--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try",
            "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            "--info-fd", str(info_fd), "--seccomp", str(seccomp_fd),
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for private in PRIVATE_DIRS:
        argv += ["--perms", "1777", "--size", str(size_bytes), "--tmpfs", private]
    for host, inside in install_mounts(python):
        argv += ["--ro-bind", host, inside]
    return argv


def _command(mode: str, limits: Limits, status_fd: int, info_fd: int, seccomp_fd: int) -> list[str]:
    """bubblewrap around ``sandbox_main``: see the module docstring."""
    python = interpreter()
    return box_argv(info_fd, seccomp_fd, limits.max_file_mb * 1024 * 1024, python) + [
        "--ro-bind", script(), MAIN_INSIDE, "--chdir", "/tmp", "--",
        python, "-I", MAIN_INSIDE, mode, str(status_fd)]


def _box_pid(info: bytes) -> int | None:
    """The host pid of the box's init (bubblewrap's ``--info-fd`` JSON), once it is written."""
    found = re.search(rb'"child-pid"\s*:\s*(\d+)', info)
    return int(found.group(1)) if found else None


def _kill_box(proc: subprocess.Popen, info_fd: int) -> None:
    """SIGKILL the box's init: the kernel then kills every process of its pid namespace, and
    bubblewrap, which waits for that init, exits only once they are all gone."""
    try:
        info = os.read(info_fd, 4096)
    except OSError:
        info = b""
    pid = _box_pid(info)
    try:
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass


def _wait_status(status: bytes, returncode: int) -> int:
    """The downloader's own exit (negative: its signal) as ``sandbox_main`` reported it; bubblewrap's
    code when the report is missing (the box was killed)."""
    try:
        return os.waitstatus_to_exitcode(int(status.strip()))
    except ValueError:
        return -signal.SIGKILL if returncode in (-signal.SIGKILL, 128 + signal.SIGKILL) else returncode


def _run(mode: str, message: dict, limits: Limits, stdout_cap: int, allow_private: bool) -> _Outcome:
    """Start the box, feed it ``message``, collect capped output until it exits or the deadline
    passes; whatever is left of it is killed before this returns."""
    wall.ensure()
    with wall.sandbox_uid(allow_private) as uid:
        return _run_as(uid, mode, message, limits, stdout_cap)


def _run_as(uid: int, mode: str, message: dict, limits: Limits, stdout_cap: int) -> _Outcome:
    deadline = time.monotonic() + limits.timeout
    outcome = _Outcome()
    status_w: int | None  # the child's ends: None once closed here
    info_w: int | None
    filter_r: int | None
    status_r, status_w = os.pipe()
    info_r, info_w = os.pipe()
    os.set_blocking(info_r, False)
    filter_r = rules = seccomp.pipe_fd()
    proc = pidfd = None
    try:
        proc = subprocess.Popen(
            _command(mode, limits, status_w, info_w, rules), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=dict(BASE_ENV), start_new_session=True,
            pass_fds=(status_w, info_w, rules))
        os.close(status_w)
        os.close(info_w)
        os.close(rules)
        status_w = info_w = filter_r = None
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = None  # fall back to polling
        _pump(proc, pidfd, json.dumps({**message, "uid": uid}, default=str).encode(), outcome, deadline,
              limits.stderr_bytes, stdout_cap)
    finally:
        for fd in (status_w, info_w, filter_r):
            if fd is not None:
                os.close(fd)
        if proc is not None:
            if proc.poll() is None:
                _kill_box(proc, info_r)
            proc.wait()
            os.set_blocking(status_r, False)
            try:
                status = os.read(status_r, 64)
            except OSError:
                status = b""
            outcome.returncode = _wait_status(status, proc.returncode)
            outcome.reported = bool(status.strip())
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    if pipe is not None:
                        pipe.close()
                except OSError:
                    pass
        if pidfd is not None:
            os.close(pidfd)
        os.close(status_r)
        os.close(info_r)
    return outcome


def _pump(proc, pidfd, stdin_data: bytes, outcome: _Outcome, deadline: float,
          stderr_bytes: int, stdout_cap: int) -> None:
    """Feed stdin and collect stdout/stderr without blocking until the leader exits, the
    deadline passes or stdout goes over its cap. Grandchildren holding the pipes open are
    not waited for: whatever the leader wrote is already in the pipes when it exits."""
    out_fd, err_fd, in_fd = proc.stdout.fileno(), proc.stderr.fileno(), proc.stdin.fileno()
    for fd in (out_fd, err_fd, in_fd):
        os.set_blocking(fd, False)
    with selectors.DefaultSelector() as sel:
        sel.register(out_fd, selectors.EVENT_READ, "out")
        sel.register(err_fd, selectors.EVENT_READ, "err")
        sel.register(in_fd, selectors.EVENT_WRITE, "in")
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ, "exit")
        sent, exited = 0, False
        while not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome.timed_out = True
                return
            for key, _ in sel.select(remaining if pidfd is not None else min(remaining, 0.02)):
                if key.data == "exit":
                    exited = True
                elif key.data == "in":
                    sent = _feed(proc, sel, stdin_data, sent)
                elif _read(key.fd, key.data, sel, outcome, stderr_bytes, stdout_cap) == "overflow":
                    return
            if pidfd is None and proc.poll() is not None:
                exited = True
        for fd, kind in ((out_fd, "out"), (err_fd, "err")):
            while fd in sel.get_map():
                status = _read(fd, kind, sel, outcome, stderr_bytes, stdout_cap)
                if status == "overflow":
                    return
                if status == "again":
                    break


def _feed(proc, sel, stdin_data: bytes, sent: int) -> int:
    """One write of what is left of ``stdin_data`` (``sent`` bytes of it gone already); stdin
    closed once it is all sent or the child stops taking it. Returns the bytes sent by now."""
    in_fd = proc.stdin.fileno()
    try:
        sent += os.write(in_fd, stdin_data[sent:sent + 65536])
    except BlockingIOError:
        return sent
    except OSError:  # the child closed stdin or died: stop feeding it
        sent = len(stdin_data)
    if sent >= len(stdin_data):
        sel.unregister(in_fd)
        proc.stdin.close()
    return sent


def _read(fd: int, kind: str, sel, outcome: _Outcome, stderr_bytes: int, stdout_cap: int) -> str:
    """One read from a pipe: "data", "again" (nothing now), "eof" or "overflow"."""
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return "again"
    except OSError:
        data = b""
    if not data:
        sel.unregister(fd)
        return "eof"
    if kind == "out":
        outcome.stdout += data
        if len(outcome.stdout) > stdout_cap:
            outcome.overflow = True
            return "overflow"
    elif stderr_bytes > 0:
        outcome.stderr = (outcome.stderr + data)[-stderr_bytes:]
    return "data"


# --- results ------------------------------------------------------------------------------

def _last_line(stderr: bytes) -> str:
    lines = [line.strip() for line in stderr.decode("utf-8", "replace").splitlines() if line.strip()]
    return " ".join(lines[-1].split())[:500] if lines else ""


def _process_error(outcome: _Outcome, limits: Limits, stdout_cap: int) -> DownloadError:
    """The failure of a sandbox that produced no usable result."""
    if outcome.timed_out:
        return DownloadError(f"timed out after {limits.timeout:g}s", retryable=True)
    if outcome.overflow:
        return DownloadError(f"output larger than {stdout_cap} bytes", retryable=False)
    code = outcome.returncode or 0
    tail = _last_line(outcome.stderr)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        why = RESOURCE_SIGNALS.get(-code)
        reason = f"killed by signal {name}" + (f" ({why})" if why else "") + (f": {tail}" if tail else "")
        return DownloadError(reason, retryable=why is None)
    if not outcome.reported and tail.startswith("bwrap:"):  # the box did not start: no downloader ran
        logger.warning("sandbox did not start: %s", redact(tail))
        return DownloadError(f"the sandbox did not start: {tail}", retryable=True)
    return DownloadError(f"exit status {code}" + (f": {tail}" if tail else ""), retryable=True)


def _redacted(error: DownloadError, extra=()) -> DownloadError:
    return DownloadError(redact(error.reason, extra), error.retryable, error.retry_after)


def shell_environment(url: str, proxy: str = "", cookie: str = "") -> dict[str, str]:
    """What a shell downloader finds in its environment: the URL, and the job's proxy and cookie
    (``DOWNLOAD_PROXY``, ``DOWNLOAD_COOKIE``; the proxy also as ``http_proxy``/``https_proxy``/
    ``ALL_PROXY``, which curl and wget honour by themselves). Secrets: never logged."""
    env = {"DOWNLOAD_URL": url}
    if proxy:
        env.update(DOWNLOAD_PROXY=proxy, http_proxy=proxy, https_proxy=proxy, HTTPS_PROXY=proxy,
                   ALL_PROXY=proxy)
    if cookie:
        env["DOWNLOAD_COOKIE"] = cookie
    return env


def run_shell(code: str, url: str, limits: Limits, proxy: str = "", cookie: str = "",
              allow_private: bool = False) -> Download:
    """Run ``/bin/sh -c CODE sh URL`` sandboxed; stdout is the body (status 200 on exit 0)."""
    if "\0" in url or "\0" in code or "\0" in proxy + cookie:
        raise DownloadError("URL, script, proxy or cookie contains a NUL byte", retryable=False)
    message = {"code": code, "url": url, "limits": asdict(limits),
               "env": _environment(shell_environment(url, proxy, cookie))}
    outcome = _run_safely("shell", message, limits, limits.maxsize, allow_private)
    if outcome.timed_out or outcome.overflow or outcome.returncode != 0:
        raise _redacted(_process_error(outcome, limits, limits.maxsize), [proxy, cookie])
    body = bytes(outcome.stdout)
    return Download(status_code=200, headers={}, body=body, url=url, encoding=body_encoding({}, body))


def run_python(code: str, task: dict, limits: Limits) -> Download:
    """Run the python downloader's ``download(task)`` sandboxed and return its result."""
    settings = task.get("settings")
    if not isinstance(settings, dict):
        settings = {}
    secrets = [str(settings.get(k) or "") for k in ("proxy", "cookie")]
    cap = limits.maxsize + FRAME_OVERHEAD
    message = {"code": code, "task": task, "limits": asdict(limits), "env": _environment({})}
    outcome = _run_safely("python", message, limits, cap, bool(settings.get("allow_private")))
    frame = None if outcome.overflow else decode_frame(bytes(outcome.stdout))
    if frame is None:
        if not (outcome.timed_out or outcome.overflow or outcome.returncode):
            raise DownloadError("downloader error: exited without a result", retryable=False)
        raise _redacted(_process_error(outcome, limits, limits.maxsize), secrets)
    header, body, request_body = frame
    if not header.get("ok"):
        kind, error = header.get("kind"), str(header.get("error", ""))
        if kind == "downloader":
            raise _redacted(DownloadError(f"downloader error: {error}", retryable=False), secrets)
        raise _redacted(DownloadError(error, retryable=kind != "size"), secrets)
    status, headers = header.get("status_code"), header.get("headers")
    remote_ip, request_headers = header.get("remote_ip", ""), header.get("request_headers", {})
    links, dropped = header.get("links"), header.get("links_dropped", 0)
    if not (type(status) is int and _is_str_dict(headers) and _is_str_dict(request_headers)
            and isinstance(remote_ip, str) and len(body) <= limits.maxsize and _is_links(links, dropped)):
        # sandbox_main validated the result; only code writing its own frame gets here
        raise DownloadError("downloader error: malformed result frame", retryable=False)
    return Download(status_code=status, headers=headers, body=body, url=str(task.get("url", "")),
                    remote_ip=remote_ip, request_headers=request_headers, request_body=request_body,
                    encoding=body_encoding(headers, body), links=links, links_dropped=dropped)


def run_generator(kind: str, code: str, limits: Limits, allow_private: bool = False) -> bytes:
    """Run a job's generator (``kind`` python or shell) sandboxed, as a downloader runs: the same
    box, limits, deadline and network wall. Its whole output (one URL a line) once it exited 0;
    DownloadError if it failed, hung past the limit or wrote more than ``limits.maxsize`` bytes."""
    if kind not in ("python", "shell"):
        raise DownloadError(f"generator type must be python or shell, got {kind!r}", retryable=False)
    if "\0" in code:
        raise DownloadError("generator code contains a NUL byte", retryable=False)
    message = {"code": code, "url": "", "limits": asdict(limits), "env": _environment({})}
    outcome = _run_safely(f"generate-{kind}", message, limits, limits.maxsize, allow_private)
    if outcome.timed_out or outcome.overflow or outcome.returncode != 0:
        raise _redacted(_process_error(outcome, limits, limits.maxsize))
    return bytes(outcome.stdout)


def _is_str_dict(value) -> TypeGuard[dict[str, str]]:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


def _is_links(links, dropped) -> TypeGuard[list[str] | None]:
    """A frame's links as sandbox_main caps them (a frame the downloader wrote itself may not)."""
    return type(dropped) is int and dropped >= 0 and (links is None or (
        isinstance(links, list) and len(links) <= MAX_LINKS
        and all(isinstance(u, str) and len(u) <= MAX_LINK_LENGTH for u in links)))


def _run_safely(mode: str, message: dict, limits: Limits, cap: int, allow_private: bool) -> _Outcome:
    """``_run``, with a failure to start the sandbox (no memory, pids or fds; no box on this
    host) as DownloadError."""
    try:
        return _run(mode, message, limits, cap, allow_private)
    except wall.Unavailable as exc:
        raise DownloadError(f"sandbox unavailable on this worker: {exc}", retryable=True) from None
    except (OSError, ValueError) as exc:
        raise DownloadError(f"cannot run the sandbox: {type(exc).__name__}: {exc}", retryable=True) from None
