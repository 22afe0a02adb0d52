"""Short-circuit writes: the replica on this client's host is written into its block file directly.

The local worker (``host`` equal to the client's host identity, as for short-circuit
reads) opens the block's staging file and passes its descriptor over its local Unix
socket (worker/localwrite.py); the client ``pwrite``s the bytes from its block buffer,
with ``O_DIRECT`` when the worker's dir takes it, then commits with the block's xxh3 and
the xxh3 of every 1 MiB chunk, which the worker writes into the meta file.  The bytes
never cross a socket on their way to the local disk; the other replicas get theirs over
the network from the client (client/blockstream.py).

Anything unexpected -- no socket (``worker.local_writes`` off, a worker in another
network namespace), a worker with another id behind it, an error -- makes ``open``
return None or the write raise, and the caller sends the block over the network instead.
"""
from __future__ import annotations

import errno
import logging
import os
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from curvine_py.client.blockio import UNREACHABLE, BlockIO
from curvine_py.common import frames
from curvine_py.common.blockmeta import BlockHasher
from curvine_py.common.buffers import aligned
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import data_pb2

log = logging.getLogger(__name__)

Op = data_pb2.Op
OPEN_TIMEOUT_S = 10.0
MAX_IDLE = 8                    # idle connections kept per worker
WRITERS = 4                     # threads writing block files


