"""A listening socket served by one thread per connection, whose accept never stops and
whose connections a flood cannot take from real clients.

Threads beat an event loop for the block data paths: every step of an exchange is a
blocking syscall (recv_into, sendmsg, an io_uring completion wait) that releases the GIL
(worker/dataserver.py has the measurement).  But a connection gets its thread only when
its first bytes arrive: until then the accept thread watches it (epoll), so an idle one
costs a descriptor, not a thread.  The worker's TCP data channel, its short-circuit write
socket and the master's framed metadata server share this accept loop and its orderly stop.

Limits (issue 42, item 5; docs/architecture.md "Failure handling"):

* the connections of one process's servers hold together at most half its descriptor
  limit (``connection_budget``; each counted with the descriptors it may hold,
  ``fds_per_conn``), one port at most ``MAX_CONNS``: descriptors for block files, the
  journal and gRPC never run out first;
* at a limit, or when accept finds no descriptor (EMFILE) or no thread can start, the
  connection that matters least is closed so the new one gets in: one that never began a
  request (oldest first), then one stalled inside a request, then the longest idle
  (``ConnectionServer._evict``).  A flood of idle connections thus holds no port: a
  client's connection takes the place of a flood's.  Only when every connection is inside
  a request is the new one refused;
* a connection that sends no first request within ``FIRST_REQUEST_S``, stops in the
  middle of a request for ``PARTIAL_S`` (a half-open peer) or waits for its next request
  for ``IDLE_S`` is closed (checked every ``SWEEP_S`` by the accept thread);
* failures are logged once per kind per 10 s with a count (``FailureLog``), never a
  traceback per connection.

A server tells its connections' phases with ``conn_of(sock)``: ``waiting()`` before it
reads a request, ``reading()`` when the request's first bytes are there, ``working()``
once it is read whole (the server's own socket timeouts then apply).  gRPC's and
Prometheus' servers are libraries: ``grpc_server_options`` sets gRPC's own knobs for the
same limits, common/metrics.py the HTTP server's.
"""
from __future__ import annotations

import errno
import heapq
import itertools
import logging
import math
import os
import resource
import selectors
import socket
import threading
import time
import weakref

from curvine_py.common.tls import EVERYONE, Tls, cut

log = logging.getLogger(__name__)
MAX_CONNS = 4096            # connections one port serves at once (and never more than connection_budget())
BACKLOG = 4096              # listen backlog (at most net.core.somaxconn): a burst waits there, not dropped
BACKOFF_S = (0.01, 1.0)     # a repeating accept failure waits this long at first, doubling up to the second
LOG_EVERY_S = 10.0          # a repeating failure is logged at most this often
FIRST_REQUEST_S = 10.0      # a connection that has not begun a request this long after accept is closed
PARTIAL_S = 30.0            # ... one that began a request and sent no more of it for this long (half-open)
IDLE_S = 600.0              # ... one that waits for its next request this long
SWEEP_S = 1.0               # the accept thread checks those timeouts this often
STALLED_S = 1.0             # a request begun this long ago and not read whole yet may be evicted
GRPC_HANDSHAKE_MS = 10_000  # a gRPC connection must finish its HTTP/2 handshake within this
# accept() reports a connection that died in the backlog (or a network error pending on it)
# this way; the next one is fine, so these neither back off nor log.
_TRANSIENT = {errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN, errno.ENETDOWN, errno.ENOPROTOOPT,
              errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH}
# Out of descriptors or kernel memory: closing a connection of ours may make room.
_NO_ROOM = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


