"""Short-circuit writes: a client on this host writes a block's bytes into the block file itself.

Why: a KV chunk written through a mount on a worker's host used to cross that host's
TCP stack to reach its own worker (a copy into the socket, a copy out, the worker's
receive loop), and the worker forwarded it to the next replica.  On two cores that hop
was a sizeable share of the CPU a chunk costs (docs/performance.md).  Here the worker
keeps everything that is its business -- the choice of data dir, the space reservation,
the staging file, the meta file, the atomic install -- and hands the client only an open
descriptor of the staging file (SCM_RIGHTS); the client writes with ``pwrite`` straight
from its block buffer (``O_DIRECT`` when the dir takes it) and sends the other replicas
their copy over the network itself.

The socket is an abstract Unix socket named after the worker's data port
(``frames.local_write_socket``): abstract names belong to the network namespace, so only
processes that share the worker's network stack (its host) reach it, and nothing is left
on disk.  Exchanges, one block at a time, any number per connection (docs/wire.md):

* ``WRITE_OPEN(block_id, length=size hint, token, tier_name)`` -> ``REPLY(acked=[worker
  id], align)`` with the staging file's descriptor attached; on an error no descriptor.
* the client writes; then ``WRITE_COMMIT(length, checksum, chunk_sums)`` -> ``REPLY(acked=
  [worker id], length, checksum)``.  The file is cut to ``length`` (the client may pad its
  last ``O_DIRECT`` write), the meta file written, the block installed.

A connection that ends (or breaks the protocol) with a block open aborts that block: its
staging file is recycled and nothing is installed.  The write token is checked as on the
TCP data channel.

Who may connect: an abstract name has no file mode, so any process on the host could
reach the socket.  The server reads its peer's credentials (``SO_PEERCRED``, set by the
kernel at ``connect``, not forgeable by the peer) and serves only root, its own uid and
the uids of ``security.local_uids``; anyone else gets ``REPLY{errno=EACCES}`` to its
first request and the connection closed (a client then writes over TCP, where it needs
a token and, with TLS, a certificate).  docs/security.md, "Local paths".
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from typing import Callable, Iterable

from curvine_py.common import frames
from curvine_py.common.blockmeta import LEGACY_CHUNK
from curvine_py.common.buffers import ALIGN
from curvine_py.common.errors import CurvineError
from curvine_py.common.listener import BACKLOG, ConnectionServer
from curvine_py.common.security import DEFAULT_GRACE_S, BlockTokens
from curvine_py.pb import data_pb2
from curvine_py.worker import metrics
from curvine_py.worker.blockstore import DEFAULT_BLOCK, TIER_INDEX, BlockStore, BlockWriter

log = logging.getLogger(__name__)

Op = data_pb2.Op


class LocalWriteServer(ConnectionServer):
    """Serves short-circuit block writes to clients in this network namespace."""

    def __init__(self, store: BlockStore, data_port: int, worker_id: Callable[[], int],
                 secret: str = "", io_timeout_s: float = 60.0, idle_timeout_s: float = 600.0,
                 allowed_uids: Iterable[int] = (), token_grace_s: float = DEFAULT_GRACE_S) -> None:
        """allowed_uids: peers served besides root and this process's uid (security.local_uids)."""
        self.store = store
        self.worker_id = worker_id
        self.tokens = BlockTokens(secret, grace_s=token_grace_s)
        self.allowed_uids = frozenset({0, os.getuid(), *allowed_uids})
        self.io_timeout_s = io_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.name = frames.local_write_socket(data_port)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.name)
            listener.listen(BACKLOG)   # a burst of connections waits here, not refused (EAGAIN)
        except OSError:
            listener.close()
            raise
        super().__init__(listener, "local-write", fds_per_conn=2)   # its socket + the staging file
        self.blocks = 0   # blocks installed through this path

    def start(self) -> "LocalWriteServer":
        super().start()
        return self

    def serve(self, sock: socket.socket, addr: object) -> None:
        conn = self.conn_of(sock)
        try:
            if not self._trusted(sock):
                return
            while not self.closing:
                conn.waiting()                       # idle: the listener may evict it
                sock.settimeout(self.idle_timeout_s)
                sock.recv(1, socket.MSG_PEEK)        # a request begins (or EOF, which recv_header raises)
                conn.reading()
                h = frames.recv_header(sock)
                conn.working()
                sock.settimeout(self.io_timeout_s)
                if h.op != Op.WRITE_OPEN or h.payload_len:
                    frames.reply(sock, errno.EINVAL, f"unexpected op {h.op} on the local write socket")
                    return
                self._write(sock, h)
        except (frames.ChannelClosed, OSError) as e:
            log.debug("local write connection ended: %s", e)
        except Exception as e:   # one line per 10 s, not one per connection
            self._failures.note("a local write connection crashed", e, trace=True)

    def _trusted(self, sock: socket.socket) -> bool:
        """Is the peer one of the allowed uids (SO_PEERCRED)?  If not, its first request is
        answered EACCES (a client sees why, then goes over TCP) and the connection ends."""
        pid, uid, gid = peer_credentials(sock)
        if uid in self.allowed_uids:
            return True
        log.warning("local write socket: refused pid %d (uid %d): not root, the worker's uid nor in "
                    "security.local_uids", pid, uid)
        sock.settimeout(self.io_timeout_s)
        frames.recv_header(sock)
        frames.reply(sock, errno.EACCES, f"uid {uid} may not use this worker's local write socket "
                                         "(security.local_uids)")
        return False

    def _write(self, sock: socket.socket, open_h: data_pb2.DataHeader) -> None:
        """One block: open a staging file, pass its descriptor, install on commit."""
        bid = open_h.block_id
        try:
            self.tokens.check(open_h.token, bid, True)   # EACCES forged, EKEYEXPIRED expired
            tier = TIER_INDEX.get(open_h.tier_name.upper(), open_h.tier)
            writer = self.store.create(bid, tier, open_h.length or DEFAULT_BLOCK, cached=open_h.cached)
        except CurvineError as e:
            frames.reply(sock, e.errno or errno.EIO, e.strerror or "open failed")
            return
        try:
            self._pass_fd(sock, writer)
            h = frames.recv_header(sock)
            if h.op != Op.WRITE_COMMIT or h.payload_len:
                raise frames.ChannelClosed(f"expected WRITE_COMMIT for block {bid}, got op {h.op}")
        except BaseException:
            writer.abort()
            raise
        try:
            entry = writer.commit_written(h.length, h.checksum, list(h.chunk_sums),
                                          h.chunk_size or LEGACY_CHUNK)
        except CurvineError as e:
            log.warning("local write of block %d failed: %s", bid, e)
            frames.reply(sock, e.errno or errno.EIO, e.strerror or "commit failed")
            return
        self.blocks += 1
        metrics.BLOCK_WRITES.labels("local").inc()
        metrics.WRITE_BYTES.labels("local").inc(entry.length)
        frames.reply(sock, 0, length=entry.length, checksum=entry.checksum, acked=[self.worker_id()])

    def _pass_fd(self, sock: socket.socket, writer: BlockWriter) -> None:
        ok = data_pb2.DataHeader(op=Op.REPLY, acked=[self.worker_id()], align=ALIGN if writer.direct else 0)
        frames.send_header_with_fd(sock, ok, writer.fd)



_UCRED = struct.Struct("3i")   # struct ucred: pid, uid, gid


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of a Unix socket's peer, as the kernel recorded them at connect."""
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return pid, uid, gid
