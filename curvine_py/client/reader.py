"""File reader: replica choice with fail-over, block read-ahead, zero-copy large reads.

A read that covers whole blocks receives them straight into the caller's buffer.
Smaller reads are served from whole blocks fetched into pooled buffers; when the
reader goes sequentially, the next ``read_ahead_blocks`` blocks are fetched in the
background.  Slots with no block (holes) and bytes past a short block read as zeros.
"""
from __future__ import annotations

import errno
import logging
import mmap
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable, Iterator, Protocol, TypeVar

from curvine_py.client import metrics
from curvine_py.client.blockio import UfsFailure
from curvine_py.client.core import ClientCore
from curvine_py.common.buffers import ALIGN, IDLE_S, BufferPool
from curvine_py.common.errors import CurvineError
from curvine_py.common.retry import Delays, Retry
from curvine_py.common.security import WRITE, token_expired
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)


LOCATION_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 4.0)
SCATTERED = 2   # small far reads in a row after which a file counts as read at random (FileReader._random)
# A whole-file read (read_all_into) fetches a block larger than this in parts of this
# size, `parallel` at once, as it fetches 4 MiB blocks: a 14 MiB KV chunk in one 16 MiB
# block was one serial read + verify on one thread.  A multiple of every chunk size a
# block's checksums use (128 KiB, 1 MiB), so a short-circuit part verifies whole chunks.
WHOLE_PART = 4 << 20
HEADER_READ = 4096   # a first read at offset 0 up to this size is a header: its range alone (_read_slot)
# A block first cached by a read inside it (its reader went on by ranges while the pool was
# dry, FileReader._acquire) is fetched from this far before that read, not from its start:
# the kernel's read-ahead requests come up to ~1 MiB out of order; the bytes before are read.
BASE_SLACK = 1 << 20
# When the pool of a block size above this has no buffer for a read, its reader takes a
# buffer of this size (that pool: 64 of them by default) for a window of the block from
# the read on, then the next window, before falling back to ranges alone: 96 readers of
# one-block 14 MiB chunks had 16 buffers of 16 MiB, and the 80 others read by 128 KiB
# ranges, twice as slow as the same chunks in 4 MiB blocks (issue 43).
WINDOW = 4 << 20
WINDOW_ALIGN = 128 << 10   # a window starts on this (the kernel's requests do: none straddles two windows)
T = TypeVar("T")


class Renewals(Protocol):
    """Who hears of the fresh tokens a renewal brought (a FileReader, for its other blocks)."""
    lease_id: int     # its writer's lease (0: none): blocks shipped under it can be renewed too

    def renewed(self, reply: pb.BlockLocationsReply) -> None: ...


def slots(offset: int, length: int, block_size: int) -> Iterator[tuple[int, int, int, int]]:
    """Split a byte range into per-block pieces: (block index, offset in block, offset in range, length)."""
    done = 0
    while done < length:
        idx, within = divmod(offset + done, block_size)
        n = min(length - done, block_size - within)
        yield idx, within, done, n
        done += n


def fetch_block(core: ClientCore, ino: int, block: pb.BlockInfo, offset: int, into: memoryview,
                progress: CachedBlock | None = None, renewed: Renewals | None = None) -> int:
    """Read block bytes [offset, offset+len(into)) from the first replica that answers.

    When no replica answers, the block's locations are asked again from the master a few
    times (_LOCATION_RETRY: a restarted master learns them from block reports within a
    few heartbeats).  progress hears how many bytes of `into` have arrived (a replica
    tried after a failed one sends the same verified bytes again: the count is only ever
    raised).

    A worker that refuses the block's token as expired (EKEYEXPIRED, common/security.py)
    is no failure: the block is located again at once, which brings fresh tokens for the
    whole file (renewed hears them, so the caller's other blocks need no refusal of
    their own), and read once more.
    """
    state = _Fetch(block, renewed)
    try:
        n = _LOCATION_RETRY.call(_fetch_attempt, core, ino, state, offset, into, progress)
    except UfsFailure as e:   # every replica would ask the same UFS: fail now, bounded
        log.warning("read of block %d of inode %d failed in its UFS: %s", state.block.block_id, ino, e.strerror)
        raise CurvineError(errno.EIO, str(e.strerror)) from None
    if n is None:
        raise CurvineError(errno.ESTALE, f"block {state.block.block_id} was replaced by a newer version")
    return n