class LocalFile:
    """One block being written into its staging file through a passed descriptor."""

    def __init__(self, owner: "LocalWrites", addr: pb.WorkerAddress, sock: socket.socket, fd: int,
                 align: int) -> None:
        self.owner, self.addr, self.sock, self.fd, self.align = owner, addr, sock, fd, align
        self._pending: list[Future[None]] = []

    def write(self, buffer: memoryview, start: int, end: int) -> None:
        """Start writing buffer[start:end] (the block's buffer) at offset start, on the
        owner's writer threads: the caller goes on (sends the network replicas their copy)
        while the disk takes it; commit waits.  With O_DIRECT a write that does not end on
        an ALIGN boundary -- only the block's last may -- is padded with the buffer's
        following bytes, which the commit cuts off."""
        if self.align and end % self.align:
            end = min(len(buffer), -(-end // self.align) * self.align)
        self._pending.append(self.owner.pool.submit(_pwrite_all, self.fd, buffer[start:end], start))

    def _settle(self) -> None:
        """Wait for every write started; raise the first error."""
        pending, self._pending = self._pending, []
        first: BaseException | None = None
        for f in pending:
            try:
                f.result()
            except BaseException as e:
                first = first or e
        if first is not None:
            raise first if isinstance(first, CurvineError) else CurvineError(
                getattr(first, "errno", None) or errno.EIO, f"short-circuit write: {first}")

    def commit(self, block_id: int, length: int, checksum: int, sums: BlockHasher) -> list[int]:
        """Install the block at length bytes, with the chunk checksums `sums` took as the
        bytes were written; returns the worker ids that hold it."""
        try:
            self._settle()
            self._close_fd()
            frames.send_frame(self.sock, data_pb2.DataHeader(op=Op.WRITE_COMMIT, block_id=block_id, length=length,
                                                             checksum=checksum, chunk_sums=sums.chunk_sums(),
                                                             chunk_size=sums.chunk_size))
            reply = frames.check_reply(frames.recv_header(self.sock), f"short-circuit write of block {block_id}")
        except BaseException:
            self.abort()
            raise
        self.owner.put(self.addr, self.sock)
        self.owner.blocks += 1
        return list(reply.acked) or [self.addr.worker_id]

    def abort(self) -> None:
        """Give the block up: the worker recycles its staging file when the connection ends."""
        try:
            self._settle()   # the writes use the caller's buffer: done before it is reused
        except CurvineError:
            pass
        self._close_fd()
        self.sock.close()

    def _close_fd(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class LocalWrites:
    """Connections to the local workers' write sockets; counters say how often they were used."""

    def __init__(self, host: str, cached: bool = False) -> None:
        self.host = host
        # ask for page-cache writes (client.cache_local_writes): readers here find the block in memory
        self.cached = cached
        self._idle: dict[int, list[socket.socket]] = {}   # data port -> idle connections
        self._align: dict[int, int] = {}                  # data port -> its files' O_DIRECT unit
        self._lock = threading.Lock()
        # Their own threads: a stream's pump waits for these, so they must not queue
        # behind pumps on the client's shared executor.
        self.pool = ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="localwrite")
        self.blocks = 0      # blocks whose local replica was written here
        self.refused = 0     # local replicas that went over the network instead

    def is_local(self, addr: pb.WorkerAddress) -> bool:
        return bool(addr.host) and addr.host == self.host

    def local_of(self, addrs: list[pb.WorkerAddress]) -> pb.WorkerAddress | None:
        """The first of a block's workers on this host, if any."""
        return next((a for a in addrs if self.is_local(a)), None)

    def open(self, addr: pb.WorkerAddress, block_id: int, length_hint: int, token: str, tier: str,
             buffer: memoryview) -> LocalFile | None:
        """Open block_id on the local worker addr for writing from `buffer` (the block's
        whole buffer); None when this path cannot be used (the caller uses the network)."""
        if not _fits(buffer, self._align.get(addr.data_port, 0)):   # known in advance: no round trip
            self.refused += 1
            return None
        header = data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=block_id, length=length_hint, token=token,
                                     tier_name=tier, cached=self.cached)
        for fresh in (False, True):   # an idle connection may have outlived its worker: once more
            try:
                sock, pooled = self._connect(addr, fresh)
            except OSError as e:
                return self._refuse(block_id, e)
            try:
                frames.send_frame(sock, header)
                reply, fd = frames.recv_header_with_fd(sock)
            except (frames.ChannelClosed, OSError) as e:
                sock.close()
                if pooled:
                    continue
                return self._refuse(block_id, e)
            try:
                frames.check_reply(reply, f"short-circuit open of block {block_id}")
                if fd is None or list(reply.acked) != [addr.worker_id]:
                    raise CurvineError(errno.ESTALE, "the local write socket belongs to another worker")
            except CurvineError as e:
                if fd is not None:
                    os.close(fd)
                sock.close()
                return self._refuse(block_id, e)
            f = LocalFile(self, addr, sock, fd, reply.align)
            self._align[addr.data_port] = reply.align
            if not _fits(buffer, reply.align):
                f.abort()   # O_DIRECT needs an aligned buffer (pooled block buffers are)
                return self._refuse(block_id, CurvineError(errno.EINVAL, "unaligned buffer"))
            return f
        return None

    def write_block(self, io: BlockIO, addrs: list[pb.WorkerAddress], block: pb.BlockInfo, data: memoryview,
                    buffer: memoryview | None = None) -> tuple[list[int], int]:
        """A whole block at once (BlockIO.write_block's contract): the replica on this
        host by short-circuit while the others go over the network, or all over the
        network when there is none or its worker refuses.  buffer: the block buffer data
        starts, if data is one (room to pad an O_DIRECT write's end)."""
        here = self.local_of(addrs)
        whole = buffer if buffer is not None else data
        f = self.open(here, block.block_id, len(data), block.token, block.tier, whole) \
            if here is not None and len(data) else None
        if f is None:
            return io.write_block(addrs, block.block_id, data, block.token, block.tier)
        remote = [a for a in addrs if a is not here]
        sums = BlockHasher()
        try:
            f.write(whole, 0, len(data))
            sums.update(data)
            acked = self._remote(io, remote, block, data, sums.checksum)
            return f.commit(block.block_id, len(data), sums.checksum, sums) + acked, sums.checksum
        except BaseException:
            f.abort()
            raise

    @staticmethod
    def _remote(io: BlockIO, remote: list[pb.WorkerAddress], block: pb.BlockInfo, data: memoryview,
                checksum: int) -> list[int]:
        """The other replicas over the network; none when none of them can be reached (a
        killed worker refuses at once): the block then commits with this host's replica
        alone, as HDFS's pipeline recovery goes on with the replicas it has, and the master
        re-replicates it once another worker is live (counted under-replicated meanwhile)."""
        if not remote:
            return []
        try:
            return io.write_block(remote, block.block_id, data, block.token, block.tier, checksum=checksum)[0]
        except CurvineError as e:
            if e.errno not in UNREACHABLE:
                raise
            log.warning("block %d: no other replica reachable (%s); committed on this host's alone",
                        block.block_id, e.strerror)
            return []

    def _refuse(self, block_id: int, why: BaseException) -> LocalFile | None:
        """Count a local replica that goes over the network; returns None for open's caller."""
        log.info("short-circuit write of block %d refused (%s); it goes over the network", block_id, why)
        self.refused += 1
        return None

    def _connect(self, addr: pb.WorkerAddress, fresh: bool) -> tuple[socket.socket, bool]:
        """(a connection to addr's local write socket, whether it was an idle one)."""
        if not fresh:
            with self._lock:
                idle = self._idle.get(addr.data_port)
                if idle:
                    return idle.pop(), True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(OPEN_TIMEOUT_S)
            sock.connect(frames.local_write_socket(addr.data_port))
        except OSError:
            sock.close()
            raise
        return sock, False

    def put(self, addr: pb.WorkerAddress, sock: socket.socket) -> None:
        """A connection whose exchange completed: kept for the next block."""
        with self._lock:
            idle = self._idle.setdefault(addr.data_port, [])
            if len(idle) < MAX_IDLE:
                idle.append(sock)
                return
        sock.close()

    def stats(self) -> dict[str, int]:
        return {"blocks": self.blocks, "refused": self.refused}

    def close(self) -> None:
        with self._lock:
            socks = [s for idle in self._idle.values() for s in idle]
            self._idle.clear()
        for s in socks:
            s.close()
        self.pool.shutdown(wait=False)


class LocalFirstWriter:
    """A BlockWriter (client/blockpaths.py): the replica on this host into its block file,
    the others over the network."""

    def __init__(self, lw: LocalWrites, io: BlockIO) -> None:
        self.lw, self.io = lw, io

    def write(self, addrs: list[pb.WorkerAddress], target: pb.BlockInfo, data: memoryview,
              owned: memoryview | None) -> tuple[list[int], int]:
        return self.lw.write_block(self.io, addrs, target, data, owned)

    def open_local(self, addrs: list[pb.WorkerAddress], target: pb.BlockInfo, length_hint: int,
                   buffer: memoryview) -> tuple[LocalFile | None, list[pb.WorkerAddress]]:
        here = self.lw.local_of(addrs)
        f = self.lw.open(here, target.block_id, length_hint, target.token, target.tier, buffer) \
            if here is not None else None
        return f, addrs if f is None else [a for a in addrs if a is not here]


def _fits(buffer: memoryview, align: int) -> bool:
    """Can buffer be written to a file opened with O_DIRECT at this unit (0: any)?"""
    return not align or (aligned(buffer) and len(buffer) % align == 0)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        k = os.pwrite(fd, view[done:], offset + done)
        if k <= 0:
            raise CurvineError(errno.EIO, f"short-circuit write of {len(view)} bytes stopped at {done}")
        done += k
