"""BlockPaths: which way each replica of a block is read and written, chosen in one place."""
from __future__ import annotations

from curvine_py.client.blockio import BlockIO, RemoteReader, RemoteWriter, WorkerDirectory
from curvine_py.client.blockpaths import BlockPaths
from curvine_py.client.localwrite import LocalFirstWriter, LocalWrites
from curvine_py.client.shortcircuit import ShortCircuit
from curvine_py.common.connpool import ConnectionPool
from curvine_py.pb import curvine_pb2 as pb

WORKERS = [pb.WorkerAddress(worker_id=1, host="other", ip="10.0.0.1", data_port=7001),
           pb.WorkerAddress(worker_id=2, host="here", ip="10.0.0.2", data_port=7002),
           pb.WorkerAddress(worker_id=3, host="third", ip="10.0.0.3", data_port=7003)]


def paths(local_reads: bool, local_writes: bool) -> BlockPaths:
    workers = WorkerDirectory()
    workers.learn(WORKERS)
    pool = ConnectionPool()
    return BlockPaths("here", workers, BlockIO(pool), pool,
                      ShortCircuit("here") if local_reads else None,
                      LocalWrites("here") if local_writes else None)


def test_the_local_file_is_tried_first_only_until_bytes_were_announced() -> None:
    p = paths(local_reads=True, local_writes=False)
    try:
        ways = p.readers()
        assert isinstance(ways[0], ShortCircuit) and isinstance(ways[1], RemoteReader)
        assert [type(w) for w in p.readers(local_ok=False)] == [RemoteReader]
        here, other = WORKERS[1], WORKERS[0]
        assert ways[0].serves(here) and not ways[0].serves(other)
        assert ways[1].serves(here) and ways[1].serves(other)
    finally:
        p.close()


def test_without_short_circuit_every_replica_goes_over_the_network() -> None:
    p = paths(local_reads=False, local_writes=False)
    try:
        assert [type(w) for w in p.readers()] == [RemoteReader]
        assert isinstance(p.writer, RemoteWriter)
        block = pb.BlockInfo(block_id=9, length=10, workers=[1, 2])
        assert p.local_replica(block) is None
        f, rest = p.writer.open_local(WORKERS[:2], block, 10, memoryview(bytearray(10)))
        assert f is None and rest == WORKERS[:2]
    finally:
        p.close()


def test_the_local_replica_comes_first_and_suspects_last() -> None:
    p = paths(local_reads=True, local_writes=True)
    try:
        assert isinstance(p.writer, LocalFirstWriter)
        block = pb.BlockInfo(block_id=4, length=10, workers=[1, 2, 3])
        order = p.replica_order(block)
        assert order[0].worker_id == 2 and {a.worker_id for a in order[1:]} == {1, 3}
        assert p.local_replica(block) == WORKERS[1]
        p.pool.mark_suspect(WORKERS[1].ip, WORKERS[1].data_port)
        assert p.replica_order(block)[-1].worker_id == 2
        assert p.local_replica(pb.BlockInfo(block_id=5, workers=[1, 3])) is None
    finally:
        p.close()


def test_remote_replicas_are_spread_even_when_ids_share_their_low_bits() -> None:
    """A writer spends ids in batches of 4, so one-block files' ids step by 4: their first
    choice must still be spread over both workers, not the same one each time."""
    p = paths(local_reads=False, local_writes=False)
    try:
        firsts = [p.replica_order(pb.BlockInfo(block_id=1 + 4 * i, workers=[1, 3]))[0].worker_id
                  for i in range(64)]
        assert 20 <= firsts.count(1) <= 44, firsts
    finally:
        p.close()


def test_a_replica_with_reads_in_flight_from_this_client_comes_after_an_idle_one() -> None:
    p = paths(local_reads=False, local_writes=False)
    try:
        block = pb.BlockInfo(block_id=8, workers=[1, 3])
        first, second = p.replica_order(block)
        with p.reading(first):
            assert p.replica_order(block) == [second, first]
            with p.reading(second), p.reading(second):
                assert p.replica_order(block) == [first, second]
        assert p.replica_order(block) == [first, second]   # the hash's order again once idle
    finally:
        p.close()
