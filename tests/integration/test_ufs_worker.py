"""The worker's UFS side, in process: read-through READs, LoadBlocks and Persist.

Two real data servers (BlockStore + DataServer on ephemeral ports, threads engine), a
``file://`` UFS in a temp dir, and the mount cache fed by an in-test resolver (no master).
Every provider call is counted, so "one ranged read" and "no UFS call" are checked, not
assumed.
"""
from __future__ import annotations

import errno
import os
import socket
import threading
import time
import typing
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import xxhash

from curvine_py.common import config, frames, rpc
from curvine_py.common.connpool import ConnectionPool
from curvine_py.common.errors import CurvineError, abort
from curvine_py.common.security import READ, BlockTokens
from curvine_py.pb import curvine_pb2, curvine_pb2_grpc, data_pb2
from curvine_py.ufs.base import ObjectInfo, Ufs, UfsError
from curvine_py.worker import service
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.dataserver import DataServer, chain_targets
from curvine_py.worker.main import Worker
from curvine_py.worker.threadio import ThreadIO
from curvine_py.worker.ufsfetch import UfsFetcher
from curvine_py.worker.ufsmounts import UfsMounts
from curvine_py.worker.ufspersist import Persister

Op = data_pb2.Op
MiB = 1 << 20
A_ID, B_ID = 1, 2
MOUNT = 7
SECRET = "ufs-test-secret"
TOKENS = BlockTokens(SECRET)
ALL = (1 << 64) - 1

try:
    from curvine_py.ufs import open_ufs as _open_ufs
except ImportError:   # the provider module lands separately: a minimal file:// stand-in until then
    _open_ufs = None


# ---------------------------------------------------------------- a file:// UFS and a counter

class _DirWriter:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".part")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(self.tmp, "wb")

    def write(self, data: memoryview | bytes) -> None:
        self.f.write(data)

    def close(self) -> ObjectInfo:
        self.f.close()
        os.replace(self.tmp, self.path)
        st = self.path.stat()
        return ObjectInfo(self.path.name, st.st_size, st.st_mtime_ns, f"{st.st_size}:{st.st_mtime_ns}")

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)


