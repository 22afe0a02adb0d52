"""The client side of the framed metadata channel (wire format: common/metaframes.py).

One connection per calling thread (threading.local): a call is a send and a blocking
receive on the caller's own socket, with no lock, no executor hop and no HTTP/2 state;
the master answers each connection's requests one at a time, in order.  Connections
are made lazily; a thread that ends drops its connection with its thread-local storage.

Failures are sorted for the retry loop in ``metaclient.MasterClient`` (the family of
``common/errors.Unreached``):
- ``NoServer``: no frame server could be reached at all (refused, not one of ours): the
  caller asks the master for its port again (it may have moved);
- ``Unreached`` (``Broken`` for a failed connection): the call may not have been
  answered (socket error, timeout, the master's UNAVAILABLE, a follower's NOT_LEADER
  with the leader it names): retried with the same request id;
- ``CurvineError``: the master's answer (an errno, or EACCES for a wrong secret).
"""
from __future__ import annotations

import errno
import os
import socket
import threading
import weakref

from curvine_py.common import metaframes as mf
from curvine_py.common.errors import Broken, CurvineError, NoServer
from curvine_py.common.tls import Tls, refusal
from curvine_py.pb.methods import Method, Rep, Req

CONNECT_TIMEOUT_S = 5.0
# Like the gRPC channel's keepalive (10 s + 5 s): a master cut off the network fails a call in ~15 s.
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, USER_TIMEOUT_MS = 10, 5, 15000

_fork_generation = 0


def _forked() -> None:
    """A forked child must not share its parent's sockets (frames would interleave)."""
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_forked)


class _Conn:
    """One thread's connection: socket, receive buffer, call ids, current timeout."""

    __slots__ = ("sock", "reader", "next_id", "timeout", "generation", "__weakref__")

    def __init__(self, sock: socket.socket, reader: mf.FrameReader, timeout: float) -> None:
        self.sock, self.reader = sock, reader
        self.next_id = 1
        self.timeout = timeout
        self.generation = _fork_generation

    def call_id(self) -> int:
        cid = self.next_id
        self.next_id = cid + 1 if cid < 0xFFFFFFFF else 1   # 0 is the server's unsolicited refusal
        return cid

    def set_timeout(self, timeout: float) -> None:
        if timeout != self.timeout:
            self.sock.settimeout(timeout)
            self.timeout = timeout

    def close(self) -> None:
        self.sock.close()   # never shutdown(): after a fork the parent still uses this socket

    def __del__(self) -> None:
        self.close()


