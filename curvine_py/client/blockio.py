"""Block I/O on the workers' framed TCP data channel (curvine_py/common/frames.py).

Writes go to the first replica with the others as its chain (the worker forwards
each piece down the chain as it arrives); reads ask one replica and receive the
bytes straight into the caller's buffer.  Connections are pooled per worker and
reused across blocks; a connection that saw an error is never reused.
"""
from __future__ import annotations

import errno
import logging
import socket
from contextlib import contextmanager
import threading
import time
from typing import Iterator

import xxhash

from curvine_py.client import metrics
from curvine_py.common import frames
from curvine_py.common.connpool import ConnectionPool
from curvine_py.common.errors import CurvineError
from curvine_py.common.frames import DataHeader, Op
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import data_pb2

log = logging.getLogger(__name__)
PIECE = 1 << 20
# A worker's data port answered so (refused, reset, no route) or not at all: the worker is
# gone or cut off, not merely slow or full; a block can be written without it.
UNREACHABLE = frozenset({errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE,
                         errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT})


def _chain(targets: list[pb.WorkerAddress]) -> list[data_pb2.ChainTarget]:
    """The replicas a block's first worker forwards it to, in order."""
    return [data_pb2.ChainTarget(ip=t.ip, port=t.data_port, worker_id=t.worker_id) for t in targets]


