"""Reads through a mount with ``fuse.direct_io_reads``: read-only opens of complete files
bypass the page cache and the mount replies with views into its block cache (pinned
until the kernel copied them).  Every byte is checked; the shared-mmap limitation the
option brings (docs/config.md) is asserted so that a libfuse that lifts it is noticed."""
from __future__ import annotations

import mmap
import os
import random
import threading
from pathlib import Path

import pytest
from pyfuse3_features import needs_direct_io_mmap

pytestmark = pytest.mark.timeout(180)

MOUNT_FLAGS = ("--fuse-direct-io-reads", "true")
MiB = 1 << 20
BS = 4 * MiB
KV = 14 * MiB + 28   # an LMCache chunk: 28-byte header + 14 MiB tensor


def kv_read(p: Path, size: int) -> bytes:
    """The KV reader's pattern: open, read 4 KiB, read the rest in one call."""
    buf = bytearray(size)
    view = memoryview(buf)
    with open(p, "rb", buffering=0) as f:
        got = f.readinto(view[:4096])
        while got < size:
            n = f.readinto(view[got:])
            assert n, f"short read at {got} of {size}"
            got += n
        assert f.read(1) == b""
    return bytes(buf)


def test_kv_chunks_written_on_one_mount_read_on_another(d: Path, second_mount) -> None:
    other = second_mount.path / d.name
    datas = [os.urandom(KV) for _ in range(3)]
    for i, data in enumerate(datas):
        (other / f"c{i}.tmp").write_bytes(data)
        os.rename(other / f"c{i}.tmp", other / f"c{i}.data")
    for i, data in enumerate(datas):
        assert kv_read(d / f"c{i}.data", KV) == data
        assert kv_read(d / f"c{i}.data", KV) == data   # a second open of the same file


def test_ranges_across_block_boundaries(d: Path) -> None:
    data = os.urandom(3 * BS + 12345)
    (d / "f").write_bytes(data)
    fd = os.open(d / "f", os.O_RDONLY)
    try:
        for off, n in ((BS - 100, MiB), (BS - 1, 2), (2 * BS - 4096, 3 * MiB), (3 * BS - 7, 12352),
                       (0, len(data)), (len(data) - 10, 100)):
            assert os.pread(fd, n, off) == data[off:off + n], (off, n)
    finally:
        os.close(fd)


def test_concurrent_random_reads_of_one_open_file(d: Path) -> None:
    """Many threads share one descriptor: blocks are fetched, pinned, evicted and reused
    (the file is larger than the reader's block cache) while replies are in flight."""
    data = os.urandom(10 * BS + 333)
    (d / "f").write_bytes(data)
    fd = os.open(d / "f", os.O_RDONLY)
    errors: list[str] = []

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(60):
            off = rnd.randrange(len(data))
            n = rnd.choice((1, 4096, MiB, 2 * MiB + 5))
            got = os.pread(fd, n, off)
            if got != data[off:off + n]:
                errors.append(f"pread({n}, {off}) returned wrong bytes")
    try:
        threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        os.close(fd)
    assert not errors, errors[:3]


def test_a_file_written_here_reads_its_new_bytes(d: Path) -> None:
    """A reader opened while this mount writes the file is not direct (the file is not
    complete); one opened after the close is, and sees the new version."""
    p = d / "f"
    p.write_bytes(b"a" * (BS + 10))
    with open(p, "r+b", buffering=0) as w:
        w.write(b"b" * 100)
        with open(p, "rb", buffering=0) as r:
            assert r.read(200) == b"b" * 100 + b"a" * 100
    assert kv_read(p, BS + 10) == b"b" * 100 + b"a" * (BS - 90)
    p.write_bytes(b"c" * 5000)   # rewritten: a new open reads the new bytes, not the block cache
    assert p.read_bytes() == b"c" * 5000


@needs_direct_io_mmap
def test_private_and_shared_mmaps_of_a_direct_read_work(d: Path) -> None:
    """The mount asks the kernel for FUSE_DIRECT_IO_ALLOW_MMAP (deploy/pyfuse3.patch): a
    shared mmap of a file opened with direct I/O (numpy memmap, safetensors) works
    instead of failing with ENODEV."""
    data = os.urandom(2 * MiB + 3)
    (d / "f").write_bytes(data)
    with open(d / "f", "rb") as f:
        with mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ) as m:
            assert m[:] == data
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
            assert m[:] == data
            assert os.pread(f.fileno(), 100, MiB) == data[MiB:MiB + 100]   # read() beside it
    with open(d / "f", "r+b") as f, mmap.mmap(f.fileno(), 0) as m:   # opened for writing: page cache
        assert m[:10] == data[:10]