class _DirUfs:
    """The few calls the worker makes, on a local directory (only without open_ufs)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.root = Path(uri[len("file://"):])

    def read_into(self, key: str, offset: int, into: memoryview) -> int:
        try:
            with open(self.root / key, "rb") as f:
                f.seek(offset)
                return f.readinto(into)
        except OSError as e:
            raise UfsError(errno.ENOENT if isinstance(e, FileNotFoundError) else errno.EIO,
                           f"{self.uri}/{key}: {e.strerror}") from None

    def writer(self, key: str) -> _DirWriter:
        return _DirWriter(self.root / key)

    def put(self, key: str, data: bytes) -> ObjectInfo:
        w = self.writer(key)
        w.write(data)
        return w.close()

    def close(self) -> None:
        pass


class Counting:
    """Wraps a provider: counts read_into calls (key, offset, length) and can slow or fail them."""

    def __init__(self, inner: typing.Any) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.reads: list[tuple[str, int, int]] = []
        self.delay_s = 0.0
        self.lock = threading.Lock()

    def read_into(self, key: str, offset: int, into: memoryview) -> int:
        with self.lock:
            self.reads.append((key, offset, len(into)))
        time.sleep(self.delay_s)
        return self.inner.read_into(key, offset, into)

    def __getattr__(self, name: str) -> typing.Any:
        return getattr(self.inner, name)


def open_dir(uri: str, options: dict[str, str], timeout_s: float) -> Ufs:
    return _open_ufs(uri, options, timeout_s) if _open_ufs is not None else _DirUfs(uri)  # type: ignore[return-value]


# ---------------------------------------------------------------- two workers

class Node:
    def __init__(self, engine: ThreadIO, root: Path, name: str, worker_id: int, ufs: Counting) -> None:
        self.worker_id = worker_id
        self.store = BlockStore([str(root / name)], engine, reserve=0, direct_io=True)
        self.server = DataServer(self.store, "127.0.0.1", 0, worker_id=worker_id, secret=SECRET).start()
        record = curvine_pb2.UfsMount(mount_id=MOUNT, path="/data", uri=ufs.uri)
        self.resolved = 0

        def resolve(mount_id: int) -> curvine_pb2.UfsMount:
            self.resolved += 1
            return record if mount_id == MOUNT else curvine_pb2.UfsMount()

        self.mounts = UfsMounts(resolve, timeout_s=5.0, opener=lambda uri, opts, t: ufs)
        self.fetcher = UfsFetcher(self.store, self.mounts, self.server.pool, SECRET, timeout_s=5.0)
        self.server.ufs = self.fetcher
        self.target = chain_targets([("127.0.0.1", self.server.port, worker_id)])
        self.address = curvine_pb2.WorkerAddress(worker_id=worker_id, ip="127.0.0.1",
                                                 data_port=self.server.port)

    def close(self) -> None:
        self.server.close()
        self.fetcher.close()


@pytest.fixture(scope="module")
def engine() -> typing.Iterator[ThreadIO]:
    io = ThreadIO(64)
    yield io
    io.close()


@pytest.fixture
def ufs(tmp_path: Path) -> Counting:
    root = tmp_path / "ufs"
    root.mkdir()
    return Counting(open_dir(f"file://{root}", {}, 5.0))


@pytest.fixture
def nodes(engine: ThreadIO, tmp_path: Path, ufs: Counting) -> typing.Iterator[tuple[Node, Node]]:
    a = Node(engine, tmp_path, "a", A_ID, ufs)
    b = Node(engine, tmp_path, "b", B_ID, ufs)
    yield a, b
    a.close()
    b.close()


def put_object(ufs: Counting, key: str, size: int) -> bytes:
    data = os.urandom(size)
    path = Path(ufs.uri[len("file://"):]) / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def connect(node: Node) -> socket.socket:
    return frames.tune(socket.create_connection(("127.0.0.1", node.server.port), timeout=20))


def ufs_read(sock: socket.socket, block_id: int, key: str, ufs_offset: int, ufs_length: int,
             offset: int = 0, length: int = ALL, chain: typing.Sequence[data_pb2.ChainTarget] = ()
             ) -> tuple[data_pb2.DataHeader, bytes]:
    """A client's READ of a UFS block: the header, then the bytes of a successful reply."""
    frames.send_frame(sock, data_pb2.DataHeader(
        op=Op.READ, block_id=block_id, offset=offset, length=length, token=TOKENS.mint(block_id, READ),
        ufs_mount=MOUNT, ufs_key=key, ufs_offset=ufs_offset, ufs_length=ufs_length, ufs_etag="e1",
        chain=list(chain)))
    h = frames.recv_header(sock)
    if h.errno:
        return h, b""
    return h, frames.recv_exact(sock, h.length)


def wait_for(cond: typing.Callable[[], object], timeout: float = 5.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


# ---------------------------------------------------------------- READ through the UFS

def test_read_of_a_missing_block_fetches_its_range_and_stores_it(nodes, ufs):
    a, _ = nodes
    obj = put_object(ufs, "dir/obj.bin", 10 * MiB + 5)
    block = obj[4 * MiB:8 * MiB]
    with connect(a) as s:
        h, got = ufs_read(s, 100, "dir/obj.bin", 4 * MiB, 4 * MiB)
        assert h.errno == 0 and got == block
        assert h.checksum == xxhash.xxh3_64_intdigest(block)
        assert ufs.reads == [("dir/obj.bin", 4 * MiB, 4 * MiB)]
        assert wait_for(lambda: 100 in a.store)
        assert a.store.read_range(100) == block
        added, _ = a.store.drain_changes()          # in the next heartbeat's report
        assert [e.block_id for e in added] == [100]
        h, got = ufs_read(s, 100, "dir/obj.bin", 4 * MiB, 4 * MiB, offset=MiB, length=10)
        assert h.errno == 0 and got == block[MiB:MiB + 10]
        tail = obj[8 * MiB:]                        # the short last block of the object
        h, got = ufs_read(s, 101, "dir/obj.bin", 8 * MiB, len(tail))
        assert got == tail and h.checksum == xxhash.xxh3_64_intdigest(tail)
    assert len(ufs.reads) == 2 and a.resolved == 1   # the stored block: no UFS call; one lookup


def test_a_4k_read_in_the_middle_fetches_the_block_once(nodes, ufs):
    a, _ = nodes
    obj = put_object(ufs, "big", 24 * MiB)
    with connect(a) as s:
        h, got = ufs_read(s, 200, "big", 8 * MiB, 16 * MiB, offset=5 * MiB + 123, length=4096)
        assert h.errno == 0 and got == obj[13 * MiB + 123:13 * MiB + 123 + 4096]
        assert h.checksum == xxhash.xxh3_64_intdigest(obj[8 * MiB:24 * MiB])
        h, got = ufs_read(s, 200, "big", 8 * MiB, 16 * MiB, offset=16 * MiB, length=4096)
        assert h.errno == 0 and got == b""          # at the end: an empty range
    assert ufs.reads == [("big", 8 * MiB, 16 * MiB)]
    assert wait_for(lambda: 200 in a.store) and a.store.read_range(200) == obj[8 * MiB:]


def test_concurrent_reads_of_one_missing_block_share_one_fetch(nodes, ufs):
    a, _ = nodes
    obj = put_object(ufs, "shared", 4 * MiB)
    ufs.delay_s = 0.3                                # every reader arrives during the fetch
    barrier = threading.Barrier(8)

    def reader(i: int) -> bytes:
        with connect(a) as s:
            barrier.wait()
            h, got = ufs_read(s, 300, "shared", 0, 4 * MiB, offset=i * 4096, length=MiB)
            assert h.errno == 0
            return got

    with futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(reader, range(8)))
    assert results == [obj[i * 4096:i * 4096 + MiB] for i in range(8)]
    assert len(ufs.reads) == 1
    assert wait_for(lambda: 300 in a.store)


