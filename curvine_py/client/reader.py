"""File reader: replica choice with fail-over, block read-ahead, zero-copy large reads.

A read that covers whole blocks receives them straight into the caller's buffer.
Smaller reads are served from whole blocks fetched into pooled buffers; when the
reader goes sequentially, the next ``read_ahead_blocks`` blocks are fetched in the
background.  Slots with no block (holes) and bytes past a short block read as zeros.
"""
from __future__ import annotations

import errno
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future

from curvine_py.client.core import ClientCore
from curvine_py.common.errors import CurvineError
from curvine_py.pb import curvine_pb2 as pb

log = logging.getLogger(__name__)


LOCATION_RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 4.0)


def fetch_block(core: ClientCore, ino: int, block: pb.BlockInfo, offset: int, into: memoryview) -> int:
    """Read block bytes [offset, offset+len(into)) from the first replica that answers.

    When no replica answers, the block's locations are asked again from the master a few
    times (a restarted master learns them from block reports within a few heartbeats).
    """
    last: CurvineError | None = None
    for delay in (0.0, *LOCATION_RETRY_DELAYS):
        if delay:
            time.sleep(delay)
            fresh = _relocate(core, ino, block)
            if fresh is None:
                break
            block = fresh
        try:
            return _fetch_once(core, block, offset, into)
        except CurvineError as e:
            last = e
    raise last or CurvineError(errno.EIO, f"block {block.block_id} unreadable")


def _relocate(core: ClientCore, ino: int, block: pb.BlockInfo) -> pb.BlockInfo | None:
    """The block's current locations, or None if its file no longer holds it."""
    try:
        reply = core.meta.block_locations(ino)
    except CurvineError:
        return None
    core.workers.learn(list(reply.workers))
    for b in reply.blocks:
        if b.block_id == block.block_id:
            return b
    return None


def _fetch_once(core: ClientCore, block: pb.BlockInfo, offset: int, into: memoryview) -> int:
    want = min(len(into), max(0, block.length - offset))
    if want == 0:
        return 0
    errors = []
    for addr in core.replica_order(block):
        try:
            n = core.io.read_block(addr, block.block_id, offset, into[:want])
            if n != want:
                raise CurvineError(errno.EIO, f"short read: {n} of {want} bytes")
            return n
        except (CurvineError, OSError) as e:
            errors.append(f"worker {addr.worker_id}: {e}")
            log.warning("read of block %d from worker %d failed (%s); trying the next replica",
                        block.block_id, addr.worker_id, e)
    detail = "; ".join(errors) or "no live replica"
    raise CurvineError(errno.EIO, f"block {block.block_id} unreadable: {detail}")


class _Cached:
    """A whole block fetched into a pooled buffer."""

    __slots__ = ("raw", "view", "future")

    def __init__(self, raw: object, view: memoryview, future: Future[int]) -> None:
        self.raw, self.view, self.future = raw, view, future


class FileReader:
    """Positional and sequential reads of one file version (its block list at open)."""

    def __init__(self, core: ClientCore, attr: pb.Attr, blocks: list[pb.BlockInfo],
                 workers: list[pb.WorkerAddress]) -> None:
        self.core = core
        self.attr = attr
        self.size = attr.size
        self.bs = attr.block_size or core.cfg.master.block_size
        self.blocks = {b.offset // self.bs: b for b in blocks}
        self.pool = core.buffer_pool(self.bs)
        self.read_ahead = core.cfg.client.read_ahead_blocks
        self._cache: OrderedDict[int, _Cached] = OrderedDict()
        self._last_end = -1
        self._lock = threading.RLock()
        core.workers.learn(list(workers))

    def pread(self, offset: int, into: memoryview) -> int:
        """Fill into from file offset; returns bytes read (short only at end of file)."""
        with self._lock:
            return self._pread(offset, into)

    def invalidate(self, idx: int) -> None:
        """Slot idx now has another block: drop what was fetched of the old one."""
        with self._lock:
            if idx in self._cache:
                self._evict(idx)

    def _pread(self, offset: int, into: memoryview) -> int:
        if offset >= self.size or len(into) == 0:
            return 0
        total = min(len(into), self.size - offset)
        sequential = offset == self._last_end
        done = 0
        while done < total:
            pos = offset + done
            idx, within = divmod(pos, self.bs)
            n = min(total - done, self.bs - within)
            self._read_slot(idx, within, into[done:done + n], sequential)
            done += n
        self._last_end = offset + total
        return total

    def _read_slot(self, idx: int, within: int, out: memoryview, sequential: bool) -> None:
        block = self.blocks.get(idx)
        if block is None:
            out[:] = bytes(len(out)) if len(out) < 65536 else bytearray(len(out))
            return
        cached = self._cache.get(idx)
        if cached is None and within == 0 and len(out) >= min(self.bs, block.length):
            self._fill(block, 0, out)   # caller wants the whole block: no staging copy
            if sequential:
                self._prefetch(idx + 1)
            return
        if cached is None:
            cached = self._start_fetch(idx)
        if sequential:
            self._prefetch(idx + 1)
        n = cached.future.result()
        have = max(0, min(len(out), n - within))
        out[:have] = cached.view[within:within + have]
        if have < len(out):
            out[have:] = bytes(len(out) - have)

    def _fill(self, block: pb.BlockInfo, within: int, out: memoryview) -> None:
        n = fetch_block(self.core, self.attr.ino, block, within, out)
        if n < len(out):
            out[n:] = bytes(len(out) - n)

    def _start_fetch(self, idx: int) -> _Cached:
        block = self.blocks[idx]
        raw = self.pool.acquire()
        view = memoryview(raw)
        fut = self.core.executor.submit(fetch_block, self.core, self.attr.ino, block, 0, view[:block.length])
        entry = _Cached(raw, view, fut)
        self._cache[idx] = entry
        while len(self._cache) > self.read_ahead + 2:
            self._evict(next(iter(self._cache)))
        return entry

    def _prefetch(self, start: int) -> None:
        for idx in range(start, start + self.read_ahead):
            if idx in self.blocks and idx not in self._cache:
                self._start_fetch(idx)

    def _evict(self, idx: int) -> None:
        entry = self._cache.pop(idx)
        try:
            entry.future.result()
        except BaseException:
            pass
        entry.view.release()
        self.pool.release(entry.raw)  # type: ignore[arg-type]

    def read_all_into(self, into: memoryview, parallel: int = 2) -> int:
        """Read the whole file into `into` (len >= size), fetching `parallel` blocks at once."""
        futures = []
        for idx in range((self.size + self.bs - 1) // self.bs):
            start = idx * self.bs
            out = into[start:min(self.size, start + self.bs)]
            block = self.blocks.get(idx)
            if block is None:
                out[:] = bytearray(len(out))
                continue
            futures.append(self.core.executor.submit(self._fill, block, 0, out))
            if len(futures) >= parallel:
                futures.pop(0).result()
        for f in futures:
            f.result()
        return self.size

    def close(self) -> None:
        with self._lock:
            for idx in list(self._cache):
                self._evict(idx)
