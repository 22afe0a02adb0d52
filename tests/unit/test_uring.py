"""The io_uring executor: real files, real ring, several threads.

Uring itself (skips through the session's io_uring probe where it cannot work); every
IoEngine-contract test here has its counterpart on both engines in test_ioengine.py."""
from __future__ import annotations

import errno
import mmap
import os

import pytest

from curvine_py.worker.uring import Uring, UringClosed

MiB = 1 << 20


@pytest.fixture
def ring():
    r = Uring(16)
    yield r
    r.close()


@pytest.fixture
def fd(tmp_path):
    f = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT, 0o644)
    yield f
    os.close(f)


def test_write_then_read_bytes_bytearray_and_mmap_slices(ring, fd):
    payload = os.urandom(3 * MiB + 17)
    assert ring.write_from(fd, payload, 0).result() == len(payload)
    buf = bytearray(len(payload))
    assert ring.pread_full(fd, buf, 0) == len(payload)
    assert bytes(buf) == payload
    m = mmap.mmap(-1, 2 * MiB)
    view = memoryview(m)
    got = ring.read_into(fd, view[100:100 + MiB], 5).result()
    assert got == MiB
    assert view[100:100 + MiB] == payload[5:5 + MiB]
    # write from a slice of an mmap at an offset
    view[:10] = b"0123456789"
    assert ring.write_from(fd, view[2:6], 1).result() == 4
    assert os.pread(fd, 6, 0) == payload[:1] + b"2345" + payload[5:6]
    view.release()


def test_readv_writev_scatter_gather(ring, fd):
    a, b = bytearray(b"x" * 4), bytearray(b"y" * 6)
    assert ring.writev_from(fd, [b"hello", memoryview(b"world!")[1:]], 0).result() == 10
    assert ring.readv_into(fd, [a, memoryview(b)], 0).result() == 10
    assert bytes(a) == b"hell" and bytes(b) == b"oorld!"


def test_pread_full_stops_at_eof(ring, fd):
    os.pwrite(fd, b"abc", 0)
    buf = bytearray(10)
    assert ring.pread_full(fd, buf, 1) == 2
    assert buf[:2] == b"bc"
    assert ring.pread_full(fd, buf, 100) == 0


def test_pwrite_full_large(ring, fd):
    data = os.urandom(9 * MiB)
    assert ring.pwrite_full(fd, memoryview(data), MiB) == len(data)
    assert os.pread(fd, len(data), MiB) == data


def test_errors_are_oserror_with_errno(ring, tmp_path):
    with pytest.raises(OSError) as e:
        ring.read_into(987654, bytearray(10), 0).result()
    assert e.value.errno == errno.EBADF
    ro = os.open(tmp_path / "ro", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as e:
            ring.write_from(ro, b"x", 0).result()
        assert e.value.errno == errno.EBADF
    finally:
        os.close(ro)
    dfd = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            ring.pread_full(dfd, bytearray(10), 0)
        assert e.value.errno == errno.EISDIR
    finally:
        os.close(dfd)
    # the ring keeps working after failed ops
    wfd = os.open(tmp_path / "w", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert ring.write_from(wfd, b"ok", 0).result() == 2
    finally:
        os.close(wfd)


def test_read_into_needs_writable_buffer(ring, fd):
    with pytest.raises(TypeError):
        ring.read_into(fd, b"readonly", 0)


def test_fsync(ring, fd):
    ring.write_from(fd, b"x" * 100, 0).result()
    assert ring.fsync(fd).result() == 0
    assert ring.fsync(fd, datasync=True).result() == 0


def test_more_ops_than_entries_in_flight(ring, fd):
    os.pwrite(fd, bytes(range(256)) * 64, 0)
    bufs = [bytearray(64) for _ in range(200)]
    futs = [ring.read_into(fd, bufs[i], i * 64) for i in range(200)]
    assert [f.result() for f in futs] == [64] * 200
    assert all(bytes(bufs[i]) == (bytes(range(256)) * 64)[i * 64:(i + 1) * 64] for i in range(200))
    assert ring.in_flight == 0



def test_closed_ring_refuses_ops(fd):
    ring = Uring(4)
    ring.close()
    ring.close()  # idempotent
    with pytest.raises(UringClosed) as e:
        ring.write_from(fd, b"x", 0)
    assert isinstance(e.value, OSError)


def test_entries_validated():
    with pytest.raises(ValueError):
        Uring(1)