def test_the_fetched_block_is_forwarded_down_the_chain(nodes, ufs):
    a, b = nodes
    obj = put_object(ufs, "chained", 6 * MiB + 77)
    with connect(a) as s:
        h, got = ufs_read(s, 400, "chained", 0, len(obj), offset=0, length=4096, chain=b.target)
        assert h.errno == 0 and got == obj[:4096]
    assert wait_for(lambda: 400 in a.store and 400 in b.store)
    assert a.store.read_range(400) == obj and b.store.read_range(400) == obj
    assert len(ufs.reads) == 1 and b.resolved == 0   # b got a WRITE, never asked the UFS


def test_ufs_failures_are_answered_and_the_connection_goes_on(nodes, ufs):
    a, _ = nodes
    obj = put_object(ufs, "ok", MiB)
    put_object(ufs, "short", MiB)
    with connect(a) as s:
        h, _ = ufs_read(s, 500, "missing/key", 0, MiB)
        assert h.errno == errno.EREMOTEIO
        assert ufs.uri in h.message and "missing/key" in h.message and "\n" not in h.message
        h, _ = ufs_read(s, 501, "short", 0, 2 * MiB)    # the object is shorter than the block
        assert h.errno == errno.EIO and "short" in h.message
        frames.send_frame(s, data_pb2.DataHeader(op=Op.READ, block_id=502, length=10, ufs_mount=99,
                                                 ufs_key="ok", ufs_length=MiB,
                                                 token=TOKENS.mint(502, READ)))
        h = frames.recv_header(s)                        # a mount the master does not know
        assert h.errno == errno.EREMOTEIO and "mount 99" in h.message
        h, got = ufs_read(s, 503, "ok", 0, MiB)          # the same connection still serves
        assert h.errno == 0 and got == obj
        h, _ = ufs_read(s, 500, "missing/key", 0, MiB)   # a failure is not remembered: asked again
        assert h.errno == errno.EREMOTEIO
    assert wait_for(lambda: 503 in a.store)
    assert 500 not in a.store and 501 not in a.store and 502 not in a.store
    assert [r[0] for r in ufs.reads] == ["missing/key", "short", "ok", "missing/key"]


def test_a_ufs_that_does_not_answer_in_time_is_eremoteio_within_the_timeout(nodes, ufs):
    a, _ = nodes
    obj = put_object(ufs, "slow", MiB)
    a.fetcher.timeout_s = 0.4
    ufs.delay_s = 1.0
    with connect(a) as s:
        start = time.monotonic()
        h, _ = ufs_read(s, 550, "slow", 0, MiB)
        assert h.errno == errno.EREMOTEIO and ufs.uri in h.message and "slow" in h.message
        assert time.monotonic() - start < 0.9
        ufs.delay_s = 0.0
        time.sleep(0.7)                  # the late fetch ends (its bytes are right: stored)
        h, got = ufs_read(s, 550, "slow", 0, MiB)
        assert h.errno == 0 and got == obj


