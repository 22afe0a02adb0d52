"""Pooled data-channel connections, shared by clients and workers.

A cluster keeps a handful of sockets per worker instead of a connect per 4 MiB block.
An idle socket is health-checked before reuse (a zero-timeout poll): a worker closes
connections idle too long, and a restarted worker leaves dead ones behind; reusing
either would fail a block that a fresh connection would have carried.

A peer that timed out (a silent worker: partitioned away, or hung) is *suspect* for a
while: its idle sockets are dropped, the exchanges in flight on its other sockets are cut
short (shutdown: they would each wait out their own timeout), and readers and writers try
it last, so one timeout per peer, not one per block, is the price of a partition.
"""
from __future__ import annotations

import select
import socket
import threading
import time
import weakref
from collections import defaultdict

from curvine_py.common import frames
from curvine_py.common.tls import Tls, cut

CONNECT_TIMEOUT_S = 1.5   # a LAN connect takes < 1 ms; a silent peer must not stall a read long
IO_TIMEOUT_S = 30.0
SUSPECT_S = 10.0          # how long a peer that timed out is tried last


class ConnectionPool:
    """Idle data-channel sockets to peers, keyed by (ip, port); thread-safe."""

    def __init__(self, max_idle_per_peer: int = 4, idle_s: float = 60.0,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S, io_timeout_s: float = IO_TIMEOUT_S,
                 congestion: str = "", tls: Tls | None = None) -> None:
        """tls: new connections run a mutual TLS handshake with the worker (the pool
        is made with one only when tls.data is on)."""
        self.max_idle_per_peer = max_idle_per_peer
        self.tls = tls
        self.congestion = congestion   # TCP congestion control of new connections ("" = the system's)
        self.idle_s = idle_s
        self.connect_timeout_s = connect_timeout_s
        self.io_timeout_s = io_timeout_s
        self._idle: dict[tuple[str, int], list[tuple[float, socket.socket]]] = defaultdict(list)
        self._suspect_until: dict[tuple[str, int], float] = {}
        self._busy: dict[tuple[str, int], weakref.WeakSet[socket.socket]] = defaultdict(weakref.WeakSet)
        self._lock = threading.Lock()

    def mark_suspect(self, ip: str, port: int) -> None:
        """(ip, port) did not answer in time: drop its idle sockets, fail the exchanges in
        flight on its busy ones at once, and have it tried last for SUSPECT_S."""
        with self._lock:
            self._suspect_until[(ip, port)] = time.monotonic() + SUSPECT_S
            idle = self._idle.pop((ip, port), [])
            busy = list(self._busy.pop((ip, port), ()))
        for _, sock in idle:
            sock.close()
        for sock in busy:
            cut(sock)   # its owner's send/recv fails now; it closes it

    def is_suspect(self, ip: str, port: int) -> bool:
        with self._lock:
            until = self._suspect_until.get((ip, port))
            if until is not None and until <= time.monotonic():
                del self._suspect_until[(ip, port)]
                until = None
        return until is not None

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
                return self._lend(ip, port, sock)
            sock.close()
        sock = frames.connect(ip, port, self.connect_timeout_s, self.congestion)
        if self.tls is not None:
            try:
                sock = self.tls.connect(sock, "worker")
            except OSError:
                sock.close()
                raise
        sock.settimeout(self.io_timeout_s)
        return self._lend(ip, port, sock)

    def _lend(self, ip: str, port: int, sock: socket.socket) -> socket.socket:
        """Remember sock as in use (weakly: a borrower may just close it) until put back."""
        with self._lock:
            self._busy[(ip, port)].add(sock)
        return sock

    def put(self, ip: str, port: int, sock: socket.socket) -> None:
        """Return a socket whose last exchange completed cleanly."""
        with self._lock:
            self._busy[(ip, port)].discard(sock)
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
