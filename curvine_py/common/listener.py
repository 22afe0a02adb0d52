"""A listening socket served by one thread per accepted connection.

Threads beat an event loop for the block data paths: every step of an exchange is a
blocking syscall (recv_into, sendmsg, an io_uring completion wait) that releases the GIL
(worker/dataserver.py has the measurement).  The worker's TCP data channel, its
short-circuit write socket and the master's framed metadata server share this accept
loop and its orderly stop.
"""
from __future__ import annotations

import itertools
import logging
import socket
import threading
import time

log = logging.getLogger(__name__)


class ConnectionServer:
    """Accepts on `listener` and runs ``serve(sock, addr)`` in a thread per connection;
    the socket is closed when serve returns.  Subclasses implement ``serve``."""

    def __init__(self, listener: socket.socket, name: str) -> None:
        self._listener = listener
        self._name = name
        self._closing = False
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._conns_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    @property
    def closing(self) -> bool:
        return self._closing

    def serve(self, sock: socket.socket, addr: object) -> None:
        raise NotImplementedError

    def start(self) -> "ConnectionServer":
        self._thread.start()
        return self

    def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end every connection, and wait (up to grace_s) for the threads:
        an exchange in its commit finishes before the caller tears down what it uses."""
        self._closing = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        if self._thread.is_alive():
            self._thread.join(timeout=grace_s)
        with self._conns_lock:
            conns = list(self._conns.items())
        for c, _ in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        for _, t in conns:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                sock, addr = self._listener.accept()
            except OSError:
                if self._closing:
                    return
                log.exception("%s: accept failed", self._name)
                continue
            t = threading.Thread(target=self._run, args=(sock, addr), daemon=True,
                                 name=f"{self._name}-conn-{next(self._ids)}")
            with self._conns_lock:
                self._conns[sock] = t
            t.start()

    def _run(self, sock: socket.socket, addr: object) -> None:
        try:
            self.serve(sock, addr)
        finally:
            with self._conns_lock:
                self._conns.pop(sock, None)
            sock.close()
