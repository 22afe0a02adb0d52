"""The worker's block data channel: framed TCP, one thread per connection.

Exchanges (docs/worker.md has the sequence diagrams):

* WRITE: ``WRITE_OPEN(block_id, chain, length=size hint, tier)``, any number of
  ``WRITE_DATA`` frames, ``WRITE_COMMIT(length, checksum)``; one REPLY after the commit
  with ``acked`` = the worker ids holding the block.  OPEN and DATA are pipelined (no
  reply), so an error found mid-stream is remembered, the rest of the stream is read
  and discarded, and the error is the commit's reply: the connection stays usable.
* READ: ``READ(block_id, offset, length)`` -> ``REPLY(length=n, checksum=whole block)``
  followed by exactly n raw bytes, n = length clamped to the block end (so a length of
  2**64-1 reads to the end).  A chunk that fails verification after bytes were
  sent closes the connection (the reader sees a short read and tries another replica).
  A READ naming a UFS range (``ufs_mount``) of a block not here is answered from the
  UFS (worker/ufsfetch.py: one shared fetch, then stored and forwarded to ``chain``).

Threads beat an event loop here: every step is a blocking syscall (recv_into, sendmsg,
I/O engine completion wait) that releases the GIL, and the measured per-connection rate
was 2.3 vs 1.5-1.7 GB/s with trio (BRIEF.md).  Payloads are received into pooled
buffers, forwarded to the next replica, and written by the I/O engine while the next piece
arrives (a ring of ``pipeline`` buffers per write).
"""
from __future__ import annotations

import errno
import logging
import mmap
import socket
import threading
import time
from typing import TYPE_CHECKING, Sequence

from curvine_py.common import frames
from curvine_py.common.buffers import BufferPool
from curvine_py.common.errors import CurvineError
from curvine_py.common.listener import BACKLOG, ConnectionServer
from curvine_py.common.security import BlockTokens
from curvine_py.common.tls import Tls
from curvine_py.pb import data_pb2
from curvine_py.worker.blockfile import BlockReader, FileRange
from curvine_py.worker.blockstore import DEFAULT_BLOCK, TIER_INDEX, BlockStore, BlockWriter, PendingWrite
from curvine_py.worker import metrics
from curvine_py.worker.memtier import BlockBuffer
from curvine_py.common.connpool import ConnectionPool
from curvine_py.worker.replication import Downstream

if TYPE_CHECKING:
    from curvine_py.worker.ufsfetch import UfsFetcher

log = logging.getLogger(__name__)

Op = data_pb2.Op
MiB = 1 << 20


class _Protocol(frames.ChannelClosed):
    """The peer broke the protocol; the stream cannot be trusted any more."""


class _PieceRing:
    """A few pooled buffers used round-robin: a buffer is reused only after its disk
    write finished, so receiving piece i+1 overlaps writing piece i."""

    def __init__(self, pool: BufferPool, bufs: list[mmap.mmap]) -> None:
        self.pool = pool
        self.bufs = bufs
        self.views = [memoryview(b) for b in bufs]
        self.pending: list[PendingWrite | None] = [None] * len(bufs)
        self.i = 0

    def next(self) -> memoryview:
        """The next free buffer; raises the write error of the piece it held, if any."""
        self.i = (self.i + 1) % len(self.views)
        pending, self.pending[self.i] = self.pending[self.i], None
        if pending is not None:
            pending.wait()
        return self.views[self.i]

    def track(self, pending: PendingWrite) -> None:
        self.pending[self.i] = pending

    def release(self) -> None:
        for p in self.pending:
            if p is not None:
                try:
                    p.wait()
                except CurvineError:
                    pass
        for v in self.views:
            v.release()
        for b in self.bufs:
            self.pool.release(b)


class _WriteState:
    """One block write in progress: the local writer, the downstream, the first error, and
    the memory tier's buffer the block is received into (if it got one)."""

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.writer: BlockWriter | None = None
        self.down: Downstream | None = None
        self.error: CurvineError | None = None
        self.mem: BlockBuffer | None = None
        self.mem_at = 0            # bytes received into mem so far
        self.mem_full = False      # the block outgrew mem: the rest goes through the ring

    def fail(self, e: CurvineError) -> None:
        """Remember the first error and stop writing and forwarding (the rest is drained)."""
        if self.error is None:
            self.error = e
            log.warning("block %d write failed: %s", self.block_id, e)
        self.abort()

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()
            self.writer = None
        if self.down is not None:
            self.down.abort()
            self.down = None


