"""Re-replication on a real 3-worker cluster (three host identities on this machine):
a lost worker's blocks are copied until every block has two live copies on two hosts;
a worker that returns with its old blocks is reconciled without double counting; a
corrupted replica is caught by its checksum, the reader gets good bytes, and the block
is copied again from the good one.  Multi-host (network namespace) versions of these
scenarios live in tests/multihost/."""
from __future__ import annotations

import errno
import os
import typing

import grpc
import pytest

from curvine_py.common.errors import CurvineError
from curvine_py.cli.stats import scrape
from curvine_py.cluster.local import LocalCluster
from curvine_py.pb import curvine_pb2, curvine_pb2_grpc
from tests.conftest import FAST_MASTER_FLAGS, client_config, wait_until

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client

MiB = 1 << 20
FLAGS = (*FAST_MASTER_FLAGS, "--master-worker-timeout-s", "2", "--master-replication-scan-s", "1",
         "--master-block-size", "1MiB")
pytestmark = pytest.mark.timeout(180)


def connect(c: LocalCluster) -> "Client":
    from curvine_py.sdk import Client
    return Client(master=c.master_address, config=client_config(c))


def payload(i: int, size: int) -> bytes:
    return (i.to_bytes(4, "little") + os.urandom(12)) * (size // 16) + b"x" * (size % 16)


def worker_ids(c: LocalCluster) -> dict[str, int]:
    """host identity -> worker id, from the master's report."""
    rep = c.report()
    assert rep is not None
    return {w.address.host: w.address.worker_id for w in rep.workers}


def replica_map(client: "Client", paths: list[str]) -> dict[int, list[int]]:
    out = {}
    for p in paths:
        for b in client.block_locations(p):
            out[b.block_id] = [w.worker_id for w in b.workers]
    return out


def healthy(c: LocalCluster) -> bool:
    rep = c.report()
    return rep is not None and rep.under_replicated == 0


def stat_block(c: LocalCluster, i: int, block_id: int) -> curvine_pb2.BlockStatReply:
    rpc_address = c.workers[i].address
    with grpc.insecure_channel(rpc_address) as ch:
        stub = curvine_pb2_grpc.WorkerServiceStub(ch)
        return stub.StatBlock(curvine_pb2.BlockRequest(block_id=block_id), timeout=5,
                              metadata=(("curvine-secret", c.secret),))


NO_MEMORY_TIER = ["--worker-memory-cache", "0"]


@pytest.fixture
def three(cluster_factory: typing.Callable[..., LocalCluster]) -> LocalCluster:
    return cluster_factory(workers=3, extra_master_flags=FLAGS)


def test_lost_worker_blocks_are_copied_then_reconciled_on_return(three: LocalCluster) -> None:
    c = three
    client = connect(c)
    files = {f"/r/f{i}": payload(i, 3 * MiB + 1000 * i) for i in range(6)}
    client.makedirs("/r")
    for p, data in files.items():
        client.put_bytes(p, data)
    ids = worker_ids(c)
    victim = ids[c.worker_host(0)]
    before = replica_map(client, list(files))
    affected = [b for b, ws in before.items() if victim in ws]
    assert affected, "the victim held no block: the test proves nothing"

    c.kill_worker(0)
    took = wait_until("re-replication of the lost worker's blocks", lambda: healthy(c)
                      and all(victim not in ws and len(ws) == 2
                              for ws in replica_map(client, list(files)).values()))
    after = replica_map(client, list(files))
    hosts = {w.address.worker_id: w.address.host for w in c.report().workers}
    for bid, ws in after.items():
        assert len({hosts[w] for w in ws}) == 2, f"block {bid}: copies on one host"
    for p, data in files.items():
        assert client.get_bytes(p) == data
    print(f"under-replicated blocks back to 0 {took:.1f} s after the kill (timeout 2 s)")

    # The victim returns with its old copies: they are now extra and get deleted; nothing counted twice.
    c.restart_worker(0)
    wait_until("the returned worker's extra copies to be dropped", lambda: (
        (rep := c.report()) is not None
        and sum(w.blocks for w in rep.workers if w.state == "live") == 2 * rep.blocks
        and all(len(ws) == 2 for ws in replica_map(client, list(files)).values())))
    for p, data in files.items():
        assert client.get_bytes(p) == data
    client.close()


def test_corrupt_replica_is_repaired_from_the_good_one(cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    # The memory tier off: a kept copy would serve the block without touching the file.
    c = cluster_factory(workers=3, extra_master_flags=FLAGS, extra_worker_flags=NO_MEMORY_TIER)
    client = connect(c)
    data = payload(7, 2 * MiB + 5)
    client.makedirs("/corrupt")
    client.put_bytes("/corrupt/a", data)
    block = client.block_locations("/corrupt/a")[0]
    ids = worker_ids(c)
    index_of = {ids[c.worker_host(i)]: i for i in range(3)}
    bad_wid = block.workers[0].worker_id
    before = {p.name: scrape(p.metrics) for p in c.workers}
    st = stat_block(c, index_of[bad_wid], block.block_id)
    assert st.exists
    with open(st.path, "r+b") as f:           # flip bytes in the middle of the block file
        f.seek(block.length // 2)
        chunk = f.read(16)
        f.seek(block.length // 2)
        f.write(bytes(b ^ 0xFF for b in chunk))

    # A read from the corrupt copy itself fails its checksum (EBADMSG), never returns bad bytes...
    ino = client.stat("/corrupt/a").ino
    info = client.meta.block_locations(ino)
    addr = next(w for w in info.workers if w.worker_id == bad_wid)
    buf = bytearray(block.length)
    with pytest.raises(CurvineError) as e:
        client.core.io.read_block(addr, block.block_id, 0, memoryview(buf), info.blocks[0].token)
    assert e.value.errno == errno.EBADMSG
    # ... and every read through the client returns the right bytes, whichever copy it tries.
    for _ in range(3):
        fresh = connect(c)
        assert fresh.get_bytes("/corrupt/a") == data
        fresh.close()
    # The worker caught the checksum mismatch, dropped its copy; the block is copied again.
    def repaired() -> bool:
        holders = [w.worker_id for w in client.block_locations("/corrupt/a")[0].workers]
        return (healthy(c) and len(holders) == 2
                and all(stat_block(c, index_of[w], block.block_id).exists for w in holders))
    wait_until("the corrupt copy to be replaced", repaired)
    for w in client.block_locations("/corrupt/a")[0].workers:
        again = stat_block(c, index_of[w.worker_id], block.block_id)
        with open(again.path, "rb") as f:
            assert f.read(block.length) == data[:block.length]
    # ... and its metrics say so: the bad worker's checksum failure, a copy pushed by a good one.
    after = {p.name: scrape(p.metrics) for p in c.workers}
    bad = f"worker{index_of[bad_wid]}"
    assert after[bad].total("curvine_worker_checksum_failures_total", op="read") \
        > before[bad].total("curvine_worker_checksum_failures_total", op="read")
    assert sum(after[n].total("curvine_worker_replication_copies_total", outcome="ok")
               - before[n].total("curvine_worker_replication_copies_total", outcome="ok") for n in after) >= 1
    client.close()


def test_reported_bad_block_is_dropped_and_recopied(three: LocalCluster) -> None:
    c = three
    client = connect(c)
    data = payload(9, MiB)
    client.makedirs("/bad")
    client.put_bytes("/bad/a", data)
    block = client.block_locations("/bad/a")[0]
    first = block.workers[0].worker_id
    ids = worker_ids(c)
    index_of = {ids[c.worker_host(i)]: i for i in range(3)}
    old_path = stat_block(c, index_of[first], block.block_id).path
    client.meta.report_bad_block(block.block_id, first, "test: pretend its checksum failed")
    wait_until("the reported copy to be deleted", lambda: not os.path.exists(old_path))

    def recopied() -> bool:
        holders = [w.worker_id for w in client.block_locations("/bad/a")[0].workers]
        return len(holders) == 2 and all(stat_block(c, index_of[w], block.block_id).exists for w in holders)
    wait_until("two good copies again", recopied)
    for w in client.block_locations("/bad/a")[0].workers:
        with open(stat_block(c, index_of[w.worker_id], block.block_id).path, "rb") as f:
            assert f.read(len(data)) == data
    assert client.get_bytes("/bad/a") == data
    client.close()
