"""Running untrusted python and shell downloaders in a process of their own: clean environment,
private temp dir, resource limits (see ``sandbox_main``), capped output and a total deadline
after which the whole process group is killed. The worker can be neither hung nor flooded.
"""
from __future__ import annotations

import json
import os
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

from common.errors import DownloadError
from common.secrets import redact
from slave.engines.base import Download, Limits
from slave.engines.charset import body_encoding
from slave.engines.sandbox_main import FRAME_OVERHEAD, decode_frame

__all__ = ["run_python", "run_shell"]

SANDBOX_MAIN = str(Path(__file__).resolve().with_name("sandbox_main.py"))
RESOURCE_SIGNALS = {signal.SIGXCPU: "CPU limit", signal.SIGXFSZ: "file size limit"}


class _Outcome:
    """What a finished sandbox process left behind."""

    def __init__(self) -> None:
        self.stdout = bytearray()
        self.stderr = b""
        self.returncode: int | None = None
        self.timed_out = False
        self.overflow = False


def _environment(home: str, extra: dict[str, str]) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home, "PYTHONDONTWRITEBYTECODE": "1", **extra}


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


def _killpg(pgid: int) -> bool:
    """SIGKILL the whole group; False if it has no members left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the leader has exited, without reaping it (its pid keeps the group id ours)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _run(mode: str, message: dict, limits: Limits, extra_env: dict[str, str], stdout_cap: int) -> _Outcome:
    """Start the sandbox, feed it ``message``, collect capped output until it exits or the
    deadline passes; the process group is always killed and the temp dir removed."""
    deadline = time.monotonic() + limits.timeout
    outcome = _Outcome()
    stdin_data = json.dumps(message, default=str).encode()
    home = tempfile.mkdtemp(prefix="downcluster-sandbox-")
    proc = pidfd = None
    try:
        proc = subprocess.Popen(
            [interpreter(), "-I", script(), mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=home, env=_environment(home, extra_env), start_new_session=True, close_fds=True)
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = None  # fall back to polling the leader
        _pump(proc, pidfd, stdin_data, outcome, deadline, limits.stderr_bytes, stdout_cap)
    finally:
        if proc is not None:
            # kill the group while the unreaped leader still pins its id, reap the leader,
            # then once more for members that were being forked during the first signal
            _killpg(proc.pid)
            proc.wait()
            if _killpg(proc.pid):
                time.sleep(0.01)
                _killpg(proc.pid)
            outcome.returncode = proc.returncode
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    pipe.close()
                except OSError:
                    pass
        if pidfd is not None:
            os.close(pidfd)
        shutil.rmtree(home, ignore_errors=True)
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
                    try:
                        sent += os.write(in_fd, stdin_data[sent:sent + 65536])
                    except BlockingIOError:
                        continue
                    except OSError:  # the child closed stdin or died: stop feeding it
                        sent = len(stdin_data)
                    if sent >= len(stdin_data):
                        sel.unregister(in_fd)
                        proc.stdin.close()
                elif _read(key.fd, key.data, sel, outcome, stderr_bytes, stdout_cap) == "overflow":
                    return
            if pidfd is None and _exited(proc):
                exited = True
        for fd, kind in ((out_fd, "out"), (err_fd, "err")):
            while fd in sel.get_map():
                status = _read(fd, kind, sel, outcome, stderr_bytes, stdout_cap)
                if status == "overflow":
                    return
                if status == "again":
                    break


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
    return DownloadError(f"exit status {code}" + (f": {tail}" if tail else ""), retryable=True)


def _redacted(error: DownloadError, extra=()) -> DownloadError:
    return DownloadError(redact(error.reason, extra), error.retryable, error.retry_after)


def shell_environment(url: str, proxy: str = "", cookie: str = "") -> dict[str, str]:
    """What a shell downloader finds in its environment: the URL, and the job's proxy and cookie
    (``DOWNLOAD_PROXY``, ``DOWNLOAD_COOKIE``; the proxy also as ``http_proxy``/``https_proxy``/
    ``ALL_PROXY``, which curl and wget honour by themselves). Secrets: never logged."""
    env = {"DOWNLOAD_URL": url}
    if proxy:
        env.update(DOWNLOAD_PROXY=proxy, http_proxy=proxy, https_proxy=proxy, HTTPS_PROXY=proxy, ALL_PROXY=proxy)
    if cookie:
        env["DOWNLOAD_COOKIE"] = cookie
    return env


def run_shell(code: str, url: str, limits: Limits, proxy: str = "", cookie: str = "") -> Download:
    """Run ``/bin/sh -c CODE sh URL`` sandboxed; stdout is the body (status 200 on exit 0)."""
    if "\0" in url or "\0" in code or "\0" in proxy + cookie:
        raise DownloadError("URL, script, proxy or cookie contains a NUL byte", retryable=False)
    message = {"code": code, "url": url, "limits": asdict(limits)}
    outcome = _run_safely("shell", message, limits, shell_environment(url, proxy, cookie), limits.maxsize)
    if outcome.timed_out or outcome.overflow or outcome.returncode != 0:
        raise _redacted(_process_error(outcome, limits, limits.maxsize), [proxy, cookie])
    body = bytes(outcome.stdout)
    return Download(status_code=200, headers={}, body=body, url=url, encoding=body_encoding({}, body))


def run_python(code: str, task: dict, limits: Limits) -> Download:
    """Run the python downloader's ``download(task)`` sandboxed and return its result."""
    settings = task.get("settings") if isinstance(task.get("settings"), dict) else {}
    secrets = [str(settings.get(k) or "") for k in ("proxy", "cookie")]
    cap = limits.maxsize + FRAME_OVERHEAD
    outcome = _run_safely("python", {"code": code, "task": task, "limits": asdict(limits)}, limits, {}, cap)
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
    if not (type(status) is int and _is_str_dict(headers) and _is_str_dict(request_headers)
            and isinstance(remote_ip, str) and len(body) <= limits.maxsize):
        # sandbox_main validated the result; only code writing its own frame gets here
        raise DownloadError("downloader error: malformed result frame", retryable=False)
    return Download(status_code=status, headers=headers, body=body, url=str(task.get("url", "")),
                    remote_ip=remote_ip, request_headers=request_headers, request_body=request_body,
                    encoding=body_encoding(headers, body))


def _is_str_dict(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


def _run_safely(mode: str, message: dict, limits: Limits, extra_env: dict[str, str], cap: int) -> _Outcome:
    """``_run``, with a failure to start the sandbox (no memory, pids or fds) as DownloadError."""
    try:
        return _run(mode, message, limits, extra_env, cap)
    except (OSError, ValueError) as exc:
        raise DownloadError(f"cannot run the sandbox: {type(exc).__name__}: {exc}", retryable=True) from None