# A chain replica silent this long is dropped from the write (the block is acked without
# it, under-replicated): it must be well below the client's data_timeout_s (10 s), or the
# client gives up on a healthy head that is waiting for a partitioned backup.
CHAIN_IO_TIMEOUT_S = 4.0


class DataServer(ConnectionServer):
    """Serves WRITE and READ exchanges for a BlockStore on one TCP port."""

    def __init__(self, store: BlockStore, bind: str = "0.0.0.0", port: int = 0, worker_id: int = 0,
                 secret: str = "", piece_size: int = MiB, pipeline: int = 4,
                 max_piece_buffers: int = 1024, idle_timeout_s: float = 600.0,
                 io_timeout_s: float = 60.0, pool: ConnectionPool | None = None, congestion: str = "",
                 cache_writes: bool = False, tls: Tls | None = None) -> None:
        """congestion: the TCP congestion control of this server's data sockets, accepted
        (block reads are sent on them) and opened downstream ("" = the system's).
        tls: mutual TLS on this port and on the connections to downstream workers (given
        only when tls.data is on).
        cache_writes: blocks received here are written through the page cache."""
        self.store = store
        self.cache_writes = cache_writes
        self.worker_id = worker_id          # set by the heartbeat once registered
        self.secret = secret
        self.tokens = BlockTokens(secret)
        self.pipeline = max(2, pipeline)
        self.idle_timeout_s = idle_timeout_s
        self.io_timeout_s = io_timeout_s
        self.pool = pool or ConnectionPool(io_timeout_s=CHAIN_IO_TIMEOUT_S, congestion=congestion, tls=tls)
        self.ufs: UfsFetcher | None = None   # READs of UFS blocks not here (set by worker/main.py)
        self.piece_pool = BufferPool(piece_size, max_buffers=max_piece_buffers)
        self._piece_lock = threading.Lock()
        listener = socket.create_server((bind, port), backlog=BACKLOG, reuse_port=False)
        frames.set_congestion(listener, congestion)   # accepted connections inherit it
        self.address: tuple[str, int] = listener.getsockname()[:2]
        # its socket + a block file or a downstream one
        super().__init__(listener, "data", fds_per_conn=2, tls=tls)

    @property
    def port(self) -> int:
        return self.address[1]

    def start(self) -> "DataServer":
        super().start()
        return self

    def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, end every connection (in-flight commits finish first), and
        close the downstream connections."""
        super().close(grace_s)
        self.pool.close()

    # ------------------------------------------------------------ connections

    def serve(self, sock: socket.socket, addr: object) -> None:
        """Serve requests on one connection until the peer closes or breaks the protocol."""
        frames.tune(sock)
        conn = self.conn_of(sock)
        try:
            while not self.closing:
                conn.waiting()                       # idle: the listener may evict it
                sock.settimeout(self.idle_timeout_s)
                frames.wait_request(sock)            # a request begins (or EOF, which recv_header raises)
                conn.reading()                       # the header is due within the listener's partial_s
                h = frames.recv_header(sock)
                conn.working()
                sock.settimeout(self.io_timeout_s)
                self._dispatch(sock, h)
        except frames.ChannelClosed as e:
            if not isinstance(e, _Protocol):
                log.debug("data connection from %s ended: %s", addr, e)
            else:   # one line per 10 s, not one per connection of a peer sending garbage
                self._failures.note("a peer broke the protocol", e)
        except OSError as e:
            log.debug("data connection from %s failed: %s", addr, e)
        except Exception as e:
            self._failures.note("a data connection crashed", e, trace=True)

    def _dispatch(self, sock: socket.socket, h: data_pb2.DataHeader) -> None:
        if h.op == Op.WRITE_OPEN:
            self._skip(sock, h.payload_len)
            self._write(sock, h)
        elif h.op == Op.READ:
            self._skip(sock, h.payload_len)
            self._read(sock, h)
        else:
            frames.reply(sock, errno.EINVAL, f"unexpected op {h.op} at the start of a request")
            raise _Protocol(f"unexpected op {h.op}")

    def _skip(self, sock: socket.socket, n: int) -> None:
        """Discard a payload nobody asked for (keeps the stream in sync)."""
        if n:
            with self.piece_pool.buffer() as view:
                while n:
                    k = min(n, len(view))
                    frames.recv_exact_into(sock, view[:k])
                    n -= k

    def _check_token(self, h: data_pb2.DataHeader, write: bool) -> None:
        """Only blocks the master handed out (with a token minted from the cluster secret),
        while their token lasts: EACCES for a forged one, EKEYEXPIRED for an expired one
        (the client renews it at the master and tries again).  worker/main.py sets
        self.tokens with the configured ttl and grace."""
        self.tokens.check(h.token, h.block_id, write)

    # ------------------------------------------------------------ WRITE

    def _write(self, sock: socket.socket, open_h: data_pb2.DataHeader) -> None:
        start = time.perf_counter()
        state = _WriteState(open_h.block_id)
        tier = TIER_INDEX.get(open_h.tier_name.upper(), open_h.tier)   # preferred tier; when full, any
        try:
            self._check_token(open_h, write=True)
            state.writer = self.store.create(open_h.block_id, tier, open_h.length or DEFAULT_BLOCK,
                                             cached=self.cache_writes)
            state.mem = self.store.memory.reserve(open_h.length or DEFAULT_BLOCK)
        except CurvineError as e:
            state.fail(e)
        if state.error is None and open_h.chain:
            state.down = Downstream.open(self.pool, open_h.chain, open_h.block_id,
                                         open_h.length, tier, open_h.token)
            if state.down is not None:
                metrics.CHAIN_FORWARDS.inc()
        ring = self._acquire_ring()
        try:
            while True:
                h = frames.recv_header(sock)
                if h.op == Op.WRITE_DATA:
                    self._receive_data(sock, h.payload_len, ring, state)
                elif h.op == Op.WRITE_COMMIT:
                    self._skip(sock, h.payload_len)
                    break
                else:
                    frames.reply(sock, errno.EINVAL, f"unexpected op {h.op} inside a block write")
                    raise _Protocol(f"unexpected op {h.op} inside a block write")
            length = self._commit(sock, state, h)
            if length is None:
                metrics.WRITE_FAILURES.inc()
            else:
                metrics.BLOCK_WRITES.labels("network").inc()
                metrics.WRITE_BYTES.labels("network").inc(length)
                metrics.WRITE_SECONDS.observe(time.perf_counter() - start)
        finally:
            state.abort()  # no-op after a successful commit
            ring.release()
            if state.mem is not None:   # not kept (the commit keeps it and clears this)
                self.store.memory.give_back(state.mem)

    def _acquire_ring(self) -> _PieceRing:
        with self._piece_lock:   # all-or-nothing: writers never deadlock holding part of a ring
            bufs = [self.piece_pool.acquire() for _ in range(self.pipeline)]
        return _PieceRing(self.piece_pool, bufs)

    def _receive_data(self, sock: socket.socket, n: int, ring: _PieceRing, state: _WriteState) -> None:
        """Receive one WRITE_DATA payload piece by piece: forward, checksum, write."""
        bid = state.block_id
        frame_len: int | None = n     # the forwarded frame's header goes with its first piece
        if n == 0 and state.down is not None:
            state.down.forward(memoryview(b""), bid)
        while n:
            piece, in_ring = self._landing(ring, state, n)
            frames.recv_exact_into(sock, piece)
            n -= len(piece)
            if state.down is not None:
                state.down.forward_raw(piece, bid, frame_len)
                metrics.CHAIN_FORWARD_BYTES.inc(len(piece))
                frame_len = None
                if not state.down.ok:
                    state.down = None
            if state.writer is not None:
                try:
                    pending = state.writer.append(piece)
                    if in_ring:                # reused once written
                        ring.track(pending)
                except CurvineError as e:
                    state.fail(e)

    def _landing(self, ring: _PieceRing, state: _WriteState, n: int) -> tuple[memoryview, bool]:
        """Where the next piece (at most n bytes) is received, and whether that is a ring
        buffer: the block's memory buffer at the piece's offset in the block, else the next
        ring buffer (no memory buffer, or the block outgrew it)."""
        mem = state.mem
        if mem is not None and not state.mem_full:
            want = min(n, self.piece_pool.size)
            if mem.size - state.mem_at >= want:
                at = state.mem_at
                state.mem_at += want
                return mem.view[at:at + want], False
            state.mem_full = True           # longer than its length hint: not kept
        try:
            view = ring.next()
        except CurvineError as e:           # the disk write of an earlier piece failed
            state.fail(e)
            view = ring.views[ring.i]
        return view[:min(n, len(view))], True

    def _commit(self, sock: socket.socket, state: _WriteState, h: data_pb2.DataHeader) -> int | None:
        """Verify locally, then commit the downstream while the local disk writes finish,
        and reply with the workers that hold the block.  The committed length; None when
        the write failed (answered with its error)."""
        bid = state.block_id
        writer = state.writer
        if writer is not None:
            try:
                writer.verify(h.length, h.checksum)
            except CurvineError as e:
                state.fail(e)
        if state.error is not None or writer is None:
            err = state.error or CurvineError(errno.EIO, "write failed")
            frames.reply(sock, err.errno or errno.EIO, err.strerror or "write failed")
            return None
        down, state.down, state.writer = state.down, None, None
        if down is not None:
            down.send_commit(h.length, h.checksum, bid)
        try:
            entry = writer.commit(h.length, h.checksum)
        except CurvineError as e:
            log.warning("block %d commit failed: %s", bid, e)
            if down is not None:
                down.wait_commit(bid)
            frames.reply(sock, e.errno or errno.EIO, e.strerror or "commit failed")
            return None
        if state.mem is not None and not state.mem_full:
            self.store.memory.keep(bid, state.mem, entry.length)   # reads of it come from memory
            state.mem = None
        acked = down.wait_commit(bid) if down is not None else []
        frames.reply(sock, 0, length=entry.length, checksum=entry.checksum,
                     acked=[self.worker_id, *acked])
        return entry.length

    # ------------------------------------------------------------ READ

    def _read(self, sock: socket.socket, h: data_pb2.DataHeader) -> None:
        start = time.perf_counter()
        try:
            self._check_token(h, write=False)
            if h.ufs_mount and self.ufs is not None and h.block_id not in self.store \
                    and self.ufs.serve_read(sock, h):   # fetched from the UFS (worker/ufsfetch.py)
                return
            reader = self.store.open_reader(h.block_id, h.offset, h.length)
        except CurvineError as e:
            frames.reply(sock, e.errno or errno.EIO, e.strerror or "read failed")
            return
        with reader:
            ok = data_pb2.DataHeader(op=Op.REPLY, length=reader.length, checksum=reader.checksum)
            head: bytes | None = frames.header_bytes(ok)
            pieces = reader.file_ranges() if isinstance(reader, BlockReader) and reader.sendable else reader
            try:
                for piece in pieces:       # the reply goes out with the first verified piece
                    if isinstance(piece, FileRange):
                        frames.send_file(sock, piece.fd, piece.offset, piece.length, head or b"")
                    elif head is not None:
                        frames.send_all(sock, [head, piece])
                    else:
                        sock.sendall(piece)
                    head = None
            except CurvineError as e:
                if head is None:
                    raise frames.ChannelClosed(f"block {h.block_id} failed mid-stream: {e}") from None
                frames.reply(sock, e.errno or errno.EIO, e.strerror or "read failed")
                return
            if head is not None:           # zero-length range
                sock.sendall(head)
        metrics.BLOCK_READS.inc()
        metrics.READ_BYTES.inc(reader.length)
        metrics.READ_SECONDS.observe(time.perf_counter() - start)


def chain_targets(entries: Sequence[tuple[str, int, int]]) -> list[data_pb2.ChainTarget]:
    """[(ip, port, worker_id), ...] -> ChainTarget messages (for callers building a chain)."""
    return [data_pb2.ChainTarget(ip=ip, port=port, worker_id=wid) for ip, port, wid in entries]
