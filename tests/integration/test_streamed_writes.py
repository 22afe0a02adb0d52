"""Blocks streamed to the workers while they are written (client/blockstream.py), on a
real cluster: bytes leave before the block is complete, and every way a stream can be
spoiled (an overwrite, a truncate, a dead worker) still leaves the file exactly as written."""
from __future__ import annotations

import typing

import errno
import os
import signal
import time

import pytest
import xxhash

from curvine_py import Client, CurvineError
from curvine_py.client.blockstream import BlockStream
from curvine_py.client.writer import FileWriter
from curvine_py.cluster.local import LocalCluster

MiB = 1 << 20


def writer_of(f: object) -> FileWriter:
    """The write state behind an SDK file: its VFS handle's writer."""
    w = f._vfs.handle(f._fh).state.writer  # type: ignore[attr-defined]
    assert w is not None
    return typing.cast(FileWriter, w)


def wait_sent(stream: BlockStream, n: int) -> None:
    deadline = time.monotonic() + 10
    while stream._sent < n:   # the pump runs on the client's executor
        assert time.monotonic() < deadline, f"stream sent {stream._sent} of {n} bytes"
        time.sleep(0.01)


def check_blocks(client: Client, path: str, data: bytes) -> None:
    assert client.get_bytes(path) == data
    for b in client.block_locations(path):
        assert b.checksum == xxhash.xxh3_64_intdigest(data[b.offset:b.offset + b.length])


def test_pieces_leave_before_the_block_is_complete(client: Client) -> None:
    data = os.urandom(9 * MiB + 12345)
    with client.open("/streamed", "wb") as f:
        f.write(data[:100])                   # a small header, as LMCache writes one
        f.write(data[100:2 * MiB + 5])
        stream = writer_of(f).streams[0]
        wait_sent(stream, 2 * MiB)            # two whole pieces are on the wire already
        assert not stream.future.done()       # ... of a block not yet committed
        for i in range(2 * MiB + 5, len(data), 300_000):
            f.write(data[i:i + 300_000])
    check_blocks(client, "/streamed", data)
    assert [b.length for b in client.block_locations("/streamed")] == [4 * MiB, 4 * MiB, MiB + 12345]


def test_an_overwrite_of_sent_bytes_drops_the_stream(client: Client) -> None:
    data = bytearray(os.urandom(6 * MiB))
    with client.open("/overwritten", "wb") as f:
        f.write(bytes(data[:3 * MiB]))
        stream = writer_of(f).streams[0]
        wait_sent(stream, 3 * MiB)
        f.seek(1000)
        f.write(b"X" * 5000)                  # bytes the workers already have
        data[1000:6000] = b"X" * 5000
        assert stream._aborted and 0 not in writer_of(f).streams   # nor streamed again
        f.seek(3 * MiB)
        f.write(bytes(data[3 * MiB:]))
    time.sleep(0.1)                           # an aborted pump closes its connection
    check_blocks(client, "/overwritten", bytes(data))


def test_a_truncate_below_sent_bytes_drops_the_stream(client: Client) -> None:
    data = os.urandom(3 * MiB)
    with client.open("/truncated", "wb") as f:
        f.write(data)
        wait_sent(writer_of(f).streams[0], 3 * MiB)
        f.truncate(MiB + 7)
        assert writer_of(f).streams == {}
        f.seek(MiB + 7)
        f.write(b"tail")
    check_blocks(client, "/truncated", data[:MiB + 7] + b"tail")


def test_a_stream_whose_worker_dies_is_sent_again_whole(shared_cluster: LocalCluster) -> None:
    """On the module's cluster (the killed worker is started again at the end)."""
    cluster, killed = shared_cluster, None
    data = os.urandom(6 * MiB + 3)
    try:
        with Client(cluster.master_address) as c:
            with c.open("/survives", "wb") as f:
                f.write(data[:2 * MiB])
                stream = writer_of(f).streams[0]
                wait_sent(stream, 2 * MiB)
                head = stream._head
                assert head is not None
                killed = next(i for i in range(2) if cluster.worker_ports(i)[1] == head.data_port)
                cluster.kill_worker(killed, signal.SIGKILL)   # the stream's head: its socket breaks
                f.write(data[2 * MiB:])
            assert stream._failed is not None and stream.future.result().block_id != stream.target.block_id
            assert c.get_bytes("/survives") == data
            for b in c.block_locations("/survives"):
                assert b.checksum == xxhash.xxh3_64_intdigest(data[b.offset:b.offset + b.length])
    finally:
        if killed is not None:
            cluster.restart_worker(killed)


def test_a_block_buffer_changed_under_the_writer_is_never_committed(client: Client) -> None:
    """The bytes a stream ships must hash as the in-order writes handed them over
    (DirtyBlock.digest).  A buffer changed behind the writer's back (what a buffer handed
    to two owners would do) fails the close; the file is never presented with bytes
    nobody wrote."""
    data = os.urandom(3 * MiB)
    client.put_bytes("/spoiled", b"before")
    with pytest.raises(CurvineError) as e:
        with client.open("/spoiled", "wb") as f:
            f.write(data[:28])
            f.write(data[28:2 * MiB + 4096])
            w = writer_of(f)
            wait_sent(w.streams[0], 2 * MiB)
            w.dirty[0].view[2 * MiB + 10] ^= 0xFF   # written, not yet on the wire
            f.write(data[2 * MiB + 4096:])
    assert e.value.errno == errno.EIO
    assert client.get_bytes("/spoiled") in (b"", b"before")   # truncated by the open, or as before
