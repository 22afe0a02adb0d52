"""The framed metadata channel: MasterService calls over a plain TCP socket.

A Python gRPC unary round trip costs 0.4-0.6 ms here while the master's handler costs
~12 us (docs/performance.md); a length-prefixed request/reply on a socket costs a small
fraction of that.  The payloads are the same protobuf messages as the gRPC service's
(proto/curvine.proto stays the contract); only the envelope differs.  Shared by the
master's server (``master/framed.py``) and the client (``client/framedclient.py``).
(``common/frames.py`` is the block data channel, a different protocol.)

Wire (big-endian, network order, like the block data channel of ``common/frames.py``,
whose 4-byte length prefix it shares), docs/wire.md:

- hello, server -> client on connect: ``"CVMF" | u16 version | 16-byte nonce``;
  client -> server: HMAC-SHA256(secret, nonce), 32 bytes.  The secret never crosses the
  wire.  A wrong MAC gets one UNAUTHENTICATED reply (call id 0) and the connection closes.
- request: ``u32 length of what follows | u32 call id | u16 method id | request bytes``
- reply:   ``u32 length of what follows | u32 call id | i32 status | payload``;
  status 0 = OK (payload = the reply message), > 0 = an errno (payload = UTF-8 message),
  -1 = UNAVAILABLE (retry), -2 = UNAUTHENTICATED, -3 = NOT_LEADER (payload: the
  leader's client address "host:port", empty when unknown; docs/ha.md).
- push (a cache session's stream only): a reply frame with call id PUSH_CALL_ID, status 0,
  an Invalidation as payload, sent by the master unasked.

Method id = index of the method in the proto's ``MasterService``: new methods must be
appended at the end of the service (or VERSION bumped), never inserted.
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import struct
import typing

from google.protobuf.message import DecodeError

from curvine_py.common.errors import CurvineError, Unreached
from curvine_py.common.frames import LEN
from curvine_py.common.rpc import MAX_MESSAGE
from curvine_py.pb import methods

MAGIC = b"CVMF"
VERSION = 2   # 2: big-endian (1 was little-endian); a client of the other order sees a wrong version
NONCE_LEN = 16
MAC_LEN = 32
HELLO = struct.Struct(">4sH16s")
REQUEST = struct.Struct(">IIH")     # length, call id, method id
REPLY = struct.Struct(">IIi")       # length, call id, status
LENGTH = LEN                        # the data channel's length prefix, one codec for both
REQUEST_REST = REQUEST.size - LENGTH.size   # bytes of a request header after its length
REPLY_REST = REPLY.size - LENGTH.size
MAX_FRAME = MAX_MESSAGE             # largest "length" accepted, as gRPC's message cap
DEFAULT_BUFFER = 64 * 1024          # a connection's receive buffer
SHRINK_ABOVE = 1 << 20              # a buffer grown past this is dropped once empty
FIRST_GROWTH = 1 << 20              # a full buffer first grows to this, then GROWTH times, up to the frame
GROWTH = 4

# A cache session's stream (OpenSession; docs/wire.md "Cache sessions"): the master's
# Invalidation frames, unasked, are replies with this call id.
PUSH_CALL_ID = 0xFFFFFFFF

OK = 0
UNAVAILABLE = -1
UNAUTHENTICATED = -2
NOT_LEADER = -3


def refusal(service: str = "master") -> str:
    """The message of a refused secret: the same words as common/security.SecretCheck."""
    return (f"{service} refused the call: missing or wrong cluster secret "
            "(set [cluster] secret in the config file, as on the servers)")


# The methods and their ids: curvine_py/pb/methods.py, generated from the proto (make proto).
Method = methods.Method
METHODS = methods.METHODS


def mac(secret: str, nonce: bytes) -> bytes:
    """The client's answer to a hello: proves it knows the secret without sending it."""
    return hmac.new(secret.encode(), nonce, hashlib.sha256).digest()


def hello(nonce: bytes) -> bytes:
    return HELLO.pack(MAGIC, VERSION, nonce)


def answer_hello(hello_bytes: bytes | memoryview, secret: str, where: str) -> bytes:
    """The client's side of the handshake, for both clients (the threads' and the mount
    loop's): the server's HELLO.size-byte hello checked, and the MAC to send back.
    Closed when the server is not a curvine frame server of this wire version."""
    magic, version, nonce = HELLO.unpack(hello_bytes)
    if magic != MAGIC or version != VERSION:
        raise Closed(f"{where} is not a curvine frame server (hello {bytes(magic)!r} v{version})")
    return mac(secret, bytes(nonce))


def request_frame(call_id: int, method_id: int, payload: bytes) -> bytes:
    """Header and payload in one bytes object (metadata requests are small: one send)."""
    return REQUEST.pack(REQUEST_REST + len(payload), call_id, method_id) + payload