def test_a_read_without_a_token_is_refused_before_any_ufs_call(nodes, ufs):
    a, _ = nodes
    put_object(ufs, "secret", MiB)
    with connect(a) as s:
        frames.send_frame(s, data_pb2.DataHeader(op=Op.READ, block_id=600, length=ALL, ufs_mount=MOUNT,
                                                 ufs_key="secret", ufs_length=MiB))
        assert frames.recv_header(s).errno == errno.EACCES
    assert ufs.reads == []


# ---------------------------------------------------------------- LoadBlocks and Persist

@pytest.fixture
def rpc_a(nodes) -> typing.Iterator[curvine_pb2_grpc.WorkerServiceStub]:
    a, _ = nodes
    persister = Persister(a.store, a.mounts, ConnectionPool(), a.fetcher.buffers, lambda: A_ID, 5.0)
    svc = service.WorkerService(a.store, lambda: A_ID, ufs=service.UfsParts(a.fetcher, persister, 2))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service.add_to_server(svc, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield curvine_pb2_grpc.WorkerServiceStub(channel)
    channel.close()
    server.stop(0)


def ufs_block(block_id: int, key: str, offset: int, length: int, workers: typing.Sequence[int]
              ) -> curvine_pb2.BlockInfo:
    return curvine_pb2.BlockInfo(block_id=block_id, offset=offset, length=length, workers=list(workers),
                                 ufs=curvine_pb2.UfsRange(mount_id=MOUNT, key=key, offset=offset, load=True))


def test_load_blocks_fetches_stores_and_forwards(nodes, ufs, rpc_a):
    a, b = nodes
    obj = put_object(ufs, "load/me", 9 * MiB)
    blocks = [ufs_block(700 + i, "load/me", i * 4 * MiB, min(4 * MiB, len(obj) - i * 4 * MiB), [A_ID, B_ID])
              for i in range(3)]
    blocks.append(ufs_block(710, "load/absent", 0, MiB, [A_ID]))
    reply = rpc_a.LoadBlocks(curvine_pb2.LoadBlocksRequest(blocks=blocks, workers=[a.address, b.address]),
                             timeout=20)
    assert sorted(reply.loaded) == [700, 701, 702] and list(reply.failed) == [710]
    assert "710" in reply.message and "load/absent" in reply.message
    for i in range(3):
        want = obj[i * 4 * MiB:(i + 1) * 4 * MiB]
        assert a.store.read_range(700 + i) == want
        assert wait_for(lambda: 700 + i in b.store) and b.store.read_range(700 + i) == want
    reads = len(ufs.reads)
    again = rpc_a.LoadBlocks(curvine_pb2.LoadBlocksRequest(blocks=blocks[:3], workers=[a.address]), timeout=20)
    assert sorted(again.loaded) == [700, 701, 702] and len(ufs.reads) == reads   # present: no UFS call


def store_block(node: Node, block_id: int, data: bytes) -> None:
    w = node.store.create(block_id, 0, len(data))
    w.append(data)
    w.commit(len(data), xxhash.xxh3_64_intdigest(data))


def test_persist_uploads_local_and_remote_blocks_byte_exact(nodes, ufs, rpc_a):
    a, b = nodes
    parts = [os.urandom(4 * MiB), os.urandom(4 * MiB), os.urandom(MiB + 3)]
    store_block(a, 800, parts[0])                   # held here: read from the store
    store_block(b, 801, parts[1])                   # only on b: a READ to b
    store_block(a, 802, parts[2])
    store_block(b, 802, parts[2])
    blocks, offset = [], 0
    for i, (bid, holders) in enumerate([(800, [A_ID]), (801, [A_ID, B_ID]), (802, [B_ID, A_ID])]):
        blocks.append(curvine_pb2.BlockInfo(block_id=bid, offset=offset, length=len(parts[i]),
                                            checksum=xxhash.xxh3_64_intdigest(parts[i]), workers=holders,
                                            token=TOKENS.mint(bid, READ)))
        offset += len(parts[i])
    req = curvine_pb2.PersistRequest(mount_id=MOUNT, key="out/file.bin", size=offset, blocks=blocks,
                                     workers=[a.address, b.address])
    reply = rpc_a.Persist(req, timeout=20)
    path = Path(ufs.uri[len("file://"):]) / "out" / "file.bin"
    assert path.read_bytes() == b"".join(parts)
    assert reply.etag and reply.mtime_ns > 0
    empty = rpc_a.Persist(curvine_pb2.PersistRequest(mount_id=MOUNT, key="out/empty", size=0), timeout=20)
    assert (path.parent / "empty").read_bytes() == b"" and empty.etag
    assert ufs.reads == []


def test_persist_reads_remote_blocks_with_tokens_it_mints(nodes, ufs):
    """An upload that outlasts the read tokens the master sent (here: sent expired) still
    reads the blocks other workers hold: a persister with the cluster's tokens mints its
    own per read; one without them is refused (issue 40: tokens expire)."""
    a, b = nodes
    data = os.urandom(MiB)
    store_block(b, 950, data)
    stale = TOKENS.mint(950, READ, expiry=int(time.time()) - 3600)

    def persist(persister: Persister, key: str) -> None:
        block = curvine_pb2.BlockInfo(block_id=950, offset=0, length=MiB, workers=[B_ID], token=stale,
                                      checksum=xxhash.xxh3_64_intdigest(data))
        persister.persist(curvine_pb2.PersistRequest(mount_id=MOUNT, key=key, size=MiB, blocks=[block],
                                                     workers=[a.address, b.address]))

    with pytest.raises(CurvineError, match="expired"):
        persist(Persister(a.store, a.mounts, ConnectionPool(), a.fetcher.buffers, lambda: A_ID, 5.0), "out/stale")
    persist(Persister(a.store, a.mounts, ConnectionPool(), a.fetcher.buffers, lambda: A_ID, 5.0, tokens=TOKENS),
            "out/fresh")
    assert (Path(ufs.uri[len("file://"):]) / "out" / "fresh").read_bytes() == data


def test_persist_failures_abort_the_upload(nodes, ufs, rpc_a):
    a, b = nodes
    store_block(a, 900, b"x" * MiB)
    blocks = [curvine_pb2.BlockInfo(block_id=900, offset=0, length=MiB, workers=[A_ID]),
              curvine_pb2.BlockInfo(block_id=901, offset=MiB, length=MiB, workers=[B_ID],
                                    token=TOKENS.mint(901, READ))]     # b lacks it
    req = curvine_pb2.PersistRequest(mount_id=MOUNT, key="out/broken", size=2 * MiB, blocks=blocks,
                                     workers=[a.address, b.address])
    with pytest.raises(grpc.RpcError) as info:
        rpc_a.Persist(req, timeout=20)
    assert "901" in info.value.details() and "\n" not in info.value.details()
    root = Path(ufs.uri[len("file://"):])
    assert not (root / "out" / "broken").exists()
    assert not [p for p in root.rglob("*") if p.is_file()]         # nothing partial left
    bad = curvine_pb2.PersistRequest(mount_id=MOUNT, key="x", size=5, blocks=blocks[:1])
    with pytest.raises(grpc.RpcError) as info:
        rpc_a.Persist(bad, timeout=20)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# ---------------------------------------------------------------- the worker as wired by main.py

class FakeMaster(curvine_pb2_grpc.MasterServiceServicer):
    """Registration, reports and heartbeats, and the mount table's UfsMountGet."""

    def __init__(self, mount: curvine_pb2.UfsMount) -> None:
        self.mount = mount
        self.mount_gets: list[int] = []
        self.heartbeats: list[curvine_pb2.HeartbeatRequest] = []

    def RegisterWorker(self, request, context):
        return curvine_pb2.RegisterReply(worker_id=A_ID, heartbeat_ms=50)

    def ReportBlocks(self, request, context):
        return curvine_pb2.Empty()

    def Heartbeat(self, request, context):
        self.heartbeats.append(request)
        return curvine_pb2.HeartbeatReply()

    def UfsMountGet(self, request, context):
        self.mount_gets.append(request.mount_id)
        if request.mount_id != self.mount.mount_id:
            abort(context, CurvineError(errno.ENOENT, f"no UFS mount {request.mount_id}"))
        return self.mount


def test_the_worker_process_wiring_asks_the_master_and_reports_the_block(tmp_path, ufs):
    master = FakeMaster(curvine_pb2.UfsMount(mount_id=MOUNT, path="/data", uri=ufs.uri))
    server = grpc.server(futures.ThreadPoolExecutor(4))
    curvine_pb2_grpc.add_MasterServiceServicer_to_server(master, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    cfg = config.Config()
    cfg.cluster.secret = SECRET
    w = cfg.worker
    w.master, w.bind, w.ip, w.data_port, w.rpc_port = f"127.0.0.1:{port}", "127.0.0.1", "127.0.0.1", 0, 0
    w.dirs, w.io_engine, w.metrics_port, w.local_writes = [str(tmp_path / "w")], "threads", 0, False
    cfg.ufs.timeout_s = 5.0
    worker = Worker(cfg)
    try:
        worker.start()
        assert worker.ready.wait(15)
        if _open_ufs is None:            # until curvine_py.ufs.open_ufs exists: the stand-in
            assert worker.ufs_mounts is not None
            worker.ufs_mounts._open = lambda uri, opts, t: ufs   # type: ignore[method-assign]
        obj = put_object(ufs, "p/obj", 3 * MiB)
        assert worker.data is not None
        with frames.tune(socket.create_connection(("127.0.0.1", worker.data.port), timeout=20)) as s:
            h, got = ufs_read(s, 1000, "p/obj", 0, len(obj))
            assert h.errno == 0 and got == obj
            frames.send_frame(s, data_pb2.DataHeader(op=Op.READ, block_id=1001, length=ALL, ufs_mount=99,
                                                     ufs_key="p/obj", ufs_length=MiB,
                                                     token=TOKENS.mint(1001, READ)))
            h = frames.recv_header(s)
            assert h.errno == errno.EREMOTEIO and "no UFS mount 99" in h.message
        assert master.mount_gets == [MOUNT, 99]
        assert wait_for(lambda: any(b.block_id == 1000 for hb in master.heartbeats for b in hb.report.added))
        channel = rpc.channel(f"127.0.0.1:{worker.rpc_port}", SECRET)
        try:
            stub = curvine_pb2_grpc.WorkerServiceStub(channel)
            reply = stub.LoadBlocks(curvine_pb2.LoadBlocksRequest(
                blocks=[ufs_block(1002, "p/obj", MiB, MiB, [A_ID])]), timeout=20)
            assert list(reply.loaded) == [1002] and worker.store is not None
            assert worker.store.read_range(1002) == obj[MiB:2 * MiB]
        finally:
            channel.close()
    finally:
        worker.stop()
        server.stop(0)


# ---------------------------------------------------------------- against a real S3 server

def test_read_through_and_persist_against_moto_s3(engine, tmp_path, request):
    """The same READ and Persist with the S3 provider on moto's server (skipped where moto,
    the moto_s3 fixture or open_ufs is missing)."""
    try:
        s3 = request.getfixturevalue("moto_s3")
    except pytest.FixtureLookupError:
        pytest.skip("tests/conftest.py has no moto_s3 fixture")
    if _open_ufs is None:
        pytest.skip("curvine_py.ufs.open_ufs is not there")
    s3.make_bucket("cvworker")
    obj = os.urandom(6 * MiB + 11)
    s3.boto3_client().put_object(Bucket="cvworker", Key="pre/obj.bin", Body=obj)
    options = {"endpoint_url": s3.endpoint, "region": s3.region, "access_key_id": s3.access_key,
               "secret_access_key": s3.secret_key}
    provider = Counting(_open_ufs("s3://cvworker/pre", options, 10.0))
    a = Node(engine, tmp_path, "a", A_ID, provider)
    try:
        with connect(a) as s:
            h, got = ufs_read(s, 1100, "obj.bin", 4 * MiB, len(obj) - 4 * MiB, offset=4096, length=4096)
            assert h.errno == 0 and got == obj[4 * MiB + 4096:4 * MiB + 8192]
            h, _ = ufs_read(s, 1101, "absent.bin", 0, MiB)
            assert h.errno == errno.EREMOTEIO and "s3://cvworker/pre" in h.message and "absent.bin" in h.message
        assert provider.reads[0] == ("obj.bin", 4 * MiB, len(obj) - 4 * MiB)
        assert wait_for(lambda: 1100 in a.store)
        store_block(a, 1102, obj[:4 * MiB])
        blocks = [curvine_pb2.BlockInfo(block_id=1102, offset=0, length=4 * MiB, workers=[A_ID]),
                  curvine_pb2.BlockInfo(block_id=1100, offset=4 * MiB, length=len(obj) - 4 * MiB, workers=[A_ID])]
        persister = Persister(a.store, a.mounts, ConnectionPool(), a.fetcher.buffers, lambda: A_ID, 10.0)
        reply = persister.persist(curvine_pb2.PersistRequest(mount_id=MOUNT, key="out/copy.bin", size=len(obj),
                                                             blocks=blocks))
        body = s3.boto3_client().get_object(Bucket="cvworker", Key="pre/out/copy.bin")["Body"].read()
        assert body == obj and reply.etag
    finally:
        a.close()
