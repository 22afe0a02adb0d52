"""Short-circuit writes through a real local cluster: a client whose host identity is
worker 0's writes worker 0's replica into the block file itself (the worker passes the
staging file's descriptor over its local socket) and sends worker 1 its copy over TCP.
Every replica is then read back over the network, and the local one through the
short-circuit reader too, which verifies it against the chunk sums the client sent."""
from __future__ import annotations

import os
import signal
import time
import typing
from collections import Counter

import xxhash


from curvine_py.cluster.local import LocalCluster
from curvine_py.pb import curvine_pb2 as pb
from tests.conftest import client_on_host

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client

MiB = 1 << 20
SIZE = 9 * MiB + 12345          # three blocks, the last one short and not 4 KiB aligned


def write_in_pieces(client: "Client", path: str, data: bytes, piece: int = MiB) -> None:
    """Sequential writes in 1 MiB pieces, as the mount hands them over: blocks are streamed."""
    with client.open(path, "wb") as f:
        for off in range(0, len(data), piece):
            f.write(data[off:off + piece])


def replicas(client: "Client", path: str) -> list[tuple[pb.BlockInfo, pb.WorkerAddress, bytes]]:
    """Every replica of every block of path, each read over the network from its worker."""
    reply = client.core.meta.block_locations(client.stat(path).ino)
    client.core.workers.learn(list(reply.workers))
    by_id = {w.worker_id: w for w in reply.workers}
    out = []
    for b in sorted(reply.blocks, key=lambda b: b.offset):
        assert len(b.workers) == 2, f"block {b.block_id} has {len(b.workers)} replicas"
        for wid in b.workers:
            buf = bytearray(b.length)
            n = client.core.io.read_block(by_id[wid], b.block_id, 0, memoryview(buf), token=b.token)
            out.append((b, by_id[wid], bytes(buf[:n])))
    return out


def test_the_local_replica_is_written_into_its_block_file(local_client: "Client",
                                                           shared_cluster: LocalCluster) -> None:
    data = os.urandom(SIZE)
    lw = local_client.core.paths.localwrites
    assert lw is not None
    before = lw.stats()
    write_in_pieces(local_client, "/lw-a", data)
    moved = {k: v - before[k] for k, v in lw.stats().items()}
    assert moved == {"blocks": 3, "refused": 0}, moved
    got = replicas(local_client, "/lw-a")
    assert len(got) == 6
    for b, _, raw in got:
        assert raw == data[b.offset:b.offset + b.length]
    # the local copy, read from its file and verified chunk by chunk against the meta
    # file the worker wrote from the client's sums
    sc = local_client.core.paths.shortcircuit
    assert sc is not None
    reads = sc.stats()["reads"]
    assert local_client.get_bytes("/lw-a") == data
    assert sc.stats()["reads"] - reads == 3 and sc.stats()["fallbacks"] == 0


def test_a_client_on_another_host_sends_every_replica_over_the_network(shared_cluster: LocalCluster) -> None:
    c = client_on_host(shared_cluster, "elsewhere")
    try:
        data = os.urandom(5 * MiB + 1)
        write_in_pieces(c, "/lw-b", data)
        lw = c.core.paths.localwrites
        assert lw is not None and lw.stats() == {"blocks": 0, "refused": 0}
        assert c.get_bytes("/lw-b") == data
    finally:
        c.close()


def test_a_stream_dropped_by_a_rewrite_leaves_no_block_behind(local_client: "Client",
                                                             shared_cluster: LocalCluster) -> None:
    """A write below what a stream already took drops the stream (the block is then
    shipped whole over the network): the staging file the local worker had passed is
    recycled, and only committed blocks exist."""
    data = bytearray(os.urandom(3 * MiB))
    with local_client.open("/lw-c", "wb") as f:
        f.write(data[:2 * MiB])               # opens the stream, 2 MiB on their way
        f.seek(10)
        f.write(b"rewritten")                 # below the stream's bytes: dropped
        data[10:19] = b"rewritten"
        f.seek(2 * MiB)
        f.write(data[2 * MiB:])
    assert local_client.get_bytes("/lw-c") == bytes(data)
    for b, _, raw in replicas(local_client, "/lw-c"):
        assert raw == bytes(data[b.offset:b.offset + b.length])
    staging = shared_cluster.dir / "worker0" / "data" / "staging"
    deadline = time.monotonic() + 10
    while list(staging.iterdir()):   # the worker sees the dropped connection, recycles the file
        assert time.monotonic() < deadline, f"left in staging: {list(staging.iterdir())}"
        time.sleep(0.05)


