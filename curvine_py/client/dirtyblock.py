"""A dirty block: a block's bytes written by this client and not shipped yet.

The writer (client/writer.py) keeps one per block slot being written: a buffer, the
sorted, merged byte ranges written into it, and the *records* of those writes, which let
the bytes shipped be checked against the bytes the writes handed over (``verify``).
Every byte an acknowledged write put here is vouched for by exactly one record: either
the running xxh3 of the writes that came in order from the block's start (the KV chunk's
case: the shipped bytes get the same hash anyway, so checking it costs nothing) or the
xxh3 of a write that came anywhere else.  A byte the kernel was told is written that is
not in what the workers stored is then a failed close, never a commit.
"""
from __future__ import annotations

import mmap
from dataclasses import dataclass, field

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


@dataclass(frozen=True)
class Verdict:
    """What DirtyBlock.verify found.  lost: ranges (in the block) whose acknowledged bytes
    the buffer no longer holds: nothing can send them again.  resend: the buffer holds
    them all, but the bytes that went out were other bytes (sent again, from the buffer)."""
    resend: bool = False
    lost: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.resend and not self.lost


class DirtyBlock:
    """A block's bytes written here and not shipped yet, with the sorted, merged ranges
    written into it and the records of the writes (module docstring).

    It starts as a small private buffer (SMALL bytes) and takes a block-sized pooled one
    only when a write reaches past that: LMCache opens every chunk of a prompt and writes
    each one's 28-byte header before any payload, and a pooled block per header let 16
    (or 64) open files take every buffer while the payload writes that would free them
    waited for one (docs/architecture.md, "Bounded buffers")."""

    __slots__ = ("pool", "raw", "view", "ranges", "streamable", "_seq", "_seq_end", "_sums")

    def __init__(self, pool: BufferPool, raw: mmap.mmap | None = None) -> None:
        self.pool = pool
        self.raw = raw               # the pooled buffer, once it has one
        # Small or pooled, the memory is page-aligned (an anonymous mmap), so a short last
        # block still goes to a local replica with O_DIRECT (client/localwrite.py).
        self.view = memoryview(raw if raw is not None else mmap.mmap(-1, SMALL))
        self.ranges: list[list[int]] = []
        self.streamable = True   # False once a stream of it was dropped: rewritten in place
        # The records: [0, _seq_end) by the running xxh3 of the in-order writes (None once a
        # write went back into that range), everything else by (start, end, xxh3).
        self._seq: xxhash.xxh3_64 | None = xxhash.xxh3_64()
        self._seq_end = 0
        self._sums: list[tuple[int, int, int]] = []

    def records(self) -> list[tuple[int, int]]:
        """The ranges acknowledged writes put here, sorted (what verify checks)."""
        seq = [(0, self._seq_end)] if self._seq is not None and self._seq_end else []
        return sorted(seq + [(a, b) for a, b, _ in self._sums])

    def in_order(self, length: int) -> bool:
        """Did the writes come in order from the block's start up to exactly length (a
        stream's block: its sent bytes' hash alone checks them)?"""
        return self._seq is not None and self._seq_end == length and not self._sums

    def verify(self, data: memoryview, sent: int) -> Verdict:
        """Check data -- the first len(data) bytes of this buffer, shipped as the block,
        whose xxh3 the workers confirmed as `sent` -- against the records.  In-order
        writes covering exactly data cost nothing more: their running hash must equal
        `sent`.  Otherwise each record's range of data is hashed, and so is data itself
        (the bytes that went out may differ from the buffer's now)."""
        if self.in_order(len(data)):
            assert self._seq is not None
            if sent == self._seq.intdigest():
                return Verdict()
            whole = xxhash.xxh3_64_intdigest(data) == self._seq.intdigest()
            return Verdict(resend=whole, lost=[] if whole else [(0, len(data))])
        lost = []
        if self._seq is not None and self._seq_end and (
                self._seq_end > len(data)
                or xxhash.xxh3_64_intdigest(data[:self._seq_end]) != self._seq.intdigest()):
            lost.append((0, self._seq_end))
        for a, b, h in self._sums:
            if b > len(data) or xxhash.xxh3_64_intdigest(data[a:b]) != h:
                lost.append((a, b))
        return Verdict(resend=not lost and xxhash.xxh3_64_intdigest(data) != sent, lost=sorted(lost))

    def _forget(self, start: int, end: int) -> None:
        """The records of bytes in [start, end) go (rewritten, or cut off); what they
        vouched for outside that range gets a record of its own, hashed from the buffer
        (a write back into earlier writes: rare, and never the KV chunk's case)."""
        kept: list[tuple[int, int]] = []
        if self._seq is not None and start < self._seq_end:
            kept += [(0, start), (end, self._seq_end)]
            self._seq = None
        sums = []
        for a, b, h in self._sums:
            if b <= start or a >= end:
                sums.append((a, b, h))
            else:
                kept += [(a, start), (end, b)]
        self._sums = sums + [(a, b, xxhash.xxh3_64_intdigest(self.view[a:b])) for a, b in kept if a < b]

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
        """Copy an acknowledged write in and record it (hashed from data, the bytes handed
        over, not from the buffer)."""
        end = within + len(data)
        assert end <= len(self.view), "room() first"
        self._forget(within, end)
        self.view[within:end] = data
        self.ranges = merge_ranges(self.ranges + [[within, end]])
        if self._seq is not None and within == self._seq_end:
            self._seq.update(data)
            self._seq_end = end
        else:
            self._sums.append((within, end, xxhash.xxh3_64_intdigest(data)))

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
        self._forget(length, max(length, len(self.view)))
        self.ranges = [[a, min(b, length)] for a, b in self.ranges if a < length]
