"""The short-circuit write exchange between the client (client/localwrite.py) and a real
worker block store serving it (worker/localwrite.py): a descriptor passed over an
abstract Unix socket, bytes written by the client, the block installed with the client's
checksums -- and every way it can go wrong leaving no block and no staging file."""
from __future__ import annotations

import errno
import mmap
import os
import random
import socket
import time
import typing

import pytest
import xxhash

from curvine_py.client.localwrite import LocalWrites
from curvine_py.common import frames
from curvine_py.common.blockmeta import CHUNK, BlockHasher
from curvine_py.common.errors import CurvineError
from curvine_py.common.security import BlockTokens
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import data_pb2
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.ioengine import IoEngine
from curvine_py.worker.localwrite import LocalWriteServer

MiB = 1 << 20
WORKER_ID = 7
SECRET = "s3cret"


@pytest.fixture(scope="module")
def engine(io_engine: IoEngine) -> IoEngine:
    """The block store's disk I/O engine: every test runs on both engines
    (tests/conftest.py: io_engine; uring skips with the probe's reason where it cannot work)."""
    return io_engine


@pytest.fixture
def served(tmp_path, engine) -> typing.Iterator[tuple[BlockStore, LocalWriteServer, pb.WorkerAddress]]:
    store = BlockStore([str(tmp_path / "data")], engine, reserve=0)
    port = random.randrange(20000, 60000)   # only names the abstract socket
    server = LocalWriteServer(store, port, lambda: WORKER_ID, secret=SECRET).start()
    addr = pb.WorkerAddress(worker_id=WORKER_ID, host="here", ip="127.0.0.1", data_port=port)
    try:
        yield store, server, addr
    finally:
        server.close()


def block_buffer(data: bytes, size: int = 4 * MiB) -> tuple[mmap.mmap, memoryview]:
    buf = mmap.mmap(-1, size)
    buf[:len(data)] = data
    return buf, memoryview(buf)


def token(block_id: int) -> str:
    return BlockTokens(SECRET).mint(block_id, "w")


def wait_for_empty_staging(store: BlockStore) -> None:
    deadline = time.monotonic() + 10
    while any(os.listdir(d.staging_dir) for d in store.dirs):
        assert time.monotonic() < deadline, "a staging file was left behind"
        time.sleep(0.02)


