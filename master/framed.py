"""The master's framed metadata server: MasterService's handlers over plain TCP frames.

The gRPC server stays (workers, tests and other languages' clients use it); this one
serves the same transport-neutral handlers (``errors.handler``: request -> reply) to
clients, without gRPC's per-call cost (0.4-0.6 ms of a Python gRPC round trip against
~12 us of handler, docs/performance.md).  The wire format is in
``common/metaframes.py`` and docs/wire.md.

One thread per connection (``common/listener.py``'s server), one request at a time per
connection: a client keeps one connection per calling thread, so replies never need
reordering, and the mount's up to 64 threads make at most 64 connections.  A handler's
CurvineError becomes its errno on the wire, NotLeader the NOT_LEADER status (with the
leader's address), Unavailable the UNAVAILABLE status.
"""
from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import os
import select
import socket
import ssl
import threading
import time
import typing

from google.protobuf.message import DecodeError

from curvine_py.common import metaframes as mf
from curvine_py.common.errors import CurvineError, NotLeader, Unavailable
from curvine_py.common.frames import send_all
from curvine_py.common.listener import BACKLOG, ConnectionServer
from curvine_py.common.tls import Tls, cut
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master


class SessionHooks(typing.Protocol):
    """The service's side of cache sessions (master/service.py, master/sessions.py)."""

    def open_session(self, request: pb.SessionRequest, push: typing.Callable[[pb.Invalidation], bool]
                     ) -> pb.SessionReply: ...

    def session_broken(self, session: int) -> None: ...

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_S = 10.0
PUSH_LOCK_WAIT_S = 0.05   # a push that cannot get its stream's send lock this soon ends the stream
Handler = typing.Callable[[typing.Any], typing.Any]


