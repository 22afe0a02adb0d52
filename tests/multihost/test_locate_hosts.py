"""Locate's holders across real hosts (issue 44 section 1): for files of known blocks
written from a worker's host, the hosts Locate names for each file are exactly the hosts
whose workers have every one of its blocks on disk; after a worker is lost and its
blocks copied again, the same holds and the lost host is named nowhere; after a chunk's
eviction, it is named absent and every host's prefix stops before it."""
from __future__ import annotations

import os
import typing

import pytest

from curvine_py.testing.netcluster import NetCluster
from tests.conftest import FAST_MASTER_FLAGS, wait_until

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(240)]

FLAGS = (*FAST_MASTER_FLAGS, "--master-worker-timeout-s", "2", "--master-replication-scan-s", "1",
         "--master-ttl-sweep-s", "0.3")   # a TTL eviction on cue
WORKER_HOSTS = (1, 2, 3)
BLOCK = 64 * 1024
FILES = 12


def on_disk(c: NetCluster, alive: typing.Sequence[int]) -> dict[int, set[str]]:
    """block id -> hosts whose (live) workers hold its committed block file."""
    out: dict[int, set[str]] = {}
    for i in alive:
        for p in c.worker_data_dir(i).rglob("*"):
            if p.is_file() and p.name.isdigit() and "staging" not in p.parts and "free" not in p.parts:
                out.setdefault(int(p.name), set()).add(c.hosts[WORKER_HOSTS[i]].name)
    return out


def expected(c: NetCluster, paths: list[str], alive: typing.Sequence[int]) -> dict[str, set[str]]:
    """Per file, the hosts holding every one of its blocks, from the block files on disk."""
    disk = on_disk(c, alive)
    with c.client(1) as cl:
        return {p: set.intersection(*(disk.get(b.block_id, set()) for b in cl.block_locations(p)))
                for p in paths}


def test_locate_names_exactly_the_hosts_with_every_block(net_cluster_factory: typing.Callable[..., NetCluster]
                                                       ) -> None:
    c = net_cluster_factory(worker_hosts=WORKER_HOSTS, extra_master_flags=FLAGS)
    paths = [f"/loc/f{i}" for i in range(FILES)]
    with c.client(1) as cl:   # a writer on host 1: a replica of each block there (short-circuit write)
        cl.mkdir("/loc")
        for i, p in enumerate(paths):
            cl.put_bytes(p, os.urandom(BLOCK * (1 + i % 4) - 3), block_size=BLOCK)
        got = {g.path: set(g.hosts) for g in cl.locate(paths)}
    want = expected(c, paths, range(len(WORKER_HOSTS)))
    assert got == want
    with c.client(1) as cl:
        assert cl.prefix_hosts(paths) == leading(paths, want)
    assert all(c.hosts[1].name in hosts for hosts in got.values()), got
    assert all(1 <= len(hosts) <= 2 for hosts in got.values()), got   # two replicas of each block

    victim = 1   # the worker on host 2
    with c.client(1) as cl:
        held = [p for p, hosts in got.items() if c.hosts[2].name in hosts]
        assert held, "host 2 held no file whole: the test proves nothing"
        c.kill_worker(victim)
        gone = c.hosts[2].name

        def copied() -> bool:
            rep = c.report()
            return rep is not None and rep.under_replicated == 0 and \
                all(gone not in g.hosts for g in cl.locate(paths))
        wait_until("the lost worker's blocks copied again", copied, timeout=120)
        got = {g.path: set(g.hosts) for g in cl.locate(paths)}
    assert got == expected(c, paths, [i for i in range(len(WORKER_HOSTS)) if i != victim])
    assert all(len(hosts) >= 1 and gone not in hosts for hosts in got.values()), got
    with c.client(1) as cl:
        counts = cl.prefix_hosts(paths)
    assert counts == leading(paths, got) and gone not in counts

    evicted = paths[3]   # the fourth chunk of the prefix goes: every host's prefix stops at 3
    with c.client(1) as cl:
        cl.set_ttl(evicted, 1)
        wait_until("the TTL sweep evicts the chunk", lambda: not cl.exists(evicted), timeout=20)
        after = {g.path: g for g in cl.locate(paths)}
        counts = cl.prefix_hosts(paths)
    assert not after[evicted].found and not after[evicted].hosts
    assert {p: set(g.hosts) for p, g in after.items() if p != evicted} == \
        {p: hosts for p, hosts in got.items() if p != evicted}
    assert counts == leading(paths[:3], got) and max(counts.values()) <= 3


def leading(paths: list[str], holders: dict[str, set[str]]) -> dict[str, int]:
    """Per host, how many of paths' leading files it holds, from the files on disk."""
    out: dict[str, int] = {}
    for host in set().union(*holders.values()):
        n = 0
        while n < len(paths) and host in holders[paths[n]]:
            n += 1
        if n:
            out[host] = n
    return out