class BlockIO:
    """Send and fetch whole or partial blocks."""

    def __init__(self, pool: ConnectionPool, read_timeout_s: float | None = None) -> None:
        self.pool = pool
        self.read_timeout_s = read_timeout_s   # None: the pool's io timeout
        self._refused: dict[tuple[str, int], float] = {}   # data port -> when it refused or reset (take_refused)
        self._refused_lock = threading.Lock()

    def _connect(self, ip: str, port: int) -> socket.socket:
        """A connection to a worker's data port (a failure noted: _failed)."""
        try:
            return self.pool.get(ip, port)
        except OSError as e:
            self._failed(ip, port, e)
            raise CurvineError(e.errno or errno.EHOSTUNREACH, f"cannot reach worker {ip}:{port}: {e}") from None

    def _failed(self, ip: str, port: int, e: OSError) -> None:
        """What a failed connect or exchange says of the worker: one that refused (a killed
        worker), reset, or did not answer (a silent host) is suspect (tried last) and told
        to the master with the next allocation (take_refused), which then offers it for no
        new block until it heartbeats again: a silent host costs one connect or data
        timeout, not one per block."""
        if isinstance(e, (TimeoutError, ConnectionError)) or e.errno in UNREACHABLE:
            self.pool.mark_suspect(ip, port)
            self._refuse(ip, port)

    def _refuse(self, ip: str, port: int) -> None:
        with self._refused_lock:
            self._refused[(ip, port)] = time.monotonic()

    def take_refused(self) -> dict[tuple[str, int], float]:
        """The data ports that refused or reset a connection since the last call, with when
        (the last time): each is reported once (the master keeps the worker out of new
        blocks until it heartbeats after that)."""
        with self._refused_lock:
            refused, self._refused = self._refused, {}
        return refused

    def write_block(self, targets: list[pb.WorkerAddress], block_id: int, data: memoryview,
                    token: str = "", tier: str = "", checksum: int | None = None) -> tuple[list[int], int]:
        """Store data as block_id on targets (chained); returns (worker ids that acked, checksum).

        If the first target cannot be reached the next one becomes the head of the chain;
        raises CurvineError when no target stored the block.
        """
        if checksum is None:
            checksum = xxhash.xxh3_64_intdigest(data)
        last: CurvineError | None = None
        targets = self.order(targets)
        for i, head in enumerate(targets):
            chain = _chain(targets[i + 1:])
            try:
                acked = self._send(head, chain, block_id, data, checksum, token, tier)
                for t in targets[i + 1:]:   # a chain member the head could not reach or store on
                    if t.worker_id not in acked:
                        self._refuse(t.ip, t.data_port)
                return acked, checksum
            except (CurvineError, OSError) as e:
                last = e if isinstance(e, CurvineError) else CurvineError(e.errno or errno.EIO, str(e))
                if last.errno == errno.ENOSPC and i + 1 >= len(targets):
                    break
                log.warning("write of block %d to worker %d failed: %s", block_id, head.worker_id, last)
        raise last or CurvineError(errno.EIO, "no worker to write to")

    def order(self, targets: list[pb.WorkerAddress]) -> list[pb.WorkerAddress]:
        """A target that just timed out goes last (stable sort): a healthy head is not held
        up by it, and the chain still offers it the block."""
        return sorted(targets, key=lambda t: self.pool.is_suspect(t.ip, t.data_port))

    @contextmanager
    def _conn(self, worker: pb.WorkerAddress) -> Iterator[socket.socket]:
        """A pooled connection to worker for one exchange: back to the pool only if the
        exchange completed; a timeout becomes ETIMEDOUT (the caller tries another replica)."""
        sock = self._connect(worker.ip, worker.data_port)
        ok = False
        try:
            yield sock
            ok = True
        except socket.timeout as e:
            self._failed(worker.ip, worker.data_port, e)
            raise CurvineError(errno.ETIMEDOUT, f"worker {worker.ip}:{worker.data_port} timed out") from None
        except ConnectionError as e:   # reset or broken mid-exchange: the worker died
            self._failed(worker.ip, worker.data_port, e)
            raise CurvineError(e.errno or errno.ECONNRESET, f"worker {worker.ip}:{worker.data_port}: {e}") from None
        finally:
            self.done_with(worker, sock, ok)

    def done_with(self, worker: pb.WorkerAddress, sock: socket.socket, ok: bool) -> None:
        """Give a connection back to the pool after a completed exchange, else close it."""
        if ok:
            self.pool.put(worker.ip, worker.data_port, sock)
        else:
            sock.close()

    def _send(self, head: pb.WorkerAddress, chain: list[data_pb2.ChainTarget], block_id: int, data: memoryview,
              checksum: int, token: str, tier: str = "") -> list[int]:
        with self._conn(head) as sock:
            self.send_open(sock, chain, block_id, len(data), token, tier)
            self.send_pieces(sock, block_id, data)
            return self.send_commit(sock, head, block_id, len(data), checksum)

    # The three steps of a block write, also used one piece at a time by client/blockstream.py.
    def open_stream(self, targets: list[pb.WorkerAddress], block_id: int, length_hint: int, token: str,
                    tier: str) -> tuple[pb.WorkerAddress, socket.socket]:
        """Connect to the first target and open block_id there, the others as its chain."""
        head, *rest = self.order(targets)
        sock = self._connect(head.ip, head.data_port)
        try:
            self.send_open(sock, _chain(rest), block_id, length_hint, token, tier)
        except BaseException:
            sock.close()
            raise
        return head, sock

    @staticmethod
    def send_open(sock: socket.socket, chain: list[data_pb2.ChainTarget], block_id: int, length_hint: int,
                  token: str, tier: str) -> None:
        frames.send_frame(sock, DataHeader(op=Op.WRITE_OPEN, block_id=block_id, length=length_hint, chain=chain,
                                           token=token, tier_name=tier))

    @staticmethod
    def send_pieces(sock: socket.socket, block_id: int, data: memoryview) -> None:
        for off in range(0, len(data), PIECE):
            frames.send_frame(sock, DataHeader(op=Op.WRITE_DATA, block_id=block_id), data[off:off + PIECE])

    @staticmethod
    def send_commit(sock: socket.socket, head: pb.WorkerAddress, block_id: int, length: int,
                    checksum: int) -> list[int]:
        """Commit the block at length bytes; returns the worker ids that hold it."""
        BlockIO.start_commit(sock, block_id, length, checksum)
        return BlockIO.commit_reply(sock, head, block_id, checksum)

    @staticmethod
    def start_commit(sock: socket.socket, block_id: int, length: int, checksum: int) -> None:
        """send_commit's first half: the caller may do other work before commit_reply."""
        frames.send_frame(sock, DataHeader(op=Op.WRITE_COMMIT, block_id=block_id, length=length, checksum=checksum))

    @staticmethod
    def commit_reply(sock: socket.socket, head: pb.WorkerAddress, block_id: int, checksum: int) -> list[int]:
        """The worker ids that hold the block, once the head confirms the xxh3 it stored
        (its own hash of the bytes it received) is the one sent (EBADMSG otherwise)."""
        reply = frames.check_reply(frames.recv_header(sock), f"write block {block_id}")
        if reply.checksum and reply.checksum != checksum:
            raise CurvineError(errno.EBADMSG, f"worker {head.worker_id} stored block {block_id} with xxh3 "
                                              f"{reply.checksum:x}, not the {checksum:x} sent")
        return list(reply.acked) or [head.worker_id]

    def read_block(self, worker: pb.WorkerAddress, block_id: int, offset: int, into: memoryview,
                   token: str = "", progress: frames.Arrivals | None = None,
                   ufs_block: pb.BlockInfo | None = None, chain: list[pb.WorkerAddress] | None = None) -> int:
        """Read up to len(into) bytes of block_id from offset into `into`; returns bytes read.
        token: the block's access token from the master (BlockInfo.token); progress hears
        how many bytes of `into` are filled as they arrive (see frames.recv_exact_into).
        ufs_block: a UFS file's block (its `ufs` says where it lies in the object): a worker without the block
        fetches it from there, keeps it and forwards a copy to chain; the wait is then
        bounded by the UFS timeout, not the replica timeout."""
        h = DataHeader(op=Op.READ, block_id=block_id, offset=offset, length=len(into), token=token)
        timeout = self.read_timeout_s
        if ufs_block is not None and ufs_block.ufs.mount_id:
            ufs = ufs_block.ufs
            h.ufs_mount, h.ufs_key, h.ufs_offset, h.ufs_etag = ufs.mount_id, ufs.key, ufs.offset, ufs.etag
            h.ufs_length = ufs_block.length
            h.chain.extend(_chain(chain or []))
            if ufs.load and timeout is not None:
                timeout = max(timeout, ufs.timeout_ms / 1000 + 5)
        with self._conn(worker) as sock:
            if timeout is not None:   # reads fail over fast: another replica has the bytes
                sock.settimeout(timeout)
            frames.send_frame(sock, h)
            reply = frames.check_reply(frames.recv_header(sock), f"read block {block_id}")
            n = reply.length
            if n > len(into):
                raise frames.ChannelClosed(f"worker sent {n} bytes for a {len(into)}-byte read")
            frames.recv_exact_into(sock, into[:n], progress)
            return n