class FrameServer(ConnectionServer):
    """Listens on the frame port and serves MasterService calls until stop()."""

    def __init__(self, service: object, secret: str, bind: str, port: int,
                 thread_done: typing.Callable[[], None] = lambda: None,
                 sessions: "SessionHooks | None" = None, tls: Tls | None = None) -> None:
        """thread_done: called by a connection's thread as it ends (the service closes the
        SQLite reader that thread opened, instead of leaving its 2 files to the GC).
        sessions: where OpenSession goes (the connection becomes a cache session's stream)."""
        self._handlers: list[Handler] = [getattr(service, m.name) for m in mf.METHODS]
        self._sessions = sessions
        self._thread_done = thread_done
        self._secret = secret
        self._address = (bind, port)
        lsock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a restarted master rebinds at once
        # a connection holds its socket and its thread's SQLite read connection (db + wal)
        super().__init__(lsock, "frames", fds_per_conn=3, tls=tls)

    def start(self) -> "FrameServer":
        """Bind, listen and start accepting (OSError if the port is taken)."""
        try:
            self._listener.bind(self._address)
            self._listener.listen(BACKLOG)
        except OSError:
            self._listener.close()
            raise
        super().start()
        return self

    @property
    def port(self) -> int:
        """The bound port (an ephemeral one when 0 was asked), which GetRing names."""
        return int(self._listener.getsockname()[1])

    def stop(self) -> None:
        """Stop accepting and cut every connection (their threads then exit)."""
        self.close(grace_s=1.0)

    def greet(self, conn: socket.socket) -> bytes:
        """The hello with a fresh nonce, sent by the accept thread: the connection gets a
        thread once the client answers (common/listener.py)."""
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        nonce = os.urandom(mf.NONCE_LEN)
        conn.sendall(mf.hello(nonce))   # a few bytes into an empty send buffer
        return nonce

    def serve(self, conn: socket.socket, addr: object) -> None:
        state = self.conn_of(conn)
        state.reading()   # the MAC is due: a peer stalled in it may be evicted
        try:
            reader = mf.FrameReader(conn)
            if self._handshake(conn, reader, state.greeting):
                self._loop(conn, reader)
        except (OSError, mf.Closed):
            pass   # the client went away (or the server is stopping, or the listener cut it)
        except Exception as e:   # one line per 10 s, not one per connection
            self._failures.note("a frame connection failed", e, trace=True)
        finally:
            self._thread_done()

    def _handshake(self, conn: socket.socket, reader: mf.FrameReader, nonce: bytes) -> bool:
        """The client must answer the hello (greet) with HMAC(secret, nonce)."""
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        answer = bytes(reader.fill(mf.MAC_LEN))
        if not hmac.compare_digest(answer, mf.mac(self._secret, nonce)):
            self._refuse(conn)
            return False
        conn.settimeout(None)   # the listener closes idle and half-open connections (IDLE_S, PARTIAL_S)
        reader.consume(mf.MAC_LEN)   # a request sent right behind the MAC stays in reader
        return True

    def _refuse(self, conn: socket.socket) -> None:
        """One UNAUTHENTICATED reply, then a graceful close: the client's first request may
        already sit unread in our buffer, and closing over unread data would send a reset
        that could destroy the reply before the client reads it."""
        message = mf.refusal("master").encode()
        conn.sendall(mf.reply_header(0, mf.UNAUTHENTICATED, len(message)) + message)
        conn.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + 1.0   # a peer that keeps sending is not read forever
        try:
            while (left := deadline - time.monotonic()) > 0:
                conn.settimeout(left)
                if not conn.recv(65536):
                    break
        except OSError:
            pass

    def _loop(self, conn: socket.socket, reader: mf.FrameReader) -> None:
        state = self.conn_of(conn)
        lock = threading.Lock()   # a cache session's pushes come from other threads
        # over TLS reads take the send lock too (_serve_one); decided once per connection
        reading: typing.ContextManager[object] = lock if isinstance(conn, ssl.SSLSocket) else contextlib.nullcontext()
        session = 0
        try:
            while True:
                session = self._serve_one(conn, reader, state, lock, reading) or session
        finally:
            if session and self._sessions is not None:
                self._sessions.session_broken(session)

    def _serve_one(self, conn: socket.socket, reader: mf.FrameReader, state: typing.Any,
                   lock: threading.Lock, reading: typing.ContextManager[object]) -> int:
        """Read and answer one request; the session id when it was an OpenSession.

        Over TLS a read holds the send lock too (one TLS connection must not be read and
        written by two threads at once, and a session's pushes come from others): it is
        taken once the request's first bytes are there, so a push waits for a read only
        while a frame is half in (and is cut after PUSH_LOCK_WAIT_S, as any slow stream)."""
        if reader.end == reader.start:   # nothing of the next request here yet: idle
            state.waiting()
            reader.short_of(mf.REQUEST.size)
            if isinstance(conn, ssl.SSLSocket) and not conn.pending():
                select.select([conn], [], [])
            with reading:
                reader.received(conn.recv_into(reader.view[reader.end:]), mf.REQUEST.size)
        state.reading()                  # the rest is due within the listener's PARTIAL_S
        with reading:
            head = reader.fill(mf.REQUEST.size)
            length, call_id, method_id = mf.REQUEST.unpack(head)
            if length < mf.REQUEST_REST:
                raise mf.Closed("a frame shorter than its header")   # the stream cannot be parsed
            if length <= mf.MAX_FRAME:
                body = reader.fill(mf.LENGTH.size + length)[mf.REQUEST.size:]
        if length > mf.MAX_FRAME:
            self._send(conn, lock, call_id, errno.EINVAL, f"frame of {length} bytes exceeds {mf.MAX_FRAME}".encode())
            raise mf.Closed("an oversized frame")   # skipping it would mean reading up to 4 GiB
        state.working()
        session = 0
        if method_id == Master.OpenSession.id:
            status, payload, session = self._session(conn, lock, body)
        else:
            status, payload = self._dispatch(method_id, body)
        reader.consume(mf.LENGTH.size + length)
        self._send(conn, lock, call_id, status, payload)
        return session

    def _session(self, conn: socket.socket, lock: threading.Lock, body: memoryview) -> tuple[int, bytes, int]:
        """OpenSession: this connection becomes the session's stream, on which the master
        pushes Invalidation frames (master/sessions.py); (status, payload, session id)."""
        def push(invalidation: pb.Invalidation) -> bool:
            """Never blocks the committing thread: a stream that cannot take a push at once
            is cut (the session's leases then run out by the clock)."""
            payload = invalidation.SerializeToString()
            frame = mf.reply_header(mf.PUSH_CALL_ID, mf.OK, len(payload)) + payload
            if not lock.acquire(timeout=PUSH_LOCK_WAIT_S):
                return _cut(conn)
            try:
                sent = _send_now(conn, frame)
            except OSError:
                sent = -1
            finally:
                lock.release()
            return sent == len(frame) or _cut(conn)

        try:
            request = pb.SessionRequest.FromString(body)
        except DecodeError:
            return errno.EINVAL, b"OpenSession: undecodable request", 0
        if self._sessions is None:
            return errno.EOPNOTSUPP, b"OpenSession: no cache sessions here", 0
        try:
            reply = self._sessions.open_session(request, push)
        except CurvineError as e:
            return e.errno or errno.EIO, (e.strerror or "error").encode(), 0
        except NotLeader as e:
            return mf.NOT_LEADER, e.leader.encode(), 0
        except Unavailable as e:
            return mf.UNAVAILABLE, str(e).encode(), 0
        return mf.OK, reply.SerializeToString(), reply.session

    def _dispatch(self, method_id: int, body: memoryview) -> tuple[int, bytes]:
        """Run one call; (status, payload) as the reply frame carries them."""
        if method_id >= len(self._handlers):
            return errno.EINVAL, f"unknown method id {method_id}".encode()
        method = mf.METHODS[method_id]
        try:
            request = method.request.FromString(body)
        except DecodeError:
            return errno.EINVAL, f"{method.name}: undecodable request".encode()
        try:
            reply = self._handlers[method_id](request)
        except CurvineError as e:
            return e.errno or errno.EIO, (e.strerror or "error").encode()
        except NotLeader as e:
            return mf.NOT_LEADER, e.leader.encode()
        except Unavailable as e:
            return mf.UNAVAILABLE, str(e).encode()
        except Exception as e:   # handlers turn their own bugs into EIO; this is a last resort
            log.exception("internal error in %s", method.name)
            return errno.EIO, f"internal error in {method.name}: {e}".encode()
        return mf.OK, reply.SerializeToString()

    @staticmethod
    def _send(conn: socket.socket, lock: threading.Lock, call_id: int, status: int, payload: bytes) -> None:
        header = mf.reply_header(call_id, status, len(payload))
        with lock:
            if len(payload) < 65536:
                conn.sendall(header + payload)   # one syscall; the copy of a small payload is cheap
            else:
                send_all(conn, [header, payload])   # no concatenation copy of a big ReadDir


def _send_now(conn: socket.socket, frame: bytes) -> int:
    """Send a push only if the socket takes it now (bytes sent; fewer: the stream is cut).
    A TLS socket takes no flags: it must be writable now, and a small frame then fits."""
    if not isinstance(conn, ssl.SSLSocket):
        return conn.send(frame, socket.MSG_DONTWAIT)
    if not select.select([], [conn], [], 0)[1]:
        return 0
    conn.sendall(frame)
    return len(frame)


def _cut(conn: socket.socket) -> bool:
    """End a session stream that cannot take a push (its thread then sees the close)."""
    cut(conn)
    return False