def descriptor_limit() -> int:
    """This process's soft RLIMIT_NOFILE (2**20 when unlimited)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if 0 < soft < 1 << 20 else 1 << 20


def connection_budget() -> int:
    """Descriptors the connections of all ConnectionServers of this process hold
    together: half the descriptor limit (512 under ``ulimit -n 1024``).  gRPC takes up to
    an eighth (grpc_server_options), /metrics a sixteenth at most; the rest is for files."""
    return max(16, descriptor_limit() // 2)


def grpc_server_options() -> list[tuple[str, int]]:
    """gRPC's own knobs for this module's limits: at most an eighth of the descriptor
    limit in connections (gRPC closes more at accept, it cannot evict), a connection that
    has not finished its HTTP/2 handshake within GRPC_HANDSHAKE_MS is closed (an idle or
    garbage-sending peer), and one without a call for IDLE_S is sent a GOAWAY (its client
    reconnects at its next call).  On EMFILE gRPC itself retries once a second and logs
    one line a second."""
    return [("grpc.max_allowed_incoming_connections", max(16, min(MAX_CONNS, descriptor_limit() // 8))),
            ("grpc.server_handshake_timeout_ms", GRPC_HANDSHAKE_MS),
            ("grpc.max_connection_idle_ms", int(IDLE_S * 1000))]


class FailureLog:
    """Failures that may repeat thousands of times a second (a flood, a descriptor limit):
    each kind logged on its first occurrence, then at most once per LOG_EVERY_S with how
    many happened since.  trace: the first line of a kind carries the traceback (an
    unexpected exception, logged from its except block).  Thread-safe."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._kinds: dict[str, list[float]] = {}   # what -> [count since the last line, when that was]
        self._lock = threading.Lock()

    def note(self, what: str, e: BaseException, trace: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            kind = self._kinds.setdefault(what, [0, -math.inf])
            kind[0] += 1
            if now - kind[1] < LOG_EVERY_S:
                return
            count, first = kind[0], kind[1] == -math.inf
            kind[0], kind[1] = 0, now
        log.warning("%s: %s (%s); %d times since the last line; it goes on", self.name, what, e, count,
                    exc_info=e if trace and first else None)


WAITING, READING, WORKING = 0, 1, 2


class Conn:
    """One accepted connection as its server sees it: its phase and since when."""

    __slots__ = ("sock", "addr", "state", "since", "served", "evicted", "greeting", "thread")

    def __init__(self, sock: socket.socket, addr: object) -> None:
        self.sock = sock
        self.addr = addr
        self.state = WAITING
        self.since = time.monotonic()
        self.served = False    # has begun a request
        self.evicted = ""      # why it was cut ("" = it was not)
        self.greeting = b""    # what ConnectionServer.greet returned for it
        self.thread: threading.Thread | None = None   # None while it waits for its first bytes

    def waiting(self) -> None:
        """The server waits for the next request: the connection may be evicted."""
        self.state = WAITING
        self.since = time.monotonic()

    def reading(self) -> None:
        """The first bytes of a request are here; the rest is due within PARTIAL_S."""
        self.state = READING
        self.since = time.monotonic()
        self.served = True

    def working(self) -> None:
        """The request is read whole: the server's own timeouts apply until the next waiting()."""
        self.state = WORKING
        self.served = True

    def rank(self, now: float) -> tuple[int, float] | None:
        """Eviction order (smallest first), None when it must not be evicted: never
        began a request (oldest first), stalled in one, then idle (longest first)."""
        if self.evicted:
            return None
        if self.state == WAITING:
            return (2, self.since) if self.served else (0, self.since)
        if self.state == READING and now - self.since >= STALLED_S:
            return (1, self.since)
        return None

    def cut(self, why: str) -> None:
        """End the connection: its thread's pending recv returns and the thread closes it
        (one still waiting for its first bytes: its accept thread does)."""
        self.evicted = why
        cut(self.sock)


# Every running server of this process (they share connection_budget()) and the lock over
# their connection tables.
_SERVERS: "weakref.WeakSet[ConnectionServer]" = weakref.WeakSet()
_LOCK = threading.Lock()


class ConnectionServer:
    """Accepts on `listener` and runs ``serve(sock, addr)`` in a thread per connection;
    the socket is closed when serve returns.  Subclasses implement ``serve`` (and
    ``greet`` if their protocol has the server speak first).

    A new connection gets its thread only once its first bytes arrive: until then its
    accept thread watches it (epoll), so idle connections cost a descriptor, not a thread
    (a PID limit), and a flood of them is accepted and evicted at ~20 us each instead of
    a thread start and exit each (measured under a burst of 4,000 connections: a new
    client waited 3.7 s behind them with a thread per accepted connection)."""

    def __init__(self, listener: socket.socket, name: str, max_conns: int = MAX_CONNS,
                 first_request_s: float = FIRST_REQUEST_S, partial_s: float = PARTIAL_S,
                 idle_s: float = IDLE_S, fds_per_conn: int = 1, tls: "Tls | None" = None,
                 accept: frozenset[str] = EVERYONE) -> None:
        """fds_per_conn: the descriptors a connection of this server may hold (its socket,
        a block file or a downstream connection, a SQLite read connection of its thread),
        what it counts for in connection_budget().  tls: each connection's thread first
        runs the server side of a mutual TLS handshake, and serves peers whose certificate
        is of a role in `accept` (common/tls.py)."""
        self._listener = listener
        self._tls = tls
        self._accept_roles = accept
        self._name = name
        self.fds_per_conn = fds_per_conn
        self.max_conns = min(max_conns, connection_budget() // fds_per_conn)
        self.first_request_s, self.partial_s, self.idle_s = first_request_s, partial_s, idle_s
        self._failures = FailureLog(name)
        self._closing = False
        self._conns: dict[socket.socket, Conn] = {}
        self._victims: dict[bool, list[tuple[tuple[int, float], int, Conn]]] = {}   # the next few to evict
        self._ids = itertools.count(1)
        self._selector: selectors.BaseSelector | None = None   # the accept thread's
        self._wake = -1                                         # an eventfd that wakes it (close)
        self._thread = threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True)

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def connections(self) -> int:
        return len(self._conns)

    def conn_of(self, sock: socket.socket) -> Conn:
        """The bookkeeping of a connection this server serves (serve's sock)."""
        return self._conns[sock]

    def greet(self, sock: socket.socket) -> bytes:
        """Called by the accept thread on each new connection before it waits for the
        peer's first bytes: a server that speaks first sends its greeting here (a few
        bytes into an empty send buffer, so it does not block) and returns what serve
        needs of it (``conn_of(sock).greeting``).  OSError: the peer is gone."""
        return b""

    def serve(self, sock: socket.socket, addr: object) -> None:
        raise NotImplementedError

    def start(self) -> "ConnectionServer":
        self._listener.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake, selectors.EVENT_READ, "wake")
        with _LOCK:
            _SERVERS.add(self)
        self._thread.start()
        return self

    def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end every connection, and wait (up to grace_s) for the threads:
        an exchange in its commit finishes before the caller tears down what it uses."""
        self._closing = True
        with _LOCK:
            _SERVERS.discard(self)
        if self._selector is None:   # never started
            self._listener.close()
        elif self._wake >= 0:
            os.eventfd_write(self._wake, 1)
            self._thread.join(timeout=grace_s)
            if not self._thread.is_alive():   # (else it may still select on it)
                os.close(self._wake)
                self._wake = -1
        with _LOCK:
            conns = list(self._conns.values())
        for c in conns:
            cut(c.sock)
        deadline = time.monotonic() + grace_s
        for c in conns:
            if c.thread is not None:
                c.thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # ------------------------------------------------------------ accept

    def _accept_loop(self) -> None:
        """Accept until closed, whatever happens: out of descriptors (EMFILE), a thread that
        cannot start (a PID limit), the cap reached.  Each failure closes what it must --
        first the connection that matters least, so the new one has room -- waits a little
        longer each time it repeats without such room (BACKOFF_S), and is logged once per
        burst (FailureLog): a worker out of descriptors once logged 303,107 tracebacks in
        20 s and, when a thread could not start, its accept thread died for good."""
        selector = self._selector
        assert selector is not None
        delay = 0.0
        swept = time.monotonic()
        try:
            while not self._closing:
                try:
                    for key, _ in selector.select(max(0.0, SWEEP_S - (time.monotonic() - swept))):
                        if self._closing:
                            break
                        if key.data == "accept":
                            delay = self._accept_some(delay)
                        elif isinstance(key.data, Conn):
                            self._first_bytes(key.data)
                    if time.monotonic() - swept >= SWEEP_S:
                        self._sweep()
                        swept = time.monotonic()
                except Exception as e:   # a bug here must not end accepting
                    self._failures.note("the accept loop failed", e, trace=True)
                    delay = self._back_off(delay)
        finally:
            with _LOCK:
                parked = [c for c in self._conns.values() if c.thread is None]
                for c in parked:
                    del self._conns[c.sock]
            for c in parked:
                c.sock.close()
            selector.close()
            self._listener.close()

    def _accept_some(self, delay: float) -> float:
        """Accept what waits in the backlog (up to a burst's worth, then the connections
        whose first bytes came get their turn); the back-off delay to go on with."""
        for _ in range(64):
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return delay
            except OSError as e:
                if self._closing or e.errno in _TRANSIENT:
                    return delay
                self._failures.note("accept failed", e)
                made_room = e.errno in _NO_ROOM and self._evict(everywhere=True, why="out of descriptors")
                return self._back_off(0.0 if made_room else delay)
            try:
                self._admit(sock, addr)
                delay = 0.0
            except OSError:        # the peer went away before its greeting
                self._forget(sock)
            except Exception as e:   # the cap, with every connection inside a request
                self._forget(sock)
                self._failures.note("a connection could not be served", e)
                return self._back_off(delay)
        return delay

    def _admit(self, sock: socket.socket, addr: object) -> None:
        """Make room if at a limit, greet, and watch for the first bytes."""
        with _LOCK:
            full = len(self._conns) >= self.max_conns
            fds = sum(len(s._conns) * s.fds_per_conn for s in _SERVERS)
        if full or fds + self.fds_per_conn > connection_budget():
            why = f"at the cap of {self.max_conns} connections" if full else \
                f"at this process's budget for connections ({connection_budget()} descriptors, half its limit)"
            if not self._evict(everywhere=not full, why=why):
                raise ConnectionRefusedError(f"{why}, each inside a request")
            self._failures.note("a connection made room for a new one", ConnectionResetError(why))
        conn = Conn(sock, addr)
        with _LOCK:
            self._conns[sock] = conn
        if self._tls is None:   # (with TLS the server speaks only inside it: _secure greets)
            conn.greeting = self.greet(sock)
        assert self._selector is not None
        self._selector.register(sock, selectors.EVENT_READ, conn)

    def _first_bytes(self, conn: Conn) -> None:
        """A watched connection is readable: bytes (a thread serves it), its end or a cut
        (closed here, no thread for it)."""
        assert self._selector is not None
        self._selector.unregister(conn.sock)
        if not conn.evicted:
            try:
                if conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    self._start_thread(conn)
                    return
            except BlockingIOError:   # (not readable after all)
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)
                return
            except OSError:
                pass
        self._forget(conn.sock)

    def _start_thread(self, conn: Conn) -> None:
        conn.working()   # the server's own marks (waiting, reading) take over
        t = threading.Thread(target=self._run, args=(conn,), daemon=True,
                             name=f"{self._name}-conn-{next(self._ids)}")
        conn.thread = t
        try:
            t.start()
        except Exception as e:   # "can't start new thread" (a PID limit)
            conn.thread = None
            self._forget(conn.sock)
            self._failures.note("a connection could not be served", e)
            made_room = self._evict(everywhere=True, why="no thread")
            self._back_off(0.0 if made_room else BACKOFF_S[0])

    def _forget(self, sock: socket.socket) -> None:
        with _LOCK:
            self._conns.pop(sock, None)
        sock.close()

    def _back_off(self, delay: float) -> float:
        delay = min(BACKOFF_S[1], max(BACKOFF_S[0], 2 * delay))
        time.sleep(delay)
        return delay

    def _run(self, conn: Conn) -> None:
        try:
            if self._tls is None or self._secure(conn, self._tls):
                self.serve(conn.sock, conn.addr)
        finally:
            self._forget(conn.sock)

    def _secure(self, conn: Conn, tls: "Tls") -> bool:
        """The TLS handshake (the ClientHello is what woke the connection), then the
        greeting inside it; False (logged once per 10 s) when the peer is refused."""
        conn.reading()   # a peer stalled in its handshake may be evicted, as in a request
        try:
            secured = tls.accept(conn.sock, self._accept_roles, self.first_request_s)
        except (OSError, ValueError) as e:   # ssl.SSLError and PeerRefused are OSErrors
            self._failures.note("a TLS handshake failed", e)
            return False
        with _LOCK:   # the plain socket object is detached now: the table keys the TLS one
            self._conns.pop(conn.sock, None)
            conn.sock = secured
            self._conns[secured] = conn
        try:
            conn.greeting = self.greet(secured)
        except OSError:
            return False
        return True

    # ------------------------------------------------------------ eviction and timeouts

    def _evict(self, everywhere: bool, why: str) -> bool:
        """Cut the connection that matters least -- of this server, or of every server of
        this process (they share the descriptors) -- and say whether there was one.
        A scan keeps the next few victims, so a flood costs no scan per connection; each
        is checked again before it is cut (it may have begun a request since)."""
        now = time.monotonic()
        victims = self._victims.setdefault(everywhere, [])
        while True:
            while victims:
                rank, _, conn = heapq.heappop(victims)
                if conn.rank(now) == rank and conn.sock.fileno() != -1:
                    conn.cut(why)
                    return True
            servers = list(_SERVERS) if everywhere else [self]
            with _LOCK:
                ranked = [(r, id(c), c) for s in servers for c in s._conns.values()
                          if (r := c.rank(now)) is not None]
            if not ranked:
                return False
            victims[:] = heapq.nsmallest(16, ranked)   # sorted: a heap

    def _sweep(self) -> None:
        """Close the connections past their timeouts (idle, silent before a first request,
        silent in the middle of one), and those cut while waiting for their first bytes."""
        now = time.monotonic()
        with _LOCK:
            conns = list(self._conns.values())
        silent = 0
        for c in conns:
            if c.evicted:
                continue
            age = now - c.since
            if c.state == WAITING and age >= (self.idle_s if c.served else self.first_request_s):
                c.cut("idle" if c.served else "no request")
            elif c.state == READING and age >= self.partial_s:
                c.cut("silent in a request")
                silent += 1
        if silent:
            self._failures.note("closed connections silent in the middle of a request",
                                TimeoutError(f"{silent} silent for {self.partial_s:g} s"))
