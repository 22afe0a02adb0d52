"""A listening socket served by one thread per accepted connection, whose accept never stops.

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
MAX_CONNS = 4096            # connections one port serves at once; more are closed at accept
BACKOFF_S = (0.01, 1.0)     # a repeating accept failure waits this long at first, doubling up to the second
LOG_EVERY_S = 10.0          # a repeating failure is logged at most this often


class FailureLog:
    """Failures that may repeat thousands of times a second (a flood, a descriptor limit):
    each kind logged on its first occurrence, then at most once per LOG_EVERY_S with how
    many happened since."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._kinds: dict[str, list[float]] = {}   # what -> [count since the last line, when that was]

    def note(self, what: str, e: BaseException) -> None:
        kind = self._kinds.setdefault(what, [0, -LOG_EVERY_S])
        kind[0] += 1
        now = time.monotonic()
        if now - kind[1] >= LOG_EVERY_S:
            log.warning("%s: %s (%s); %d such failures since the last line; it goes on", self.name, what, e,
                        kind[0])
            kind[0], kind[1] = 0, now


class ConnectionServer:
    """Accepts on `listener` and runs ``serve(sock, addr)`` in a thread per connection;
    the socket is closed when serve returns.  Subclasses implement ``serve``."""

    def __init__(self, listener: socket.socket, name: str, max_conns: int = MAX_CONNS) -> None:
        self._listener = listener
        self._name = name
        self.max_conns = max_conns
        self._failures = FailureLog(name)
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
        """Accept until closed, whatever happens: out of descriptors (EMFILE), a thread that
        cannot start (a PID limit), the cap reached.  Each failure closes what it must,
        waits a little longer each time it repeats (BACKOFF_S), and is logged once per burst
        (FailureLog): a worker out of descriptors once logged 303,107 tracebacks in 20 s
        and, when a thread could not start, its accept thread died for good."""
        delay = 0.0
        while not self._closing:
            try:
                sock, addr = self._listener.accept()
            except OSError as e:
                if self._closing:
                    return
                self._failures.note("accept failed", e)
                delay = self._back_off(delay)
                continue
            try:
                self._start_conn(sock, addr)
                delay = 0.0
            except Exception as e:   # (a thread that cannot start: RuntimeError)
                sock.close()
                self._failures.note("a connection could not be served", e)
                delay = self._back_off(delay)

    def _start_conn(self, sock: socket.socket, addr: object) -> None:
        with self._conns_lock:
            if len(self._conns) >= self.max_conns:
                raise ConnectionRefusedError(f"at the cap of {self.max_conns} connections")
            t = threading.Thread(target=self._run, args=(sock, addr), daemon=True,
                                 name=f"{self._name}-conn-{next(self._ids)}")
            self._conns[sock] = t
        try:
            t.start()
        except BaseException:
            with self._conns_lock:
                self._conns.pop(sock, None)
            raise

    def _back_off(self, delay: float) -> float:
        delay = min(BACKOFF_S[1], max(BACKOFF_S[0], 2 * delay))
        time.sleep(delay)
        return delay

    def _run(self, sock: socket.socket, addr: object) -> None:
        try:
            self.serve(sock, addr)
        finally:
            with self._conns_lock:
                self._conns.pop(sock, None)
            sock.close()
