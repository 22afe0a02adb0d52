"""Placement across real hosts: the two replicas of every block are on two distinct hosts,
as the master reports them and as the block files on the workers' disks show."""
from __future__ import annotations

import os
import typing
from collections import Counter
from pathlib import Path

import pytest

from curvine_py.testing.netcluster import NetCluster

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(180)]

FILES = 24
BLOCK = 64 * 1024
BLOCKS_PER_FILE = 5


def blocks_on_disk(data_dir: Path) -> set[int]:
    """Ids of the committed block files under a worker's data dir (not staging, not sidecars)."""
    return {int(p.name) for p in data_dir.rglob("*") if p.is_file() and p.name.isdigit()
            and "staging" not in p.parts and "free" not in p.parts}


def write_and_locate(c: NetCluster) -> dict[int, list[str]]:
    """Write FILES files of BLOCKS_PER_FILE blocks from a client on host 3; block id -> replica hosts."""
    placed: dict[int, list[str]] = {}
    with c.client(3) as cl:
        cl.mkdir("/p")
        for i in range(FILES):
            data = os.urandom(BLOCK * BLOCKS_PER_FILE - 7)
            cl.put_bytes(f"/p/f{i}", data, block_size=BLOCK)
            assert cl.get_bytes(f"/p/f{i}") == data
            for loc in cl.block_locations(f"/p/f{i}"):
                placed[loc.block_id] = [w.host for w in loc.workers]
    return placed


@pytest.mark.parametrize("worker_hosts", [(1, 2, 3), (1, 1, 2)], ids=["three-hosts", "two-workers-on-host1"])
def test_two_replicas_never_on_one_host(net_cluster_factory: typing.Callable[..., NetCluster],
                                        worker_hosts: tuple[int, ...]) -> None:
    c = net_cluster_factory(worker_hosts=worker_hosts)
    hosts = {w.address.host for w in c.report().workers}
    assert hosts == {c.hosts[i].name for i in worker_hosts}
    placed = write_and_locate(c)
    assert len(placed) == FILES * BLOCKS_PER_FILE
    for block_id, replica_hosts in placed.items():
        assert len(replica_hosts) == 2 and len(set(replica_hosts)) == 2, (block_id, replica_hosts)
    use = Counter(h for replica_hosts in placed.values() for h in replica_hosts)
    assert set(use) == hosts   # every host holds some replicas (the ring spreads them)
    # The files on the workers' disks agree with the master: each block on the workers of
    # two distinct hosts, nowhere else.
    on_disk: dict[int, list[str]] = {}
    for i, h in enumerate(worker_hosts):
        for block_id in blocks_on_disk(c.worker_data_dir(i)):
            on_disk.setdefault(block_id, []).append(c.hosts[h].name)
    assert set(on_disk) == set(placed)
    for block_id, replica_hosts in on_disk.items():
        assert sorted(replica_hosts) == sorted(placed[block_id]), block_id
