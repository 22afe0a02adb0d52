"""The master's framed metadata server: MasterService over plain TCP frames.

The gRPC server stays (workers, tests and older clients use it); this one serves the
same ``MasterService`` method objects to clients, without gRPC's per-call cost (0.4-0.6
ms of a Python gRPC round trip against ~12 us of handler, docs/performance.md).  The
wire format is in ``common/metaframes.py`` and docs/wire.md.

One thread per connection, one request at a time per connection: a client keeps one
connection per calling thread, so replies never need reordering, and the mount's up to
64 threads make at most 64 connections.  The handlers are the gRPC ones, decorated with
``errors.rpc_method``: they report errors through a ``FrameContext`` that implements
the two calls that decorator makes on a ``grpc.ServicerContext``.
"""
from __future__ import annotations

import errno
import hmac
import logging
import os
import socket
import threading
import typing

import grpc
from google.protobuf.message import DecodeError

from curvine_py.common import metaframes as mf
from curvine_py.common.errors import ERRNO_KEY
from curvine_py.common.frames import send_all

log = logging.getLogger(__name__)
HANDSHAKE_TIMEOUT_S = 10.0
# What errors.status_of maps each errno to, inverted (for aborts that carry no errno).
_ERRNO_OF_CODE = {
    grpc.StatusCode.NOT_FOUND: errno.ENOENT, grpc.StatusCode.ALREADY_EXISTS: errno.EEXIST,
    grpc.StatusCode.PERMISSION_DENIED: errno.EACCES, grpc.StatusCode.RESOURCE_EXHAUSTED: errno.ENOSPC,
    grpc.StatusCode.DEADLINE_EXCEEDED: errno.ETIMEDOUT, grpc.StatusCode.INTERNAL: errno.EIO,
    grpc.StatusCode.UNIMPLEMENTED: errno.ENOSYS, grpc.StatusCode.FAILED_PRECONDITION: errno.ESTALE,
    grpc.StatusCode.INVALID_ARGUMENT: errno.EINVAL,
}
Handler = typing.Callable[[typing.Any, "FrameContext"], typing.Any]


class FrameAbort(grpc.RpcError):
    """Raised by FrameContext.abort; an RpcError so that rpc_method lets it through."""

    def __init__(self, status: int, details: str) -> None:
        super().__init__(details)
        self.status = status
        self.details = details


class FrameContext:
    """The part of grpc.ServicerContext the master's handlers use (via errors.rpc_method)."""

    __slots__ = ("errno",)

    def __init__(self) -> None:
        self.errno = 0

    def set_trailing_metadata(self, metadata: typing.Iterable[tuple[str, str]]) -> None:
        for key, value in metadata:
            if key == ERRNO_KEY:
                self.errno = int(value)

    def abort(self, code: grpc.StatusCode, details: str) -> typing.NoReturn:
        raise FrameAbort(status_of(code, self.errno), details)

    def invocation_metadata(self) -> tuple[()]:
        return ()

    def peer(self) -> str:
        return "frames"

    def time_remaining(self) -> None:
        return None

    def is_active(self) -> bool:
        return True


def status_of(code: grpc.StatusCode, err: int = 0) -> int:
    """A frame status for a gRPC outcome: the errno if there is one, else by code."""
    if err > 0:
        return err
    if code == grpc.StatusCode.UNAVAILABLE:
        return mf.UNAVAILABLE
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return mf.UNAUTHENTICATED
    return _ERRNO_OF_CODE.get(code, errno.EIO)


class FrameServer:
    """Listens on the frame port and serves MasterService calls until stop()."""

    def __init__(self, service: object, secret: str, bind: str, port: int) -> None:
        self._handlers: list[Handler] = [getattr(service, m.name) for m in mf.METHODS]
        self._secret = secret
        self._bind, self._port = bind, port
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def start(self) -> int:
        """Bind, listen and start accepting; returns the bound port (OSError if taken)."""
        lsock = socket.socket(socket.AF_INET6 if ":" in self._bind else socket.AF_INET, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a restarted master rebinds at once
        try:
            lsock.bind((self._bind, self._port))
            lsock.listen(128)
        except OSError:
            lsock.close()
            raise
        self._listener = lsock
        threading.Thread(target=self._accept_loop, name="frames-accept", daemon=True).start()
        return int(lsock.getsockname()[1])

    def stop(self) -> None:
        """Stop accepting and cut every connection (their threads then exit)."""
        with self._lock:
            self._stopped = True
            conns, self._conns = list(self._conns), set()
        for s in ([self._listener] if self._listener else []) + conns:
            try:
                s.shutdown(socket.SHUT_RDWR)   # wakes a thread blocked in accept or recv
            except OSError:
                pass
            s.close()

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                if self._stopped:
                    return
                continue   # e.g. EMFILE, or a connection reset before accept: keep serving
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="frames-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            reader = mf.FrameReader(conn)
            if self._handshake(conn, reader):
                self._loop(conn, reader)
        except (OSError, mf.Closed):
            pass   # the client went away (or the server is stopping)
        except Exception:
            log.exception("frame connection failed")
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _handshake(self, conn: socket.socket, reader: mf.FrameReader) -> bool:
        """Hello with a fresh nonce; the client must answer HMAC(secret, nonce)."""
        nonce = os.urandom(mf.NONCE_LEN)
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        conn.sendall(mf.hello(nonce))
        answer = bytes(reader.fill(mf.MAC_LEN))
        if not hmac.compare_digest(answer, mf.mac(self._secret, nonce)):
            self._refuse(conn)
            return False
        conn.settimeout(None)   # idle client connections live as long as their thread
        reader.consume(mf.MAC_LEN)   # a request sent right behind the MAC stays in reader
        return True

    def _refuse(self, conn: socket.socket) -> None:
        """One UNAUTHENTICATED reply, then a graceful close: the client's first request may
        already sit unread in our buffer, and closing over unread data would send a reset
        that could destroy the reply before the client reads it."""
        message = mf.refusal("master").encode()
        conn.sendall(mf.reply_header(0, mf.UNAUTHENTICATED, len(message)) + message)
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(1.0)
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def _loop(self, conn: socket.socket, reader: mf.FrameReader) -> None:
        while True:
            head = reader.fill(mf.REQUEST.size)
            length, call_id, method_id = mf.REQUEST.unpack(head)
            if length < mf.REQUEST_REST:
                return   # cannot even hold its own header: the stream cannot be parsed
            if length > mf.MAX_FRAME:
                self._send(conn, call_id, errno.EINVAL, f"frame of {length} bytes exceeds {mf.MAX_FRAME}".encode())
                return   # skipping it would mean reading up to 4 GiB of whatever this is
            body = reader.fill(mf.LENGTH.size + length)[mf.REQUEST.size:]
            status, payload = self._dispatch(method_id, body)
            reader.consume(mf.LENGTH.size + length)
            self._send(conn, call_id, status, payload)

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
            reply = self._handlers[method_id](request, FrameContext())
        except FrameAbort as e:
            return e.status, e.details.encode()
        except Exception as e:   # handlers are wrapped by rpc_method; this is a last resort
            log.exception("internal error in %s", method.name)
            return errno.EIO, f"internal error in {method.name}: {e}".encode()
        return mf.OK, reply.SerializeToString()

    @staticmethod
    def _send(conn: socket.socket, call_id: int, status: int, payload: bytes) -> None:
        header = mf.reply_header(call_id, status, len(payload))
        if len(payload) < 65536:
            conn.sendall(header + payload)   # one syscall; the copy of a small payload is cheap
        else:
            send_all(conn, [header, payload])   # no concatenation copy of a big ReadDir