class _Fetch:
    """One fetch_block across its attempts: the block as last located, the last failure."""

    __slots__ = ("block", "last", "renewed", "tell")

    def __init__(self, block: pb.BlockInfo, tell: Renewals | None) -> None:
        self.block = block
        self.last: CurvineError | None = None
        self.renewed = False      # its token was renewed once already
        self.tell = tell          # hears the renewal's fresh tokens


def _fetch_attempt(core: ClientCore, ino: int, state: _Fetch, offset: int, into: memoryview,
                   progress: CachedBlock | None) -> int | None:
    """One attempt of fetch_block; after a failed one, the block is located again first.
    None: the file no longer holds the block."""
    if state.last is not None:
        try:
            fresh = _relocate(core, ino, state.block, state.tell)
        except CurvineError:
            raise state.last from None   # the master is unreachable right now: failed as the last one did
        if fresh is None:
            return None
        state.block = fresh
    try:
        return _fetch_once(core, state.block, offset, into, progress)
    except CurvineError as e:
        state.last = e
        if not token_expired(e) or state.renewed:
            raise
    return _fetch_renewed(core, ino, state, offset, into, progress)


def _fetch_renewed(core: ClientCore, ino: int, state: _Fetch, offset: int, into: memoryview,
                   progress: CachedBlock | None) -> int | None:
    """The block's token expired: fresh ones from the master (its answer to a block
    location call), then the read once more.  Failures go on as any failed attempt."""
    state.renewed = True
    metrics.TOKEN_RENEWALS.labels("read").inc()
    log.info("block %d of inode %d: its token expired; renewed at the master", state.block.block_id, ino)
    own = state.block.token.startswith(WRITE)   # a writer's: shipped, maybe not committed yet
    fresh = _relocate(core, ino, state.block, state.tell)
    if fresh is None and own:
        fresh = _renew_shipped(core, ino, state)
    if fresh is None:
        if own:
            raise UnrenewableToken(errno.EKEYEXPIRED, f"block {state.block.block_id} of inode {ino}: its write "
                                   "token expired and the master renews it no more (the writer's lease "
                                   "no longer holds it)")
        return None
    state.block = fresh
    try:
        return _fetch_once(core, state.block, offset, into, progress)
    except CurvineError as e:
        state.last = e
        raise


def _renew_shipped(core: ClientCore, ino: int, state: _Fetch) -> pb.BlockInfo | None:
    """The block, with a fresh write token, if the caller's writer shipped it under its
    lease and has not committed it (the file's block list does not hold it yet)."""
    lease_id = state.tell.lease_id if state.tell is not None else 0
    if not lease_id:
        return None
    reply = core.meta.block_locations(ino, lease_id=lease_id, pending=[state.block.block_id])
    if state.tell is not None:
        state.tell.renewed(reply)
    token = next((b.token for b in reply.pending if b.block_id == state.block.block_id), "")
    if not token:
        return None
    fresh = pb.BlockInfo()
    fresh.CopyFrom(state.block)
    fresh.token = token
    return fresh


class UnrenewableToken(CurvineError):
    """A writer read back a block it shipped, after the block's write token expired, and
    the master renewed it neither as a committed block nor as one its lease holds.
    Final (not a replaced block: the writer's own slots must not be reloaded from the
    master, which would drop the block from them)."""


def _no_replica_answered(e: BaseException) -> bool:
    """A failed read worth trying again, not a UFS failure (every replica would ask that UFS alike)."""
    return isinstance(e, CurvineError) and not isinstance(e, (UfsFailure, UnrenewableToken))


# A block no replica answered for: located again after each of these waits, then given up
# (the last replica error raised).
_LOCATION_RETRY = Retry(transient=_no_replica_answered, wait=Delays(LOCATION_RETRY_DELAYS),
                        attempts=len(LOCATION_RETRY_DELAYS) + 1)


def _relocate(core: ClientCore, ino: int, block: pb.BlockInfo, tell: Renewals | None = None) -> pb.BlockInfo | None:
    """The block's current locations (with fresh tokens), or None if its file no longer holds it.
    A writer names its lease: the master hands it read tokens without R (a file opened
    write-only reads back the blocks it patches)."""
    reply = core.meta.block_locations(ino, lease_id=tell.lease_id if tell is not None else 0)
    core.workers.learn(list(reply.workers))
    if tell is not None:
        tell.renewed(reply)
    for b in reply.blocks:
        if b.block_id == block.block_id:
            return b
    return None


