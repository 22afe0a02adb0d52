"""The worker's memory tier (worker/memtier.py) on real data servers: recently written
blocks are read from memory, and every way a kept copy can go stale or be crowded out
(delete, rewrite, eviction, a block longer than its hint, a failed write) still reads
back exactly the block's bytes."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import xxhash

from curvine_py.common import frames
from curvine_py.pb import data_pb2
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.dataserver import DataServer, chain_targets
from curvine_py.worker.memtier import MemoryReader
from curvine_py.worker.ioengine import IoEngine
from tests.integration.test_worker_dataserver import MiB, Op, connect, read, send_block, write


class Node:
    def __init__(self, engine: IoEngine, root: Path, name: str, worker_id: int, memory: int) -> None:
        self.store = BlockStore([str(root / name)], engine, reserve=0, direct_io=True, memory_cache=memory)
        self.server = DataServer(self.store, "127.0.0.1", 0, worker_id=worker_id).start()
        self.target = chain_targets([("127.0.0.1", self.server.port, worker_id)])

    def close(self) -> None:
        self.server.close()


@pytest.fixture(scope="module")
def engine(io_engine: IoEngine) -> IoEngine:
    """Both disk I/O engines (tests/conftest.py: io_engine)."""
    return io_engine


@pytest.fixture
def nodes(engine, tmp_path):
    a = Node(engine, tmp_path, "a", 11, 8 * MiB)   # room for two 4 MiB blocks
    b = Node(engine, tmp_path, "b", 22, 8 * MiB)
    yield a, b
    a.close()
    b.close()


def test_a_written_block_is_read_from_memory_on_both_replicas(nodes):
    a, b = nodes
    data = os.urandom(4 * MiB - 1000)
    with connect(a.server) as s:
        assert write(s, 1, data, b.target).errno == 0
    for node in (a, b):
        assert node.store.memory.usage()[:2] == (1, len(data))
        with connect(node.server) as s:
            h, got = read(s, 1)
            assert got == data and h.checksum == node.store.get(1).checksum
            assert read(s, 1, 5 * 1024, 3 * MiB)[1] == data[5 * 1024:5 * 1024 + 3 * MiB]
            assert read(s, 1, len(data))[1] == b""
        assert node.store.memory.hits == 3
        # The disk copy is complete too: with the memory copy gone, the file serves it.
        node.store.memory.drop(1)
        with connect(node.server) as s:
            assert read(s, 1)[1] == data
        assert node.store.memory.hits == 3


def test_delete_and_rewrite_drop_the_memory_copy(nodes):
    a, _ = nodes
    old, new = os.urandom(MiB), os.urandom(2 * MiB)
    with connect(a.server) as s:
        assert write(s, 7, old).errno == 0
        assert a.store.delete(7)
        assert a.store.memory.usage()[0] == 0
        h, _ = read(s, 7)
        assert h.errno == errno.ENOENT
        assert write(s, 8, old).errno == 0
        assert write(s, 8, new).errno == 0          # a new version under the same id
        assert read(s, 8)[1] == new
        assert a.store.memory.usage()[:2] == (1, len(new))


def test_least_recently_used_blocks_make_room_and_stay_readable_from_disk(nodes):
    a, _ = nodes
    blocks = {i: os.urandom(4 * MiB) for i in (1, 2, 3)}
    with connect(a.server) as s:
        assert write(s, 1, blocks[1]).errno == 0
        assert write(s, 2, blocks[2]).errno == 0
        assert read(s, 1)[1] == blocks[1]           # 1 is now the most recently used
        assert write(s, 3, blocks[3]).errno == 0    # 2 makes room
        hits = a.store.memory.hits
        for i in (1, 3):
            assert read(s, i)[1] == blocks[i]
        assert a.store.memory.hits == hits + 2
        assert read(s, 2)[1] == blocks[2]           # from its file
        assert a.store.memory.hits == hits + 2
    assert a.store.memory.usage() == (2, 8 * MiB, 8 * MiB)


def test_a_block_being_read_is_not_evicted(nodes):
    a, _ = nodes
    first, others = os.urandom(4 * MiB), [os.urandom(4 * MiB) for _ in range(3)]
    with connect(a.server) as s:
        assert write(s, 1, first).errno == 0
        reader = a.store.open_reader(1)
        assert isinstance(reader, MemoryReader)
        with reader:
            for i, data in enumerate(others, start=2):   # every new write needs room
                assert write(s, i, data).errno == 0
            assert b"".join(bytes(p) for p in reader) == first
        assert read(s, 1)[1] == first
        assert read(s, 4)[1] == others[2]


def test_a_block_longer_than_its_hint_and_a_failed_write_are_not_kept(nodes):
    a, _ = nodes
    data = os.urandom(3 * MiB + 5)
    with connect(a.server) as s:
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=5, length=MiB))   # hint: 1 MiB
        for i in range(0, len(data), 700_000):
            frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_DATA), memoryview(data)[i:i + 700_000])
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_COMMIT, length=len(data),
                                                 checksum=xxhash.xxh3_64_intdigest(data)))
        assert frames.recv_header(s).errno == 0
        assert a.store.memory.usage()[0] == 0
        assert read(s, 5)[1] == data
        send_block(s, 6, os.urandom(MiB), checksum=12345)   # refused at commit
        assert frames.recv_header(s).errno == errno.EBADMSG
        assert a.store.memory.usage()[0] == 0 and 6 not in a.store
        assert write(s, 9, data[:MiB]).errno == 0         # the buffers came back for reuse
        assert a.store.memory.usage()[0] == 1


def test_no_memory_tier_reads_from_disk(engine, tmp_path):
    node = Node(engine, tmp_path, "n", 1, 0)
    try:
        data = os.urandom(2 * MiB)
        with connect(node.server) as s:
            assert write(s, 1, data).errno == 0
            assert read(s, 1)[1] == data
        assert node.store.memory.usage() == (0, 0, 0) and node.store.memory.hits == 0
    finally:
        node.close()
