"""The ways to a block's replicas, and the one place that chooses among them.

A replica on this client's host can be read from its block file and written into it
without the network (short-circuit); every other replica goes over the data channel.
Two small interfaces name those ways, and one object per client (``ClientCore.paths``,
built from the configuration once) says which this client has:

* ``BlockReader``: ``ShortCircuit`` (client/shortcircuit.py: the local replica's file,
  verified chunk by chunk; a bad copy reported to the master) and ``RemoteReader``
  (client/blockio.py: any replica over the network, a UFS block fetched by its worker).
  ``BlockPaths.readers`` gives them in the order a replica is tried; the reader's
  fail-over loop (client/reader.py ``_fetch_once``) asks each replica of the
  ``replica_order`` by the first way that serves it.  Each way counts its reads by source
  (client/metrics.py).  ``local_ok=False`` once bytes of the block were announced to a
  reader: those are in use, and only a network replica's bytes (verified before they are
  sent) may be written over them.
* ``BlockWriter``: ``LocalFirstWriter`` (client/localwrite.py: the local replica into its
  block file, the others over the network) or ``RemoteWriter`` (client/blockio.py), for
  whole blocks (``write``, client/blockship.py) and streamed ones (``open_local``,
  client/blockstream.py) alike.
* the kernel's own reads of a local block file (FUSE passthrough): ``local_replica``
  names the replica whose file ``ShortCircuit.open_verified`` hands over (client/vfs.py
  ``VFS.backing_file``).

The implementations live beside the transport each uses, so a block's bytes cross no
more modules than before: this module only names and chooses.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
from typing import Iterator, Protocol

from curvine_py.client.blockio import BlockIO, RemoteReader, RemoteWriter, WorkerDirectory
from curvine_py.client.localwrite import LocalFile, LocalFirstWriter, LocalWrites
from curvine_py.client.shortcircuit import ShortCircuit
from curvine_py.common.connpool import ConnectionPool
from curvine_py.common.frames import Arrivals
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)
_U64 = (1 << 64) - 1


def spread(block_id: int) -> int:
    """The block id's bits mixed (splitmix64's finaliser), for choosing among replicas.

    Not the id itself: a writer spends its ids in batches (client/blockids.py, 4 at a
    file's first allocation), so the ids of one-block files share their low bits, and
    ``block_id % 2`` sent every KV chunk's read to the same one of two workers."""
    z = (block_id + 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    return z ^ (z >> 31)


class BlockReader(Protocol):
    """One way to read a replica."""

    def serves(self, addr: pb.WorkerAddress) -> bool:
        """May this way read addr's replica at all (e.g. is it on this host)?"""

    def read(self, addr: pb.WorkerAddress, block: pb.BlockInfo, offset: int, into: memoryview,
             progress: Arrivals | None) -> int | None:
        """Fill into (len(into) bytes from offset) from addr's replica: len(into), or None when
        this way cannot now (the same replica is then read the next way).  Raises
        CurvineError or OSError when the replica failed (the next replica is tried)."""


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


class BlockPaths:
    """Which way each replica of a block is read and written, for one client."""

    def __init__(self, host: str, workers: WorkerDirectory, io: BlockIO, pool: ConnectionPool,
                 shortcircuit: ShortCircuit | None, localwrites: LocalWrites | None) -> None:
        self.host, self.workers, self.pool = host, workers, pool
        self.shortcircuit = shortcircuit   # None: client.short_circuit off
        self.localwrites = localwrites     # None: client.short_circuit_writes off
        self.remote = RemoteReader(io, workers)
        self.writer: BlockWriter = LocalFirstWriter(localwrites, io) if localwrites is not None \
            else RemoteWriter(io)
        self._busy: collections.Counter[int] = collections.Counter()   # reads in flight, by worker id
        self._busy_lock = threading.Lock()

    def replica_order(self, block: pb.BlockInfo) -> list[pb.WorkerAddress]:
        """Replicas to try: the local host's first; then the others, the one this client
        has the fewest reads in flight from first (ties rotated by a hash of the block id),
        so concurrent fetches of one-block files use every replica's worker and link;
        replicas that recently timed out (suspect, see connpool) last."""
        addrs = self.workers.of(block)
        local = [a for a in addrs if a.host == self.host]
        remote = [a for a in addrs if a.host != self.host]
        if remote:
            k = spread(block.block_id) % len(remote)
            remote = sorted(remote[k:] + remote[:k], key=lambda a: self._busy[a.worker_id])
        ordered = local + remote
        suspect = [a for a in ordered if self.pool.is_suspect(a.ip, a.data_port)]
        return [a for a in ordered if a not in suspect] + suspect

    @contextlib.contextmanager
    def reading(self, addr: pb.WorkerAddress) -> Iterator[None]:
        """A read from addr's replica in flight (counted for replica_order)."""
        with self._busy_lock:
            self._busy[addr.worker_id] += 1
        try:
            yield
        finally:
            with self._busy_lock:
                self._busy[addr.worker_id] -= 1

    def readers(self, local_ok: bool = True) -> list[BlockReader]:
        """The ways to try on each replica, in order (a way that does not serve a replica,
        or cannot now, passes it to the next).  local_ok: see the module docstring."""
        return [self.shortcircuit, self.remote] if local_ok and self.shortcircuit is not None else [self.remote]

    def local_replica(self, block: pb.BlockInfo) -> pb.WorkerAddress | None:
        """The block's replica on this host when local reads are on (placement puts at most
        one on a host; one of this host's identity first, as in replica_order).  Without
        replica_order's sorting of the remote replicas: a mount asks at every lookup of a
        one-block file, where the sorting cost ~13 us of the ~60 us a listed lookup took
        (bench/kv_lookup.py --replica-host)."""
        sc = self.shortcircuit
        if sc is None:
            return None
        found = None
        for a in self.workers.of(block):
            if sc.serves(a):
                if a.host == self.host:
                    return a
                if found is None:
                    found = a
        return found

    def close(self) -> None:
        if self.shortcircuit is not None:
            self.shortcircuit.close()
        if self.localwrites is not None:
            self.localwrites.close()
