"""Pooled data-channel connections, shared by clients and workers.

A cluster keeps a handful of sockets per worker instead of a connect per 4 MiB block.
An idle socket is health-checked before reuse (a zero-timeout poll): a worker closes
connections idle too long, and a restarted worker leaves dead ones behind; reusing
either would fail a block that a fresh connection would have carried.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from collections import defaultdict

from curvine_py.common import frames

CONNECT_TIMEOUT_S = 3.0
IO_TIMEOUT_S = 30.0


class ConnectionPool:
    """Idle data-channel sockets to peers, keyed by (ip, port); thread-safe."""

    def __init__(self, max_idle_per_peer: int = 4, idle_s: float = 60.0,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S, io_timeout_s: float = IO_TIMEOUT_S) -> None:
        self.max_idle_per_peer = max_idle_per_peer
        self.idle_s = idle_s
        self.connect_timeout_s = connect_timeout_s
        self.io_timeout_s = io_timeout_s
        self._idle: dict[tuple[str, int], list[tuple[float, socket.socket]]] = defaultdict(list)
        self._lock = threading.Lock()

    def get(self, ip: str, port: int) -> socket.socket:
        """A healthy pooled socket to (ip, port), else a new connection (raises OSError)."""
        while True:
            with self._lock:
                idle = self._idle.get((ip, port))
                item = idle.pop() if idle else None
            if item is None:
                break
            since, sock = item
            if time.monotonic() - since < self.idle_s and _healthy(sock):
                sock.settimeout(self.io_timeout_s)
                return sock
            sock.close()
        sock = socket.create_connection((ip, port), timeout=self.connect_timeout_s)
        frames.tune(sock)
        sock.settimeout(self.io_timeout_s)
        return sock

    def put(self, ip: str, port: int, sock: socket.socket) -> None:
        """Return a socket whose last exchange completed cleanly."""
        with self._lock:
            idle = self._idle[(ip, port)]
            if len(idle) < self.max_idle_per_peer:
                idle.append((time.monotonic(), sock))
                return
        sock.close()

    def close(self) -> None:
        with self._lock:
            socks = [s for idle in self._idle.values() for _, s in idle]
            self._idle.clear()
        for s in socks:
            s.close()


def _healthy(sock: socket.socket) -> bool:
    """An idle socket must have nothing to read: readable means the peer closed it (EOF)
    or sent unsolicited bytes, and either way the stream is unusable."""
    try:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLERR | select.POLLHUP)
        return not poller.poll(0)
    except (OSError, ValueError):
        return False
