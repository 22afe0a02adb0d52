"""A pool of preallocated, page-aligned buffers for the data path.

Touching fresh memory runs at ~1.2 GB/s on these machines while copying into a
reused buffer runs at ~46 GB/s (BRIEF.md), so block data is always received into,
read into and sent from buffers taken from a pool, never from new ``bytes``.
Buffers are anonymous mmaps (page aligned, usable with O_DIRECT and io_uring).
"""
from __future__ import annotations

import ctypes
import mmap
import platform
import threading
import weakref
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol


# A holder in a request less than this ago is busy, not idle: a KV chunk's payload comes
# as 1 MiB requests back to back, and taking a buffer between two of them (a part-filled
# block shipped early, a fetched block dropped before its next 1 MiB is copied) costs a
# whole block's rewrite or refetch: 32 writers or 128 readers on 16 buffers then thrashed
# (KV write 0.05 GB/s).  A holder that really holds buffers across a wait is idle longer.
IDLE_S = 0.5

# O_DIRECT needs offsets, lengths and buffer addresses on a multiple of the device's
# logical block size: 4 KiB covers every device (512 B or 4 KiB).
ALIGN = 4096


def aligned(view: memoryview) -> bool:
    """Can view go to an O_DIRECT write as it is (writable memory starting on ALIGN)?"""
    if view.readonly or not view.contiguous:
        return False
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(view)) % ALIGN == 0
    except (TypeError, ValueError):
        return False


class Holder(Protocol):
    """Something that keeps pooled buffers between requests (a file's reader cache, a
    writer's part-filled blocks) and can give one back when the pool runs dry."""

    def reclaim(self) -> bool:
        """Give back (or start giving back: a block shipped, its buffer freed when it is on
        its workers) one buffer it is not using (idle for IDLE_S, or a block a reader has
        gone past), without waiting for any lock; False: none can go now."""


@dataclass(frozen=True)
class PoolStats:
    """What the pool holds, for the mount's watchdog and `describe`."""
    size: int
    max_buffers: int
    created: int
    free: int
    waiters: int
    holders: int
    reclaims: int

    def __str__(self) -> str:
        return (f"BufferPool size={self.size} max={self.max_buffers} created={self.created} "
                f"free={self.free} waiters={self.waiters} holders={self.holders} reclaims={self.reclaims}")


class Budget:
    """Bytes of buffers that several pools of one client hold together at most
    (client.buffer_pool_bytes): a mount reading 16 MiB blocks also keeps the 4 MiB pool of
    its windows (client/reader.py), and each pool sized to the whole key held up to twice it.

    A pool that would pass the total first drops buffers the other pools have free (made
    for a block size nobody reads now), then asks their idle holders for one (reclaim).
    Each pool may still make its floor of buffers past it (at least FLOOR: one being
    filled, one shipped): a pool never starves because another holds the whole budget."""

    FLOOR = 2

    def __init__(self, total: int) -> None:
        self.total = total
        self._used = 0
        self._lock = threading.Lock()
        self._pools: weakref.WeakSet[BufferPool] = weakref.WeakSet()

    @property
    def used(self) -> int:
        """Bytes of the buffers the pools have made and not dropped."""
        with self._lock:
            return self._used

    def join(self, pool: BufferPool) -> None:
        with self._lock:
            self._pools.add(pool)

    def take(self, size: int, pool: BufferPool, floor: bool = False) -> bool:
        """Room for a new buffer of pool's: within the total (or under the pool's floor),
        else after dropping a free buffer of another pool; False: no room now."""
        while True:
            with self._lock:
                if floor or self._used + size <= self.total:
                    self._used += size
                    return True
                others = [p for p in self._pools if p is not pool]
            if not any(p.drop_free() for p in others):
                return False

    def give(self, size: int) -> None:
        """A buffer of size was dropped."""
        with self._lock:
            self._used -= size

    def reclaim_elsewhere(self, pool: BufferPool, requester: object | None) -> bool:
        """Ask the other pools' idle holders for a buffer (it goes back to their free list,
        and the next take drops it); True if one gave (or will)."""
        with self._lock:
            others = [p for p in self._pools if p is not pool]
        return any(p.reclaim_own(requester) for p in others)


