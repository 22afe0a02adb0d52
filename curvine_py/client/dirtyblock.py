"""A dirty block: a block's bytes written by this client and not shipped yet.

The writer (client/writer.py) keeps one per block slot being written: a buffer plus the
sorted, merged byte ranges written into it, and the xxh3 of the bytes as they came in
order from the block's start (what a streamed or shipped block must hash to).
"""
from __future__ import annotations

import mmap

import xxhash

from curvine_py.common.buffers import BufferPool

SMALL = 64 << 10       # a dirty block's bytes are kept outside the pool until a write passes this


def ranges_cover(ranges: list[list[int]], length: int) -> bool:
    """Do merged ranges cover [0, length)?"""
    return bool(ranges) and ranges[0][0] == 0 and ranges[0][1] >= length


def merge_ranges(ranges: list[list[int]]) -> list[list[int]]:
    """Sorted, merged [start, end) ranges (touching ranges join)."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def written_prefix(ranges: list[list[int]]) -> int:
    """How many bytes from the block's start are written without a gap."""
    return ranges[0][1] if ranges and ranges[0][0] == 0 else 0


class DirtyBlock:
    """A block's bytes written here and not shipped yet, with the sorted, merged ranges
    written into it.

    It starts as a small private buffer (SMALL bytes) and takes a block-sized pooled one
    only when a write reaches past that: LMCache opens every chunk of a prompt and writes
    each one's 28-byte header before any payload, and a pooled block per header let 16
    (or 64) open files take every buffer while the payload writes that would free them
    waited for one (docs/architecture.md, "Bounded buffers")."""

    __slots__ = ("pool", "raw", "view", "ranges", "streamable", "_seq", "_seq_end")

    def __init__(self, pool: BufferPool, raw: mmap.mmap | None = None) -> None:
        self.pool = pool
        self.raw = raw               # the pooled buffer, once it has one
        # Small or pooled, the memory is page-aligned (an anonymous mmap), so a short last
        # block still goes to a local replica with O_DIRECT (client/localwrite.py).
        self.view = memoryview(raw if raw is not None else mmap.mmap(-1, SMALL))
        self.ranges: list[list[int]] = []
        self.streamable = True   # False once a stream of it was dropped: rewritten in place
        # The xxh3 of the bytes as the writes handed them over, while they come in order
        # from the block's start (the KV chunk's case): what is shipped must hash the same.
        self._seq: xxhash.xxh3_64 | None = xxhash.xxh3_64()
        self._seq_end = 0

    def digest(self, length: int) -> int | None:
        """The xxh3 the block's first length bytes must have, as written; None when the
        writes did not come in order from the start up to exactly there."""
        return self._seq.intdigest() if self._seq is not None and self._seq_end == length else None

    def unordered(self) -> None:
        """Bytes went into the buffer other than by an in-order write: no digest."""
        self._seq = None

    @property
    def pooled(self) -> bool:
        return self.raw is not None

    def room(self, end: int, raw: mmap.mmap | None) -> None:
        """Make the buffer hold bytes up to end: past SMALL, move into raw, a pooled buffer
        the caller took (FileWriter._room, or try_pwrite's plan); raw goes back to the pool
        when it is not needed."""
        if end <= len(self.view):
            if raw is not None:
                self.pool.release(raw)
            return
        assert raw is not None, f"a dirty block needs a pooled buffer for {end} bytes"
        small, self.raw, self.view = self.view, raw, memoryview(raw)
        self.view[:len(small)] = small
        small.release()

    def write(self, within: int, data: memoryview) -> None:
        end = within + len(data)
        assert end <= len(self.view), "room() first"
        self.view[within:end] = data
        self.ranges = merge_ranges(self.ranges + [[within, end]])
        if self._seq is not None:
            if within == self._seq_end:
                self._seq.update(data)
                self._seq_end = end
            else:
                self._seq = None

    def release(self) -> None:
        """Give the memory back (to the pool when it came from there)."""
        self.view.release()
        if self.raw is not None:
            self.pool.release(self.raw)
            self.raw = None

    def covers(self, length: int) -> bool:
        return ranges_cover(self.ranges, length)

    def gaps(self, length: int) -> list[tuple[int, int]]:
        out, pos = [], 0
        for a, b in self.ranges:
            if a > pos:
                out.append((pos, min(a, length)))
            pos = max(pos, b)
        if pos < length:
            out.append((pos, length))
        return [(a, b) for a, b in out if a < b]

    def clip(self, length: int) -> None:
        """Forget bytes at or past length (truncate inside this block)."""
        self.ranges = [[a, min(b, length)] for a, b in self.ranges if a < length]
        self._seq = None
