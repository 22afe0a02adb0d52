"""Short-circuit reads: a replica on this client's host is read from its block file.

Instead of streaming a local block over TCP (a worker thread, a socket copy each way),
the client finds the block's file by the worker's documented layout under its data
dirs (``blockmeta.block_file``; the dirs come from one ``Info`` call per worker), or
asks the worker (``StatBlock``) when it is not there, then reads
the file itself with ``preadv`` straight into the caller's buffer and verifies every
1 MiB chunk against the block's ``.meta`` sidecar (``common/blockmeta.py``), as the
worker would.  A replica is local when the worker's ``host`` equals the client's host
identity (``client.host``, default the hostname).

Anything unexpected -- the file moved or deleted, a checksum mismatch, a short file, a
worker that does not answer -- makes ``read`` return None and the caller reads the block
over the network instead: this path never returns bytes it has not verified.  A copy
whose bytes do not match its checksums is also reported to the master (``report_bad``).

Paths and parsed metas are cached per block (bounded LRU), not open file descriptors:
a cached descriptor would pin the space of blocks the worker deleted, and one
``open`` per 4 MiB block costs about 1% of the read.
"""
from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import grpc
import xxhash

from curvine_py.client import metrics
from curvine_py.common import rpc
from curvine_py.common.blockmeta import BlockMeta, block_file, mapped_chunk_sums
from curvine_py.common.errors import CurvineError
from curvine_py.common.frames import Arrivals
from curvine_py.common.tls import Tls
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc

log = logging.getLogger(__name__)

STAT_TIMEOUT_S = 2.0
MAX_CACHED_BLOCKS = 4096
CHECK_WAIT_S = 5.0             # an open waits this long for a check ahead of the same block
Hasher = Callable[[int, BlockMeta], list[int]]   # (open block file, its meta) -> chunk sums
PIECE = 256 << 10               # read + hash step: fits the L2 cache
ANNOUNCE = 1 << 20              # `progress` hears of verified bytes at MiB boundaries (and the end)


@dataclass(frozen=True)
class LocalBlock:
    """Where one local replica's bytes are and the checksums they must match."""
    path: str
    meta: BlockMeta


