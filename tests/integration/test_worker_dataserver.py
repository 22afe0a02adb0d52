"""Two real data servers on ephemeral ports, on both disk I/O engines: chain writes, reads,
corruption, garbage.

Also: the worker process itself (standalone, signals, bad config), the gRPC
WorkerService, and the heartbeat against a minimal in-test MasterService.
"""
from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest
import xxhash

from curvine_py.common import config, frames
from curvine_py.common.errors import CurvineError
from curvine_py.common.security import BlockTokens
from curvine_py.pb import curvine_pb2, curvine_pb2_grpc, data_pb2
from curvine_py.worker import heartbeat, service
from curvine_py.worker.blockfile import BlockReader, can_populate, supports_direct
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.dataserver import DataServer, chain_targets
from curvine_py.common.connpool import ConnectionPool
from curvine_py.worker.replication import push_block
from curvine_py.worker.ioengine import IoEngine

Op = data_pb2.Op
MiB = 1 << 20
A_ID, B_ID = 11, 22


# ---------------------------------------------------------------- client side of the protocol

def connect(server: DataServer) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server.port), timeout=20)
    return frames.tune(s)


def send_block(sock: socket.socket, block_id: int, data: bytes, chain=(), piece: int = MiB,
               checksum: int | None = None, token: str = "") -> None:
    frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=block_id, chain=list(chain),
                                                length=len(data), token=token))
    view = memoryview(data)
    for i in range(0, len(data), piece):
        frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_DATA), view[i:i + piece])
    if checksum is None:
        checksum = xxhash.xxh3_64_intdigest(data)
    frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_COMMIT, length=len(data), checksum=checksum))


def write(sock: socket.socket, block_id: int, data: bytes, chain=(), **kw) -> data_pb2.DataHeader:
    send_block(sock, block_id, data, chain, **kw)
    return frames.recv_header(sock)


def read(sock: socket.socket, block_id: int, offset: int = 0, length: int = (1 << 64) - 1,
         token: str = "") -> tuple[data_pb2.DataHeader, bytes]:
    frames.send_frame(sock, data_pb2.DataHeader(op=Op.READ, block_id=block_id, offset=offset, length=length,
                                                token=token))
    h = frames.recv_header(sock)
    if h.errno:
        return h, b""
    buf = bytearray(h.length)
    got = 0
    view = memoryview(buf)
    while got < h.length:
        k = sock.recv_into(view[got:])
        if k == 0:
            break
        got += k
    return h, bytes(buf[:got])


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def engine(io_engine: IoEngine) -> IoEngine:
    """The data servers' disk I/O engine: every test using it runs on both engines
    (tests/conftest.py: io_engine; uring skips with the probe's reason where it cannot work)."""
    return io_engine


class Node:
    def __init__(self, engine: IoEngine, root, name: str, worker_id: int, spec: str = "",
                 cache_writes: bool = False, read_io: str = "pread") -> None:
        self.store = BlockStore([spec or str(root / name)], engine, reserve=0, direct_io=True,   # as worker.direct_io
                                read_io=read_io)
        self.server = DataServer(self.store, "127.0.0.1", 0, worker_id=worker_id, cache_writes=cache_writes).start()
        self.target = chain_targets([("127.0.0.1", self.server.port, worker_id)])

    def close(self) -> None:
        self.server.close()


@pytest.fixture
def nodes(engine, tmp_path):
    a = Node(engine, tmp_path, "a", A_ID)
    b = Node(engine, tmp_path, "b", B_ID)
    yield a, b
    a.close()
    b.close()


def dead_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def closed_by_peer(sock: socket.socket) -> bool:
    """EOF or RST (a close with unread input resets the connection)."""
    try:
        return sock.recv(10) == b""
    except ConnectionResetError:
        return True


