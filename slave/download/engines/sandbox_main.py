"""Entry point of a sandboxed downloader process: ``python -m slave.download.engines.sandbox_main MODE``.

It reads one JSON message ``{code, limits, task | url}`` from stdin, applies the resource limits,
gives up root where it can, then either runs a python downloader and writes one result frame to
stdout (python mode) or replaces itself with ``/bin/sh -c CODE sh URL`` (shell mode); a job's
generator runs the same way (generate-python: ``generate()``'s URLs, one a line, ``URL<TAB>HOST``
for pairs; generate-shell: ``/bin/sh -c CODE sh``, its stdout as it is).
Standard library only, so it starts fast; ``slave.download.engines.sandbox`` is the parent side.

Frame: ``MAGIC | u32 header length | u64 body length | u64 request-body length | header JSON |
body | request body``. The header is ``{"ok": true, status_code, headers, remote_ip,
request_headers[, links, links_dropped]}`` or ``{"ok": false, "kind": "exception" | "downloader" |
"size", "error"}``.

It runs inside the box ``slave.download.engines.sandbox`` builds with bubblewrap, which starts it as root
without capabilities but CAP_SETUID/CAP_SETGID: it switches at once, for good, to the uid the
parent chose (``message["uid"]``, one per box: RLIMIT_NPROC holds per box, the network wall
matches it), applies the limits, then forks the downloader and stays as its supervisor: it waits
for it and reports how it ended on the status fd (``argv[2]``), which the downloader does not
hold. Its environment is exactly ``message["env"]``.
"""
from __future__ import annotations

import builtins
import json
import os
import resource
import struct
import sys
import types

MAGIC = b"DCSB"
PREFIX = struct.Struct(">4sIQQ")
MAX_HEADER = 1024 * 1024            # header JSON plus request body allowed beside the body
MAX_LINKS, MAX_LINK_LENGTH = 10_000, 2048  # links a result may carry (common.jobsettings's caps)
MAX_LINK_BYTES = 1024 * 1024        # and their JSON, beside the header
FRAME_OVERHEAD = PREFIX.size + MAX_HEADER + MAX_LINK_BYTES


def write_frame(out, header: dict, body: bytes = b"", request_body: bytes = b"") -> None:
    """Write one frame to the binary stream ``out`` (in parts: no copy of a large body)."""
    head = json.dumps(header, ensure_ascii=True).encode()
    out.write(PREFIX.pack(MAGIC, len(head), len(body), len(request_body)) + head)
    out.write(body)
    out.write(request_body)


def decode_frame(data: bytes) -> tuple[dict, bytes, bytes] | None:
    """(header, body, request_body) if ``data`` is exactly one well-formed frame, else None."""
    if len(data) < PREFIX.size:
        return None
    magic, hlen, blen, rlen = PREFIX.unpack_from(data)
    if magic != MAGIC or len(data) != PREFIX.size + hlen + blen + rlen:
        return None
    start = PREFIX.size + hlen
    try:
        header = json.loads(data[PREFIX.size:start])
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    return header, data[start:start + blen], data[start + blen:]


# --- limits and privileges ----------------------------------------------------------------

def apply_limits(limits: dict) -> None:
    """Hard resource limits for this process and everything it starts."""
    mib = 1024 * 1024
    wanted = {
        resource.RLIMIT_AS: int(limits["memory_mb"]) * mib,
        resource.RLIMIT_CPU: int(limits["cpu_seconds"]),
        resource.RLIMIT_NPROC: int(limits["max_processes"]),
        resource.RLIMIT_FSIZE: int(limits["max_file_mb"]) * mib,
        resource.RLIMIT_NOFILE: int(limits["max_open_files"]),
        resource.RLIMIT_CORE: 0,
    }
    for which, value in wanted.items():
        hard = value + 1 if which == resource.RLIMIT_CPU else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(which, (value, hard))