class ShortCircuit:
    """Reads of local replicas from their block files; counters say how often it worked."""

    def __init__(self, host: str, secret: str = "", max_blocks: int = MAX_CACHED_BLOCKS,
                 report_bad: Callable[[int, int, str], object] | None = None, tls: Tls | None = None) -> None:
        self._tls = tls
        self.host = host
        self.report_bad = report_bad   # (block id, worker id, reason): tell the master of a bad copy
        self.max_blocks = max_blocks
        self._secret = secret
        self._stubs: dict[tuple[str, int], curvine_pb2_grpc.WorkerServiceStub] = {}
        self._dirs: dict[tuple[str, int], list[str]] = {}   # worker -> its data dirs (Info)
        self._channels: list[grpc.Channel] = []
        self._blocks: OrderedDict[tuple[int, int], LocalBlock] = OrderedDict()
        self._lock = threading.Lock()
        self._scratch = threading.local()
        self.reads = 0        # block reads served from a local file
        self.bytes = 0        # bytes they returned
        self.fallbacks = 0    # local replicas that had to be read over the network instead
        self.handed = 0       # block files handed to the kernel (open_verified)
        self.ahead = 0        # blocks checked ahead of their open (verify)
        self._verified: OrderedDict[tuple[int, int], bool] = OrderedDict()
        self._verifying: dict[tuple[int, int], tuple[threading.Event, Callable[[], None] | None]] = {}
        self._hasher: ThreadPoolExecutor | None = None

    def is_local(self, addr: pb.WorkerAddress) -> bool:
        return bool(addr.host) and addr.host == self.host

    serves = is_local   # as a BlockReader (client/blockpaths.py): only the replica on this host

    def read(self, addr: pb.WorkerAddress, block: pb.BlockInfo, offset: int, into: memoryview,
             progress: Arrivals | None = None) -> int | None:
        """Fill `into` with block bytes from `offset` (len(into) <= block length - offset) out
        of the local file; returns len(into), or None when the network must be used.
        `progress` hears how many bytes of `into` are in and verified, MiB by MiB, so a
        reader of the block's head need not wait for its tail (as over the network)."""
        key = (addr.worker_id, block.block_id)
        try:
            local = self._locate(key, addr, block)
            if local is None:
                self._count_fallback()
                return None
            self._read_verified(local, offset, into, progress)
        except (OSError, ValueError, grpc.RpcError, CurvineError) as e:
            self._count_fallback()
            self._give_up(key, addr, block, e, "read")
            return None
        with self._lock:
            self.reads += 1
            self.bytes += len(into)
        if metrics.on:
            metrics.SHORT_CIRCUIT_READS.inc()
            metrics.SHORT_CIRCUIT_BYTES.inc(len(into))
        return len(into)

    def open_verified(self, addr: pb.WorkerAddress, block: pb.BlockInfo) -> int | None:
        """The local replica's block file opened read-only for the kernel to read by itself
        (FUSE passthrough, fuse/passthrough.py); None: read the block the usual way.

        Nothing checks the bytes the kernel reads, so the whole file is checked here first:
        every chunk's xxh3 against the sidecar, whose checksum is the master's.  Once per
        block and mount: a committed block file is never changed in place, and the worker
        recycles a freed file only when nobody has it open (worker/blockstore.unshared).
        The file must still be at its path once open: one renamed away before that may be
        about to be overwritten."""
        fd = self._open_checked(addr, block, "open")
        if fd is not None:
            with self._lock:
                self.handed += 1
        return fd

    def verify(self, addr: pb.WorkerAddress, block: pb.BlockInfo, hasher: Hasher,
               lend: Callable[[], None]) -> bool:
        """open_verified's check done ahead of the open (a lookup of a file the kernel is
        likely to read next), so that the open finds the block verified and only opens it;
        its fadvise also starts a cold block's disk read early.  `hasher` computes the
        chunk sums (client/mount/checker.py, at idle priority); an open that comes meanwhile
        calls `lend` and waits for it.  False: not usable."""
        fd = self._open_checked(addr, block, "check", hasher, lend)
        if fd is None:
            return False
        os.close(fd)
        with self._lock:
            self.ahead += 1
        return True

    def _open_checked(self, addr: pb.WorkerAddress, block: pb.BlockInfo, what: str,
                      hasher: Hasher | None = None, lend: Callable[[], None] | None = None) -> int | None:
        key = (addr.worker_id, block.block_id)
        try:
            local = self._locate(key, addr, block)
            if local is None:
                return None
            fd = os.open(local.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                self._check_whole(key, local, fd, block, hasher, lend)
            except BaseException:
                os.close(fd)
                raise
        except (OSError, ValueError, grpc.RpcError, CurvineError) as e:
            self._give_up(key, addr, block, e, what)
            return None
        return fd

    def _chunk_sums(self, fd: int, meta: BlockMeta) -> list[int]:
        """The xxh3 of every chunk of the file, hashed from its page-cache pages (no copy
        out of them), the first half on a helper thread: hashing from memory is bound by
        one core's memory bandwidth (~6 GB/s here), and the opener waits (median 1.92 ->
        1.36 ms per 14 MiB).  The file is asked of the disk whole first (_check_whole)."""
        if meta.length == 0:
            return []
        cs = meta.chunk_size
        with mmap.mmap(fd, meta.length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ) as m:
            half = (meta.length // 2) // cs * cs
            first = self._helper().submit(mapped_chunk_sums, m, 0, half, cs) if half else None
            try:
                rest = mapped_chunk_sums(m, half, meta.length, cs)
            finally:
                head = first.result() if first is not None else []   # done with the map first
            return head + rest

    def _helper(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._hasher is None:
                self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify")
            return self._hasher

    def _give_up(self, key: tuple[int, int], addr: pb.WorkerAddress, block: pb.BlockInfo,
                 e: BaseException, what: str) -> None:
        """A local replica that could not be used: forget it, report a bad copy, say so."""
        self._forget(key)
        if isinstance(e, CurvineError) and e.errno == errno.EBADMSG and self.report_bad is not None:
            self.report_bad(block.block_id, addr.worker_id, f"short-circuit {what}: {e}")
        log.warning("short-circuit %s of block %d from worker %d's file failed (%s); using the network",
                    what, block.block_id, addr.worker_id, _brief(e))

    def _check_whole(self, key: tuple[int, int], local: LocalBlock, fd: int, block: pb.BlockInfo,
                     hasher: Hasher | None, lend: Callable[[], None] | None) -> None:
        """The open file is the block (its length, every chunk's xxh3 against the sidecar,
        whose own checksum _locate matched to the master's), and still at its path."""
        st = os.fstat(fd)
        if st.st_size != block.length:
            raise CurvineError(errno.EBADMSG, f"block file holds {st.st_size} bytes, not {block.length}")
        # The whole file is asked of the disk at once (a no-op for cached pages): faulting
        # it in page by page, or the kernel's read-ahead behind the reader, reads it in
        # small requests at about half the disk's speed here.
        os.posix_fadvise(fd, 0, st.st_size, os.POSIX_FADV_WILLNEED)
        self._ensure_verified(key, local, fd, hasher or self._chunk_sums, lend)
        here = os.stat(local.path)
        if (here.st_dev, here.st_ino) != (st.st_dev, st.st_ino):
            raise CurvineError(errno.ESTALE, "the block file was replaced while it was opened")

    def _ensure_verified(self, key: tuple[int, int], local: LocalBlock, fd: int, hasher: Hasher,
                         lend: Callable[[], None] | None) -> None:
        """Hash the block unless it was verified before; an open that comes while the same
        block is being checked ahead waits for that check instead of hashing it again, and
        lends it normal priority (a check ahead runs at idle priority: on a busy machine it
        would otherwise hold the open up for as long as others keep the CPUs busy)."""
        while True:
            with self._lock:
                if key in self._verified:
                    return
                running = self._verifying.get(key)
                if running is None:
                    running = self._verifying[key] = (threading.Event(), lend)
                    break
            if running[1] is not None:
                running[1]()
            if not running[0].wait(CHECK_WAIT_S):   # a check stuck somewhere: hash it here
                self._hash_and_remember(key, local, fd, hasher)
                return
            # done: known now, or failed, and then this caller tries for itself
        try:
            self._hash_and_remember(key, local, fd, hasher)
        finally:
            with self._lock:
                del self._verifying[key]
            running[0].set()

    def _hash_and_remember(self, key: tuple[int, int], local: LocalBlock, fd: int, hasher: Hasher) -> None:
        if hasher(fd, local.meta) != list(local.meta.chunk_sums):
            raise CurvineError(errno.EBADMSG, "block checksum mismatch")
        with self._lock:
            self._verified[key] = True
            while len(self._verified) > self.max_blocks:
                self._verified.popitem(last=False)

    def warm(self, addrs: list[pb.WorkerAddress]) -> None:
        """Learn the data dirs of this host's workers now: the first block a reader opens
        would otherwise wait for a gRPC channel and an Info call (~15 ms here)."""
        for addr in addrs:
            if self.is_local(addr):
                try:
                    self._data_dirs(addr)
                except (grpc.RpcError, OSError) as e:
                    log.info("worker %d's data dirs not learned ahead (%s)", addr.worker_id, _brief(e))

    def _count_fallback(self) -> None:
        with self._lock:
            self.fallbacks += 1

    def _locate(self, key: tuple[int, int], addr: pb.WorkerAddress, block: pb.BlockInfo) -> LocalBlock | None:
        """The block's file and meta (cached); None when the worker does not hold this version."""
        with self._lock:
            local = self._blocks.get(key)
            if local is not None:
                self._blocks.move_to_end(key)
        if local is not None and _same_version(local.meta.checksum, block):
            return local
        local = self._probe_layout(addr, block)
        if local is None:   # not where the layout says (another dir, a changed layout): ask
            reply = self._stub(addr).StatBlock(pb.BlockRequest(block_id=block.block_id), timeout=STAT_TIMEOUT_S)
            if not reply.exists or not reply.path or not _same_version(reply.checksum, block):
                return None
            local = _load(reply.path, block)
            if local is None:
                return None
        with self._lock:
            self._blocks[key] = local
            while len(self._blocks) > self.max_blocks:
                self._blocks.popitem(last=False)
        return local

    def _probe_layout(self, addr: pb.WorkerAddress, block: pb.BlockInfo) -> LocalBlock | None:
        """The block's file found by the documented layout under the worker's data dirs
        (one Info call per worker, then no call per block): a StatBlock round trip per
        block cost more than reading the block itself (fetches ran 2x faster without).
        The sidecar must match the block's length and checksum, so a stale file at that
        path is never used."""
        for data_dir in self._data_dirs(addr):
            try:
                local = _load(block_file(data_dir, block.block_id), block)
            except (OSError, ValueError):
                continue
            if local is not None:
                return local
        return None

    def _data_dirs(self, addr: pb.WorkerAddress) -> list[str]:
        where = (addr.ip, addr.rpc_port)
        with self._lock:
            dirs = self._dirs.get(where)
        if dirs is None:
            info = self._stub(addr).Info(pb.Empty(), timeout=STAT_TIMEOUT_S)
            dirs = [d.path for d in info.dirs]
            with self._lock:
                self._dirs[where] = dirs
        return dirs

    def _read_verified(self, local: LocalBlock, offset: int, into: memoryview,
                       progress: Arrivals | None = None) -> None:
        """Chunks the range covers whole are read straight into `into` and verified there; a
        partly covered chunk at either end is read whole into a per-thread scratch buffer
        and verified there (a chunk is verified whole).  Raises on any mismatch; `progress`
        hears of the verified bytes in `into` at each MiB boundary and at the end (not at
        every 128 KiB chunk: each call may wake a waiting reader)."""
        meta, cs, length = local.meta, local.meta.chunk_size, local.meta.length
        end = offset + len(into)
        if end > length:
            raise CurvineError(errno.EBADMSG, f"read past the block's end ({end} > {length})")
        if end == offset:
            return
        fd = os.open(local.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            for c in range(offset // cs, (end - 1) // cs + 1):
                lo, hi = c * cs, min((c + 1) * cs, length)
                if offset <= lo and hi <= end:
                    _read_chunk(fd, meta, c, into[lo - offset:hi - offset])
                else:
                    self._partial(fd, meta, c, max(offset, lo), min(end, hi), offset, into)
                if progress is not None and (hi % ANNOUNCE == 0 or hi >= end):
                    progress.advance(min(end, hi) - offset)
        finally:
            os.close(fd)

    def _partial(self, fd: int, meta: BlockMeta, chunk: int, a: int, b: int, offset: int, into: memoryview) -> None:
        """Bytes [a, b) of one chunk: read and verify the whole chunk, copy the part."""
        cs = meta.chunk_size
        start = chunk * cs
        view = self._scratch_view(cs)[:min(cs, meta.length - start)]
        _read_chunk(fd, meta, chunk, view)
        into[a - offset:b - offset] = view[a - start:b - start]

    def _scratch_view(self, size: int) -> memoryview:
        buf = getattr(self._scratch, "buf", None)
        if buf is None or len(buf) < size:
            buf = self._scratch.buf = memoryview(bytearray(size))
        return buf

    def _forget(self, key: tuple[int, int]) -> None:
        with self._lock:
            self._blocks.pop(key, None)

    def _stub(self, addr: pb.WorkerAddress) -> curvine_pb2_grpc.WorkerServiceStub:
        where = (addr.ip, addr.rpc_port)
        with self._lock:
            stub = self._stubs.get(where)
            if stub is None:
                channel = rpc.channel(f"{addr.ip}:{addr.rpc_port}", self._secret, self._tls, peer="worker")
                self._channels.append(channel)
                stub = self._stubs[where] = curvine_pb2_grpc.WorkerServiceStub(channel)
            return stub

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"reads": self.reads, "bytes": self.bytes, "fallbacks": self.fallbacks, "handed": self.handed,
                    "ahead": self.ahead}

    def close(self) -> None:
        with self._lock:
            channels, self._channels = self._channels, []
            self._stubs.clear()
            self._dirs.clear()
            self._blocks.clear()
            hasher, self._hasher = self._hasher, None
        for c in channels:
            c.close()
        if hasher is not None:
            hasher.shutdown(wait=False)


def _load(path: str, block: pb.BlockInfo) -> LocalBlock | None:
    """path's sidecar parsed, if it describes this block version (else None)."""
    with open(path + ".meta", "rb") as f:
        meta = BlockMeta.decode(f.read())
    if not _same_version(meta.checksum, block) or meta.length != block.length:
        return None
    return LocalBlock(path, meta)


def _same_version(checksum: int, block: pb.BlockInfo) -> bool:
    """Is a local file with this whole-block checksum the block the master means?  A UFS
    file's block cut from its object has checksum 0 at the master (unknown until a worker
    fetched it; its id is never reused, a changed object gets new ids): then the worker's
    sidecar, written from the fetched bytes, is the reference, and every chunk is still
    verified against it."""
    return checksum == block.checksum or (block.checksum == 0 and bool(block.ufs.mount_id))


def _pread_full(fd: int, view: memoryview, offset: int) -> None:
    """Fill view from the file at offset; a short file (truncated, replaced) raises."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n <= 0:
            raise CurvineError(errno.EBADMSG, f"block file is short: {offset + got} bytes")
        got += n


def _read_chunk(fd: int, meta: BlockMeta, chunk: int, view: memoryview) -> None:
    """Read one whole chunk into view and verify it.  The chunk is read and hashed in
    PIECE steps so that each piece is hashed while the copy left it in the CPU cache
    (hashing the chunk cold from memory afterwards cost ~0.1 s/GB more here)."""
    h = xxhash.xxh3_64()
    start = chunk * meta.chunk_size
    for pos in range(0, len(view), PIECE):
        piece = view[pos:pos + PIECE]
        _pread_full(fd, piece, start + pos)
        h.update(piece)
    if h.intdigest() != meta.chunk_sums[chunk]:
        raise CurvineError(errno.EBADMSG, f"chunk {chunk} checksum mismatch")


def _brief(e: BaseException) -> str:
    if isinstance(e, grpc.RpcError):
        return f"worker rpc: {e.code()}"
    return str(e)
