"""TLS on the Raft port (issue 40): PySyncObj's peer connections, each under an
``ssl.SSLObject`` with two memory BIOs, so only masters of the cluster's CA talk Raft.

Why not PySyncObj's own protection alone: its ``password`` encrypts each message with
the cluster secret (kept, as the second check), but anyone who holds the secret may then
send pickles to the port.  With TLS a peer must also hold a master certificate of the
cluster's CA; the TLS server name ``master.curvine`` is checked one way, the client's
certificate's role the other (``tls.peer_role``).

How it fits PySyncObj (0.3.17): its TcpConnection does non-blocking ``send``/``recv`` on
a socket from its poller thread.  ``TlsTransport`` swaps a connection's socket for a
``TlsSocket`` at the moment the TCP connection exists (before any byte is exchanged):
for an accepted one when the server hands it over, for an outgoing one when it
connects.  ``TlsSocket`` offers the calls TcpConnection makes of its socket and maps
OpenSSL's "want read" onto EAGAIN, as TcpConnection expects of a non-blocking socket.

Both transports (plain and TLS) also frame small messages without compressing them
(``Connection``): PySyncObj's ``zlib.compress(pickle, 3)`` costs 50-60 us per message
here whatever its size (deflate's state is set up afresh each call), more than the
pickle, the encryption and the send together; a mutation on three masters sends three
such messages on its critical path (an AppendEntries to each follower, a follower's
answer).  A message under 64 KiB is sent as one stored deflate block, which any zlib
reads (``zlib.decompress``, as every PySyncObj does), so masters of either kind mix.
"""

from __future__ import annotations

import errno
import functools
import logging
import select
import socket
import ssl
import struct
import time
import zlib
from typing import Any

from pysyncobj import pickle
from pysyncobj.monotonic import monotonic
from pysyncobj.tcp_connection import TcpConnection
from pysyncobj.transport import TCPTransport

from curvine_py.common.tls import Tls, peer_role, role_name

log = logging.getLogger("curvine_py.master.raft")

RECORD = 64 * 1024          # plaintext encrypted per send call: TcpConnection loops for the rest
HANDSHAKE_WAIT_S = 0.002    # a send during the handshake waits this long for the peer's answer
LOG_EVERY_S = 60.0          # one warning per peer host and reason per minute
PEER = "master"
STORED_MAX = 0xFFFF         # a message up to this is one stored deflate block, larger ones zlib level 3
ZLIB_STORED = b"\x78\x01"   # a zlib header (deflate, 32 KiB window, check bits) for stored blocks


def stored_zlib(data: bytes) -> bytes:
    """data as a zlib stream of one stored (uncompressed) deflate block: what
    ``zlib.decompress`` reads back, for the cost of an adler32 instead of deflate's set-up."""
    n = len(data)
    return b"".join((ZLIB_STORED, struct.pack("<BHH", 1, n, n ^ 0xFFFF), data, struct.pack(">I", zlib.adler32(data))))


def pack(message: Any) -> bytes:
    """A message as PySyncObj's receivers unpack it (zlib of its pickle): small ones stored."""
    data = pickle.dumps(message)
    return stored_zlib(data) if len(data) <= STORED_MAX else zlib.compress(data, 3)


class Connection(TcpConnection):
    """PySyncObj's connection with ``send`` framing as its own does (the random key, the
    encryption, a length prefix) but small messages stored, not compressed (module
    docstring).  Its transports make their connections this class (``cheap``)."""

    def send(self, message: Any) -> None:
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        data = pack(message)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(monotonic()))
        self._TcpConnection__writeBuffer += struct.pack("i", len(data)) + data
        self._TcpConnection__trySendBuffer()


def cheap(conn: Any) -> None:
    """Make one of PySyncObj's connections a Connection (a subclass that adds no state,
    only its send), where PySyncObj hands it over: TcpServer and addNode create theirs."""
    if type(conn) is TcpConnection:
        conn.__class__ = Connection


class PlainTransport(TCPTransport):
    """PySyncObj's TCP transport, its connections Connections (small messages stored)."""

    def _onNewIncomingConnection(self, conn: Any) -> None:
        cheap(conn)
        super()._onNewIncomingConnection(conn)

    def addNode(self, node: Any) -> None:
        super().addNode(node)
        conn = self._connections.get(node)
        if conn is not None:
            cheap(conn)


def _again() -> BlockingIOError:
    return BlockingIOError(errno.EAGAIN, "TLS: waiting for the socket")