class BufferPool:
    """Fixed-size buffers, handed out as memoryviews; grows up to max_buffers (and, with a
    budget, while the client's pools together stay within it: Budget).

    When every buffer is out, a waiter does not simply sleep: buffers held between
    requests by idle holders (a fetched block no read pins, a part-filled block of a
    file whose writer is not in a request) are taken back, cheap ones (cached reads)
    first.  So a wait ends whenever anything is idle, and an application that keeps more
    files open part-written than there are buffers (LMCache's put pool) slows down
    instead of hanging.  Holders are kept weakly; a holder's own lock is only ever tried,
    never waited for, so a waiter holding its own file's lock cannot deadlock another.
    """

    RECHECK_S = 0.05   # a waiter asks the holders again this often (one may have gone idle)

    def __init__(self, size: int, max_buffers: int = 64, budget: Budget | None = None,
                 floor: int = 0) -> None:
        self.size = size
        self.max_buffers = max_buffers
        self.budget = budget
        self.floor = max(Budget.FLOOR, floor)   # buffers it may make past a full budget
        self._free: deque[mmap.mmap] = deque()
        self._count = 0
        self._waiters = 0
        self._reclaims = 0
        self._cond = threading.Condition()
        self._cheap: weakref.WeakSet[Holder] = weakref.WeakSet()   # readers: a drop costs a refetch
        self._dear: weakref.WeakSet[Holder] = weakref.WeakSet()    # writers: a spill costs a ship
        if budget is not None:
            budget.join(self)

    def acquire(self, requester: object | None = None) -> mmap.mmap:
        """A buffer, waiting (and reclaiming from idle holders other than requester) if
        none is free and the pool is at its size."""
        while True:
            buf = self.acquire_nowait()
            if buf is not None:
                return buf
            reclaimed = self._reclaim(requester)
            with self._cond:
                if self._free:
                    continue
                self._waiters += 1
                try:
                    self._cond.wait(self.RECHECK_S if not reclaimed else 4 * self.RECHECK_S)
                finally:
                    self._waiters -= 1

    def acquire_nowait(self) -> mmap.mmap | None:
        """A free buffer or a new one (up to max_buffers); None rather than any wait.
        For speculative work (prefetch, read-ahead): skipped when the pool is dry."""
        with self._cond:
            if self._free:
                return self._free.pop()
            if self._count >= self.max_buffers:
                return None
            self._count += 1
            floor = self._count <= self.floor
        if self.budget is not None and not self.budget.take(self.size, self, floor):
            with self._cond:
                self._count -= 1
            return None
        return mmap.mmap(-1, self.size)

    def drop_free(self) -> bool:
        """Unmap one free buffer and give its bytes back to the budget (another pool needs
        the room); False: none free."""
        with self._cond:
            if not self._free:
                return False
            buf = self._free.pop()
            self._count -= 1
        try:
            buf.close()
        except BufferError:   # still viewed somewhere: not really free, keep it
            with self._cond:
                self._free.append(buf)
                self._count += 1
            return False
        if self.budget is not None:
            self.budget.give(self.size)
        return True

    def acquire_or_reclaim(self, requester: object | None = None) -> mmap.mmap | None:
        """A free or new buffer, else one taken back from an idle holder other than
        requester; None rather than any wait.  For a read that can be served without a
        buffer (its range alone, client/reader.py): waiting blocked the mount's request
        slots (the kernel sends a connection at most 12 reads at once), the readers that
        held buffers could not reach them with their next request, looked idle, and had
        their blocks taken back and fetched again whole (issue 43)."""
        buf = self.acquire_nowait()
        if buf is None and self._reclaim(requester):
            buf = self.acquire_nowait()
        return buf

    def share(self) -> int:
        """The buffers each holder may keep for speculative work (read-ahead, prefetch):
        an even split among the holders, at least 1.  96 readers opened at once used to
        prefetch whole files: the first 16 took all 64 buffers and the 80 others found
        none for their reads (issue 43)."""
        with self._cond:
            holders = len(self._cheap) + len(self._dear)
        return max(1, self.max_buffers // max(1, holders))

    def plenty(self) -> bool:
        """More than half the buffers are free or not yet made: speculative work need not
        keep to share() (files held open but not being read are holders too, and would
        leave a lone sequential reader without read-ahead)."""
        with self._cond:
            return len(self._free) + self.max_buffers - self._count > self.max_buffers // 2

    def try_acquire(self) -> mmap.mmap | None:
        """A free (already touched) buffer, or None: never waits, never allocates (the
        mount's event loop: touching fresh memory costs ~3 ms per 4 MiB here)."""
        with self._cond:
            return self._free.pop() if self._free else None

    def release(self, buf: mmap.mmap) -> None:
        with self._cond:
            self._free.append(buf)
            self._cond.notify()

    def hold(self, holder: Holder, cheap: bool) -> None:
        """holder keeps buffers between requests; reclaim() it when the pool runs dry."""
        with self._cond:
            (self._cheap if cheap else self._dear).add(holder)

    def unhold(self, holder: Holder) -> None:
        with self._cond:
            self._cheap.discard(holder)
            self._dear.discard(holder)

    def _reclaim(self, requester: object | None) -> bool:
        """Ask idle holders, cheap ones first, for one buffer, then (a budget full of other
        pools' buffers) the other pools' idle holders; True if one gave (or will)."""
        if self.reclaim_own(requester):
            return True
        return self.budget is not None and self.budget.reclaim_elsewhere(self, requester)

    def reclaim_own(self, requester: object | None) -> bool:
        """Ask this pool's idle holders, cheap ones first, for one buffer."""
        with self._cond:
            holders = [*self._cheap, *self._dear]
        for h in holders:
            if h is not requester and h.reclaim():
                with self._cond:
                    self._reclaims += 1
                return True
        return False

    def stats(self) -> PoolStats:
        with self._cond:
            return PoolStats(self.size, self.max_buffers, self._count, len(self._free), self._waiters,
                             len(self._cheap) + len(self._dear), self._reclaims)

    @contextmanager
    def buffer(self) -> Iterator[memoryview]:
        buf = self.acquire()
        view = memoryview(buf)
        try:
            yield view
        finally:
            view.release()
            self.release(buf)


_new_bytes = None
if platform.python_implementation() == "CPython":
    _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new_bytes.restype = ctypes.py_object
    _new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_BYTES_DATA_OFFSET = bytes.__basicsize__ - 1   # CPython: where ob_sval starts in a bytes object


def fresh_bytes(n: int) -> tuple[bytes, memoryview]:
    """A new, not yet shared ``bytes`` of n bytes and a writable view of its contents.

    ``get_bytes`` must return ``bytes``; receiving into a bytearray and copying it into a
    new bytes object would touch 2 × n fresh bytes (fresh pages fill at ~0.3 GB/s here).
    On CPython the bytes object is allocated uninitialized and filled in place; the caller
    must fill all of it before anyone else sees the object.  Elsewhere: a bytearray.
    """
    if n <= 0 or _new_bytes is None:
        buf = bytearray(n)
        return buf, memoryview(buf)  # type: ignore[return-value]  # the fallback: a bytearray stands in for bytes
    obj = _new_bytes(None, n)
    raw = (ctypes.c_char * n).from_address(id(obj) + _BYTES_DATA_OFFSET)
    return obj, memoryview(raw).cast("B")
