"""The box's seccomp filter: no unix sockets, no io_uring.

The network wall (``wall``) matches sockets by uid on the IP path; a unix socket never takes it.
A world-writable socket file (a Redis ``unixsocketperm 777``, a Docker socket with loose rights)
or an abstract socket of the host (the box shares the host's network namespace, where abstract
names live) would be a way round it. So every process of a box is refused ``socket(AF_UNIX, …)``
(``EAFNOSUPPORT``, as if the kernel had no unix sockets) and the io_uring calls, which can open
sockets without ``socket()``. ``socketpair()`` stays: a pair connects only to itself.

A browser's box keeps unix sockets (Chromium cannot start without them: its profile lock is
one), and only io_uring is refused there: a page's scripts have no unix sockets to open, and the
box still has no ``/run``.

The program is classic BPF over ``struct seccomp_data``, handed to bubblewrap's ``--seccomp FD``
(bubblewrap sets ``no_new_privs`` and loads it just before it runs the command). A process of
another architecture (a 32-bit binary, x32 calls) is refused every call.
"""
from __future__ import annotations

import errno
import os
import platform
import struct

__all__ = ["program", "pipe_fd"]

# BPF opcodes
_LD_ABS = 0x20      # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15         # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35         # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06         # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16        # offsets in struct seccomp_data (args[0]'s low half: little endian)
AF_UNIX = 1
IO_URING = (425, 426, 427)          # io_uring_setup, io_uring_enter, io_uring_register (all arches)
X32_BIT = 0x40000000

# machine: (AUDIT_ARCH_*, socket's number)
ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def program(machine: str | None = None, unix: bool = False) -> bytes:
    """The filter for this machine's architecture (RuntimeError on one it does not know);
    ``unix``: unix sockets allowed (a browser's box)."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise RuntimeError(f"no seccomp filter for {machine}")
    arch, socket_nr = ARCHES[machine]
    deny_all = _insn(_RET, _ERRNO | errno.EPERM)
    body = [
        _insn(_LD_ABS, _ARCH),
        _insn(_JEQ, arch, 1, 0),        # our architecture: go on; else refuse every call
        deny_all,
        _insn(_LD_ABS, _NR),
        _insn(_JGE, X32_BIT, 0, 1),     # x32's calls (x86_64 only; harmless elsewhere)
        deny_all,
        _insn(_JEQ, IO_URING[0], 6, 0),
        _insn(_JEQ, IO_URING[1], 5, 0),
        _insn(_JEQ, IO_URING[2], 4, 0),
        _insn(_JEQ, socket_nr, 0, 2),   # socket(): look at its family; else allow
        _insn(_LD_ABS, _ARG0),
        _insn(_JEQ, 0xFFFFFFFF if unix else AF_UNIX, 2, 0),  # no family is -1: nothing refused
        _insn(_RET, _ALLOW),
        deny_all,
        _insn(_RET, _ERRNO | errno.EAFNOSUPPORT),
    ]
    return b"".join(body)


_cached: dict[bool, bytes] = {}


def pipe_fd(unix: bool = False) -> int:
    """A pipe's read end holding the program, for ``bwrap --seccomp FD`` (the caller passes it to
    the child and closes it after the start)."""
    if unix not in _cached:
        _cached[unix] = program(unix=unix)
    read, write = os.pipe()
    try:
        os.write(write, _cached[unix])  # far below a pipe's buffer
    finally:
        os.close(write)
    return read
