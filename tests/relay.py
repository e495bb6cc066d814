"""A TCP relay of the tests' own, between one worker and a server (Redis or MongoDB), to meet the
network as operators do: it can stop forwarding both ways without closing any socket (a
partition that drops packets), heal, let connections made before the heal resume only some
seconds after new ones (TCP retransmission backoff), and partition at the moment the client
sends a chosen message (that message is held, then delivered late)."""
from __future__ import annotations

import socket
import threading
import time


class Relay:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self.generation = 0           # bumped by heal(); older connections may wait longer
        self.old_resume_at = 0.0
        self.trigger: tuple[bytes, ...] | None = None
        self.tripped = threading.Event()
        self.delivered_late = threading.Event()  # a connection older than the heal forwarded again
        self.sockets: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"relay-{self.port}").start()

    # --- control ----------------------------------------------------------------------------

    def partition(self) -> None:
        self._open.clear()

    def partition_on(self, *markers: bytes) -> None:
        """Partition when the client next sends bytes containing every one of ``markers`` (held,
        not forwarded)."""
        self.trigger = markers

    def heal(self, old_after: float = 0.0) -> None:
        """Forward again: at once on connections made from now on, after ``old_after`` seconds on
        the ones that lived through the partition."""
        with self._lock:
            self.generation += 1
            self.old_resume_at = time.monotonic() + old_after
        self._open.set()

    def close(self) -> None:
        self.closed = True
        self._open.set()
        for s in [self.listener, *self.sockets]:
            try:
                s.close()
            except OSError:
                pass

    # --- forwarding -------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.sockets += [client, server]
            born = self.generation
            for src, dst, up in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, up, born), daemon=True).start()

    def _wait(self, born: int) -> None:
        while not self.closed:
            if self._open.is_set():
                with self._lock:
                    late = born < self.generation and time.monotonic() < self.old_resume_at
                    old = born < self.generation
                if not late:
                    if old:
                        self.delivered_late.set()
                    return
            time.sleep(0.01)

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool, born: int) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if upstream and self.trigger is not None and all(m in data for m in self.trigger):
                    self.trigger = None
                    self._open.clear()
                    self.tripped.set()
                self._wait(born)
                dst.sendall(data)
        except OSError:
            return
