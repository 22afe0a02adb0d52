"""Block fetches from the under storage (UFS): read-through on READ, and LoadBlocks.

A READ of a block this worker does not hold, naming a UFS range (``DataHeader.ufs_*``),
makes the worker read that block's bytes from the mount with ONE ranged read into a
pooled block-sized buffer, answer the READ from the buffer, and then, off the reply's
path, store the block (BlockStore create/append/commit, as a WRITE would) and forward
a copy down the READ's ``chain`` (the WRITE exchange, replication.Downstream).  The
buffer goes back to the pool when the readers have sent it and the copies are written.

Single flight: concurrent READs (and LoadBlocks) of one missing block share one fetch
(``Flight``, keyed by block id): a later arrival joins the flight in progress and waits
for the same bytes.  A flight stays joinable until its block is in the store, so a READ
arriving between the fetch and the commit reuses the bytes instead of fetching again.

The fetch runs on a small thread pool, not in the asking thread: every waiter waits at
most ``ufs.timeout_s`` (a provider that hangs past its own timeout costs a pool thread,
never a data connection), and a flight past its deadline is replaced by a new one.
A UFS failure is answered EREMOTEIO with one line naming the mount URI, the key and the
cause (logged once per fetch); a short object (fewer bytes than the block) is EIO.
Nothing is stored after a failure.
"""
from __future__ import annotations

import errno
import logging
import mmap
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import xxhash

from curvine_py.common import frames
from curvine_py.common.buffers import BufferPool
from curvine_py.common.connpool import ConnectionPool
from curvine_py.common.errors import CurvineError
from curvine_py.common.security import WRITE, BlockTokens
from curvine_py.pb import curvine_pb2, data_pb2
from curvine_py.ufs.base import UfsError
from curvine_py.worker import metrics
from curvine_py.worker.blockstore import READ_STEP, BlockStore, BlockWriter
from curvine_py.worker.replication import Downstream
from curvine_py.worker.ufsmounts import UfsMounts

log = logging.getLogger(__name__)

MiB = 1 << 20
FETCH_THREADS = 16              # block fetches (and their stores) running at once
MIN_BUFFER = 4 * MiB            # the smallest block buffer size class
BUFFER_BUDGET = 256 * MiB       # per size class: 64 x 4 MiB, 4 x 64 MiB, 2 of anything larger
PIECE = READ_STEP               # the store's appends and the forward's frames: 1 MiB each
MAX_BLOCK = 1 << 30             # a READ naming a longer UFS block is refused (EINVAL), not allocated


# ---------------------------------------------------------------- block buffers