def _fetch_once(core: ClientCore, block: pb.BlockInfo, offset: int, into: memoryview,
                progress: CachedBlock | None = None) -> int:
    """One round over the block's replicas (ClientCore.paths.replica_order), each by the
    first way that serves it (BlockPaths.readers: its local file, else the network)."""
    want = min(len(into), max(0, block.length - offset))
    if want == 0:
        return 0
    errors = []
    # Bytes already announced as arrived are in use: only a network replica (whose bytes are
    # verified before they are sent) may write over them, never a local file read unverified
    # (a local read announces each chunk once verified, so its head is served early too).
    ways = core.paths.readers(local_ok=progress is None or progress.got == 0)
    for addr in core.paths.replica_order(block):
        try:
            with core.paths.reading(addr):
                for way in ways:
                    if way.serves(addr) and way.read(addr, block, offset, into[:want], progress) is not None:
                        return want
        except UfsFailure:
            raise
        except CurvineError as e:
            if token_expired(e):   # every replica checks the same token: renew it first (_fetch_attempt)
                raise
            errors.append(f"worker {addr.worker_id}: {e}")
            log.warning("read of block %d from worker %d failed (%s); trying the next replica",
                        block.block_id, addr.worker_id, e)
        except OSError as e:
            errors.append(f"worker {addr.worker_id}: {e}")
            log.warning("read of block %d from worker %d failed (%s); trying the next replica",
                        block.block_id, addr.worker_id, e)
    detail = "; ".join(errors) or "no live replica"
    raise CurvineError(errno.EIO, f"block {block.block_id} unreadable: {detail}")


def _note_use(entry: CachedBlock) -> None:
    """A read uses entry (the reader's lock held): the first use of a block fetched ahead
    is a read-ahead hit."""
    if entry.ahead:
        entry.ahead = False
        if metrics.on:
            metrics.READAHEAD_HITS.inc()


def start_fetch(core: ClientCore, ino: int, block: pb.BlockInfo, raw: mmap.mmap,
                renewed: Renewals | None = None, base: int = 0, home: BufferPool | None = None) -> CachedBlock:
    """A fetch of the block from base (0: its start) into the pooled buffer raw (from its
    start), to the block's end or as far as raw holds, on the core's executor.  home: the
    pool raw goes back to, if not the reader's own (a window, FileReader._acquire)."""
    view = memoryview(raw)
    entry = CachedBlock(raw, view)
    entry.base = base = min(base, block.length)
    entry.end = min(block.length, base + len(raw))
    entry.tail = entry.end >= block.length
    entry.home = home
    entry.future = core.executor.submit(fetch_block, core, ino, block, base, view[:entry.end - base], entry,
                                        renewed)
    entry.future.add_done_callback(entry.fetched)
    return entry


class LentView:
    """Bytes of a read, lent out of a reader's block cache without a copy.

    `view` stays valid until `release()`: the cached block is pinned meanwhile, so the
    cache neither evicts nor reuses its buffer (the mount hands the view to FUSE's reply
    and releases it once the kernel has copied it).  A read served from a copy (a hole,
    a range across blocks, a small random read) pins nothing: `copied`."""

    __slots__ = ("view", "_reader", "_entry")

    def __init__(self, view: memoryview, reader: "FileReader | None" = None,
                 entry: "CachedBlock | None" = None) -> None:
        self.view, self._reader, self._entry = view, reader, entry

    @classmethod
    def copied(cls, data: bytes | bytearray | memoryview) -> "LentView":
        return cls(memoryview(data))

    def release(self) -> None:
        """Give the block back to the cache (once; a copy has nothing to give back)."""
        reader, entry = self._reader, self._entry
        self._reader = self._entry = None
        if reader is not None and entry is not None:
            reader._unpin(entry)


