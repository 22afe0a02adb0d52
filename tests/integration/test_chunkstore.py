"""ChunkStore (curvine_py/kv/chunkstore.py), the core under LMCache's adapters, on real
small-capacity clusters: its locks hold chunks against the pool's eviction while held
(renewed past their TTL), and let them go at unlock or close."""
from __future__ import annotations

import time
import typing

import pytest

from curvine_py.cluster.local import LocalCluster
from curvine_py.kv.chunkstore import ChunkStore, ChunkStoreConfig
from curvine_py.sdk import Client

from tests.integration.test_eviction import EVICT_FLAGS, connect, payload, present, settle

TTL_S = 1.5   # shorter than the filling below: only renewal keeps a lock's pin


@pytest.fixture
def small(cluster_factory: typing.Callable[..., LocalCluster]) -> typing.Iterator[tuple[Client, ChunkStore]]:
    """Two workers of 48 MiB each, two replicas, eviction every 0.1 s."""
    c = cluster_factory(capacity="48MiB", extra_master_flags=EVICT_FLAGS)
    client, writer = connect(c), connect(c)
    store = ChunkStore(client, ChunkStoreConfig("/kv", io_threads=4, lock_ttl_s=TTL_S))
    try:
        yield writer, store
    finally:
        store.close()
        client.close()
        writer.close()


def fill(writer: Client, first: int, n: int) -> None:
    """n more 4 MiB files (the pool holds 12), slowly enough to outlive a lock's TTL."""
    for i in range(first, first + n):
        writer.put_bytes(f"/kv/fill{i}", payload(i))
        time.sleep(TTL_S / 8)


def test_locked_chunks_outlive_eviction_and_their_ttl_until_unlocked(small: tuple[Client, ChunkStore]) -> None:
    writer, store = small
    names = ["a.data", "b.data", "c.data"]
    got = store.store(names, [memoryview(payload(i)) for i in range(3)])
    assert got.written == (0, 1, 2) and got.failed == 0
    assert store.store(names, [memoryview(payload(i)) for i in range(3)]).written == ()   # once only
    assert store.lookup([*names, "nope.data"], lock=True) == [True, True, True, False]
    assert store.lookup(names[:1], lock=True) == [True]   # a.data twice
    fill(writer, 0, 16)                                   # 64 MiB into a 48 MiB pool, 3 s
    settle(writer)
    assert all(present(writer, f"/kv/{n}") for n in names)
    bufs = [memoryview(bytearray(len(payload(0)))) for _ in names]
    assert store.load(names, bufs) == [True, True, True] and bytes(bufs[1]) == payload(1)
    store.unlock(names)                                   # a.data still held once
    assert store.locked() == 1
    time.sleep(0.5)                                       # the background unpin
    fill(writer, 16, 16)
    settle(writer)
    assert present(writer, "/kv/a.data")
    assert not present(writer, "/kv/b.data") and not present(writer, "/kv/c.data")
    assert store.delete(["a.data", "b.data"]) == [len(payload(0)), -1]
