"""Short-circuit reads through a real local cluster: a client whose host identity is
worker 0's reads worker 0's replicas from their block files, verified; a corrupt or
missing block file falls back to the network (the other replica) with exact bytes."""
from __future__ import annotations

import mmap
import os
import typing


from curvine_py.common import rpc
from curvine_py.cluster.local import LocalCluster
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc
from tests.conftest import client_on_host

if typing.TYPE_CHECKING:
    from curvine_py.client.shortcircuit import ShortCircuit
    from curvine_py.sdk import Client

MiB = 1 << 20
SIZE = 9 * MiB + 12345          # three blocks, the last one short and not chunk-aligned


def payload(seed: int) -> bytes:
    return os.urandom(64) * (SIZE // 64) + os.urandom(SIZE % 64) + bytes([seed])


def local_block_files(client: "Client", cluster: LocalCluster, path: str) -> list[str]:
    """Paths of worker 0's block files of path, as its StatBlock reports them."""
    ino = client.stat(path).ino
    reply = client.core.meta.block_locations(ino)
    w0 = next(w for w in reply.workers if w.host == cluster.worker_host(0))
    channel = rpc.channel(f"{w0.ip}:{w0.rpc_port}", client.config.cluster.secret)
    try:
        stub = curvine_pb2_grpc.WorkerServiceStub(channel)
        stats = [stub.StatBlock(pb.BlockRequest(block_id=b.block_id), timeout=5) for b in reply.blocks]
    finally:
        channel.close()
    assert all(s.exists for s in stats), "both replicas were written (two workers, two replicas)"
    return [s.path for s in stats]


def local_block(client: "Client", path: str, last: bool) -> tuple["ShortCircuit", pb.WorkerAddress, pb.BlockInfo]:
    """The client's short-circuit reader, the local worker, and path's first or last block."""
    sc = client.core.paths.shortcircuit
    assert sc is not None
    reply = client.core.meta.block_locations(client.stat(path).ino)
    client.core.workers.learn(list(reply.workers))
    block = (max if last else min)(reply.blocks, key=lambda b: b.offset)
    return sc, next(w for w in reply.workers if w.host == sc.host), block


def counted_read(client: "Client", path: str) -> tuple[bytes, dict[str, int]]:
    """get_bytes(path) and how the client's short-circuit counters moved during it."""
    sc = client.core.paths.shortcircuit
    assert sc is not None
    before = sc.stats()
    got = client.get_bytes(path)
    after = sc.stats()
    return got, {k: after[k] - before[k] for k in after}


def test_same_host_reads_use_the_block_file(local_client: "Client", remote_dir: str) -> None:
    data = payload(1)
    local_client.put_bytes(f"{remote_dir}/f", data)
    got, moved = counted_read(local_client, f"{remote_dir}/f")
    assert got == data
    assert moved["reads"] == 3
    assert moved["bytes"] == len(data)
    assert moved["fallbacks"] == 0
    sc = local_client.core.paths.shortcircuit
    assert sc is not None
    fallbacks = sc.stats()["fallbacks"]
    # unaligned ranges (partial chunks at both ends, across a block boundary)
    with local_client.open(f"{remote_dir}/f") as f:
        for off, n in ((1, 100), (MiB - 7, 2 * MiB + 9), (4 * MiB - 3, 5 * MiB), (SIZE - 10, 50)):
            f.seek(off)
            assert f.read(n) == data[off:off + n]
    assert sc.stats()["fallbacks"] == fallbacks


def test_other_hosts_read_over_the_network(shared_cluster: LocalCluster, client: "Client",
                                           remote_dir: str) -> None:
    """The default client's host is the hostname: no worker of the local cluster is on it."""
    data = payload(2)
    client.put_bytes(f"{remote_dir}/f", data)
    assert client.get_bytes(f"{remote_dir}/f") == data
    assert client.core.paths.shortcircuit is not None and client.core.paths.shortcircuit.stats()["reads"] == 0
    off = client_on_host(shared_cluster, shared_cluster.worker_host(0), short_circuit=False)
    try:
        assert off.core.paths.shortcircuit is None
        assert off.get_bytes(f"{remote_dir}/f") == data
    finally:
        off.close()


def test_flipped_byte_falls_back_to_the_other_replica(shared_cluster: LocalCluster, local_client: "Client",
                                                      remote_dir: str) -> None:
    data = payload(3)
    local_client.put_bytes(f"{remote_dir}/f", data)
    paths = local_block_files(local_client, shared_cluster, f"{remote_dir}/f")
    with open(paths[1], "r+b") as f:   # one byte in the middle of block 1
        f.seek(MiB + 17)
        byte = f.read(1)
        f.seek(MiB + 17)
        f.write(bytes([byte[0] ^ 0x40]))
    got, moved = counted_read(local_client, f"{remote_dir}/f")
    assert got == data
    assert moved["fallbacks"] == 1
    assert moved["reads"] == 2   # blocks 0 and 2 still came from the files


def test_deleted_block_file_falls_back(shared_cluster: LocalCluster, local_client: "Client",
                                       remote_dir: str) -> None:
    data = payload(4)
    local_client.put_bytes(f"{remote_dir}/f", data)
    assert local_client.get_bytes(f"{remote_dir}/f") == data   # paths now cached by the client
    paths = local_block_files(local_client, shared_cluster, f"{remote_dir}/f")
    os.unlink(paths[0])
    got, moved = counted_read(local_client, f"{remote_dir}/f")
    assert got == data
    assert moved["fallbacks"] == 1
    assert moved["reads"] == 2


def test_partial_ranges_of_a_block(local_client: "Client", remote_dir: str) -> None:
    """Ranges that start or end inside a 1 MiB chunk (the writer's read-modify-write asks
    for these): the partly covered chunks are verified whole, only the range is copied."""
    data = payload(5)
    local_client.put_bytes(f"{remote_dir}/f", data)
    sc, w0, block = local_block(local_client, f"{remote_dir}/f", last=True)   # the short last block
    base = block.offset
    for off, n in ((0, 1), (5, MiB), (MiB - 1, 2), (MiB, block.length - MiB), (3, block.length - 3), (0, block.length),
                   (block.length - 1, 1), (MiB + 1, block.length - MiB - 2)):
        into = bytearray(n)
        assert sc.read(w0, block, off, memoryview(into)) == n
        assert bytes(into) == data[base + off:base + off + n], (off, n)
    assert sc.stats()["fallbacks"] == 0


class _NoStatBlock:
    """A worker stub whose StatBlock must not be called."""

    def StatBlock(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("StatBlock called although the layout names the block's file")


def test_block_files_are_found_by_the_layout_without_a_call(local_client: "Client", remote_dir: str) -> None:
    """After one Info per worker, local blocks are found under its data dirs by the
    documented layout (blockmeta.block_file): no StatBlock round trip per block."""
    sc = local_client.core.paths.shortcircuit
    assert sc is not None
    local_client.put_bytes(f"{remote_dir}/warm", payload(6))
    assert local_client.get_bytes(f"{remote_dir}/warm")          # learns the data dirs (Info)
    data = payload(7)
    local_client.put_bytes(f"{remote_dir}/f", data)
    real_stub, sc._stub = sc._stub, lambda addr: _NoStatBlock()  # type: ignore[method-assign]
    try:
        got, moved = counted_read(local_client, f"{remote_dir}/f")
    finally:
        sc._stub = real_stub  # type: ignore[method-assign]
    assert got == data
    assert moved["reads"] == 3 and moved["fallbacks"] == 0


def test_a_block_outside_the_layout_is_found_by_statblock(local_client: "Client", remote_dir: str) -> None:
    """Data dirs where the layout does not find a block (here: a wrong list) cost one
    StatBlock per block; the read stays local and verified."""
    sc = local_client.core.paths.shortcircuit
    assert sc is not None
    local_client.put_bytes(f"{remote_dir}/warm", payload(8))
    assert local_client.get_bytes(f"{remote_dir}/warm")          # learns the data dirs (Info)
    with sc._lock:
        assert sc._dirs
        for where in sc._dirs:
            sc._dirs[where] = ["/nonexistent/curvine-data"]
    data = payload(9)
    local_client.put_bytes(f"{remote_dir}/f", data)
    got, moved = counted_read(local_client, f"{remote_dir}/f")
    assert got == data
    assert moved["reads"] == 3 and moved["fallbacks"] == 0


class Heard(list[int]):
    """What a reader's block-cache entry hears of a read's progress (frames.Arrivals)."""

    def advance(self, got: int) -> None:
        self.append(got)


def test_a_local_read_announces_each_chunk_once_verified(shared_cluster: LocalCluster, local_client: "Client",
                                                         remote_dir: str) -> None:
    """The block's head is usable before its tail is read (the reader's `advance`), and
    only verified chunks are announced: a chunk that fails its checksum is not."""
    data = payload(10)
    local_client.put_bytes(f"{remote_dir}/f", data)
    sc, w0, block = local_block(local_client, f"{remote_dir}/f", last=False)   # a whole 4 MiB block: 4 chunks
    heard = Heard()
    into = memoryview(mmap.mmap(-1, block.length))
    assert sc.read(w0, block, 0, into, heard) == block.length
    assert heard == [MiB, 2 * MiB, 3 * MiB, 4 * MiB] and into == data[:block.length]
    heard.clear()
    assert sc.read(w0, block, 5, into[:3 * MiB], heard) == 3 * MiB   # ends inside chunk 3
    assert heard == [MiB - 5, 2 * MiB - 5, 3 * MiB - 5, 3 * MiB] and into[:3 * MiB] == data[5:3 * MiB + 5]
    path = local_block_files(local_client, shared_cluster, f"{remote_dir}/f")[0]
    with open(path, "r+b") as f:   # one byte of chunk 2
        f.seek(2 * MiB + 3)
        f.write(bytes([data[2 * MiB + 3] ^ 1]))
    heard.clear()
    assert sc.read(w0, block, 0, into, heard) is None    # the caller reads the network instead
    assert heard == [MiB, 2 * MiB]