def wait_for(cond, timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


# ---------------------------------------------------------------- writes

def test_chain_write_reaches_both_replicas(nodes):
    a, b = nodes
    data = os.urandom(4 * MiB + 12345)
    with connect(a.server) as s:
        h = write(s, 1, data, b.target)
        assert (h.op, h.errno) == (Op.REPLY, 0)
        assert list(h.acked) == [A_ID, B_ID]
        assert (h.length, h.checksum) == (len(data), xxhash.xxh3_64_intdigest(data))
        for blk in range(2, 12):   # a persistent connection serves many blocks
            assert list(write(s, blk, data[:MiB * (blk % 4) + blk], b.target).acked) == [A_ID, B_ID]
    assert a.store.read_range(1) == data and b.store.read_range(1) == data
    assert len(a.store) == len(b.store) == 11


def test_received_blocks_can_be_kept_in_the_page_cache(engine, tmp_path):
    """worker.cache_received: what arrives over the network is written through the page
    cache (this host's readers find it in memory), even in an O_DIRECT dir."""
    a = Node(engine, tmp_path, "a", A_ID)
    b = Node(engine, tmp_path, "b", B_ID, cache_writes=True)
    try:
        assert a.store.dirs[0].direct and b.store.dirs[0].direct
        data = os.urandom(3 * MiB + 5)
        with connect(a.server) as s:
            assert list(write(s, 1, data, b.target).acked) == [A_ID, B_ID]
        ea, eb = a.store.get(1), b.store.get(1)
        assert ea is not None and eb is not None
        assert not ea.cached and eb.cached          # b's file went through the page cache
        assert a.store.read_range(1) == data and b.store.read_range(1) == data
    finally:
        a.close()
        b.close()

def test_empty_block_and_empty_and_oversized_frames(nodes):
    a, b = nodes
    with connect(a.server) as s:
        assert list(write(s, 30, b"", b.target).acked) == [A_ID, B_ID]
        big = os.urandom(6 * MiB)       # one 6 MiB frame (split over several buffers)
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=31, chain=b.target))
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_DATA), b"")
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_DATA), big)
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_DATA), b"")
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_COMMIT, length=len(big),
                                                 checksum=xxhash.xxh3_64_intdigest(big)))
        assert list(frames.check_reply(frames.recv_header(s), "w").acked) == [A_ID, B_ID]
    assert a.store.read_range(30) == b"" and b.store.read_range(30) == b""
    assert a.store.read_range(31) == big and b.store.read_range(31) == big


def test_chain_to_dead_port_acks_only_the_primary(nodes):
    a, _ = nodes
    chain = chain_targets([("127.0.0.1", dead_port(), 99)])
    with connect(a.server) as s:
        h = write(s, 5, b"z" * 3 * MiB, chain)
    assert h.errno == 0 and list(h.acked) == [A_ID]
    assert a.store.read_range(5) == b"z" * 3 * MiB


def test_downstream_failing_midway_is_left_out(nodes):
    a, _ = nodes
    lsock = socket.create_server(("127.0.0.1", 0))

    def flaky_replica() -> None:   # accepts, reads a little, then drops the connection
        conn, _ = lsock.accept()
        conn.recv(100_000)
        conn.close()

    t = threading.Thread(target=flaky_replica, daemon=True)
    t.start()
    chain = chain_targets([("127.0.0.1", lsock.getsockname()[1], 77)])
    data = os.urandom(8 * MiB)
    with connect(a.server) as s:
        h = write(s, 6, data, chain)
    t.join(5)
    lsock.close()
    assert h.errno == 0 and list(h.acked) == [A_ID]
    assert a.store.read_range(6) == data


def test_three_replica_chain(nodes, engine, tmp_path):
    a, b = nodes
    c = Node(engine, tmp_path, "c", 33)
    try:
        with connect(a.server) as s:
            h = write(s, 8, b"abc" * 1000, b.target + c.target)
        assert list(h.acked) == [A_ID, B_ID, 33]
        assert c.store.read_range(8) == b"abc" * 1000
    finally:
        c.close()


def test_checksum_mismatch_rejected_everywhere_and_connection_survives(nodes):
    a, b = nodes
    with connect(a.server) as s:
        h = write(s, 3, b"q" * MiB, b.target, checksum=42)
        assert h.errno == errno.EBADMSG
        assert list(write(s, 4, b"ok", b.target).acked) == [A_ID, B_ID]
    assert 3 not in a.store
    assert wait_for(lambda: 3 not in b.store and not os.listdir(b.store.dirs[0].staging_dir))


