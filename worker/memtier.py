"""The memory tier: recently written blocks kept in RAM, in front of their disk files.

Blocks are written to disk with O_DIRECT (docs/worker.md: a fresh page-cache page is the
costliest part of a buffered write here), so without this a block read right after it
was written (the KV cache's case: one node writes a chunk, another reads it) came from
the device. A write whose block fits a buffer of the tier receives its pieces straight
into that block-sized buffer instead of the piece ring: the disk write and the forward
to the next replica go from there, and at commit the buffer is kept as the block's
memory copy. No byte is copied to fill the tier. Reads of a kept block are sent from
memory (``MemoryReader``); they are not verified against the chunk sums again (the bytes
were hashed as they arrived, and a kept buffer is never written again).

Memory is bounded by ``worker.memory_cache_mb``: when a new write needs room, the least
recently used kept blocks that nobody is reading are dropped (their disk copy stays) and
their buffers reused. A write that finds no room is written through the ring, uncached.
A deleted or corrupt block is dropped at once (readers already sending it finish first).
"""
from __future__ import annotations

import mmap
import threading
from collections import OrderedDict
from typing import Iterator


PAGE = 4096


class BlockBuffer:
    """A block-sized buffer: being filled by one write, then (if kept) read by many."""

    __slots__ = ("raw", "view", "size", "length", "readers", "dropped")

    def __init__(self, raw: mmap.mmap) -> None:
        self.raw = raw
        self.view = memoryview(raw)
        self.size = len(raw)
        self.length = 0          # the block's bytes (set when kept)
        self.readers = 0         # MemoryReaders sending from it
        self.dropped = False     # no longer in the tier: freed when the last reader closes


class MemoryTier:
    """Thread-safe.  capacity: bytes of buffers at most (0: the tier is off)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._kept: OrderedDict[int, BlockBuffer] = OrderedDict()   # block id -> buffer, LRU first
        self._free: dict[int, list[mmap.mmap]] = {}                 # size -> unused buffers
        self._allocated = 0      # bytes of every buffer that exists (kept, writing, free, read)
        self.hits = 0            # reads served from memory
        self.kept_bytes = 0      # bytes of the kept blocks

    # ------------------------------------------------------------ writes

    def reserve(self, length_hint: int) -> BlockBuffer | None:
        """A buffer for a block of up to length_hint bytes, or None (tier off or full of
        blocks being read or written: the write goes through the ring, uncached)."""
        size = -(-max(length_hint, 1) // PAGE) * PAGE
        if size > self.capacity:
            return None
        with self._lock:
            free = self._free.get(size)
            if free:
                return BlockBuffer(free.pop())
            while self._allocated + size > self.capacity:
                if not self._evict_one():
                    return None
            self._allocated += size
        try:
            return BlockBuffer(mmap.mmap(-1, size))
        except OSError:
            with self._lock:
                self._allocated -= size
            return None

    def keep(self, block_id: int, buf: BlockBuffer, length: int) -> None:
        """The write of block_id committed from buf: keep it as the block's memory copy."""
        buf.length = length
        with self._lock:
            old = self._kept.pop(block_id, None)
            if old is not None:
                self._retire(old)
            self._kept[block_id] = buf
            self.kept_bytes += length

    def give_back(self, buf: BlockBuffer) -> None:
        """A write that did not commit from buf (failed, or outgrew it): reuse the buffer.
        The caller has waited for the disk writes that read from it."""
        with self._lock:
            self._free_buffer(buf)

    # ------------------------------------------------------------ reads

    def open(self, block_id: int) -> BlockBuffer | None:
        """The kept copy of block_id, pinned until close(); None when not in memory."""
        with self._lock:
            buf = self._kept.get(block_id)
            if buf is None:
                return None
            self._kept.move_to_end(block_id)
            buf.readers += 1
            self.hits += 1
            return buf

    def close(self, buf: BlockBuffer) -> None:
        with self._lock:
            buf.readers -= 1
            if buf.readers == 0 and buf.dropped:
                self._free_buffer(buf)

    # ------------------------------------------------------------ removal

    def drop(self, block_id: int) -> None:
        """block_id was deleted (or found corrupt): forget its memory copy."""
        with self._lock:
            buf = self._kept.pop(block_id, None)
            if buf is not None:
                self._retire(buf)

    def usage(self) -> tuple[int, int, int]:
        """(blocks kept, bytes kept, bytes of buffers allocated)."""
        with self._lock:
            return len(self._kept), self.kept_bytes, self._allocated

    def _evict_one(self) -> bool:
        """Drop the least recently used block nobody reads, or a free buffer of another
        size; False when there is none.  Caller holds the lock."""
        for size, bufs in self._free.items():
            if bufs:
                _unmap(bufs.pop())
                self._allocated -= size
                return True
        for bid, buf in self._kept.items():
            if buf.readers == 0:
                del self._kept[bid]
                self.kept_bytes -= buf.length
                _unmap(buf.raw)
                self._allocated -= buf.size
                return True
        return False

    def _retire(self, buf: BlockBuffer) -> None:
        """buf left the kept set; caller holds the lock."""
        self.kept_bytes -= buf.length
        buf.dropped = True
        if buf.readers == 0:
            self._free_buffer(buf)

    def _free_buffer(self, buf: BlockBuffer) -> None:
        self._free.setdefault(buf.size, []).append(buf.raw)


def _unmap(raw: mmap.mmap) -> None:
    try:
        raw.close()
    except BufferError:
        pass   # a view of it is still alive somewhere: the mapping goes with the last one


class MemoryReader:
    """The BlockReader interface (length, checksum, pieces, close) over a kept buffer; the
    range is the caller's, already checked and clamped to the block (BlockStore.open_reader)."""

    def __init__(self, tier: MemoryTier, buf: BlockBuffer, offset: int, length: int,
                 checksum: int, piece_size: int) -> None:
        self.tier, self.buf = tier, buf
        self.offset = offset
        self.length = length
        self.checksum = checksum
        self.piece_size = piece_size
        self._closed = False

    def __enter__(self) -> "MemoryReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[memoryview]:
        end = self.offset + self.length
        for at in range(self.offset, end, self.piece_size):
            yield self.buf.view[at:min(end, at + self.piece_size)]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.tier.close(self.buf)
