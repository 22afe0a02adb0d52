"""The ways to a block's replicas, and the one place that chooses among them.

A replica on this client's host can be read from its block file and written into it
without the network (short-circuit: client/shortcircuit.py reads, client/localwrite.py
writes); every other replica goes over the data channel (client/blockio.py).  Which way
each replica goes is decided here, once per block, by one object built per client
(``ClientCore.paths``):

* reads: a ``BlockReader`` per way, ``LocalReplicaReader`` and ``RemoteReader``;
  ``BlockPaths.read`` tries the replicas local first, each by the first reader that
  serves it.  A local read only before any byte of the block was announced to a reader
  (``local_ok``): bytes announced are in use, and only a network replica's (verified
  before they are sent) may be written over them.  Reads are counted by source.  A local
  copy that fails its checksums is reported to the master by the short-circuit reader.
* writes: one ``BlockWriter``, ``LocalFirstWriter`` when short-circuit writes are on
  (the local replica into its block file, the others over the network) else
  ``RemoteWriter``; whole blocks (``write``) and streamed ones (``open_local``,
  client/blockstream.py) alike.
* the kernel's own reads of a local block file (FUSE passthrough): ``open_verified``.
"""
from __future__ import annotations

import errno
import logging
import threading
from typing import Callable, Protocol

from curvine_py.client import metrics
from curvine_py.client.blockio import BlockIO
from curvine_py.client.localwrite import LocalFile, LocalWrites
from curvine_py.client.shortcircuit import ShortCircuit
from curvine_py.common.connpool import ConnectionPool
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
Advance = Callable[[int], None]   # hears how many bytes of the read's buffer have arrived


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

    def of(self, block: pb.BlockInfo, but: int | None = None) -> list[pb.WorkerAddress]:
        """The known addresses of block's workers (but: leave that worker out)."""
        return [a for a in (self.get(w) for w in block.workers if w != but) if a is not None]


class BlockReader(Protocol):
    """One way to read a replica."""

    def serves(self, addr: pb.WorkerAddress) -> bool:
        """May this way read addr's replica at all (e.g. is it on this host)?"""

    def read(self, addr: pb.WorkerAddress, block: pb.BlockInfo, offset: int, into: memoryview,
             advance: Advance | None) -> int | None:
        """Fill into (len(into) bytes from offset) from addr's replica: len(into), or None when
        this way cannot now (the same replica is then read the next way).  Raises
        CurvineError or OSError when the replica failed (the next replica is tried)."""


class LocalReplicaReader:
    """The replica on this host, read from its block file and verified chunk by chunk."""

    def __init__(self, sc: ShortCircuit) -> None:
        self.sc = sc

    def serves(self, addr: pb.WorkerAddress) -> bool:
        return self.sc.is_local(addr)

    def read(self, addr: pb.WorkerAddress, block: pb.BlockInfo, offset: int, into: memoryview,
             advance: Advance | None) -> int | None:
        n = self.sc.read(addr, block, offset, into, advance)
        if n is not None and metrics.on:
            metrics.SHORT_CIRCUIT_READS.inc()
            metrics.SHORT_CIRCUIT_BYTES.inc(n)
        return n