class UfsFailure(CurvineError):
    """A worker could not fetch a UFS file's block from the UFS (down, denied, changed)."""


class WorkerDirectory:
    """worker_id -> address, learned from every reply that names workers."""

    def __init__(self) -> None:
        self._by_id: dict[int, pb.WorkerAddress] = {}
        self._lock = threading.Lock()

    def learn(self, addresses: list[pb.WorkerAddress]) -> None:
        with self._lock:
            for a in addresses:
                self._by_id[a.worker_id] = a

    def get(self, wid: int) -> pb.WorkerAddress | None:
        with self._lock:
            return self._by_id.get(wid)

    def all(self) -> list[pb.WorkerAddress]:
        with self._lock:
            return list(self._by_id.values())

    def of(self, block: pb.BlockInfo, but: int | None = None) -> list[pb.WorkerAddress]:
        """The known addresses of block's workers (but: leave that worker out)."""
        return [a for a in (self.get(w) for w in block.workers if w != but) if a is not None]


class RemoteReader:
    """A BlockReader (client/blockpaths.py) for any replica, over the data channel; a UFS
    file's block its worker does not hold is fetched by that worker from the UFS."""

    def __init__(self, io: BlockIO, workers: WorkerDirectory) -> None:
        self.io, self.workers = io, workers

    def serves(self, addr: pb.WorkerAddress) -> bool:
        return True

    def read(self, addr: pb.WorkerAddress, block: pb.BlockInfo, offset: int, into: memoryview,
             progress: frames.Arrivals | None) -> int | None:
        try:
            n = self.io.read_block(addr, block.block_id, offset, into, block.token, progress,
                                   *self._ufs_args(block, addr))
        except CurvineError as e:
            if e.errno == errno.EREMOTEIO:   # every replica would ask the same UFS
                raise UfsFailure(errno.EIO, e.strerror or str(e)) from None
            raise
        if n != len(into):
            raise CurvineError(errno.EIO, f"short read: {n} of {len(into)} bytes")
        if metrics.on:
            metrics.REMOTE_READS.inc()
            metrics.REMOTE_BYTES.inc(n)
        return n

    def _ufs_args(self, block: pb.BlockInfo,
                  addr: pb.WorkerAddress) -> tuple[pb.BlockInfo | None, list[pb.WorkerAddress]]:
        """For a UFS file's block: the block (its UFS range) and the replicas the asked
        worker forwards a fetched copy to (the block's other workers)."""
        if not block.ufs.mount_id:
            return None, []
        if not block.ufs.load:
            return block, []
        return block, self.workers.of(block, but=addr.worker_id)


class RemoteWriter:
    """A BlockWriter (client/blockpaths.py): every replica over the network, as one chain."""

    def __init__(self, io: BlockIO) -> None:
        self.io = io

    def write(self, addrs: list[pb.WorkerAddress], target: pb.BlockInfo, data: memoryview,
              owned: memoryview | None) -> tuple[list[int], int]:
        return self.io.write_block(addrs, target.block_id, data, target.token, target.tier)

    def open_local(self, addrs: list[pb.WorkerAddress], target: pb.BlockInfo, length_hint: int,
                   buffer: memoryview) -> tuple[None, list[pb.WorkerAddress]]:
        return None, addrs