def test_a_block_written_through_the_passed_descriptor_is_installed_with_its_sums(served) -> None:
    store, server, addr = served
    data = os.urandom(2 * MiB + 12345)            # the last write is not 4 KiB aligned
    buf, view = block_buffer(data)
    lw = LocalWrites("here")
    f = lw.open(addr, 41, 4 * MiB, token(41), "", view)
    assert f is not None
    f.write(view, 0, MiB)
    f.write(view, MiB, len(data))                 # padded to the O_DIRECT unit, cut at commit
    h = BlockHasher()
    h.update(view[:len(data)])
    assert f.commit(41, len(data), h.checksum, h) == [WORKER_ID]
    entry = store.get(41)
    assert entry is not None and entry.length == len(data) and entry.checksum == xxhash.xxh3_64_intdigest(data)
    assert len(entry.chunk_sums) == -(-len(data) // CHUNK)
    assert entry.chunk_sums[0] == xxhash.xxh3_64_intdigest(data[:CHUNK])
    with store.open_reader(41) as r:             # the worker's own verifying reader
        assert b"".join(bytes(p) for p in r) == data
    assert os.path.getsize(store.dirs[0].block_path(41)) == len(data)
    assert lw.stats() == {"blocks": 1, "refused": 0}
    # the connection is reused for the next block
    f2 = lw.open(addr, 42, 4 * MiB, token(42), "", view)
    assert f2 is not None
    f2.write(view, 0, 100)
    h2 = BlockHasher()
    h2.update(view[:100])
    f2.commit(42, 100, h2.checksum, h2)
    assert store.get(42) is not None and lw.stats()["blocks"] == 2 and server.blocks == 2
    lw.close()
    view.release()
    buf.close()


def test_a_bad_token_is_refused_and_leaves_nothing(served) -> None:
    store, _, addr = served
    buf, view = block_buffer(b"x")
    lw = LocalWrites("here")
    assert lw.open(addr, 43, 4 * MiB, "forged", "", view) is None
    assert lw.stats() == {"blocks": 0, "refused": 1}
    assert store.get(43) is None
    wait_for_empty_staging(store)
    lw.close()
    view.release()
    buf.close()


def test_a_commit_with_1_MiB_chunk_sums_installs_a_block_read_by_1_MiB_chunks(served) -> None:
    """A client from before session 20 hashes 1 MiB chunks and sends no chunk size: the
    sidecar records 1 MiB and the worker's reader verifies by it, any range."""
    store, _, addr = served
    data = os.urandom(3 * MiB + 777)
    buf, view = block_buffer(data)
    lw = LocalWrites("here")
    f = lw.open(addr, 45, 4 * MiB, token(45), "", view)
    assert f is not None
    f.write(view, 0, len(data))
    h = BlockHasher(MiB)
    h.update(view[:len(data)])
    f.commit(45, len(data), h.checksum, h)
    entry = store.get(45)
    assert entry is not None and entry.chunk_size == MiB and len(entry.chunk_sums) == 4
    for off, n in ((0, None), (MiB - 3, 10), (5, 128 << 10), (3 * MiB, 777)):
        assert store.read_range(45, off, n) == data[off:None if n is None else off + n]
    lw.close()
    view.release()
    buf.close()


def test_wrong_chunk_sums_fail_the_commit_and_install_nothing(served) -> None:
    store, _, addr = served
    data = os.urandom(3 * MiB)
    buf, view = block_buffer(data)
    lw = LocalWrites("here")
    f = lw.open(addr, 44, 4 * MiB, token(44), "", view)
    assert f is not None
    f.write(view, 0, len(data))
    with pytest.raises(CurvineError) as e:
        half = BlockHasher()
        half.update(view[:len(data) // 2])
        f.commit(44, len(data), xxhash.xxh3_64_intdigest(data), half)   # sums for half the chunks
    assert e.value.errno == errno.EBADMSG
    assert store.get(44) is None
    wait_for_empty_staging(store)
    lw.close()
    view.release()
    buf.close()


def test_a_connection_dropped_before_the_commit_recycles_the_staging_file(served) -> None:
    store, _, addr = served
    data = os.urandom(MiB)
    buf, view = block_buffer(data)
    lw = LocalWrites("here")
    f = lw.open(addr, 45, 4 * MiB, token(45), "", view)
    assert f is not None
    f.write(view, 0, len(data))
    assert any(os.listdir(d.staging_dir) for d in store.dirs)
    f.abort()
    wait_for_empty_staging(store)
    assert store.get(45) is None
    lw.close()
    view.release()
    buf.close()


def test_a_socket_of_another_worker_is_not_used(served) -> None:
    """The socket is named after a data port; the id in the open's reply must be the
    worker the client meant (a port reused by another worker is not trusted)."""
    store, _, addr = served
    buf, view = block_buffer(b"x")
    lw = LocalWrites("here")
    other = pb.WorkerAddress(worker_id=WORKER_ID + 1, host="here", ip=addr.ip, data_port=addr.data_port)
    assert lw.open(other, 46, 4 * MiB, token(46), "", view) is None
    assert lw.stats()["refused"] == 1
    wait_for_empty_staging(store)
    assert lw.open(pb.WorkerAddress(worker_id=1, host="here", data_port=1), 47, MiB, "", "", view) is None
    lw.close()
    view.release()
    buf.close()


def test_garbage_on_the_socket_gets_an_error_reply_and_a_closed_connection(served) -> None:
    _, _, addr = served
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(frames.local_write_socket(addr.data_port))
    frames.send_frame(s, data_pb2.DataHeader(op=data_pb2.Op.READ, block_id=1))
    reply = frames.recv_header(s)
    assert reply.op == data_pb2.Op.REPLY and reply.errno == errno.EINVAL
    assert s.recv(1) == b""
    s.close()


def test_an_idle_connection_to_a_restarted_worker_is_replaced(served) -> None:
    store, server, addr = served
    buf, view = block_buffer(os.urandom(MiB))
    lw = LocalWrites("here")

    def write(block_id: int) -> None:
        f = lw.open(addr, block_id, 4 * MiB, token(block_id), "", view)
        assert f is not None
        f.write(view, 0, MiB)
        h = BlockHasher()
        h.update(view[:MiB])
        f.commit(block_id, MiB, h.checksum, h)

    write(48)                                       # leaves an idle connection behind
    server.close()
    again = LocalWriteServer(store, addr.data_port, lambda: WORKER_ID, secret=SECRET).start()
    try:
        write(49)
        assert lw.stats() == {"blocks": 2, "refused": 0} and store.get(49) is not None
    finally:
        again.close()
        lw.close()
        view.release()
        buf.close()