def test_enospc_reply_keeps_connection_usable(engine, tmp_path):
    small = Node(engine, tmp_path, "s", 44, spec=f"[SSD:8MiB]{tmp_path}/s")
    try:
        with connect(small.server) as s:
            assert write(s, 1, os.urandom(4 * MiB)).errno == 0
            assert write(s, 2, os.urandom(4 * MiB)).errno == 0
            h = write(s, 3, os.urandom(4 * MiB))
            assert h.errno == errno.ENOSPC and h.message
            h, got = read(s, 1, 0, 10)          # same connection still in sync
            assert h.errno == 0 and len(got) == 10
    finally:
        small.close()


def test_pipelined_blocks_on_one_connection(nodes):
    a, b = nodes
    blobs = [os.urandom(MiB + i) for i in range(4)]
    with connect(a.server) as s:
        for i, data in enumerate(blobs):    # no waiting for replies between blocks
            send_block(s, 100 + i, data, b.target)
        replies = [frames.recv_header(s) for _ in blobs]
    assert [list(h.acked) for h in replies] == [[A_ID, B_ID]] * 4
    assert [h.length for h in replies] == [len(d) for d in blobs]


def test_client_vanishing_mid_write_leaves_nothing(nodes):
    a, b = nodes
    s = connect(a.server)
    frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=50, chain=b.target))
    frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_DATA), b"x" * MiB)
    s.close()
    for node in (a, b):
        assert wait_for(lambda: not os.listdir(node.store.dirs[0].staging_dir))
    assert 50 not in a.store and 50 not in b.store
    with connect(a.server) as s2:
        assert write(s2, 51, b"fine").errno == 0


# ---------------------------------------------------------------- reads

def test_read_ranges(nodes):
    a, b = nodes
    data = os.urandom(4 * MiB + 99)
    with connect(a.server) as s:
        write(s, 7, data, b.target)
        for off, n in ((0, len(data)), (0, 0), (5, 10), (MiB - 1, 2), (3 * MiB, 2 * MiB),
                       (len(data), 10), (len(data) - 1, 100), (7, (1 << 64) - 1)):
            h, got = read(s, 7, off, n)
            want = data[off:off + n]
            assert h.errno == 0 and h.length == len(want) and got == want, (off, n)
            assert h.checksum == xxhash.xxh3_64_intdigest(data)
        h, _ = read(s, 7, len(data) + 1, 1)
        assert h.errno == errno.EINVAL
        h, _ = read(s, 999, 0, 1)
        assert h.errno == errno.ENOENT and h.message
        h, got = read(s, 7, 1, 3)            # still in sync after error replies
        assert got == data[1:4]
    with connect(b.server) as s:
        assert read(s, 7)[1] == data


def test_corrupt_replica_fails_and_other_replica_serves(nodes):
    a, b = nodes
    data = os.urandom(4 * MiB)
    with connect(a.server) as s:
        write(s, 9, data, b.target)
    path = a.store.get(9).path
    with open(path, "r+b") as f:            # flip a byte in the third chunk
        f.seek(2 * MiB + 5)
        byte = f.read(1)
        f.seek(2 * MiB + 5)
        f.write(bytes([byte[0] ^ 1]))
    with connect(a.server) as s:
        h, got = read(s, 9)
        assert h.errno == 0 and len(got) < len(data)   # short read: the server closed
        assert got == data[:len(got)]
        assert s.recv(1) == b""
    assert 9 not in a.store
    added, removed = a.store.drain_changes()
    assert 9 in removed
    with connect(b.server) as s:
        h, got = read(s, 9)
        assert got == data


def test_corruption_in_first_chunk_is_an_error_reply(nodes):
    a, _ = nodes
    with connect(a.server) as s:
        write(s, 12, b"k" * 100)
        with open(a.store.get(12).path, "r+b") as f:
            f.write(b"K")
        h, _ = read(s, 12)
        assert h.errno == errno.EBADMSG
        assert write(s, 13, b"after").errno == 0


# ---------------------------------------------------------------- read_io "sendfile"

