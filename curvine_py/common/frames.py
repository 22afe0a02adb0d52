"""The block data channel: length-prefixed protobuf headers followed by raw bytes.

Frame = 4-byte big-endian header length N | N bytes of ``data_pb2.DataHeader`` |
``header.payload_len`` raw bytes.  A READ is answered by one REPLY header whose
``length`` says how many raw bytes follow (sent in pieces as the worker reads them
from disk; a worker that finds a bad checksum mid-block closes the connection, so
the reader sees a short read and moves to the other replica).  docs/wire.md
describes every exchange.

Senders use ``sendmsg`` with the header and the payload as separate buffers (no
concatenation copy); receivers ``recv_into`` preallocated buffers.  Over TLS
(common/tls.py) a socket has neither ``sendmsg`` nor ``sendfile`` nor flags: each buffer
goes by ``sendall`` (TLS copies it into records anyway), a file's range by ``preadv``
into a pooled piece, and a server's wait for the next request by ``select``.
"""
from __future__ import annotations

import array
import errno
import logging
import os
import select
import socket
import ssl
import struct
import threading
import typing

from curvine_py.common.errors import CurvineError
from curvine_py.pb import data_pb2

log = logging.getLogger(__name__)

LEN = struct.Struct(">I")
MAX_HEADER = 64 * 1024
MAX_PAYLOAD = 64 * 1024 * 1024
Op = data_pb2.Op
DataHeader = data_pb2.DataHeader


def local_write_socket(data_port: int) -> str:
    """The abstract Unix socket on which the worker whose data channel listens on
    data_port takes short-circuit writes (worker/localwrite.py, client/localwrite.py).
    Abstract names belong to a network namespace: only its host's processes reach it."""
    return f"\0curvine/worker-data-{data_port}/local-writes"


class ChannelClosed(CurvineError):
    """The peer closed the connection (or sent garbage); the stream is unusable."""

    def __new__(cls, message: str = "data connection closed by peer") -> "ChannelClosed":
        # OSError takes errno from __new__'s arguments: without this the message became
        # the errno, and a handler that passed it on (the mount's FUSEError) crashed.
        return typing.cast("ChannelClosed", super().__new__(cls, errno.ECONNRESET, message))

    def __init__(self, message: str = "data connection closed by peer") -> None:
        super().__init__(errno.ECONNRESET, message)


def send_all(sock: socket.socket, buffers: list[bytes | bytearray | memoryview]) -> None:
    """Send every buffer with as few syscalls as possible (sendmsg gathers them)."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    if isinstance(sock, ssl.SSLSocket):
        _send_all_tls(sock, views)
        return
    while views:
        sent = sock.sendmsg(views)
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


_TLS_JOIN = 16 * 1024   # buffers smaller than a TLS record are joined into one record


def _send_all_tls(sock: ssl.SSLSocket, views: list[memoryview]) -> None:
    """A header and its small payload in one record; a large payload alone (no copy here)."""
    if sum(len(v) for v in views) <= _TLS_JOIN:
        sock.sendall(b"".join(views))
        return
    for v in views:
        sock.sendall(v)


def wait_request(sock: socket.socket) -> None:
    """Block until the next request's first bytes are readable (the socket's timeout
    applies: TimeoutError), without consuming them; EOF shows in the read that follows."""
    if not isinstance(sock, ssl.SSLSocket):
        sock.recv(1, socket.MSG_PEEK)
        return
    if sock.pending():   # decrypted bytes are waiting already
        return
    if not select.select([sock], [], [], sock.gettimeout())[0]:
        raise TimeoutError("timed out waiting for a request")


def send_file(sock: socket.socket, fd: int, offset: int, n: int, head: bytes = b"") -> None:
    """Send head, then n bytes of the file fd from offset, by sendfile(2): the kernel sends
    them from the page cache, with no copy through this process (worker/dataserver.py).

    head goes with MSG_MORE so it leaves in the same segment as the file's first bytes.
    The socket may have a timeout (internally non-blocking): a full send buffer is waited
    for, up to that timeout, as sendall does."""
    if isinstance(sock, ssl.SSLSocket):
        _send_file_tls(sock, fd, offset, n, head)
        return
    if head:
        view = memoryview(head)
        while view:
            view = view[sock.send(view, socket.MSG_MORE):]
    timeout = sock.gettimeout()
    while n > 0:
        try:
            sent = os.sendfile(sock.fileno(), fd, offset, n)
        except BlockingIOError:
            if not select.select([], [sock], [], timeout)[1]:
                raise TimeoutError("timed out sending a file") from None
            continue
        if sent == 0:
            raise CurvineError(errno.EIO, f"file ended {n} bytes early at {offset}")
        offset += sent
        n -= sent


def _send_file_tls(sock: ssl.SSLSocket, fd: int, offset: int, n: int, head: bytes) -> None:
    """send_file over TLS: the kernel cannot encrypt (no kTLS from Python 3.11's ssl), so
    the range is read into one buffer and sent (the head in the same record)."""
    total = len(head) + n
    buf = getattr(_tls_scratch, "buf", None)
    if buf is None or len(buf) < total:   # one per sending thread, as large as its largest piece
        buf = _tls_scratch.buf = bytearray(total)
    view = memoryview(buf)[:total]
    view[:len(head)] = head
    got = len(head)
    while got < total:
        k = os.preadv(fd, [view[got:]], offset + got - len(head))
        if k == 0:
            raise CurvineError(errno.EIO, f"file ended {total - got} bytes early at {offset}")
        got += k
    sock.sendall(view)


_tls_scratch = threading.local()


def header_bytes(header: DataHeader) -> bytes:
    """A frame's length prefix and header, ready to send (its payload goes after it)."""
    raw = header.SerializeToString()
    return LEN.pack(len(raw)) + raw


def send_frame(sock: socket.socket, header: DataHeader,
               payload: bytes | bytearray | memoryview | None = None) -> None:
    """Send one frame; header.payload_len is set from payload."""
    header.payload_len = len(payload) if payload is not None else 0
    if payload is not None and len(payload):
        send_all(sock, [header_bytes(header), payload])
    else:
        sock.sendall(header_bytes(header))


def send_header_with_fd(sock: socket.socket, header: DataHeader, fd: int) -> None:
    """Send a payload-less frame with a file descriptor attached (SCM_RIGHTS, Unix
    sockets only: the short-circuit write socket, worker/localwrite.py)."""
    msg = header_bytes(header)
    sent = sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
    if sent < len(msg):
        sock.sendall(msg[sent:])


class Arrivals(typing.Protocol):
    """Who hears how far a read's buffer is filled (the block cache's entry for the
    block, client/reader.py CachedBlock), so a reader can use the head of a block while
    its tail is still on the wire or not yet verified."""

    def advance(self, got: int) -> None:
        """`got` bytes from the start of the buffer are in (called from the reading thread)."""


def recv_exact_into(sock: socket.socket, view: memoryview, progress: Arrivals | None = None) -> None:
    """Fill view completely from sock or raise ChannelClosed; progress, if given, hears
    the count of bytes in view so far after each receive."""
    got = 0
    n = len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ChannelClosed(f"connection closed after {got} of {n} bytes")
        got += k
        if progress is not None:
            progress.advance(got)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_exact_into(sock, memoryview(buf))
    return bytes(buf)


def recv_header(sock: socket.socket) -> DataHeader:
    """Read one frame header (the caller then reads header.payload_len bytes)."""
    return _read_header(sock, recv_exact(sock, LEN.size))


def recv_header_with_fd(sock: socket.socket) -> tuple[DataHeader, int | None]:
    """recv_header for a frame that may carry a file descriptor (send_header_with_fd);
    the descriptor, if any, is the caller's to close."""
    fd_size = array.array("i").itemsize
    head, ancillary, _flags, _addr = sock.recvmsg(LEN.size, socket.CMSG_SPACE(fd_size))
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fd_size])
    try:
        if not head:
            raise ChannelClosed("connection closed before a frame")
        if len(head) < LEN.size:
            head += recv_exact(sock, LEN.size - len(head))
        header = _read_header(sock, head)
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    for extra in fds[1:]:
        os.close(extra)
    return header, (fds[0] if fds else None)


