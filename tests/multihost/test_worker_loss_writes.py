"""A write survives the loss of any one worker of two (issue 42, item 1).

Two workers, two replicas: killing the one that is not on the writer's host used to fail
the write (`cannot reach worker ...: Connection refused`), and every write after it for
26-28 s, until the master's worker timeout.  Now a block whose other replica refuses (or
resets) commits with the replica it has (client/localwrite.py ``LocalWrites._remote``), the
client tells the master with its next allocation, and the master offers that worker to
nobody until it heartbeats again (master/workers.py ``report_unreachable``); the blocks
are counted under-replicated until the worker returns and the master copies them.

Four rounds; each kills a worker at a random point of a 160 MiB SDK write from worker
host 1 and of LMCache's write pattern (``.tmp``, a header, one payload write, rename)
through a mount on host 1: over the rounds, each path loses each worker (the one on the
writer's host, whose replica was local, and the other) twice, the second time after it
came back (ten random rounds drove the same four cases 3-7 times each); every byte is
read back after the kill and again after the worker returns; the last round waits for
re-replication to end (under-replicated blocks counted, then 0).  The longest stall of a
write call per round goes into the fault table.
"""
from __future__ import annotations

import random
import time
import typing
from pathlib import Path

import pytest
import xxhash

from curvine_py.testing.netcluster import NetCluster
from tests.multihost.faulttable import Row, record
from tests.multihost.test_faults import FLAGS, payload, wait_until

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(900)]
MiB = 1 << 20
ROUNDS = 4        # SDK victims 0, 1, 0, 1; mount victims 0, 0, 1, 1
PUT = 160 * MiB    # 40 pieces: the kill lands before a random one of them
PIECE = 4 * MiB
CHUNKS, CHUNK = 12, 14 * MiB + 28


def timed_writes(write: typing.Callable[[int], None], steps: int, kill_at: int,
                 kill: typing.Callable[[], None]) -> float:
    """write(i) for each step, kill() before step kill_at; the longest single step (s)."""
    longest = 0.0
    for i in range(steps):
        if i == kill_at:
            kill()
        t = time.monotonic()
        write(i)
        longest = max(longest, time.monotonic() - t)
    return longest


def lmcache_chunks(d: Path, seed: int, kill_at: int, kill: typing.Callable[[], None]) -> tuple[float, list[bytes]]:
    """LMCache's put of CHUNKS chunks, one after another, a kill before chunk kill_at."""
    datas = [payload(seed * 100 + i, CHUNK) for i in range(CHUNKS)]

    def put(i: int) -> None:
        tmp = d / f"c{i}.tmp"
        with open(tmp, "wb") as f:
            f.write(datas[i][:28])
            f.write(memoryview(datas[i])[28:])
        tmp.rename(d / f"c{i}.data")

    return timed_writes(put, CHUNKS, kill_at, kill), datas


@pytest.fixture
def two(net_cluster_factory: typing.Callable[..., NetCluster]) -> NetCluster:
    return net_cluster_factory(extra_master_flags=FLAGS)


def test_writes_survive_a_worker_killed_mid_write(two: NetCluster, tmp_path: Path) -> None:
    """Each round's files are read back after the kill and after the worker's restart, then
    removed (a later round may kill the other worker: a block of this round may have one
    replica until re-replication); the last round's are kept until re-replication ends."""
    c, rng = two, random.Random(42)
    sdk = c.client(1)                 # on worker 0's host: its replica local
    mnt = c.mount(1, tmp_path / "m")
    data = payload(7, PUT)
    view, digest = memoryview(data), xxhash.xxh3_64_intdigest(data)
    try:
        for r in range(ROUNDS):
            last = r == ROUNDS - 1
            # the SDK's write
            victim, kill_at = r % 2, rng.randrange(1, PUT // PIECE)
            path = f"/r{r}.bin"
            with sdk.open(path, "wb") as f:
                stall = timed_writes(lambda i: f.write(view[i * PIECE:(i + 1) * PIECE]), PUT // PIECE, kill_at,
                                     lambda: c.kill_worker(victim))
            assert xxhash.xxh3_64_intdigest(sdk.get_bytes(path)) == digest, f"round {r}"
            assert c.report().under_replicated > 0, "blocks written with one replica are not counted"
            healed = back(c, victim, heal=last)
            assert xxhash.xxh3_64_intdigest(sdk.get_bytes(path)) == digest, f"round {r}, worker back"
            record(Row(f"issue 42: worker {victim} killed at {kill_at * 4} MiB of a {PUT // MiB} MiB SDK write "
                       "(2 workers)",
                       PUT, PUT, healed, f"longest 4 MiB write() {stall:.2f} s"))
            assert stall < 2.0, f"round {r}: a 4 MiB write took {stall:.2f} s"
            if not last:
                sdk.remove(path)

            # LMCache's writes through the mount
            victim, kill_at = r // 2 % 2, rng.randrange(1, CHUNKS)
            d = mnt / f"kv{r}"
            d.mkdir()
            stall, datas = lmcache_chunks(d, r, kill_at, lambda: c.kill_worker(victim))
            for i, want in enumerate(datas):
                assert (d / f"c{i}.data").read_bytes() == want, f"round {r} chunk {i}"
            healed = back(c, victim, heal=last)
            for i, want in enumerate(datas):
                assert sdk.get_bytes(f"/kv{r}/c{i}.data") == want, f"round {r} chunk {i}, worker back"
            record(Row(f"issue 42: worker {victim} killed before chunk {kill_at} of {CHUNKS} LMCache writes "
                       "(a mount on host 1)", CHUNKS * CHUNK, CHUNKS * CHUNK, healed,
                       f"longest chunk {stall:.2f} s"))
            assert stall < 2.0, f"round {r}: a chunk took {stall:.2f} s"
            if not last:
                for i in range(CHUNKS):
                    sdk.remove(f"/kv{r}/c{i}.data")
        assert c.report().under_replicated == 0
    finally:
        sdk.close()


def back(c: NetCluster, victim: int, heal: bool) -> float:
    """The worker restarted (and, with heal, every block with two replicas again, bounded);
    the seconds it took."""
    t = time.monotonic()
    c.restart_worker(victim)
    if heal:
        wait_until("re-replication", lambda: c.report().under_replicated == 0, timeout=120)
    return time.monotonic() - t