@pytest.fixture
def sending(engine, tmp_path):
    """A node that keeps received blocks in the page cache and sends them from there."""
    if not can_populate():
        pytest.skip("read_io \"sendfile\" needs MADV_POPULATE_READ (Linux 5.14+)")
    node = Node(engine, tmp_path, "s", A_ID, cache_writes=True, read_io="sendfile")
    yield node
    node.close()


def test_a_cached_block_is_verified_in_place_and_sent_from_the_page_cache(sending):
    data = os.urandom(9 * MiB + 12345)                 # three 4 MiB send steps, the last one partial
    with connect(sending.server) as s:
        write(s, 7, data)
        with sending.store.open_reader(7) as r:
            assert isinstance(r, BlockReader) and r.sendable
        with sending.store.open_reader(7, 5 * MiB, 128 << 10) as r:   # a random read: copied (preadv)
            assert isinstance(r, BlockReader) and not r.sendable
        for off, n in ((0, len(data)), (0, 0), (5, 10), (MiB - 1, 2), (4 * MiB - 3, 6), (3 * MiB, 2 * MiB),
                       (len(data) - 1, 100), (7, (1 << 64) - 1)):
            h, got = read(s, 7, off, n)
            want = data[off:off + n]
            assert h.errno == 0 and h.length == len(want) and got == want, (off, n)
        h, _ = read(s, 7, len(data) + 1, 1)
        assert h.errno == errno.EINVAL
        assert read(s, 7, 1, 3)[1] == data[1:4]       # still in sync after an error reply


def test_a_block_written_past_the_page_cache_is_not_sent_from_it(engine, tmp_path):
    """A block this node wrote O_DIRECT (a client's short-circuit write) is read O_DIRECT
    into a buffer as before: there is no page-cache copy to send."""
    if not supports_direct(str(tmp_path)):
        pytest.skip(f"{tmp_path} takes no O_DIRECT writes")
    node = Node(engine, tmp_path, "d", A_ID, cache_writes=False, read_io="sendfile")
    try:
        with connect(node.server) as s:
            write(s, 3, b"d" * (2 * MiB))
            assert read(s, 3)[1] == b"d" * (2 * MiB)
        with node.store.open_reader(3) as r:
            assert isinstance(r, BlockReader) and r.dfd >= 0 and not r.sendable
    finally:
        node.close()


@pytest.mark.parametrize("where", [5, 6 * MiB + 5], ids=["first-step", "second-step"])
def test_a_flipped_byte_is_caught_before_it_is_sent(sending, where):
    """In the first step: an error reply; later: the connection closes after the good steps."""
    data = os.urandom(8 * MiB)
    with connect(sending.server) as s:
        write(s, 9, data)
    with open(sending.store.get(9).path, "r+b") as f:
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 1]))
    with connect(sending.server) as s:
        h, got = read(s, 9)
        if where < 4 * MiB:
            assert h.errno == errno.EBADMSG
        else:
            assert h.errno == 0 and got == data[:4 * MiB]   # the verified first step only
            assert closed_by_peer(s)
    assert 9 not in sending.store


def test_a_truncated_block_file_is_corrupt_not_a_fault(sending):
    """A mapping past a file's end would SIGBUS the worker: the size is checked first."""
    data = os.urandom(3 * MiB)
    with connect(sending.server) as s:
        write(s, 4, data)
        os.truncate(sending.store.get(4).path, 2 * MiB)
        h, _ = read(s, 4)
        assert h.errno == errno.EBADMSG
        assert write(s, 5, b"after").errno == 0
    assert 4 not in sending.store


# ---------------------------------------------------------------- hostile input

def test_garbage_and_bad_ops_close_only_that_connection(nodes):
    a, _ = nodes
    with connect(a.server) as s:
        s.sendall(b"\xff\xff\xff\xffthis is not a frame" * 10)
        assert closed_by_peer(s)
    with connect(a.server) as s:
        s.sendall(b"\x00\x00\x00\x05hello")          # not a protobuf header
        assert closed_by_peer(s)
    with connect(a.server) as s:                     # a valid header with a wrong op
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_DATA), b"xx")
        h = frames.recv_header(s)
        assert h.errno == errno.EINVAL
        assert closed_by_peer(s)
    with connect(a.server) as s:
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=60))
        frames.send_frame(s, data_pb2.DataHeader(op=Op.READ, block_id=60))
        h = frames.recv_header(s)
        assert h.errno == errno.EINVAL
    with connect(a.server) as s:
        assert write(s, 61, b"still serving").errno == 0
        assert read(s, 61)[1] == b"still serving"


