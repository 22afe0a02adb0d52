"""A file's space through the mount: fallocate(2)'s modes and lseek's SEEK_DATA/SEEK_HOLE
(docs/posix.md "Space"), as plain functions over a file's size and block map.

Why apart from vfs.py: these are arithmetic on (size, the slots that hold a block), with
no state of their own; the VFS applies what they decide to the file's writer.

What a block map can say: a file is a map of slots (block index -> block); a slot without a
block is a hole and reads as zeros.  So SEEK_DATA/SEEK_HOLE answer per block (a block is
data all through, even where its bytes are zeros), fallocate's zeroing modes empty the
slots they cover whole (``whole_slots``: the commit's ``holes``, the block freed on the
workers) and write zeros into the part-covered ones that hold a block, and st_blocks
counts the bytes the slots that hold a block hold (``allocated``).
"""
from __future__ import annotations

import errno
import os
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from curvine_py.common.errors import err

KEEP_SIZE = 0x01     # FALLOC_FL_KEEP_SIZE (linux/falloc.h)
PUNCH_HOLE = 0x02    # FALLOC_FL_PUNCH_HOLE
ZERO_RANGE = 0x10    # FALLOC_FL_ZERO_RANGE
SUPPORTED = (0, KEEP_SIZE, PUNCH_HOLE | KEEP_SIZE, ZERO_RANGE, ZERO_RANGE | KEEP_SIZE)
OFF_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class Fallocation:
    """What one fallocate does to a file: bytes [zero_start, zero_end) become zeros, then
    the size becomes size (unchanged when nothing grows)."""

    zero_start: int
    zero_end: int
    size: int


def fallocation(mode: int, offset: int, length: int, size: int) -> Fallocation:
    """The effect of fallocate(mode, offset, length) on a file of size bytes; EOPNOTSUPP for
    the modes the pool does not do (COLLAPSE_RANGE, INSERT_RANGE, UNSHARE_RANGE, a punch
    without KEEP_SIZE, as Linux requires), EINVAL for a bad range, EFBIG past off_t.

    Mode 0 and KEEP_SIZE reserve nothing: no block is written ahead, so a later write can
    still meet a full pool (ENOSPC); mode 0 grows the size, the new bytes a hole."""
    if mode not in SUPPORTED:
        raise err(errno.EOPNOTSUPP, f"fallocate mode {mode:#x} is not supported")
    if offset < 0 or length <= 0:
        raise err(errno.EINVAL, "fallocate needs offset >= 0 and length > 0")
    end = offset + length
    if end > OFF_MAX:
        raise err(errno.EFBIG, "fallocate past the largest file offset")
    grown = size if mode & KEEP_SIZE else max(size, end)
    if mode & (PUNCH_HOLE | ZERO_RANGE):
        return Fallocation(min(offset, size), min(end, size), grown)   # past the size it reads zeros already
    return Fallocation(0, 0, grown)


def pieces(start: int, end: int, block_size: int, most: int) -> Iterator[tuple[int, int]]:
    """[start, end) as (offset, length) pieces of at most most bytes, none across a block."""
    at = start
    while at < end:
        n = min(end - at, most, block_size - at % block_size)
        yield at, n
        at += n


def seek_data(present: Collection[int], size: int, block_size: int, offset: int, whence: int) -> int:
    """lseek(offset, SEEK_DATA or SEEK_HOLE) in a file of size bytes whose slots in present
    hold a block: the first byte at or after offset that is data (or a hole; the end of the
    file counts as one).  ENXIO at or past the end, and for SEEK_DATA when only holes follow."""
    if whence not in (os.SEEK_DATA, os.SEEK_HOLE):
        raise err(errno.EINVAL, f"whence {whence} is neither SEEK_DATA nor SEEK_HOLE")
    if offset < 0:
        raise err(errno.EINVAL, "negative offset")
    if offset >= size:
        raise err(errno.ENXIO, "offset at or past the end of the file")
    want_data = whence == os.SEEK_DATA
    last = (size - 1) // block_size
    idx = offset // block_size
    if want_data:
        after = sorted(i for i in present if idx <= i <= last)
        if not after:
            raise err(errno.ENXIO, "no data after the offset")
        return max(offset, after[0] * block_size)
    while idx <= last and idx in present:
        idx += 1
    return min(size, max(offset, idx * block_size))


def whole_slots(start: int, end: int, size: int, block_size: int) -> range:
    """The slots whose bytes [start, end) covers whole, in a file of size bytes: the last
    slot's bytes end at the size, so a range reaching the end of the file covers it."""
    first = -(-start // block_size)
    last = min(end, size) // block_size if min(end, size) < size else -(-size // block_size)
    return range(first, max(first, last))


def allocated(present: Collection[int], size: int, block_size: int) -> int:
    """The bytes the slots in present hold in a file of size bytes (each whole, the last up
    to the size): Attr.allocated as a writer sees its unflushed file."""
    return sum(min(block_size, size - i * block_size) for i in present if i * block_size < size)