class RemoteReader:
    """Any replica, over the data channel; a UFS file's missing block is fetched by its worker."""

    def __init__(self, io: BlockIO, workers: WorkerDirectory) -> None:
        self.io, self.workers = io, workers

    def serves(self, addr: pb.WorkerAddress) -> bool:
        return True

    def read(self, addr: pb.WorkerAddress, block: pb.BlockInfo, offset: int, into: memoryview,
             advance: Advance | None) -> int | None:
        try:
            n = self.io.read_block(addr, block.block_id, offset, into, block.token, advance,
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


class BlockWriter(Protocol):
    """How a block's replicas are written."""

    def write(self, addrs: list[pb.WorkerAddress], target: pb.BlockInfo, data: memoryview,
              owned: memoryview | None) -> tuple[list[int], int]:
        """The whole block data on addrs as target: (worker ids that hold it, its checksum).
        owned: the pooled buffer data starts (room to pad an O_DIRECT write), if it is one."""

    def open_local(self, addrs: list[pb.WorkerAddress], target: pb.BlockInfo, length_hint: int,
                   buffer: memoryview) -> tuple[LocalFile | None, list[pb.WorkerAddress]]:
        """For a streamed block: the local replica's file opened for writing from buffer
        (None: no local replica, or its worker refused) and the workers left for the network."""


class RemoteWriter:
    """Every replica over the network, as one chain."""

    def __init__(self, io: BlockIO) -> None:
        self.io = io

    def write(self, addrs: list[pb.WorkerAddress], target: pb.BlockInfo, data: memoryview,
              owned: memoryview | None) -> tuple[list[int], int]:
        return self.io.write_block(addrs, target.block_id, data, target.token, target.tier)

    def open_local(self, addrs: list[pb.WorkerAddress], target: pb.BlockInfo, length_hint: int,
                   buffer: memoryview) -> tuple[LocalFile | None, list[pb.WorkerAddress]]:
        return None, addrs


class LocalFirstWriter:
    """The replica on this host into its block file, the others over the network."""

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


class BlockPaths:
    """Which way each replica of a block is read and written, for one client."""

    def __init__(self, host: str, workers: WorkerDirectory, io: BlockIO, pool: ConnectionPool,
                 shortcircuit: ShortCircuit | None, localwrites: LocalWrites | None) -> None:
        self.host, self.workers, self.pool = host, workers, pool
        self.shortcircuit = shortcircuit   # None: client.short_circuit off
        self.localwrites = localwrites     # None: client.short_circuit_writes off
        self.local = LocalReplicaReader(shortcircuit) if shortcircuit is not None else None
        self.remote = RemoteReader(io, workers)
        self.writer: BlockWriter = LocalFirstWriter(localwrites, io) if localwrites is not None \
            else RemoteWriter(io)

    def replica_order(self, block: pb.BlockInfo) -> list[pb.WorkerAddress]:
        """Replicas to try, local host first, others rotated by block id to spread load;
        replicas that recently timed out (suspect, see connpool) last."""
        addrs = self.workers.of(block)
        local = [a for a in addrs if a.host == self.host]
        remote = [a for a in addrs if a.host != self.host]
        if remote:
            k = block.block_id % len(remote)
            remote = remote[k:] + remote[:k]
        ordered = local + remote
        suspect = [a for a in ordered if self.pool.is_suspect(a.ip, a.data_port)]
        return [a for a in ordered if a not in suspect] + suspect

    def _readers(self, local_ok: bool) -> list[BlockReader]:
        return [self.local, self.remote] if local_ok and self.local is not None else [self.remote]

    def read(self, block: pb.BlockInfo, offset: int, into: memoryview, local_ok: bool = True,
             advance: Advance | None = None) -> int:
        """Block bytes [offset, offset+len(into)) (less past the block's end) from the first
        replica that answers, each replica by the first way that serves it.  local_ok: False
        once bytes of into were announced to a reader (then only the network may refill it)."""
        want = min(len(into), max(0, block.length - offset))
        if want == 0:
            return 0
        errors = []
        readers = self._readers(local_ok)
        for addr in self.replica_order(block):
            try:
                for way in readers:
                    if way.serves(addr) and way.read(addr, block, offset, into[:want], advance) is not None:
                        return want
            except UfsFailure:
                raise
            except (CurvineError, OSError) as e:
                errors.append(f"worker {addr.worker_id}: {e}")
                log.warning("read of block %d from worker %d failed (%s); trying the next replica",
                            block.block_id, addr.worker_id, e)
        detail = "; ".join(errors) or "no live replica"
        raise CurvineError(errno.EIO, f"block {block.block_id} unreadable: {detail}")

    def local_replica(self, block: pb.BlockInfo) -> pb.WorkerAddress | None:
        """The block's replica on this host when local reads are on (placement puts at most one on a host)."""
        if self.local is None:
            return None
        return next((a for a in self.replica_order(block) if self.local.serves(a)), None)

    def open_verified(self, block: pb.BlockInfo) -> int | None:
        """The local replica's block file, checked whole, for the kernel to read by itself
        (ShortCircuit.open_verified); None: read the block the usual way."""
        addr = self.local_replica(block)
        if addr is None or self.shortcircuit is None:
            return None
        return self.shortcircuit.open_verified(addr, block)

    def write(self, target: pb.BlockInfo, data: memoryview, owned: memoryview | None) -> tuple[list[int], int]:
        """The whole block data on target's workers: (worker ids that hold it, its checksum)."""
        return self.writer.write(self.workers.of(target), target, data, owned)

    def close(self) -> None:
        if self.shortcircuit is not None:
            self.shortcircuit.close()
        if self.localwrites is not None:
            self.localwrites.close()
