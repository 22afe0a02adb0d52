"""fallocate(2) and lseek's SEEK_DATA/SEEK_HOLE through the mount (issue 41; docs/posix.md
"Space"): the patched pyfuse3's handlers (deploy/pyfuse3.patch) onto the VFS
(client/vfsspace.py).  A zeroed range reads as zeros through this mount at once and through
another mount after the close; a hole is reported where the file's block map has no block.
"""
from __future__ import annotations

import ctypes
import errno
import os

import pyfuse3
import pytest

from tests.posix.conftest import Mount

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(pyfuse3, "locks_enabled"), reason="stock pyfuse3: no fallocate handler")]

MiB = 1 << 20
BS = 4 * MiB   # the pool's default block size (master.block_size)
KEEP_SIZE, PUNCH_HOLE, COLLAPSE_RANGE, ZERO_RANGE, INSERT_RANGE = 0x01, 0x02, 0x08, 0x10, 0x20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """fallocate(2) with any mode (os.posix_fallocate has mode 0 only)."""
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def pattern(n: int, seed: int = 1) -> bytes:
    return (bytes(range(seed, seed + 251)) * (n // 251 + 1))[:n]


def test_modes_change_size_and_bytes_as_on_ext4(mounted: Mount, second_mount: Mount) -> None:
    name = f"falloc-{os.urandom(3).hex()}"
    a, b = mounted.path / name, second_mount.path / name
    data = pattern(3 * BS)
    a.write_bytes(data)
    want = bytearray(data)
    fd = os.open(a, os.O_RDWR)
    try:
        fallocate(fd, 0, 0, 100)                              # inside the file: nothing changes
        fallocate(fd, KEEP_SIZE, 3 * BS, 5 * MiB)             # past the end, size kept
        assert os.fstat(fd).st_size == 3 * BS
        fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 1000, 2 * BS + 5000)   # a part of block 0, all of 1, a part of 2
        want[1000:2 * BS + 6000] = bytes(2 * BS + 5000)
        fallocate(fd, ZERO_RANGE | KEEP_SIZE, 2 * BS + 10007, 100)
        want[2 * BS + 10007:2 * BS + 10107] = bytes(100)
        fallocate(fd, ZERO_RANGE, 3 * BS - 10, 30)            # across the end: grows by 20
        want[3 * BS - 10:] = bytes(10)
        want += bytes(20)
        assert os.fstat(fd).st_size == len(want)
        assert os.pread(fd, len(want) + 10, 0) == bytes(want)   # this mount, before the close
        fallocate(fd, 0, len(want), MiB)                      # mode 0 past the end: grows, reads zeros
        want += bytes(MiB)
        assert os.fstat(fd).st_size == len(want)
        for mode in (PUNCH_HOLE, COLLAPSE_RANGE, INSERT_RANGE):   # punch needs KEEP_SIZE (Linux's rule)
            with pytest.raises(OSError) as e:
                fallocate(fd, mode, 0, BS)
            assert e.value.errno == errno.EOPNOTSUPP, mode
        with pytest.raises(OSError) as e:
            fallocate(fd, 0, 0, 0)
        assert e.value.errno == errno.EINVAL
    finally:
        os.close(fd)
    assert a.read_bytes() == bytes(want)
    assert b.read_bytes() == bytes(want)                      # another mount, after the close
    ro = os.open(a, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            fallocate(ro, 0, 0, 10)
        assert e.value.errno == errno.EBADF
    finally:
        os.close(ro)


def test_seek_data_and_hole_follow_the_block_map(mounted: Mount, second_mount: Mount) -> None:
    """A sparse file: data in blocks 1 and 3 of 5 (the tail of the size a hole)."""
    name = f"sparse-{os.urandom(3).hex()}"
    a, b = mounted.path / name, second_mount.path / name
    fd = os.open(a, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.pwrite(fd, b"x" * 10, BS + 5)
        os.pwrite(fd, b"y" * 10, 3 * BS)
        os.ftruncate(fd, 5 * BS)
        # while this mount writes it: its writer's map
        assert os.lseek(fd, 0, os.SEEK_DATA) == BS
        assert os.lseek(fd, BS + 100, os.SEEK_HOLE) == 2 * BS
        assert os.lseek(fd, 2 * BS, os.SEEK_DATA) == 3 * BS
        assert os.lseek(fd, 3 * BS, os.SEEK_HOLE) == 4 * BS
        with pytest.raises(OSError) as e:
            os.lseek(fd, 4 * BS, os.SEEK_DATA)                # only a hole follows
        assert e.value.errno == errno.ENXIO
    finally:
        os.close(fd)
    fd = os.open(b, os.O_RDONLY)                               # another mount: the committed map
    try:
        assert [os.lseek(fd, 0, os.SEEK_DATA), os.lseek(fd, BS, os.SEEK_HOLE)] == [BS, 2 * BS]
        assert os.lseek(fd, 4 * BS - 1, os.SEEK_HOLE) == 4 * BS
        assert os.lseek(fd, 0, os.SEEK_HOLE) == 0
        with pytest.raises(OSError) as e:
            os.lseek(fd, 5 * BS, os.SEEK_HOLE)                # at the end
        assert e.value.errno == errno.ENXIO
        assert os.pread(fd, 20, BS) == bytes(5) + b"x" * 10 + bytes(5)
    finally:
        os.close(fd)
    # a punch over a hole leaves it a hole (no block of zeros is written there)
    fd = os.open(a, os.O_RDWR)
    try:
        fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 0, BS)
        fallocate(fd, ZERO_RANGE | KEEP_SIZE, 4 * BS, BS)
        assert os.lseek(fd, 0, os.SEEK_DATA) == BS
        with pytest.raises(OSError) as e:
            os.lseek(fd, 4 * BS, os.SEEK_DATA)
        assert e.value.errno == errno.ENXIO
    finally:
        os.close(fd)
