"""Blocks fetched at the lookup (client/mount/fetchahead.py, fuse.fetch_ahead) through a real
local cluster and the mount's own VFS: a lookup of a one-block file with no replica on the
client's host starts fetching its block, and the open after it reads from that fetch; a
file of two blocks, one with a replica here, or one rewritten between the lookup and the
open is not taken from it, and what is held is bounded and given back."""
from __future__ import annotations

import os
import time
import typing

import pytest

from curvine_py.client.mount.fetchahead import LIMIT
from curvine_py.client.mount.policy import MountOpens
from curvine_py.client.vfs import VFS
from curvine_py.sdk import Client
from tests.conftest import client_config
from tests.integration.test_verify_ahead import ONE_BLOCK, lookup, opens_of

if typing.TYPE_CHECKING:
    from curvine_py.cluster.local import LocalCluster

MiB = 1 << 20


@pytest.fixture
def far_vfs(shared_cluster: "LocalCluster") -> typing.Iterator[VFS]:
    """A mount's VFS on a host with no worker, fetching ahead at lookups."""
    cfg = client_config(shared_cluster)
    cfg.client.host = "no-worker-here"
    cfg.fuse.fetch_ahead = True
    client = Client(master=shared_cluster.master_address, config=cfg)
    vfs = VFS(client.core, opens=MountOpens(client.core))
    try:
        yield vfs
    finally:
        vfs.close()
        client.close()


def held(vfs: VFS) -> dict[int, typing.Any]:
    assert opens_of(vfs).ahead is not None
    return dict(opens_of(vfs).ahead._held)


def fetched(vfs: VFS, timeout: float = 10.0) -> None:
    """Wait until every held block's fetch (one at a time, in lookup order) is over."""
    deadline = time.monotonic() + timeout
    while not all(a.entry is not None and a.entry.future.done() for a in held(vfs).values()) \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(a.entry is not None and a.entry.future.done() for a in held(vfs).values())


def read_whole(vfs: VFS, ino: int, size: int) -> tuple[bytes, typing.Any]:
    opened = vfs.run(vfs.open(ino, os.O_RDONLY, vfs.meta.identity))
    try:
        reader = vfs.handle(opened.fh).reader
        return vfs.read(opened.fh, 0, size + 1), dict(reader._cache) if reader is not None else {}
    finally:
        vfs.run(vfs.release(opened.fh))


def test_the_open_after_a_lookup_reads_the_block_fetched_then(far_vfs: VFS, client: Client,
                                                              remote_dir: str) -> None:
    data = os.urandom(ONE_BLOCK)
    client.put_bytes(f"{remote_dir}/chunk", data)
    attr = lookup(far_vfs, f"{remote_dir}/chunk")
    fetched(far_vfs)
    (ahead,) = held(far_vfs).values()
    assert ahead.block.token and ahead.entry.future.exception() is None   # the lookup's block carries a read token
    got, cache = read_whole(far_vfs, attr.ino, ONE_BLOCK)
    assert got == data
    assert cache.get(0) is ahead.entry          # the open took the lookup's fetch, not a new one
    assert held(far_vfs) == {}


def test_only_one_block_files_without_a_replica_here_are_fetched(shared_cluster: "LocalCluster", client: Client,
                                                                  remote_dir: str) -> None:
    client.put_bytes(f"{remote_dir}/two", os.urandom(4 * MiB + 1))   # two blocks
    client.put_bytes(f"{remote_dir}/empty", b"")
    client.mkdir(f"{remote_dir}/d")
    cfg = client_config(shared_cluster)
    cfg.client.host = shared_cluster.worker_host(0)
    cfg.fuse.fetch_ahead = True
    with Client(master=shared_cluster.master_address, config=cfg) as near:
        near.put_bytes(f"{remote_dir}/local", os.urandom(ONE_BLOCK))   # a replica on worker 0's host
        vfs = VFS(near.core, opens=MountOpens(near.core))
        try:
            for name in ("two", "empty", "d", "local"):
                lookup(vfs, f"{remote_dir}/{name}")
            assert held(vfs) == {}
        finally:
            vfs.close()


def test_a_file_rewritten_after_its_lookup_reads_its_new_bytes(far_vfs: VFS, client: Client,
                                                               remote_dir: str) -> None:
    client.put_bytes(f"{remote_dir}/chunk", os.urandom(ONE_BLOCK))
    lookup(far_vfs, f"{remote_dir}/chunk")
    fetched(far_vfs)
    new = os.urandom(ONE_BLOCK)
    client.put_bytes(f"{remote_dir}/chunk", new)      # another version: other block
    got, _ = read_whole(far_vfs, client.stat(f"{remote_dir}/chunk").ino, ONE_BLOCK)
    assert got == new
    assert len(held(far_vfs)) == 1                     # the old fetch is not taken


def test_what_is_held_is_the_first_lookups_and_given_back(far_vfs: VFS, client: Client, remote_dir: str) -> None:
    names = [f"c{i}" for i in range(LIMIT + 4)]
    for name in names:
        client.put_bytes(f"{remote_dir}/{name}", os.urandom(ONE_BLOCK))
    pool = far_vfs.core.buffers
    for name in names:
        lookup(far_vfs, f"{remote_dir}/{name}")
    fetched(far_vfs)
    first = {client.core.meta.block_locations(client.stat(f"{remote_dir}/{n}").ino).blocks[0].block_id
             for n in names[:LIMIT]}
    assert set(held(far_vfs)) == first           # the first lookups' blocks: read first, kept
    assert opens_of(far_vfs).ahead is not None
    opens_of(far_vfs).ahead.close()
    deadline = time.monotonic() + 10
    while pool.stats().free < pool.stats().created and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stats().free == pool.stats().created, pool.stats()