def test_block_tokens(engine, tmp_path):
    """With a cluster secret, only blocks handed out by the master (a token minted from the
    secret for that block and mode) can be written or read; the secret itself is no token."""
    store = BlockStore([str(tmp_path / "x")], engine, reserve=0)
    server = DataServer(store, "127.0.0.1", 0, worker_id=1, secret="s3cret").start()
    tokens = BlockTokens("s3cret")
    try:
        with connect(server) as s:
            assert write(s, 1, b"data").errno == errno.EACCES
            assert write(s, 1, b"data", token="s3cret").errno == errno.EACCES
            assert write(s, 1, b"data", token=tokens.mint(1, "r")).errno == errno.EACCES
            assert write(s, 1, b"data", token=tokens.mint(2, "w")).errno == errno.EACCES
            assert write(s, 1, b"data", token=BlockTokens("other").mint(1, "w")).errno == errno.EACCES
            assert write(s, 1, b"data", token=tokens.mint(1, "w")).errno == 0
            assert read(s, 1)[0].errno == errno.EACCES
            assert read(s, 1, token=tokens.mint(2, "r"))[0].errno == errno.EACCES
            assert read(s, 1, token=tokens.mint(1, "r"))[1] == b"data"
            assert read(s, 1, token=tokens.mint(1, "w"))[1] == b"data"  # a writer reads back
    finally:
        server.close()


# ---------------------------------------------------------------- re-replication push

def test_push_block_copies_a_local_block(nodes, engine, tmp_path):
    a, b = nodes
    data = os.urandom(2 * MiB + 3)
    with connect(a.server) as s:
        write(s, 70, data)
    pool = ConnectionPool()
    try:
        assert push_block(a.store, pool, 70, b.target) == [B_ID]
        assert b.store.read_range(70) == data
        with pytest.raises(CurvineError) as e:
            push_block(a.store, pool, 71, b.target)
        assert e.value.errno == errno.ENOENT
        with pytest.raises(CurvineError) as e:
            push_block(a.store, pool, 70, chain_targets([("127.0.0.1", dead_port(), 5)]))
        assert e.value.errno == errno.EHOSTDOWN
    finally:
        pool.close()


# ---------------------------------------------------------------- gRPC service and heartbeat

