"""File data through the kernel mount: offsets, append, truncate, sparse, sync, mmap, O_DIRECT."""
from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from tests.posix.conftest import Mount, block_ids, deletions_delivered, wait_deleted

MiB = 1 << 20
BS = 4 * MiB

pytestmark = pytest.mark.timeout(120)


def raises_errno(code: int, fn, *args) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OSError) as info:
        fn(*args)
    assert info.value.errno == code, f"expected {errno.errorcode[code]}, got {info.value!r}"


def pattern(n: int, seed: int = 1) -> bytes:
    """Bytes that differ at every offset (a misplaced range is caught)."""
    block = bytes((i * 131 + seed * 7 + (i >> 8)) & 0xFF for i in range(65536))
    return (block * (n // 65536 + 1))[:n]


def read_all(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_create_write_read_round_trip(d: Path) -> None:
    data = pattern(3 * MiB + 12345)
    (d / "f").write_bytes(data)
    assert os.stat(d / "f").st_size == len(data)
    assert read_all(d / "f") == data
    assert (d / "empty").write_bytes(b"") == 0
    assert os.stat(d / "empty").st_size == 0 and read_all(d / "empty") == b""


def test_pwrite_at_any_offset_overwrites_in_place(d: Path) -> None:
    model = bytearray(pattern(10 * MiB, 3))
    p = d / "f"
    p.write_bytes(model)
    fd = os.open(p, os.O_RDWR)
    try:
        for off, n in [(0, 10), (BS - 5, 10), (BS, 1), (2 * BS + 100, MiB), (10 * MiB - 1, 1), (777, 3 * BS // 2)]:
            chunk = os.urandom(n)
            assert os.pwrite(fd, chunk, off) == n
            model[off:off + n] = chunk
            assert os.pread(fd, n, off) == chunk   # read-your-writes before close
    finally:
        os.close(fd)
    assert os.stat(p).st_size == len(model)
    assert read_all(p) == bytes(model)


def test_write_past_end_leaves_a_zero_filled_hole(d: Path) -> None:
    p = d / "sparse"
    fd = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.pwrite(fd, b"head", 0)
        os.pwrite(fd, b"tail", 9 * MiB + 3)
    finally:
        os.close(fd)
    data = read_all(p)
    assert len(data) == 9 * MiB + 7
    assert data[:4] == b"head" and data[-4:] == b"tail"
    assert data[4:-4] == bytes(len(data) - 8)
    with open(p, "rb") as f:   # a read inside the hole
        f.seek(6 * MiB)
        assert f.read(100) == bytes(100)


def test_lseek_then_write_into_the_middle_of_a_block(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"a" * 100)
    with open(p, "r+b") as f:
        f.seek(40)
        f.write(b"XYZ")
    assert read_all(p) == b"a" * 40 + b"XYZ" + b"a" * 57


def test_o_append_always_writes_at_the_end(d: Path) -> None:
    p = d / "log"
    p.write_bytes(b"0123")
    fd = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, b"ab")
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"cd")
        os.pwrite(fd, b"ef", 0)   # Linux: pwrite on O_APPEND appends too
    finally:
        os.close(fd)
    assert read_all(p) == b"0123abcdef"


def test_two_append_descriptors_interleave_without_loss(d: Path) -> None:
    p = d / "log"
    a = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
    b = os.open(p, os.O_WRONLY | os.O_APPEND)
    try:
        for i in range(20):
            os.write(a if i % 2 else b, b"%02d" % i)
    finally:
        os.close(a)
        os.close(b)
    assert read_all(p) == b"".join(b"%02d" % i for i in range(20))


def test_o_trunc_empties_an_existing_file(d: Path) -> None:
    p = d / "f"
    p.write_bytes(pattern(5 * MiB))
    fd = os.open(p, os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.fstat(fd).st_size == 0
        os.write(fd, b"new")
    finally:
        os.close(fd)
    assert read_all(p) == b"new"


def test_o_rdonly_with_o_trunc_truncates_as_on_ext4(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"abc")
    fd = os.open(p, os.O_RDONLY | os.O_TRUNC)   # Linux truncates (and requires write permission)
    try:
        assert os.read(fd, 10) == b""
    finally:
        os.close(fd)
    assert os.stat(p).st_size == 0


def test_o_excl_of_an_existing_name_is_eexist(d: Path) -> None:
    p = d / "f"
    os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    raises_errno(errno.EEXIST, os.open, p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.mkdir(d / "sub")
    raises_errno(errno.EEXIST, os.open, d / "sub", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    os.symlink("dangling-target", d / "link")   # O_EXCL does not follow a symlink
    raises_errno(errno.EEXIST, os.open, d / "link", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)


def test_open_errors(d: Path) -> None:
    raises_errno(errno.ENOENT, os.open, d / "missing", os.O_RDONLY)
    raises_errno(errno.ENOENT, os.open, d / "nodir" / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    (d / "file").write_bytes(b"x")
    raises_errno(errno.ENOTDIR, os.open, d / "file" / "f", os.O_CREAT | os.O_WRONLY, 0o644)
    os.mkdir(d / "dir")
    raises_errno(errno.EISDIR, os.open, d / "dir", os.O_WRONLY)
    raises_errno(errno.ENOTDIR, os.open, d / "file", os.O_RDONLY | os.O_DIRECTORY)
    dfd = os.open(d / "dir", os.O_RDONLY)
    try:
        raises_errno(errno.EISDIR, os.read, dfd, 10)
    finally:
        os.close(dfd)
    fd = os.open(d / "file", os.O_RDONLY)
    try:
        raises_errno(errno.EBADF, os.write, fd, b"y")
    finally:
        os.close(fd)
    fd = os.open(d / "file", os.O_WRONLY)
    try:
        raises_errno(errno.EBADF, os.read, fd, 1)
    finally:
        os.close(fd)


def test_truncate_grows_with_zeros_and_shrinks(d: Path) -> None:
    p = d / "f"
    data = pattern(6 * MiB + 5)
    p.write_bytes(data)
    os.truncate(p, 5 * MiB + 1)        # shrink inside block 1
    assert os.stat(p).st_size == 5 * MiB + 1
    assert read_all(p) == data[:5 * MiB + 1]
    os.truncate(p, 13 * MiB)           # grow over several blocks: zeros
    got = read_all(p)
    assert len(got) == 13 * MiB
    assert got[:5 * MiB + 1] == data[:5 * MiB + 1] and got[5 * MiB + 1:] == bytes(13 * MiB - 5 * MiB - 1)
    os.truncate(p, 3)
    assert read_all(p) == data[:3]
    os.truncate(p, 0)
    assert read_all(p) == b"" and os.stat(p).st_size == 0


def test_shrink_then_grow_does_not_resurrect_old_bytes(d: Path) -> None:
    p = d / "f"
    p.write_bytes(b"\xff" * (BS + 100))
    os.truncate(p, 10)
    os.truncate(p, BS + 100)
    assert read_all(p) == b"\xff" * 10 + bytes(BS + 90)


def test_ftruncate_on_an_open_descriptor_with_unflushed_writes(d: Path) -> None:
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, pattern(5 * MiB))
        os.ftruncate(fd, 4 * MiB + 7)
        assert os.fstat(fd).st_size == 4 * MiB + 7
        assert os.pread(fd, 10, 4 * MiB) == pattern(5 * MiB)[4 * MiB:4 * MiB + 7]
        os.ftruncate(fd, 6 * MiB)
        os.pwrite(fd, b"end", 6 * MiB - 3)
        assert os.pread(fd, 8, 4 * MiB + 5) == pattern(5 * MiB)[4 * MiB + 5:4 * MiB + 7] + bytes(6)
    finally:
        os.close(fd)
    want = pattern(5 * MiB)[:4 * MiB + 7] + bytes(6 * MiB - 3 - (4 * MiB + 7)) + b"end"
    assert read_all(p) == want


def test_truncate_errors(d: Path) -> None:
    os.mkdir(d / "dir")
    raises_errno(errno.EISDIR, os.truncate, d / "dir", 0)
    raises_errno(errno.ENOENT, os.truncate, d / "missing", 0)
    (d / "f").write_bytes(b"x")
    raises_errno(errno.EINVAL, os.truncate, d / "f", -1)
    fd = os.open(d / "f", os.O_RDONLY)
    try:
        raises_errno(errno.EINVAL, os.ftruncate, fd, 0)   # not open for writing
    finally:
        os.close(fd)


def test_fsync_fdatasync_and_flush_make_data_durable_and_visible(d: Path) -> None:
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, b"a" * 1000)
        os.fsync(fd)
        assert os.stat(p).st_size == 1000
        os.write(fd, b"b" * 1000)
        os.fdatasync(fd)
        assert os.stat(p).st_size == 2000
        dup = os.dup(fd)
        os.write(dup, b"c")
        os.close(dup)          # close of a dup is a FUSE flush
        assert os.stat(p).st_size == 2001
    finally:
        os.close(fd)
    assert read_all(p) == b"a" * 1000 + b"b" * 1000 + b"c"
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)          # fsync of a directory is allowed
    finally:
        os.close(dfd)


def test_read_of_a_file_being_written_by_another_descriptor(d: Path) -> None:
    p = d / "f"
    w = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(w, pattern(BS + 10))
        r = os.open(p, os.O_RDONLY)
        try:
            assert os.pread(r, BS + 10, 0) == pattern(BS + 10)
        finally:
            os.close(r)
    finally:
        os.close(w)


def test_mmap_shared_writes_reach_the_file(d: Path) -> None:
    p = d / "f"
    size = BS + 8192
    p.write_bytes(bytes(size))
    fd = os.open(p, os.O_RDWR)
    try:
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            m[0:5] = b"hello"
            m[BS - 2:BS + 3] = b"cross"
            m[size - 3:size] = b"end"
            m.flush()
        finally:
            m.close()
    finally:
        os.close(fd)
    data = read_all(p)
    assert data[:5] == b"hello" and data[BS - 2:BS + 3] == b"cross" and data[-3:] == b"end"
    assert data.count(0) == size - 13


def test_mmap_read_only_mapping_sees_file_data(d: Path) -> None:
    p = d / "f"
    data = pattern(2 * MiB + 3)
    p.write_bytes(data)
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        assert m[:] == data


def test_o_direct_write_and_read(d: Path) -> None:
    p = d / "direct"
    buf = mmap.mmap(-1, 2 * MiB)       # page-aligned buffer
    buf.write(pattern(2 * MiB, 9))
    fd = os.open(p, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
    try:
        assert os.write(fd, buf) == 2 * MiB
        out = mmap.mmap(-1, MiB)
        assert os.preadv(fd, [out], MiB) == MiB
        assert out[:] == pattern(2 * MiB, 9)[MiB:]
    finally:
        os.close(fd)
    assert read_all(p) == pattern(2 * MiB, 9)


def test_large_file_spanning_blocks_reads_back_in_odd_chunks(d: Path) -> None:
    data = pattern(17 * MiB + 999, 5)
    p = d / "big"
    with open(p, "wb") as f:
        for off in range(0, len(data), 300_001):
            f.write(data[off:off + 300_001])
    with open(p, "rb", buffering=0) as f:
        got = bytearray()
        while chunk := f.read(1_234_567):
            got += chunk
    assert got == data


@pytest.mark.parametrize("header, request_size", [(28, 14 * MiB), (0, 4 * MiB), (0, MiB), (4096, 3 * MiB + 1)])
def test_sequential_writes_streamed_while_written_read_back_exactly(d: Path, header: int,
                                                                    request_size: int) -> None:
    """The KV-cache pattern (a small header, then the payload in one write) and plain
    sequential writes: blocks are streamed to the workers piece by piece while the
    kernel's 1 MiB write requests arrive, and a block's last piece ends its stream."""
    data = pattern(header + 14 * MiB, header + request_size)
    p = d / f"seq-{header}-{request_size}"
    with open(p, "wb", buffering=0) as f:
        if header:
            f.write(data[:header])
        for off in range(header, len(data), request_size):
            f.write(data[off:off + request_size])
    assert os.stat(p).st_size == len(data)
    assert read_all(p) == data


def test_close_then_reopen_for_write_keeps_unwritten_bytes(d: Path) -> None:
    p = d / "f"
    data = bytearray(pattern(9 * MiB, 2))
    p.write_bytes(data)
    with open(p, "r+b") as f:
        f.seek(5 * MiB)
        f.write(b"Q" * 10)
    data[5 * MiB:5 * MiB + 10] = b"Q" * 10
    assert read_all(p) == bytes(data)


def test_reader_open_across_an_overwrite_sees_the_new_bytes(d: Path, mounted: Mount) -> None:
    """A descriptor opened before another descriptor of this mount rewrote the file and
    closed it reads the new bytes (one node: as on ext4), never stale bytes and never
    EIO, also after the replaced blocks were deleted on the workers."""
    p = d / "f"
    old = pattern(24 * MiB, 1)
    p.write_bytes(old)
    old_ids = block_ids(mounted, p)
    r = os.open(p, os.O_RDONLY | os.O_DIRECT)     # no page cache: each read reaches the daemon
    buf = mmap.mmap(-1, MiB)
    try:
        assert os.preadv(r, [buf], 0) == MiB and buf[:] == old[:MiB]
        new = pattern(24 * MiB, 2)
        with open(p, "r+b") as f:
            f.write(new)
        wait_deleted(mounted, old_ids)   # the master tells the workers to delete the old blocks
        assert os.preadv(r, [buf], 21 * MiB) == MiB
        assert buf[:] == new[21 * MiB:22 * MiB], "stale bytes" if buf[:] == old[21 * MiB:22 * MiB] else "garbage"
        assert os.preadv(r, [buf], MiB) == MiB
        assert buf[:] == new[MiB:2 * MiB], "stale bytes" if buf[:] == old[MiB:2 * MiB] else "garbage"
    finally:
        os.close(r)


def test_unlinked_open_file_stays_readable_after_its_blocks_would_be_freed(d: Path, mounted: Mount) -> None:
    """POSIX: an unlinked (or renamed-over) file lives on while a descriptor is open."""
    p = d / "f"
    data = pattern(24 * MiB, 4)
    p.write_bytes(data)
    fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, MiB)
    try:
        assert os.preadv(fd, [buf], 0) == MiB
        os.unlink(p)
        deletions_delivered(mounted, d)   # block deletions ordered at the unlink would have reached the workers
        assert os.preadv(fd, [buf], 21 * MiB) == MiB
        assert buf[:] == data[21 * MiB:22 * MiB]
    finally:
        os.close(fd)


def test_file_renamed_over_stays_readable_through_an_open_descriptor(d: Path, mounted: Mount) -> None:
    old = pattern(24 * MiB, 5)
    (d / "x.data").write_bytes(old)
    fd = os.open(d / "x.data", os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, MiB)
    try:
        assert os.preadv(fd, [buf], 0) == MiB
        (d / "x.tmp").write_bytes(b"replacement")
        os.rename(d / "x.tmp", d / "x.data")
        deletions_delivered(mounted, d)
        assert os.preadv(fd, [buf], 20 * MiB) == MiB
        assert buf[:] == old[20 * MiB:21 * MiB]
    finally:
        os.close(fd)
    assert (d / "x.data").read_bytes() == b"replacement"


def test_write_to_an_unlinked_open_file(d: Path) -> None:
    p = d / "f"
    fd = os.open(p, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        os.write(fd, pattern(5 * MiB, 6))
        os.unlink(p)
        os.write(fd, b"more")
        os.fsync(fd)
        assert os.pread(fd, 4, 5 * MiB) == b"more"
        assert os.fstat(fd).st_size == 5 * MiB + 4
        assert os.fstat(fd).st_nlink == 0
    finally:
        os.close(fd)
    assert not p.exists()