def test_a_worker_with_local_writes_off_gets_the_bytes_over_tcp(cluster_factory: typing.Callable[..., LocalCluster]
                                                                ) -> None:
    c = cluster_factory(extra_worker_flags=("--worker-local-writes", "false"))
    client = client_on_host(c, c.worker_host(0))
    try:
        data = os.urandom(5 * MiB + 7)
        write_in_pieces(client, "/off", data)
        lw = client.core.paths.localwrites
        assert lw is not None and lw.blocks == 0 and lw.refused == 2
        for b, _, raw in replicas(client, "/off"):
            assert raw == data[b.offset:b.offset + b.length]
    finally:
        client.close()


def test_client_switch_off_keeps_every_replica_on_the_network(shared_cluster: LocalCluster) -> None:
    c = client_on_host(shared_cluster, shared_cluster.worker_host(0), short_circuit_writes=False)
    try:
        assert c.core.paths.localwrites is None
        data = os.urandom(4 * MiB + 3)
        write_in_pieces(c, "/lw-d", data)
        assert c.get_bytes("/lw-d") == data
    finally:
        c.close()


def test_the_writers_host_gets_the_first_replica_of_every_block(
        cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    """With three workers the ring alone would put a block on the writer's host two
    times in three; the writer names its host in AllocateBlocks, so every block has a
    replica there, written by short-circuit."""
    c = cluster_factory(workers=3)
    client = client_on_host(c, c.worker_host(2), block_size=2 * MiB)
    try:
        data = os.urandom(40 * MiB)
        write_in_pieces(client, "/local-first", data)
        lw = client.core.paths.localwrites
        assert lw is not None and lw.stats() == {"blocks": 20, "refused": 0}
        got = replicas(client, "/local-first")
        hosts = {}
        for b, w, raw in got:
            assert raw == data[b.offset:b.offset + b.length]
            hosts.setdefault(b.block_id, set()).add(w.host)
        assert len(hosts) == 20 and all(c.worker_host(2) in h and len(h) == 2 for h in hosts.values())
    finally:
        client.close()
    elsewhere = client_on_host(c, "elsewhere", block_size=2 * MiB)
    try:   # a writer on no worker's host: the ring spreads the blocks over all three
        write_in_pieces(elsewhere, "/ring", os.urandom(40 * MiB))
        held = Counter(w.host for _, w, _ in replicas(elsewhere, "/ring"))
        assert len(held) == 3 and held[c.worker_host(2)] < 20
    finally:
        elsewhere.close()


def test_blocks_shipped_whole_from_the_writers_buffer_go_local_too(local_client: "Client") -> None:
    """A block written out of order is not streamed: it is shipped whole from its
    (page-aligned) buffer when complete, and its local replica by short-circuit as well.
    Whole blocks handed over from the application's own memory are not aligned for
    O_DIRECT: they go over the network, without asking the worker first."""
    lw = local_client.core.paths.localwrites
    assert lw is not None
    data = os.urandom(4 * MiB + 5000)
    before = lw.stats()
    with local_client.open("/lw-e", "wb") as f:
        f.seek(2 * MiB)
        f.write(data[2 * MiB:])               # the tail first: nothing to stream
        f.seek(0)
        f.write(data[:2 * MiB])
    moved = {k: v - before[k] for k, v in lw.stats().items()}
    assert moved == {"blocks": 2, "refused": 0}, moved
    for b, _, raw in replicas(local_client, "/lw-e"):
        assert raw == data[b.offset:b.offset + b.length]
    before = lw.stats()
    whole = os.urandom(8 * MiB)
    local_client.put_bytes("/lw-f", whole)    # two whole blocks straight from `whole`
    moved = {k: v - before[k] for k, v in lw.stats().items()}
    assert moved["blocks"] == 0 and local_client.get_bytes("/lw-f") == whole


def test_the_local_worker_killed_mid_block_costs_no_byte(shared_cluster: LocalCluster) -> None:
    """SIGKILL of the local worker while a block is half written into its staging file
    through the passed descriptor: the client's writes to it still succeed (the file is
    open), its commit finds the socket gone, and the block goes again, whole, to a new
    block on the worker that is left.  Every byte reads back.  On the module's cluster:
    the worker is started again at the end."""
    from tests.integration.test_streamed_writes import wait_sent, writer_of
    cluster, killed = shared_cluster, False
    client = client_on_host(cluster, cluster.worker_host(0))
    data = os.urandom(6 * MiB + 3)
    try:
        with client.open("/survives-local", "wb") as f:
            f.write(data[:2 * MiB])
            stream = writer_of(f).streams[0]
            wait_sent(stream, 2 * MiB)
            assert stream._file is not None, "the block's local replica is being written directly"
            cluster.kill_worker(0, signal.SIGKILL)
            killed = True
            f.write(data[2 * MiB:])
        assert stream._failed is not None and stream.future.result().block_id != stream.target.block_id
        assert client.get_bytes("/survives-local") == data
        for b in client.block_locations("/survives-local"):
            assert b.checksum == xxhash.xxh3_64_intdigest(data[b.offset:b.offset + b.length])
    finally:
        client.close()
        if killed:
            cluster.restart_worker(0)