def test_worker_service_info_and_stat_block(nodes):
    a, _ = nodes
    with connect(a.server) as s:
        write(s, 80, b"hello")
    server = grpc.server(futures.ThreadPoolExecutor(2))
    service.add_to_server(service.WorkerService(a.store, lambda: A_ID, "hostA"), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = curvine_pb2_grpc.WorkerServiceStub(ch)
            info = stub.Info(curvine_pb2.Empty(), timeout=5)
            assert (info.worker_id, info.host, info.blocks) == (A_ID, "hostA", 1)
            assert info.dirs[0].tier == "DISK" and info.dirs[0].used == 5
            st = stub.StatBlock(curvine_pb2.BlockRequest(block_id=80), timeout=5)
            assert st.exists and st.length == 5 and st.checksum == xxhash.xxh3_64_intdigest(b"hello")
            with open(st.path, "rb") as f:                 # the short-circuit path
                assert f.read() == b"hello"
            assert not stub.StatBlock(curvine_pb2.BlockRequest(block_id=81), timeout=5).exists
    finally:
        server.stop(0)


class FakeMaster(curvine_pb2_grpc.MasterServiceServicer):
    """Just enough of the master to watch what a worker sends."""

    def __init__(self) -> None:
        self.registrations: list[curvine_pb2.RegisterRequest] = []
        self.reports: list[curvine_pb2.BlockReport] = []
        self.heartbeats: list[curvine_pb2.HeartbeatRequest] = []
        self.replies: list[curvine_pb2.HeartbeatReply] = []

    def RegisterWorker(self, request, context):
        self.registrations.append(request)
        return curvine_pb2.RegisterReply(worker_id=7, heartbeat_ms=50)

    def ReportBlocks(self, request, context):
        self.reports.append(request)
        return curvine_pb2.Empty()

    def Heartbeat(self, request, context):
        self.heartbeats.append(request)
        return self.replies.pop(0) if self.replies else curvine_pb2.HeartbeatReply()


def test_heartbeat_registers_reports_and_obeys(engine, tmp_path):
    port = dead_port()
    store = BlockStore([str(tmp_path / "h")], engine, reserve=0)
    for i in range(5):
        w = store.create(i)
        w.append(b"x" * (i + 1))
        w.commit()
    cfg = config.WorkerConfig(master=f"127.0.0.1:{port}", ip="10.0.0.9", host="hostH")
    registered: list[int] = []
    hb = heartbeat.Heartbeat(cfg, store, rpc_port=1234, data_port=5678,
                             on_registered=registered.append, report_batch=2).start()
    master = FakeMaster()
    time.sleep(0.5)                      # the master starts after the worker
    server = grpc.server(futures.ThreadPoolExecutor(4))
    curvine_pb2_grpc.add_MasterServiceServicer_to_server(master, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        assert hb.registered.wait(15)
        reg = master.registrations[0]
        assert (reg.host, reg.ip, reg.rpc_port, reg.data_port) == ("hostH", "10.0.0.9", 1234, 5678)
        assert reg.storage_id == heartbeat.load_storage_id(store.dirs[0].path)
        assert registered == [7]
        assert [r.full for r in master.reports] == [True, False, False]   # batches of 2
        assert sorted(b.block_id for r in master.reports for b in r.added) == list(range(5))
        master.replies.append(curvine_pb2.HeartbeatReply(delete_blocks=[0, 1]))
        assert wait_for(lambda: 0 not in store and 1 not in store)
        assert wait_for(lambda: any(list(h.report.removed) == [0, 1] for h in master.heartbeats))
        master.replies.append(curvine_pb2.HeartbeatReply(reregister=True))
        assert wait_for(lambda: len(master.registrations) == 2)
        assert master.registrations[1].storage_id == reg.storage_id
        assert wait_for(lambda: sum(r.full for r in master.reports) == 2)
        hb_dirs = master.heartbeats[-1].dirs
        assert hb_dirs[0].used == 3 + 4 + 5 and hb_dirs[0].capacity > 0
    finally:
        hb.stop()
        server.stop(0)


# ---------------------------------------------------------------- the process

def _worker_cmd(tmp_path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "curvine_py.worker.main", "--worker-master", "",
            "--worker-dirs", f"[SSD:64MiB]{tmp_path}/proc", "--worker-bind", "127.0.0.1",
            "--worker-data-port", "0", "--worker-rpc-port", "0", *extra]


def test_worker_process_serves_and_stops_cleanly(tmp_path):
    p = subprocess.Popen(_worker_cmd(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path)
    try:
        words = p.stdout.readline().split()
        assert words[0] == "worker" and words[2] == "data" and words[4] == "rpc", words
        port = int(words[3].rsplit(":", 1)[1])
        tokens = BlockTokens(os.environ.get("CURVINE_CLUSTER_SECRET", ""))  # the tests' secret
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            assert write(s, 1, b"via process").errno == errno.EACCES
            assert write(s, 1, b"via process", token=tokens.mint(1, "w")).errno == 0
            assert read(s, 1, token=tokens.mint(1, "r"))[1] == b"via process"
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert "Traceback" not in p.stderr.read()


def test_worker_process_bad_config_exits_2(tmp_path):
    for bad in (["--worker-dirs", "[TAPE]/x"], ["--worker-reserve", "lots"], ["--worker-data-port", "70000"]):
        cmd = _worker_cmd(tmp_path)[:3] + bad
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=tmp_path)
        assert r.returncode == 2, (bad, r.stderr)
        assert "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0
        assert r.stderr.startswith("curvine-worker:")
