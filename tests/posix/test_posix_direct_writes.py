"""Files created write-only through the mount are written past the kernel page cache
(``fuse.direct_io_creates``, on by default).  Every byte is checked, in particular
through another descriptor of the same file that reads through the page cache while the
creator is still writing: the kernel must drop the pages a direct write changes."""
from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20


def test_kv_chunk_written_in_one_call_then_renamed(d: Path) -> None:
    """LMCache's pattern: `<name>.tmp` opened "wb", a 28-byte header, the payload in one
    write, close, rename to `<name>.data`."""
    header, payload = os.urandom(28), os.urandom(14 * MiB)
    with open(d / "c.tmp", "wb") as f:
        f.write(header)
        f.write(payload)
    os.rename(d / "c.tmp", d / "c.data")
    assert (d / "c.data").read_bytes() == header + payload


def test_unaligned_and_out_of_order_writes(d: Path) -> None:
    data = bytearray(os.urandom(9 * MiB + 4321))
    fd = os.open(d / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        for off, n in ((5 * MiB + 3, 2 * MiB), (0, 7), (7, 5 * MiB - 4), (7 * MiB + 3, len(data) - 7 * MiB - 3)):
            assert os.pwrite(fd, data[off:off + n], off) == n
        os.pwrite(fd, b"xyz", 4 * MiB - 1)        # across a block boundary, over written bytes
        data[4 * MiB - 1:4 * MiB + 2] = b"xyz"
    finally:
        os.close(fd)
    assert (d / "f").read_bytes() == bytes(data)


def test_a_reader_through_the_page_cache_sees_each_direct_write(d: Path) -> None:
    """Another descriptor reads (and so caches) a range, the creator overwrites it with a
    direct write, the reader reads it again: the new bytes, not its cached pages."""
    w = os.open(d / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        os.pwrite(w, b"a" * (2 * MiB), 0)
        r = os.open(d / "f", os.O_RDONLY)
        try:
            assert os.pread(r, MiB, 0) == b"a" * MiB
            os.pwrite(w, b"b" * 4096, 8192)
            assert os.pread(r, 3 * 4096, 4096) == b"a" * 4096 + b"b" * 4096 + b"a" * 4096
            os.pwrite(w, b"c" * 10, 2 * MiB)          # grows the file
            assert os.pread(r, 20, 2 * MiB - 5) == b"a" * 5 + b"c" * 10
        finally:
            os.close(r)
    finally:
        os.close(w)
    assert (d / "f").read_bytes() == b"a" * 8192 + b"b" * 4096 + b"a" * (2 * MiB - 12288) + b"c" * 10


def test_read_write_creates_keep_the_page_cache(d: Path) -> None:
    """Only write-only creates go direct: a file created for reading and writing can be
    mmapped shared while it is open (a direct descriptor could not: ENODEV)."""
    with open(d / "rw", "w+b") as f:
        f.write(os.urandom(MiB))
        f.flush()
        with mmap.mmap(f.fileno(), 0) as m:
            m[:5] = b"hello"
    assert (d / "rw").read_bytes()[:5] == b"hello"
    with open(d / "wo", "wb") as f:
        f.write(b"x" * 4096)
        f.flush()
        with pytest.raises(OSError) as e:        # what any write-only descriptor gets
            mmap.mmap(f.fileno(), 4096)
        assert e.value.errno == errno.EACCES


def test_append_truncate_and_fsync_on_a_direct_descriptor(d: Path) -> None:
    """O_APPEND writes land at the end the kernel knows (it updates the size after each
    direct write); ftruncate and fsync work on the write-only descriptor."""
    parts = [os.urandom(n) for n in (10, MiB + 7, 3 * MiB, 5)]
    fd = os.open(d / "log", os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_APPEND, 0o644)
    try:
        for p in parts:
            assert os.write(fd, p) == len(p)
        os.fsync(fd)
        assert os.fstat(fd).st_size == sum(map(len, parts))
        os.ftruncate(fd, MiB)
        assert os.write(fd, b"tail") == 4
    finally:
        os.close(fd)
    assert (d / "log").read_bytes() == (b"".join(parts))[:MiB] + b"tail"