def drop_privileges(uid: int) -> None:
    """Continue for good as ``uid``: real, effective, saved and file-system ids all change, and
    with them every capability goes."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid):
        raise OSError("the uid did not change")


def supervise(status_fd: int) -> None:
    """Fork: the child returns and becomes the downloader; this process waits for it and writes
    its wait status to ``status_fd``. The box's pid namespace takes care of the rest: whatever
    the downloader started dies when this process and the box end."""
    child = os.fork()
    if child == 0:
        os.close(status_fd)
        return
    os.close(0)
    for fd in (1, 2):  # only the downloader writes to the pipes
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    os.write(status_fd, b"%d\n" % status)
    os._exit(0)


# --- python mode --------------------------------------------------------------------------

class DownloaderError(Exception):
    """The code itself is unusable (does not compile, no download(), malformed result)."""


def _str_dict(value, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise DownloaderError(f"{name} must be a dict, got {type(value).__name__}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, (str, int, float)) or isinstance(v, bool):
            raise DownloaderError(f"{name} must map str to str")
        out[k] = str(v)
    return out


def _as_bytes(value, name: str) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError:
            raise DownloaderError(f"{name} is a str that cannot be encoded as UTF-8") from None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise DownloaderError(f"{name} must be bytes or str, got {type(value).__name__}")


def _links(value) -> tuple[list[str], int]:
    """The URLs a result found (``links``): the first strings within the caps, and how many
    were left out (a million links cost no more than the caps)."""
    if value is None:
        return [], 0
    if not isinstance(value, (list, tuple)):
        raise DownloaderError(f"links must be a list of URLs, got {type(value).__name__}")
    kept, size = [], 0
    for link in value[:MAX_LINKS]:
        if isinstance(link, str) and len(link) <= MAX_LINK_LENGTH:
            size += len(json.dumps(link)) + 2
            if size > MAX_LINK_BYTES:
                break
            kept.append(link)
    return kept, len(value) - len(kept)


def validate_result(result, maxsize: int) -> tuple[dict, bytes, bytes]:
    """(header, body, request_body) of a download() result, or DownloaderError."""
    if not isinstance(result, dict):
        raise DownloaderError(f"download() must return a dict, got {type(result).__name__}")
    status = result.get("status_code")
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 999:
        raise DownloaderError(f"status_code must be an int from 100 to 999, got {status!r:.40}")
    if "body" not in result and status != 304:  # 304: "not modified" since task["previous"]
        raise DownloaderError("result has no body")
    remote_ip = result.get("remote_ip") or ""
    if not isinstance(remote_ip, str):
        raise DownloaderError("remote_ip must be a str")
    header = {"ok": True, "status_code": status, "headers": _str_dict(result.get("headers"), "headers"),
              "remote_ip": remote_ip,
              "request_headers": _str_dict(result.get("request_headers"), "request_headers")}
    body = _as_bytes(result.get("body", b""), "body")
    request_body = _as_bytes(result.get("request_body"), "request_body")
    if len(body) > maxsize:
        raise OverflowError(f"body larger than {maxsize} bytes")
    if len(request_body) + len(json.dumps(header)) > MAX_HEADER:
        raise DownloaderError("headers and request_body larger than 1 MiB")
    if "links" in result:
        header["links"], header["links_dropped"] = _links(result["links"])
    return header, body, request_body


def _describe(exc: BaseException) -> str:
    """"ExcType: message" on one line."""
    try:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        text = type(exc).__name__
    return " ".join(text.split())[:1000]


def run_python(message: dict, out) -> int:
    """Run the downloader; write one frame to ``out``; return the exit status."""
    code, task, maxsize = message["code"], message["task"], int(message["limits"]["maxsize"])
    main_pid = os.getpid()
    try:
        try:
            compiled = compile(code, "<downloader>", "exec")
            module = types.ModuleType("downloader")
            module.__dict__["__builtins__"] = builtins
            sys.modules["downloader"] = module
            exec(compiled, module.__dict__)
            download = module.__dict__.get("download")
            if not callable(download):
                raise DownloaderError("no download(task) function")
        except DownloaderError:
            raise
        except BaseException as exc:  # noqa: BLE001 - the module's own top-level code failed
            raise DownloaderError(_describe(exc)) from None
        try:
            result = download(task)
        except BaseException as exc:  # noqa: BLE001 - incl. SystemExit, MemoryError
            if os.getpid() != main_pid:  # a process the downloader forked: only main reports
                os._exit(1)
            write_frame(out, {"ok": False, "kind": "exception", "error": _describe(exc)})
            return 1
        if os.getpid() != main_pid:
            os._exit(0)
        header, body, request_body = validate_result(result, maxsize)
        write_frame(out, header, body, request_body)
        return 0
    except OverflowError as exc:
        write_frame(out, {"ok": False, "kind": "size", "error": str(exc)})
    except DownloaderError as exc:
        write_frame(out, {"ok": False, "kind": "downloader", "error": str(exc)[:1000]})
    except BaseException as exc:  # noqa: BLE001 - e.g. MemoryError while validating
        write_frame(out, {"ok": False, "kind": "exception", "error": _describe(exc)})
    return 1


# --- generator modes -----------------------------------------------------------------------

def _line(item) -> str:
    """One item a generator yielded as one output line: ``URL`` or ``URL<TAB>HOST``. Line breaks
    and tabs inside become spaces, so intake rejects such a URL by its line number."""
    def clean(value) -> str:
        return str(value).replace("\r", " ").replace("\n", " ").replace("\t", " ")

    if isinstance(item, (tuple, list)) and len(item) == 2:
        return clean(item[0]) + "\t" + clean(item[1])
    if isinstance(item, bytes):
        item = item.decode("utf-8", "replace")
    return clean(item)


def run_generate(message: dict, out) -> int:
    """Run the generator's ``generate()``: each URL (or (url, host) pair) it returns or yields is
    one line on ``out``; an exception is one line on stderr and exit status 1."""
    main_pid = os.getpid()
    try:
        module = types.ModuleType("generator")
        module.__dict__["__builtins__"] = builtins
        sys.modules["generator"] = module
        exec(compile(message["code"], "<generator>", "exec"), module.__dict__)
        generate = module.__dict__.get("generate")
        if not callable(generate):
            raise DownloaderError("no generate() function")
        result = generate()
        if isinstance(result, (str, bytes)):
            result = [result]
        for item in result if result is not None else ():
            out.write((_line(item) + "\n").encode("utf-8", "replace"))
    except BaseException as exc:  # noqa: BLE001 - incl. SystemExit, MemoryError
        if os.getpid() != main_pid:
            os._exit(1)
        out.flush()
        print(f"generator error: {_describe(exc)}", file=sys.stderr)
        return 1
    if os.getpid() != main_pid:
        os._exit(0)
    return 0


MODES = ("python", "shell", "generate-python", "generate-shell")


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else ""
    if mode not in MODES or len(argv) < 3 or not argv[2].isdigit():
        print("usage: sandbox_main.py python|shell|generate-python|generate-shell STATUS_FD < message.json",
              file=sys.stderr)
        return 2
    status_fd = int(argv[2])
    message = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.closerange(3, status_fd)
    os.closerange(status_fd + 1, 1 << 16)  # e.g. bubblewrap's info fd
    try:
        drop_privileges(int(message["uid"]))
    except (OSError, KeyError, ValueError) as exc:  # never run a downloader as root
        print(f"sandbox: cannot drop root: {exc}", file=sys.stderr)
        return 70
    apply_limits(message["limits"])
    env = {str(k): str(v) for k, v in message["env"].items()}
    os.environ.clear()
    os.environ.update(env)
    supervise(status_fd)
    if mode == "shell":
        os.execve("/bin/sh", ["/bin/sh", "-c", message["code"], "sh", message["url"]], env)
    if mode == "generate-shell":
        os.execve("/bin/sh", ["/bin/sh", "-c", message["code"], "sh"], env)
    # the frame goes to a private copy of stdout; fd 1 and sys.stdout become stderr, so the
    # downloader's prints (and its child processes' output) cannot corrupt the frame
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    status = run_generate(message, out) if mode == "generate-python" else run_python(message, out)
    out.flush()
    sys.stderr.flush()
    os._exit(status)  # do not wait for threads the downloader may have left running


if __name__ == "__main__":
    sys.exit(main(sys.argv))