class CachedBlock:
    """A whole block fetched into a pooled buffer; `users` pins it while it is copied from.

    `got` counts the bytes from `base` already in the buffer while the fetch runs, so a
    read of the block's head is answered before its tail has arrived: a KV chunk's first
    4 KiB no longer waits for the whole first block (docs/performance.md).  Bytes before
    `base` are not fetched (a reader that was already past them, FileReader._acquire).
    """

    __slots__ = ("raw", "view", "future", "users", "base", "end", "tail", "home", "got", "needs", "wanted",
                 "arrived", "retired", "ahead")

    def __init__(self, raw: mmap.mmap, view: memoryview) -> None:
        self.raw, self.view = raw, view
        self.future: Future[int] = Future()   # the fetch's, set by the one who starts it
        self.users = 0
        self.retired = False         # its buffer went back to the pool
        self.ahead = False           # fetched ahead of any read of it, and no read has used it yet
        self.base = 0                # where in the block the fetch starts (the buffer's first byte)
        self.end = 0                 # where it stops (the block's length, or a window's end)
        self.tail = True             # it goes on to the block's end
        self.home: BufferPool | None = None   # where raw goes back (None: the reader's pool)
        self.got = 0                 # bytes from base in the buffer so far
        self.needs: list[int] = []   # what each waiting reader needs `got` to reach
        self.wanted = 0              # the least of them (0: nobody waits)
        self.arrived = threading.Condition()

    def holds(self, within: int, size: int) -> bool:
        """Does this entry fetch the block's bytes [within, within+size) (past the block's
        end: zeros)?"""
        return self.base <= within and (within + size <= self.end or self.tail)

    def part(self, within: int, size: int) -> memoryview:
        """The block's bytes [within, within+size) in the buffer (holds them)."""
        return self.view[within - self.base:within - self.base + size]

    def available(self) -> int:
        """The end (from the block's start) of the bytes usable now; -1 once the fetch has
        failed.  Bytes before `base` are not usable whatever this says."""
        if not self.future.done():
            return self.base + self.got
        return -1 if self.future.exception() is not None else self.base + self.future.result()

    def advance(self, got: int) -> None:
        """The fetch's progress (called from its thread after each receive).  Waiters are
        woken only once a need of theirs is met, not at every receive."""
        self.got = max(self.got, got)
        if self.wanted and self.base + self.got >= self.wanted:
            with self.arrived:
                self.arrived.notify_all()

    def fetched(self, _future: Future[int]) -> None:
        with self.arrived:
            self.arrived.notify_all()

    def wait_for(self, need: int) -> int:
        """Block until the bytes up to `need` (from the block's start) have arrived or the
        fetch is over; returns where the usable bytes end (the block's length once
        fetched); raises the fetch's error."""
        with self.arrived:
            self.needs.append(need)
            self.wanted = min(self.needs)
            try:
                while self.base + self.got < need and not self.future.done():
                    self.arrived.wait(1.0)
            finally:
                self.needs.remove(need)
                self.wanted = min(self.needs, default=0)
        return self.base + (self.future.result() if self.future.done() else self.got)