class FramedClient:
    """Calls MasterService methods over frames to one master address; thread-safe."""

    def __init__(self, host: str, port: int, secret: str, master: str = "", tls: Tls | None = None) -> None:
        self.host, self.port = host, port
        self.tls = tls
        self.master = master   # the gRPC address ("host:port") of the master that named this port
        self._secret = secret
        self._local = threading.local()
        self._conns: weakref.WeakSet[_Conn] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._closed = False
        self.verified = False   # some connection got the server's hello: the port is ours

    def __repr__(self) -> str:
        return f"FramedClient({self.host}:{self.port})"

    def call(self, method: Method[Req, Rep], request: Req, timeout: float) -> Rep:
        """One call; raises NoServer, Unreached (Broken) or CurvineError."""
        payload = request.SerializeToString()
        conn, fresh = self._conn(timeout)
        try:
            return self._exchange(conn, method, payload, timeout)
        except Broken as e:
            self._drop(conn)
            if fresh or e.code == errno.ETIMEDOUT:
                raise
        # A kept connection found dead (typically: the master restarted since this thread's
        # last call): reconnect at once rather than after a retry back-off.  Resending is
        # safe: a mutation carries its request id, which the master's retry cache knows.
        conn, _ = self._conn(timeout)
        try:
            return self._exchange(conn, method, payload, timeout)
        except Broken:
            self._drop(conn)
            raise

    def close(self) -> None:
        """Close every thread's connection (at shutdown; calls in flight then fail)."""
        with self._lock:
            self._closed = True
            conns = list(self._conns)
        for c in conns:
            c.close()

    # ------------------------------------------------------------------ connections
    def _conn(self, timeout: float) -> tuple[_Conn, bool]:
        """This thread's connection and whether it is new."""
        conn: _Conn | None = getattr(self._local, "conn", None)
        if conn is not None and conn.generation == _fork_generation:
            return conn, False
        if conn is not None:
            conn.close()   # inherited from the parent process: our copy of the fd only
        conn = self._local.conn = self._connect(timeout)
        return conn, True

    def _drop(self, conn: _Conn) -> None:
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def _connect(self, timeout: float) -> _Conn:
        if self._closed:
            raise NoServer(f"{self!r} is closed")
        sock, reader = connect(self.host, self.port, self._secret, timeout, self.tls)
        conn = _Conn(sock, reader, timeout)
        with self._lock:
            self._conns.add(conn)
        self.verified = True
        return conn

    # ------------------------------------------------------------------ one exchange
    def _exchange(self, conn: _Conn, method: Method[Req, Rep], payload: bytes, timeout: float) -> Rep:
        cid = conn.call_id()
        try:
            conn.set_timeout(timeout)
            conn.sock.sendall(mf.request_frame(cid, method.id, payload))
            length, got_id, status = mf.REPLY.unpack(conn.reader.fill(mf.REPLY.size))
            if not mf.REPLY_REST <= length <= mf.MAX_FRAME:
                raise Broken(f"bad reply frame length {length}")
            body = conn.reader.fill(mf.LENGTH.size + length)[mf.REPLY.size:]
        except TimeoutError:
            raise Broken(f"{method.name} timed out after {timeout:g} s", errno.ETIMEDOUT) from None
        except (OSError, mf.Closed) as e:
            raise Broken(f"{method.name}: {e}") from None
        try:
            return self._result(conn, method, cid, got_id, status, body)
        finally:
            conn.reader.consume(mf.LENGTH.size + length)

    def _result(self, conn: _Conn, method: Method[Req, Rep], cid: int, got_id: int, status: int,
                body: memoryview) -> Rep:
        """The reply message, or the error the status stands for (metaframes.reply_of)."""
        if status == mf.UNAUTHENTICATED:
            self._drop(conn)   # the server closes it after the refusal
        try:   # UNAVAILABLE, NOT_LEADER: Unreached, an answer (the connection stays good)
            return mf.reply_of(method, cid, got_id, status, body)
        except mf.Closed as e:
            raise Broken(str(e)) from None


def connect(host: str, port: int, secret: str, timeout: float,
            tls: Tls | None = None) -> tuple[socket.socket, mf.FrameReader]:
    """A connection to the frame server at host:port, past its handshake(s); NoServer when
    nothing answers there, or not a frame server of ours; CurvineError EACCES when TLS
    was refused either way (no retry changes that)."""
    try:
        sock = socket.create_connection((host, port), timeout=min(timeout, CONNECT_TIMEOUT_S))
    except OSError as e:
        raise NoServer(f"cannot connect to {host}:{port}: {e.strerror or e}") from None
    try:
        _tune(sock)
        sock.settimeout(timeout)
        if tls is not None:
            sock = tls.connect(sock, "master")
        reader = mf.FrameReader(sock)
        answer = mf.answer_hello(reader.fill(mf.HELLO.size), secret, f"{host}:{port}")
        reader.consume(mf.HELLO.size)
        sock.sendall(answer)
    except OSError as e:   # mf.Closed too: closed before its hello, or not one of ours
        sock.close()
        if why := refusal(e, f"the master at {host}:{port}"):
            raise CurvineError(errno.EACCES, why) from None
        raise NoServer(f"no hello from {host}:{port}: {e}") from None
    return sock, reader


def _tune(sock: socket.socket) -> None:
    """No Nagle (small request/reply frames) and keepalives that notice a vanished master."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                       ("TCP_KEEPCNT", 1), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