def reply_header(call_id: int, status: int, payload_len: int) -> bytes:
    return REPLY.pack(REPLY_REST + payload_len, call_id, status)


class Closed(ConnectionError):
    """The peer closed the connection (or sent a frame that cannot be parsed)."""


def reply_of(method: Method[typing.Any, methods.Rep], cid: int, got_id: int, status: int,
             body: memoryview) -> methods.Rep:
    """The reply message a frame carries, or the error its status stands for: the
    master's answer as CurvineError (an errno; EACCES for a refused secret), Unreached
    for the master's UNAVAILABLE or a follower's NOT_LEADER (an answer: the connection
    stays good), or Closed for a frame that does not fit this call (it is unusable)."""
    if status == UNAUTHENTICATED:
        raise CurvineError(errno.EACCES, bytes(body).decode("utf-8", "replace"))
    if got_id != cid:
        raise Closed(f"{method.name}: reply to call {got_id}, expected {cid}")
    if status == OK:
        try:
            return method.reply.FromString(body)
        except DecodeError:
            raise CurvineError(errno.EIO, f"{method.name}: undecodable reply from the master") from None
    message = bytes(body).decode("utf-8", "replace")
    if status == NOT_LEADER:
        raise Unreached.not_leader(message)
    if status == UNAVAILABLE:
        raise Unreached(message)
    if status > 0:
        raise CurvineError(status, message)
    raise Closed(f"{method.name}: unknown reply status {status}")


class FrameReader:
    """Reads frames from one socket into a reused buffer with recv_into.

    One recv usually brings a whole small frame (a request or a reply of a few hundred
    bytes), so a frame costs one syscall, not one for its length and one for its body;
    bytes past the frame are kept for the next one.  Views handed out stay valid until
    the next fill().
    """

    __slots__ = ("sock", "data", "view", "start", "end")

    def __init__(self, sock: typing.Any) -> None:
        self.sock = sock
        self.data = bytearray(DEFAULT_BUFFER)
        self.view = memoryview(self.data)
        self.start = 0
        self.end = 0

    def fill(self, n: int) -> memoryview:
        """The next n unread bytes (read from the socket as needed); raises Closed at EOF."""
        while self.short_of(n):
            self.received(self.sock.recv_into(self.view[self.end:]), n)
        return self.view[self.start:self.start + n]

    def short_of(self, n: int) -> bool:
        """Are fewer than n unread bytes here?  If so, makes room for n after start: the
        caller then receives into view[end:] and reports it with received()."""
        if self.end - self.start >= n:
            return False
        self._make_room(n)
        return True

    def received(self, k: int, n: int) -> None:
        """k more bytes arrived at end, while n are wanted; 0 is the peer's EOF: Closed."""
        if k == 0:
            raise Closed(f"connection closed with {self.end - self.start} of {n} bytes read")
        self.end += k

    def consume(self, n: int) -> None:
        """Done with the next n bytes (views of them are no longer used)."""
        self.start += n
        if self.start >= self.end:
            self.start = self.end = 0
            if len(self.data) > SHRINK_ABOVE:   # one huge ReadDir must not pin MiBs per idle connection
                self.data = bytearray(DEFAULT_BUFFER)
                self.view = memoryview(self.data)

    def _make_room(self, n: int) -> None:
        """Room to receive toward n bytes from start: move the unread tail to the front, or
        grow a full buffer.

        A frame larger than the buffer grows it only once the buffer is full of that
        frame's bytes, i.e. as they arrive: to FIRST_GROWTH, then GROWTH times its size,
        and straight to n when that step would reach past n/2 (no last growth of a few
        bytes).  A length prefix is a claim, not bytes: a peer announcing 64 MiB frames on
        many connections and sending a few bytes of each must not make this process
        allocate 64 MiB per connection.  A buffer holds at most max(FIRST_GROWTH,
        2 * GROWTH * the frame's bytes received).  A frame that fits the buffer (every
        usual request and reply) is received with no copy; a 4 MiB one with copies of
        64 KiB and 1 MiB, measured as fast as the single allocation of n it replaced (on
        these VMs fresh pages cost more than the copies; doubling steps cost 1.5-5x)."""
        size = len(self.data)
        if self.start + n <= size:
            return
        have = self.end - self.start
        if self.start:   # consumed bytes in front: reuse their room first
            self.view[:have] = self.view[self.start:self.end]
            self.start, self.end = 0, have
        elif self.end == size:   # full of this frame's bytes, and n > size
            target = max(FIRST_GROWTH, GROWTH * size)
            data = bytearray(n if 2 * target > n else target)
            data[:have] = self.view[:have]
            self.data, self.view = data, memoryview(data)