class TlsSocket:
    """The socket calls PySyncObj's TcpConnection makes (send, recv, fileno, getsockopt,
    close), with TLS between them and the raw socket.

    Sends: TcpConnection offers its whole write buffer and drops what ``send`` says it
    took.  Ciphertext the socket does not take at once waits here; until it is gone the
    plaintext it came from is not reported as taken (``_ahead``), so TcpConnection keeps a
    non-empty buffer and keeps asking the poller for write readiness: nothing can be left
    here with nobody to flush it."""

    def __init__(self, raw: socket.socket, ctx: ssl.SSLContext, server_side: bool, warned: dict[str, float]) -> None:
        self.raw = raw
        self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self._in, self._out, server_side=server_side,
                                server_hostname=None if server_side else role_name(PEER))
        self._pending = b""     # ciphertext the socket has not taken yet
        self._ahead = 0         # plaintext already encrypted, not yet reported as sent
        self._ready = False     # handshake done and the peer's role checked
        self._warned = warned

    # ---------------------------------------------------------------- TcpConnection's calls
    def fileno(self) -> int:
        return self.raw.fileno()

    def getsockopt(self, *args: Any) -> Any:
        return self.raw.getsockopt(*args)

    def setsockopt(self, *args: Any) -> None:
        self.raw.setsockopt(*args)

    def close(self) -> None:
        self.raw.close()

    def send(self, data: bytes) -> int:
        if not self._flush():
            raise _again()
        if self._ahead:
            taken, self._ahead = self._ahead, 0
            return taken
        if not self._handshake():
            # TcpConnection polls for write readiness while its buffer holds the first
            # message: wait briefly for the peer's answer instead of spinning on it
            select.select([self.raw], [], [], HANDSHAKE_WAIT_S)
            raise _again()
        chunk = memoryview(data)[:RECORD]
        self.obj.write(chunk)
        if self._flush():
            return len(chunk)
        self._ahead = len(chunk)
        raise _again()

    def recv(self, size: int) -> bytes:
        while True:
            if self._ready:
                try:
                    return self.obj.read(size)
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError:
                    return b""
            data = self.raw.recv(size)     # BlockingIOError (EAGAIN) when empty: TcpConnection stops
            if not data:
                return b""
            self._in.write(data)
            self._handshake()

    # ---------------------------------------------------------------- TLS
    def _handshake(self) -> bool:
        """One step of the handshake; True once it is done and the peer is a master."""
        if self._ready:
            return True
        try:
            self.obj.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return False
        except ssl.SSLError as e:
            self._flush()          # the alert tells the peer why
            self._warn(f"TLS handshake failed: {e.reason or e}")
            raise
        if peer_role(self.obj) != PEER:
            self._warn("the peer's certificate is not a master's: refused")
            raise PermissionError(errno.EACCES, "raft: the peer is not a master")
        self._ready = True
        self._flush()
        return True

    def _flush(self) -> bool:
        """OpenSSL's output onto the socket as far as it takes it; True when none waits."""
        self._pending += self._out.read()
        while self._pending:
            try:
                sent = self.raw.send(self._pending)
            except BlockingIOError:
                return False
            self._pending = self._pending[sent:]
        return True

    def _warn(self, what: str) -> None:
        try:
            name = self.raw.getpeername()
        except OSError:
            name = None
        peer = str(name[0]) if isinstance(name, tuple) else "a peer"   # a host: a port changes per try
        now, key = time.monotonic(), f"{peer} {what}"
        if now - self._warned.get(key, -LOG_EVERY_S) >= LOG_EVERY_S:
            self._warned[key] = now
            log.warning("raft: %s with %s (the same from there is not logged again for %d s)",
                        what, peer, LOG_EVERY_S)


class TlsTransport(PlainTransport):
    """PySyncObj's TCP transport with each connection under TLS (module docstring)."""

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any, tls: Tls) -> None:
        self._tls_server = tls.server_context()
        self._tls_client = tls.client_context()
        self._warned: dict[str, float] = {}
        super().__init__(syncObj, selfNode, otherNodes)

    def _secure(self, conn: Any, server_side: bool) -> None:
        ctx = self._tls_server if server_side else self._tls_client
        raw = conn._TcpConnection__socket
        conn._TcpConnection__socket = TlsSocket(raw, ctx, server_side, self._warned)

    def _onNewIncomingConnection(self, conn: Any) -> None:
        self._secure(conn, server_side=True)
        super()._onNewIncomingConnection(conn)

    def _onOutgoingConnected(self, conn: Any) -> None:
        self._secure(conn, server_side=False)
        super()._onOutgoingConnected(conn)


def transport_class(tls: Tls | None) -> Any:
    """What SyncObj's transportClass should be: TLS when tls.enabled, else plain TCP."""
    return PlainTransport if tls is None else functools.partial(TlsTransport, tls=tls)