class FileReader:
    """Positional and sequential reads of one file version (its block list at open).

    Thread-safe: the lock guards only the cache's bookkeeping; waiting for a fetch and
    copying out of a fetched block happen outside it, so concurrent kernel read-ahead
    requests proceed in parallel.
    """

    def __init__(self, core: ClientCore, reply: pb.OpenReply) -> None:
        """Read the file version an Open reply describes (its attributes and blocks)."""
        self.core = core
        self.attr = reply.attr
        self.size = reply.attr.size
        self.bs = reply.attr.block_size or core.cfg.master.block_size
        self.blocks = {b.offset // self.bs: b for b in reply.blocks}
        self.pool = core.buffer_pool(self.bs)
        self.read_ahead = core.cfg.client.read_ahead_blocks
        self._cache: OrderedDict[int, CachedBlock] = OrderedDict()
        self._max_end = 0
        self._random_end = -1            # where the latest small random read ended (see _random)
        self._scattered = 0              # small random reads since a read last went on from one
        self._last_idx = -1              # the block the latest read was in
        self._used = time.monotonic()    # when that was (the pool takes from idle readers)
        self._lock = threading.RLock()
        self._closed = False
        self.lease_id = 0                # a writer's reader: its lease (Renewals)
        self._windows: _WindowHolder | None = None   # held in the WINDOW pool once a window came from it
        core.workers.learn(list(reply.workers))
        self.pool.hold(self, cheap=True)

    def prefetch_small(self) -> None:
        """A file no bigger than the read-ahead window is fetched whole at once: the KV-cache
        reader opens a chunk and reads all of it, so every block is wanted right away.
        Speculative: only with buffers the pool has at hand (a dry pool is not waited for:
        128 open readers prefetching once took every buffer and every I/O thread), and not
        once the reader is closed (it runs in the background, possibly after the release)."""
        if 0 < self.size <= self.read_ahead * self.bs:
            with self._lock:
                for idx in sorted(self.blocks):
                    if idx not in self._cache and not self._start_fetch_nowait(idx):
                        return

    def adopt(self, idx: int, entry: CachedBlock) -> bool:
        """Take block idx as already fetched (or being fetched) into entry, a buffer of this
        reader's pool (client/mount/fetchahead.py: fetched when the file was looked up)."""
        with self._lock:
            if self._closed or idx in self._cache or idx not in self.blocks:
                return False
            self._cache[idx] = entry
            return True

    def reclaim(self, home: BufferPool | None = None) -> bool:
        """The pool ran dry (common/buffers.py): drop the least recently used fetched block
        nobody is copying from, if the reads have gone past it or have paused (IDLE_S); a
        later read fetches it again.  home: that of a window's pool (_WindowHolder)."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            paused = time.monotonic() - self._used >= IDLE_S
            idx = next((i for i, e in self._cache.items()
                        if e.home is home and e.users == 0 and e.future.done() and (paused or i < self._last_idx)),
                       None)
            if idx is None:
                return False
            entry = self._cache.pop(idx)
        finally:
            self._lock.release()
        self._retire(entry)
        return True

    def invalidate(self, idx: int) -> None:
        """Slot idx now has another block: drop what was fetched of the old one."""
        with self._lock:
            entry = self._cache.pop(idx, None)
        if entry is not None:
            self._retire(entry)

    def refresh(self) -> None:
        """Load the file's current block list and size (its blocks were replaced: another
        client rewrote it since this reader opened it); drop everything fetched."""
        reply = self.core.meta.block_locations(self.attr.ino)
        self.core.workers.learn(list(reply.workers))
        with self._lock:
            entries = list(self._cache.values())
            self._cache.clear()
            self.blocks.clear()
            self.blocks.update({b.offset // self.bs: b for b in reply.blocks})
            self.size = reply.attr.size
        for entry in entries:
            self._retire(entry)

    def renewed(self, reply: pb.BlockLocationsReply) -> None:
        """Fresh tokens came for this file (a worker refused one as expired; fetch_block):
        its blocks take them, so each does not wait for a refusal of its own.  Only the
        tokens: a block replaced meanwhile is refresh's business (ESTALE)."""
        fresh = {b.block_id: b.token for b in (*reply.blocks, *reply.pending)}
        with self._lock:
            for block in self.blocks.values():
                token = fresh.get(block.block_id)
                if token:
                    block.token = token

    def _fresh(self, fn: Callable[..., T], *args: object) -> T:
        """Run a read; if a block it needed was replaced (ESTALE), reload the file and run it again."""
        try:
            return fn(*args)
        except CurvineError as e:
            if e.errno != errno.ESTALE:
                raise
            self.refresh()
            return fn(*args)

    def pread(self, offset: int, into: memoryview) -> int:
        """Fill into from file offset; returns bytes read (short only at end of file)."""
        return self._fresh(self._pread, offset, into)

    def _pread(self, offset: int, into: memoryview) -> int:
        if offset >= self.size or len(into) == 0:
            return 0
        total = min(len(into), self.size - offset)
        last = (offset + total - 1) // self.bs
        for idx, within, done, n in slots(offset, total, self.bs):
            self._read_slot(idx, within, into[done:done + n], offset, last)
        return total

    def read_bytes(self, offset: int, size: int) -> bytes:
        """Up to size bytes at offset as one new bytes object (one copy out of the block cache)."""
        return self._fresh(self._read_bytes, offset, size)

    def _read_bytes(self, offset: int, size: int) -> bytes:
        lent = self._view_wait(offset, size)
        try:
            return bytes(lent.view)
        finally:
            lent.release()

    def view_nowait(self, offset: int, size: int) -> LentView | None:
        """Up to size already fetched bytes at offset, lent out of the block cache (no copy,
        no waiting) until released; None when they are not fetched yet or cross a block
        boundary.

        The mount calls this on its event loop thread before paying for a worker thread,
        and hands the view straight to FUSE's reply, so the kernel's copy is the only
        one (a bytes object per 1 MiB request was a second copy, into fresh memory).
        """
        if offset >= self.size or size <= 0:
            return LentView.copied(b"")
        size = min(size, self.size - offset)
        idx, within = divmod(offset, self.bs)
        if within + size > self.bs or not self._lock.acquire(blocking=False):
            return None
        try:
            entry = self._cache.get(idx)
            if entry is None or not entry.holds(within, size) or within + size > entry.available():
                return None
            entry.users += 1   # _retire leaves the buffer alone until the caller unpins
            _note_use(entry)
        finally:
            self._lock.release()
        self._note(offset, idx)
        return LentView(entry.part(within, size), self, entry)

    def view_wait(self, offset: int, size: int) -> LentView:
        """view_nowait that waits for the bytes (in a worker thread).  A range not inside
        one fetched block (a hole, across blocks, past a short block) comes back as a
        copy, which pins nothing."""
        return self._fresh(self._view_wait, offset, size)

    def _view_wait(self, offset: int, size: int) -> LentView:
        if offset >= self.size or size <= 0:
            return LentView.copied(b"")
        size = min(size, self.size - offset)
        idx, within = divmod(offset, self.bs)
        block = self.blocks.get(idx)
        if block is None or within + size > min(self.bs, block.length):
            buf = bytearray(size)   # a hole, across blocks, past a short block: gathered
            self._pread(offset, memoryview(buf))
            return LentView.copied(buf)
        if self._random(idx, offset, size):   # its range alone, not its whole block
            buf = bytearray(size)
            self._fill(block, within, memoryview(buf))
            return LentView.copied(buf)
        entry = self._acquire(idx, offset, within, size)
        if entry is None:   # no buffer at hand (or the read is before its cached part): this range alone
            buf = bytearray(size)
            self._fill(block, within, memoryview(buf))
            return LentView.copied(buf)
        try:
            entry.wait_for(within + size)
        except BaseException:
            self._unpin(entry)
            raise
        return LentView(entry.part(within, size), self, entry)

    def _read_slot(self, idx: int, within: int, out: memoryview, offset: int, last: int = -1) -> None:
        """Bytes of block idx into out.  last: the last block the caller's read covers
        (read-ahead starts after it: the read fetches the blocks up to there itself)."""
        block = self.blocks.get(idx)
        if block is None:
            out[:] = bytearray(len(out))
            return
        with self._lock:
            cached = idx in self._cache
            first = self._last_idx < 0 and not cached
        whole = min(self.bs, block.length)
        if not cached and within + len(out) >= whole and len(out) >= whole // 2:
            # the caller wants the block, or its rest after a header: no staging copy
            self._note(offset, idx, last)
            self._fill(block, within, out)
            return
        if first and offset == 0 and len(out) <= HEADER_READ:
            # a file's header read first (LMCache's fs:// chunks: 28 bytes, then the rest in
            # one read): its range alone; the read that goes on from its end is sequential
            self._fill(block, within, out)
            with self._lock:
                self._random_end = len(out)
            return
        if not cached and self._random(idx, offset, len(out)):
            self._fill(block, within, out)   # a small random read: its range alone
            return
        entry = self._acquire(idx, offset, within, len(out))
        if entry is None:   # no buffer at hand (or the read is before its cached part): this range alone
            self._fill(block, within, out)
            return
        try:
            n = entry.wait_for(within + len(out))
            have = max(0, min(len(out), n - within))
            out[:have] = entry.part(within, have)
        finally:
            self._unpin(entry)
        if have < len(out):
            out[have:] = bytearray(len(out) - have)

    def _random(self, idx: int, offset: int, size: int) -> bool:
        """Is this a small read far from where the file is being read (a Parquet footer, a
        safetensors header, a random ``pread``)?  Then only its range is fetched, straight
        into the caller's buffer, not its whole block into the cache: a 128 KiB read of a
        4 MiB block moved 32x its bytes (and the worker reads and hashes only the 128 KiB
        chunks it covers).  "Far": outside the read-ahead window around the furthest
        read so far, on either side (the kernel's own read-ahead sends requests that far
        ahead and out of order).  A small read that starts where the previous random one
        ended is a sequential reader starting there: it re-anchors the window.  Once
        SCATTERED small reads in a row were far, the file is being read at random, and a
        small read near the furthest one is random too: otherwise ~1 in 5 random reads of
        a 1 GiB file of 16 MiB blocks fell in the window and fetched its block and four
        more whole (80 MiB for 128 KiB)."""
        if size > self.bs // 4:
            return False
        with self._lock:
            if idx in self._cache:
                return False
            if offset == self._random_end:
                self._max_end, self._scattered = offset, 0
                return False
            window = (self.read_ahead + 2) * self.bs
            if self._max_end - window <= offset <= self._max_end + window and self._scattered < SCATTERED:
                return False
            self._scattered += 1
            self._random_end = offset + size
            return True

    def _note(self, offset: int, idx: int, upto: int = -1) -> None:
        """Reads near the furthest point read so far are sequential: fetch the blocks after
        upto (default idx: the last block the read covers) ahead."""
        with self._lock:
            self._last_idx, self._used = idx, time.monotonic()
            sequential = offset <= self._max_end + self.bs
            self._max_end = max(self._max_end, offset)
            if sequential:
                after = max(idx, upto) + 1
                for nxt in range(after, after + self.read_ahead):
                    if nxt in self.blocks and nxt not in self._cache and not self._start_fetch_nowait(nxt):
                        return

    def _acquire(self, idx: int, offset: int, within: int, size: int) -> CachedBlock | None:
        """The cache entry of block idx for a read of [within, within+size) in it, pinned,
        its fetch started if need be (from BASE_SLACK before within: the reader is past
        the bytes before; or a WINDOW from within, _buffer); None when the entry cached
        does not hold the range and cannot be let go yet, or when no buffer is at hand
        even after taking one back from an idle holder: the caller then fetches its
        range alone.  Never waits for a buffer: a read waiting for one
        held a mount request slot that the holders' next requests needed (issue 43;
        BufferPool.acquire_or_reclaim), and the pool is never asked with the lock held
        (the mount's loop takes it, and so does the pool's reclaim of this reader)."""
        self._note(offset, idx)
        got: tuple[mmap.mmap, BufferPool] | None = None
        while True:
            with self._lock:
                entry = self._cache.get(idx)
                if entry is not None and not entry.holds(within, size):
                    if within < entry.end or entry.users:
                        entry = None   # before it, or a window still copied from: this range alone
                        break
                    del self._cache[idx]   # a window the reads went past: the next one
                    self._retire(entry)
                    entry = None
                if entry is not None:
                    self._cache.move_to_end(idx)
                elif got is not None:
                    raw, home = got
                    window = home is not self.pool
                    base = within // WINDOW_ALIGN * WINDOW_ALIGN if window else \
                        max(0, within - BASE_SLACK) // ALIGN * ALIGN
                    if window and within + size > base + len(raw) and base + len(raw) < self.blocks[idx].length:
                        break   # a read larger than a window: its range alone
                    entry = self._start_fetch(idx, raw, base, home if window else None)
                    got = None
                if entry is not None:
                    entry.users += 1
                    _note_use(entry)
                    break
            got = self._buffer()
            if got is None:
                break
        if got is not None:   # another thread started it meanwhile, or it cannot be used
            got[1].release(got[0])
        return entry

    def _buffer(self) -> tuple[mmap.mmap, BufferPool] | None:
        """A buffer for a read's block, and its pool, without waiting: the block size's,
        else (a block above WINDOW) a window's; None if neither has one at hand."""
        raw = self.pool.acquire_or_reclaim(self)
        if raw is not None:
            return raw, self.pool
        if self.bs <= WINDOW:
            return None
        windows = self.core.buffer_pool(WINDOW)
        if self._windows is None:
            self._windows = _WindowHolder(self)
            windows.hold(self._windows, cheap=True)
        raw = windows.acquire_or_reclaim(self._windows)
        return None if raw is None else (raw, windows)

    def _unpin(self, entry: CachedBlock) -> None:
        """A read is done with entry.  Its end counts as a use: a read that waited seconds
        for its block's bytes (many readers sharing the network) started long ago, and
        dated by its start the reader looked paused the moment it was served; the pool
        then took its block back between two requests and the next fetched it whole
        again (issue 43: 16 MiB blocks fetched 26 times each by 32 readers)."""
        with self._lock:
            entry.users -= 1
            self._used = time.monotonic()
            retire = entry.users == 0 and entry not in self._cache.values()
        if retire:
            self._retire(entry)

    def _fill(self, block: pb.BlockInfo, within: int, out: memoryview) -> None:
        n = fetch_block(self.core, self.attr.ino, block, within, out, renewed=self)
        if n < len(out):
            out[n:] = bytearray(len(out) - n)

    def _start_fetch_nowait(self, idx: int) -> bool:
        """Start fetching block idx ahead of its reads if a buffer is at hand and this
        reader keeps fewer than its share of the pool, or the pool has plenty (lock held)."""
        if self._closed or (len(self._cache) >= self.pool.share() and not self.pool.plenty()):
            return False
        raw = self.pool.acquire_nowait()
        if raw is None:
            return False
        self._start_fetch(idx, raw).ahead = True
        if metrics.on:
            metrics.READAHEAD_BLOCKS.inc()
        return True

    def _start_fetch(self, idx: int, raw: mmap.mmap, base: int = 0, home: BufferPool | None = None) -> CachedBlock:
        """Fetch block idx from base into raw, a pooled buffer (of home, if not self.pool),
        called with the lock held."""
        entry = start_fetch(self.core, self.attr.ino, self.blocks[idx], raw, self, base, home)
        self._cache[idx] = entry
        # Room for the read-ahead window beyond the kernel's own read-ahead in flight: a
        # buffered mount has up to 12 requests of 1 MiB (3 blocks) pending at once; with
        # room for only read_ahead + 2 blocks, fetching ahead of the furthest request
        # evicted blocks that pending requests still wanted, and they were fetched again
        # (a 256 MiB file read at 0.28 GB/s, each 1 MiB request waiting 20-50 ms).
        limit = 2 * self.read_ahead + 2
        for old in [i for i in self._cache if i != idx][:max(0, len(self._cache) - limit)]:
            victim = self._cache.pop(old)
            if victim.users == 0:
                self._retire(victim)
        return entry

    def _retire(self, entry: CachedBlock) -> None:
        """Give a dropped entry's buffer back once its fetch is over and nobody copies from
        it.  Never waits: a fetch still running retires it when it ends (waiting for it on
        an I/O thread could wait for a fetch queued behind that very thread)."""
        if not entry.future.done():
            entry.future.add_done_callback(lambda _f: self._retire(entry))
            return
        with self._lock:
            if entry.users or entry.retired:
                return   # the last _unpin retires it
            entry.retired = True
        entry.view.release()
        (entry.home or self.pool).release(entry.raw)

    def read_all_into(self, into: memoryview, parallel: int = 2) -> int:
        """Read the whole file into `into` (len >= size), fetching `parallel` parts of at
        most WHOLE_PART bytes at once (a block larger than that in several parts)."""
        futures = []
        for idx, within, done, n in slots(0, self.size, self.bs):
            out = into[done:done + n]
            block = self.blocks.get(idx)
            if block is None:
                out[:] = bytearray(len(out))
                continue
            for part in range(0, n, WHOLE_PART):
                futures.append(self.core.executor.submit(self._fill, block, within + part,
                                                         out[part:part + WHOLE_PART]))
                if len(futures) >= parallel:
                    futures.pop(0).result()
        for f in futures:
            f.result()
        return self.size

    def idle(self) -> bool:
        """No block fetch of this reader is still running and no thread is inside it
        (close() would not wait).  Asked on the mount's loop: never waits for the lock."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            return all(entry.future.done() for entry in self._cache.values())
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            entries = list(self._cache.values())
            self._cache.clear()
        self.pool.unhold(self)
        if self._windows is not None:
            self.core.buffer_pool(WINDOW).unhold(self._windows)
        for entry in entries:
            self._retire(entry)


class _WindowHolder:
    """A reader's place among the WINDOW pool's holders: that pool's reclaim takes back
    only the reader's windows (its own reclaim, the blocks of its block size's pool).
    Weak: the pool holds this weakly and the reader holds this."""

    __slots__ = ("reader", "__weakref__")

    def __init__(self, reader: FileReader) -> None:
        self.reader = weakref.ref(reader)

    def reclaim(self) -> bool:
        reader = self.reader()
        return reader is not None and reader.reclaim(reader.core.buffer_pool(WINDOW))