class BlockBuffers:
    """Pooled buffers a whole block fits in: one BufferPool per power-of-two size from
    4 MiB up (blocks are 4 MiB by default, 64 MiB and more for large files), so a fetched
    block is read into memory touched before instead of a fresh 4-64 MiB allocation."""

    POLL_S = 0.005

    def __init__(self, budget: int = BUFFER_BUDGET) -> None:
        self.budget = budget
        self._pools: dict[int, BufferPool] = {}
        self._lock = threading.Lock()

    def _pool(self, size: int) -> BufferPool:
        with self._lock:
            pool = self._pools.get(size)
            if pool is None:
                pool = self._pools[size] = BufferPool(size, max_buffers=max(2, self.budget // size))
            return pool

    def acquire(self, length: int, deadline: float) -> mmap.mmap:
        """A buffer of at least length bytes; EAGAIN if none is free by deadline (monotonic)."""
        size = max(MIN_BUFFER, 1 << max(length - 1, 0).bit_length())
        pool = self._pool(size)
        while True:
            buf = pool.acquire_nowait()
            if buf is not None:
                return buf
            if time.monotonic() >= deadline:
                raise CurvineError(errno.EAGAIN, f"no free {size >> 20} MiB block buffer "
                                                 f"({pool.max_buffers} in use)")
            time.sleep(self.POLL_S)

    def release(self, buf: mmap.mmap) -> None:
        self._pool(len(buf)).release(buf)


# ---------------------------------------------------------------- what to fetch

@dataclass(frozen=True)
class UfsBlock:
    """One block to fetch: where its bytes lie in the UFS and where copies go."""
    block_id: int
    mount_id: int
    key: str
    offset: int                 # of the block in the object
    length: int                 # the whole block
    etag: str                   # informational: the object's version when the block was cut
    chain: tuple[data_pb2.ChainTarget, ...] = ()

    @classmethod
    def from_header(cls, h: data_pb2.DataHeader) -> "UfsBlock":
        return cls(h.block_id, h.ufs_mount, h.ufs_key, h.ufs_offset, h.ufs_length, h.ufs_etag, tuple(h.chain))

    @classmethod
    def from_info(cls, b: curvine_pb2.BlockInfo, addresses: Mapping[int, curvine_pb2.WorkerAddress],
                  me: int) -> "UfsBlock":
        """A LoadBlocks entry: the chain is b.workers without this worker (the master puts
        this worker first); a worker without an address is left out."""
        chain = tuple(data_pb2.ChainTarget(ip=a.ip, port=a.data_port, worker_id=a.worker_id)
                      for a in (addresses.get(w) for w in b.workers if w != me) if a is not None)
        r = b.ufs
        return cls(b.block_id, r.mount_id, r.key, r.offset, b.length, r.etag, chain)

    def where(self, uri: str) -> str:
        return f"{uri} key {self.key!r} [{self.offset}, +{self.length})"


class Flight:
    """One fetch of one block, shared by every READ and load that wants it.  Holds the
    pooled buffer until the last holder (each joiner, and the fetch's own store step)
    lets go."""

    def __init__(self, block: UfsBlock, deadline: float, buffers: BlockBuffers) -> None:
        self.block = block
        self.uri = f"UFS mount {block.mount_id}"   # the mount's URI once it is known (messages)
        self.deadline = deadline             # the fetch's bound (monotonic)
        self.fetched = threading.Event()     # view/checksum or error are set
        self.stored = threading.Event()      # the store (and forward) step is over
        self.view: memoryview | None = None
        self.checksum = 0
        self.error: CurvineError | None = None        # the fetch failed
        self.store_error: CurvineError | None = None  # the fetch worked, the local store did not
        self.acked: list[int] = []           # chain workers that took the forwarded copy
        self._buffers = buffers
        self._buf: mmap.mmap | None = None
        self._refs = 1                       # the fetch itself
        self._timeout_logged = False
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            self._refs += 1

    def release(self) -> None:
        """Drop one hold; the last one returns the buffer to its pool."""
        with self._lock:
            self._refs -= 1
            last = self._refs == 0
        if last and self._buf is not None:
            buf, self._buf = self._buf, None
            if self.view is not None:
                self.view.release()
                self.view = None
            self._buffers.release(buf)

    def wait_fetched(self) -> memoryview:
        """The block's bytes (valid while held); the fetch's error, or EREMOTEIO past the deadline."""
        if not self.fetched.wait(max(0.0, self.deadline - time.monotonic())):
            raise self._timed_out()
        if self.error is not None:
            raise self.error
        assert self.view is not None
        return self.view

    def _timed_out(self) -> CurvineError:
        """EREMOTEIO for a fetch past its deadline; logged once, however many wait."""
        e = CurvineError(errno.EREMOTEIO, f"UFS fetch of block {self.block.block_id} from "
                                          f"{self.block.where(self.uri)} failed: no answer in time")
        with self._lock:
            first, self._timeout_logged = not self._timeout_logged, True
        if first:
            log.warning("%s", e.strerror)
        return e

    def wait_stored(self, timeout_s: float) -> None:
        """Wait for the local copy (bounded); raises the fetch's or the store's error."""
        self.wait_fetched()
        if not self.stored.wait(timeout_s):
            raise CurvineError(errno.ETIMEDOUT, f"block {self.block.block_id}: storing the fetched "
                                                f"block took over {timeout_s:g}s")
        if self.store_error is not None:
            raise self.store_error


# ---------------------------------------------------------------- the fetcher

class UfsFetcher:
    """Fetches missing blocks from their UFS, single-flight by block id, and stores them
    here and down their chain.  Thread-safe; shared by the data server and the service."""

    def __init__(self, store: BlockStore, mounts: UfsMounts, pool: ConnectionPool, secret: str = "",
                 timeout_s: float = 30.0, cache_writes: bool = True, threads: int = FETCH_THREADS,
                 buffers: BlockBuffers | None = None) -> None:
        """pool: the data server's peer connections (forwards); cache_writes: fetched
        blocks go through the page cache (worker.cache_received: read again soon)."""
        self.store = store
        self.mounts = mounts
        self.pool = pool
        self.tokens = BlockTokens(secret)
        self.timeout_s = timeout_s
        self.cache_writes = cache_writes
        self.buffers = buffers or BlockBuffers()
        self._flights: dict[int, Flight] = {}
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ufs-fetch")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def join(self, block: UfsBlock) -> Flight | None:
        """A held flight fetching block (started now, or the one in progress); None when the
        block is in the store (serve it from there).  The caller must release() it."""
        with self._lock:
            flight = self._flights.get(block.block_id)
            if flight is not None and (flight.fetched.is_set() or time.monotonic() < flight.deadline):
                flight.hold()
                return flight
            if block.block_id in self.store:   # checked under the lock: a flight leaves after its commit
                return None
            flight = Flight(block, time.monotonic() + self.timeout_s, self.buffers)
            flight.hold()
            self._flights[block.block_id] = flight
        self._executor.submit(self._run, flight)
        return flight

    def _leave(self, flight: Flight) -> None:
        """Make the block's next request find the store (or a new fetch), not this flight."""
        with self._lock:
            if self._flights.get(flight.block.block_id) is flight:
                del self._flights[flight.block.block_id]

    def _run(self, flight: Flight) -> None:
        """On a pool thread: fetch, let the readers go, then store and forward."""
        try:
            if self._fetch(flight):
                self._store(flight)
        except Exception as e:   # a bug: never leave waiters without an answer
            log.exception("UFS fetch of block %d crashed", flight.block.block_id)
            if not flight.fetched.is_set():
                flight.error = CurvineError(errno.EIO, f"UFS fetch of block {flight.block.block_id}: {e}")
                flight.fetched.set()
        finally:
            self._leave(flight)
            flight.stored.set()
            flight.release()

    # ------------------------------------------------------------ fetch

    def _fetch(self, flight: Flight) -> bool:
        """One ranged read into a pooled buffer and its checksum; False (flight.error set,
        one warning logged) on failure."""
        b = flight.block
        start = time.perf_counter()
        try:
            if not 0 < b.length <= MAX_BLOCK:
                raise CurvineError(errno.EINVAL, f"ufs_length {b.length} is not in (0, {MAX_BLOCK}]")
            ufs = self.mounts.get(b.mount_id)
            flight.uri = ufs.uri
            log.debug("fetching block %d from %s (etag %s)", b.block_id, b.where(ufs.uri), b.etag or "-")
            flight._buf = self.buffers.acquire(b.length, flight.deadline)
            view = memoryview(flight._buf)[:b.length]
            flight.view = view
            got = ufs.read_into(b.key, b.offset, view)
            if got < b.length:
                raise _Short(got)
            flight.checksum = xxhash.xxh3_64_intdigest(view)
        except Exception as e:
            metrics.UFS_FETCHES.labels("failed").inc()
            flight.error = _failure(b, flight.uri, e)
            log.warning("%s", flight.error.strerror)
            self._leave(flight)          # the next request tries again
            flight.fetched.set()
            return False
        took = time.perf_counter() - start
        metrics.UFS_FETCHES.labels("ok").inc()
        metrics.UFS_FETCH_BYTES.inc(b.length)
        metrics.UFS_FETCH_SECONDS.observe(took)
        log.debug("fetched block %d (%d bytes) in %.3fs", b.block_id, b.length, took)
        flight.fetched.set()
        return True

    # ------------------------------------------------------------ store and forward

    def _store(self, flight: Flight) -> None:
        """Write the fetched bytes to the local store and down the chain at once (the
        disk writes overlap the forward, as a chain WRITE does)."""
        b, view = flight.block, flight.view
        assert view is not None
        down = self._downstream(b)
        writer = self._writer(flight)
        try:
            for i in range(0, b.length, PIECE):
                piece = view[i:i + PIECE]
                if down is not None:
                    down.forward(piece, b.block_id)
                    down = down if down.ok else None
                if writer is not None:
                    try:
                        writer.append(piece)
                    except CurvineError as e:
                        self._failed(flight, writer, e)
                        writer = None
            if down is not None:
                down.send_commit(b.length, flight.checksum, b.block_id)
            if writer is not None:
                try:
                    writer.commit(b.length, flight.checksum)
                except CurvineError as e:      # commit discards the block itself
                    self._failed(flight, None, e)
            flight.acked = down.wait_commit(b.block_id) if down is not None else []
        except BaseException:
            if writer is not None:
                writer.abort()
            if down is not None:
                down.abort()
            raise

    def _downstream(self, b: UfsBlock) -> Downstream | None:
        if not b.chain:
            return None
        token = self.tokens.mint(b.block_id, WRITE)   # this worker holds the cluster secret
        down = Downstream.open(self.pool, b.chain, b.block_id, b.length, 0, token)
        if down is not None:
            metrics.CHAIN_FORWARDS.inc()
        return down

    def _writer(self, flight: Flight) -> BlockWriter | None:
        """The local block's writer; None when the block is already here (written by a
        client meanwhile) or cannot be created (flight.store_error)."""
        b = flight.block
        if b.block_id in self.store:
            return None
        try:
            return self.store.create(b.block_id, 0, b.length, cached=self.cache_writes)
        except CurvineError as e:
            self._failed(flight, None, e)
            return None

    def _failed(self, flight: Flight, writer: BlockWriter | None, e: CurvineError) -> None:
        """Remember why the local copy failed (LoadBlocks reports it); the readers and
        the forward are not affected."""
        flight.store_error = e
        log.warning("block %d fetched from UFS but not stored: %s", flight.block.block_id, e)
        if writer is not None:
            writer.abort()

    # ------------------------------------------------------------ callers

    def serve_read(self, sock: socket.socket, h: data_pb2.DataHeader) -> bool:
        """Answer a READ of a block missing here from its UFS range; False when the block
        is in the store after all (the caller serves it as usual).  Same reply as a
        stored block: REPLY(length clamped, checksum of the whole block) + the bytes."""
        if h.offset > h.ufs_length:
            frames.reply(sock, errno.EINVAL, f"offset {h.offset} beyond block {h.block_id} "
                                             f"of length {h.ufs_length}")
            return True
        flight = self.join(UfsBlock.from_header(h))
        if flight is None:
            return False
        try:
            try:
                view = flight.wait_fetched()
            except CurvineError as e:
                frames.reply(sock, e.errno or errno.EREMOTEIO, e.strerror or "UFS fetch failed")
                return True
            n = min(h.length, len(view) - h.offset)
            head = frames.header_bytes(data_pb2.DataHeader(op=data_pb2.Op.REPLY, length=n,
                                                           checksum=flight.checksum))
            frames.send_all(sock, [head, view[h.offset:h.offset + n]])
        finally:
            flight.release()
        metrics.BLOCK_READS.inc()
        metrics.READ_BYTES.inc(n)
        return True

    def load(self, block: UfsBlock) -> None:
        """Make block present here (fetch + store + forward unless it already is); raises
        the fetch's or the store's error.  Bounded: the fetch by its deadline, the store
        by another timeout_s."""
        flight = self.join(block)
        if flight is None:
            return
        try:
            flight.wait_stored(self.timeout_s)
        finally:
            flight.release()


def load_blocks(fetcher: UfsFetcher, blocks: Sequence[curvine_pb2.BlockInfo],
                workers: Iterable[curvine_pb2.WorkerAddress], me: int, threads: int) -> curvine_pb2.LoadBlocksReply:
    """WorkerService.LoadBlocks: every block fetched and stored (up to `threads` at
    once); the ids loaded (present already counts), the ids failed, the last failure."""
    addresses = {w.worker_id: w for w in workers}
    reply = curvine_pb2.LoadBlocksReply()
    lock = threading.Lock()

    def one(b: curvine_pb2.BlockInfo) -> None:
        try:
            if not b.HasField("ufs") or not b.ufs.mount_id:
                raise CurvineError(errno.EINVAL, f"block {b.block_id} has no UFS range")
            fetcher.load(UfsBlock.from_info(b, addresses, me))
        except CurvineError as e:
            with lock:
                reply.failed.append(b.block_id)
                reply.message = f"block {b.block_id}: {e.strerror}"
            return
        with lock:
            reply.loaded.append(b.block_id)

    if blocks:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(blocks))),
                                thread_name_prefix="ufs-load") as pool:
            list(pool.map(one, blocks))
    return reply


# ---------------------------------------------------------------- errors

class _Short(Exception):
    def __init__(self, got: int) -> None:
        super().__init__(got)
        self.got = got


def _failure(b: UfsBlock, uri: str, e: BaseException) -> CurvineError:
    """A failed fetch as the reply's error: EIO for a short object, the errno of the
    worker's own limits (no buffer), EREMOTEIO for everything the UFS (or the mount
    lookup) did; one line naming the URI, the key and the cause."""
    if isinstance(e, _Short):
        return CurvineError(errno.EIO, f"UFS object {uri} key {b.key!r} is short: {e.got} of "
                                       f"{b.length} bytes at offset {b.offset} (changed behind the cache?)")
    if isinstance(e, CurvineError) and e.errno in (errno.EAGAIN, errno.EINVAL) and not isinstance(e, UfsError):
        return CurvineError(e.errno, f"UFS fetch of block {b.block_id}: {e.strerror}")
    cause = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)) or type(e).__name__
    cause = " ".join(cause.split())
    return CurvineError(errno.EREMOTEIO, f"UFS fetch of block {b.block_id} from {b.where(uri)} failed: {cause}")

