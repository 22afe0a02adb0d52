"""The KV adapter's load path on a real local cluster: ``get_into`` of chunks written on
a replica's host.  A chunk written past the page cache (the local replica with
O_DIRECT) was read back from disk, 4-5x slower in one 16 MiB block than in 4 MiB ones
(whose full blocks went over TCP and were cached on arrival): ``client.cache_local_writes``
(the KV adapter's ``cache_writes``) writes it through the page cache, and a whole-file
read fetches a large block in parts, as it fetches 4 MiB blocks (docs/kvcache.md)."""
from __future__ import annotations

import errno
import os
import typing

import pytest

from curvine_py.cluster.local import LocalCluster
from curvine_py.client.reader import WHOLE_PART
from curvine_py.common.blockmeta import block_file
from worker.blockfile import supports_direct

from tests.conftest import client_on_host

if typing.TYPE_CHECKING:
    from curvine_py.sdk import Client

MiB = 1 << 20
BLOCK = 16 * MiB


def resident(path: str) -> int:
    """Bytes of the file's head in the page cache: read with RWF_NOWAIT until it would
    have to wait for the disk."""
    fd = os.open(path, os.O_RDONLY)
    buf = bytearray(MiB)
    got = 0
    try:
        while True:
            try:
                n = os.preadv(fd, [buf], got, os.RWF_NOWAIT)
            except BlockingIOError:
                return got
            if n <= 0:
                return got
            got += n
    finally:
        os.close(fd)


def local_block_file(cluster: LocalCluster, client: "Client", path: str) -> str:
    """The block file of path's one block under worker 0's data dir."""
    blocks = client.core.meta.block_locations(client.stat(path).ino).blocks
    assert len(blocks) == 1
    return block_file(str(cluster.dir / "worker0" / "data"), blocks[0].block_id)


@pytest.mark.parametrize("cached", [True, False])
def test_a_local_replica_is_in_the_page_cache_when_asked(shared_cluster: LocalCluster, cached: bool) -> None:
    data_dir = str(shared_cluster.dir / "worker0" / "data")
    if not cached and not supports_direct(data_dir):
        pytest.skip("the data dir's filesystem takes no O_DIRECT: every write is cached")
    c = client_on_host(shared_cluster, shared_cluster.worker_host(0), cache_local_writes=cached)
    try:
        lw = c.core.paths.localwrites
        assert lw is not None
        before = lw.stats()["blocks"]
        size = 6 * MiB + 4097
        c.put_bytes(f"/kvr-cached-{cached}", os.urandom(size), BLOCK)   # one partial block: the pooled buffer
        assert lw.stats()["blocks"] == before + 1   # written here, by the short-circuit path
        held = resident(local_block_file(shared_cluster, c, f"/kvr-cached-{cached}"))
        assert held == size if cached else held < MiB, held
    finally:
        c.close()


def test_get_into_reads_a_large_block_in_parts_byte_exact(shared_cluster: LocalCluster) -> None:
    size = 2 * WHOLE_PART + 3 * MiB + 5   # three parts of one block, the last not chunk-aligned
    data = os.urandom(size)
    here = client_on_host(shared_cluster, shared_cluster.worker_host(0), cache_local_writes=True)
    far = client_on_host(shared_cluster, "no-worker-here")
    try:
        here.put_bytes("/kvr-large", data, BLOCK)
        sc = here.core.paths.shortcircuit
        assert sc is not None
        reads = sc.stats()["reads"]
        out = bytearray(size + 100)
        assert here.get_into("/kvr-large", out) == size and out[:size] == data
        assert sc.stats()["reads"] - reads == 3     # the local replica, in three parts
        out[:] = bytes(len(out))
        assert far.get_into("/kvr-large", out) == size and out[:size] == data   # over the network, in parts
        with pytest.raises(Exception) as e:
            far.get_into("/kvr-large", bytearray(size - 1))
        assert getattr(e.value, "errno", None) == errno.EOVERFLOW
    finally:
        here.close()
        far.close()


def test_a_header_then_the_rest_is_read_straight_in(shared_cluster: LocalCluster) -> None:
    """LMCache's fs:// chunk format read through the SDK (the in-process plugin's get):
    28 bytes of header, then the rest in one readinto.  The header's range alone is
    fetched and the rest goes straight into the caller's buffer, block by block: one
    short-circuit read more than the blocks, none of them into the reader's block cache
    (before, the header read fetched block 0 whole and read the others ahead into pooled
    buffers, and the rest was copied out of them)."""
    c = client_on_host(shared_cluster, shared_cluster.worker_host(0), cache_local_writes=True)
    try:
        data = os.urandom(28 + 3 * 4 * MiB - 1000)   # 3 blocks of the directory's 4 MiB
        c.put_bytes("/kvr-header", data, 4 * MiB)
        sc = c.core.paths.shortcircuit
        assert sc is not None
        reads = sc.stats()["reads"]
        rest = memoryview(bytearray(len(data) - 28))
        with c.open("/kvr-header", "rb") as f:
            assert f.read(28) == data[:28]
            assert f.readinto(rest) == len(rest)
        assert bytes(rest) == data[28:]
        assert sc.stats()["reads"] - reads == 4   # the header's range, then 3 blocks' bytes
    finally:
        c.close()
