"""The work a lookup starts ahead of an open, made cheap for a run of stats
(client/mount/policy.py MountOpens.after_lookup, BlockPaths.local_replica,
LocalFiles.check_ahead), through a real local cluster and the mount's own lookup: whether a
block is local is answered by the replicas' hosts without ordering them, and a run of lookups
queues its checks in lookup order for one thread, which runs them all in the pause after
the run."""
from __future__ import annotations

import os
import time
import typing

from tests.conftest import client_config
from curvine_py.sdk import Client
from tests.integration.test_verify_ahead import ONE_BLOCK, lookup, mount_vfs, opens_of, settled

if typing.TYPE_CHECKING:
    from curvine_py.cluster.local import LocalCluster


def test_a_local_replica_is_the_one_block_paths_reads_locally(shared_cluster: "LocalCluster",
                                                              local_client: Client, remote_dir: str) -> None:
    local_client.put_bytes(f"{remote_dir}/chunk", os.urandom(ONE_BLOCK))
    block = local_client.core.meta.block_locations(local_client.stat(f"{remote_dir}/chunk").ino).blocks[0]
    paths = local_client.core.paths
    here = paths.local_replica(block)
    assert here is not None and here.host == paths.host and here == paths.replica_order(block)[0]
    cfg = client_config(shared_cluster)
    cfg.client.host = "no-worker-here"
    with Client(master=shared_cluster.master_address, config=cfg) as far:
        far.core.workers.learn([here])
        assert far.core.paths.local_replica(block) is None


def test_a_run_of_lookups_queues_its_checks_for_one_thread(local_client: Client, remote_dir: str) -> None:
    names = [f"c{i}" for i in range(6)]
    for name in names:
        local_client.put_bytes(f"{remote_dir}/{name}", os.urandom(ONE_BLOCK))
    vfs, sc = mount_vfs(local_client)
    checked: list[int] = []
    verify = sc.verify

    def recorded(addr: typing.Any, block: typing.Any, *args: typing.Any) -> typing.Any:
        checked.append(block.block_id)
        return verify(addr, block, *args)
    sc.verify = recorded                       # type: ignore[method-assign]
    try:
        local = opens_of(vfs).local
        before = sc.stats()["ahead"]
        with opens_of(vfs).lookups:            # the run of stats goes on: no check starts
            attrs = [lookup(vfs, f"{remote_dir}/{name}") for name in names]
            assert local._queued == len(names)
            time.sleep(0.1)
            assert checked == [] and sc.stats()["ahead"] == before
        settled(vfs)
        assert checked == [local_client.core.meta.block_locations(a.ino).blocks[0].block_id for a in attrs]
        assert sc.stats()["ahead"] == before + len(names)
        assert not local._todo and not local._draining
        assert local._pool is not None and len(local._pool._threads) == 1
    finally:
        sc.verify = verify                     # type: ignore[method-assign]
        vfs.close()