def _read_header(sock: socket.socket, head: bytes) -> DataHeader:
    """The header whose length prefix is head; its bytes are read from sock."""
    (n,) = LEN.unpack(head)
    if n == 0 or n > MAX_HEADER:
        raise ChannelClosed(f"bad frame header length {n}")
    header = DataHeader()
    try:
        header.ParseFromString(recv_exact(sock, n))
    except Exception:
        raise ChannelClosed("malformed frame header") from None
    if header.payload_len > MAX_PAYLOAD:
        raise ChannelClosed(f"frame payload too large: {header.payload_len}")
    return header


def reply(sock: socket.socket, code: int = 0, message: str = "", **fields: object) -> None:
    """Send a REPLY frame (code 0 = success)."""
    h = DataHeader(op=Op.REPLY, errno=code, message=message)
    for k, v in fields.items():
        if isinstance(v, (list, tuple)):
            getattr(h, k).extend(v)
        else:
            setattr(h, k, v)
    send_frame(sock, h)


def check_reply(h: DataHeader, what: str) -> DataHeader:
    """Raise the REPLY's error, if any; return the header."""
    if h.op != Op.REPLY:
        raise ChannelClosed(f"{what}: expected a reply, got op {h.op}")
    if h.errno:
        raise CurvineError(h.errno, f"{what}: {h.message or 'failed'}")
    return h


def tune(sock: socket.socket, bufsize: int = 4 << 20) -> socket.socket:
    """Large socket buffers and no Nagle: block data moves in big pieces."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, bufsize)
        except OSError:
            pass
    return sock


def set_congestion(sock: socket.socket, congestion: str) -> None:
    """Give a socket that is not connected yet (a listener, or before connect) the TCP
    congestion control ``cluster.data_congestion``; "" keeps the system's.

    It must be set before the connection exists: a connection that started under BBR
    keeps BBR's packet pacing (its timers) after a switch to another algorithm, and
    that pacing was what cost the KV write here (docs/performance.md, session 7).
    Connections accepted by a listener inherit the listener's.  One the kernel refuses
    is logged once and the default kept."""
    if not congestion or congestion in _refused_congestion:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
    except OSError as e:
        _refused_congestion.add(congestion)
        log.warning("data channel: TCP congestion control %r refused (%s); the system's default is used",
                    congestion, e.strerror)


_refused_congestion: set[str] = set()


def connect(ip: str, port: int, timeout: float, congestion: str = "") -> socket.socket:
    """A tuned data connection to (ip, port), its congestion control set before the
    connect (``socket.create_connection`` has no hook for that)."""
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(ip, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            set_congestion(sock, congestion)
            sock.settimeout(timeout)
            sock.connect(address)
            return tune(sock)
        except OSError as e:
            sock.close()
            error = e
    raise error or OSError(f"cannot resolve {ip}")
