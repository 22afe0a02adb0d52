"""Three masters on three network-namespace hosts (NetCluster(master_hosts=(0, 1, 2))), each
on its host's default ports: a leader is elected; killed, or cut off from the others, it
is replaced within 10 s and what was acknowledged before stays readable; back, it rejoins
as a follower (docs/ha.md).

The fault helpers are the NetCluster's (kill_master, restart_master, master_status,
leader_index, partitioned); these tests need the Raft master (master/raft.py) and skip
without it.
"""
from __future__ import annotations

import signal
import time
import typing
from pathlib import Path

import pytest

from curvine_py.common.config import MasterConfig
from curvine_py.testing.netcluster import NetCluster

RAFT = Path(__file__).resolve().parents[2] / "master" / "raft.py"
pytestmark = [
    pytest.mark.multihost,
    pytest.mark.skipif(not RAFT.exists(), reason="the Raft master (master/raft.py, issue 23) is not in the tree yet"),
    pytest.mark.timeout(240),
]
NEW_LEADER_S = 10.0
REJOIN_S = 30.0


@pytest.fixture
def group(net_cluster_factory: typing.Callable[..., NetCluster]) -> NetCluster:
    """Masters on hosts 0, 1 and 2; workers on hosts 1, 2 and 3 (a cut master host keeps
    two workers for the two replicas)."""
    return net_cluster_factory(master_hosts=(0, 1, 2), worker_hosts=(1, 2, 3))


def rejoined_as_follower(c: NetCluster, i: int, timeout: float = REJOIN_S) -> bool:
    """Master i follows the leader (whichever it is by then: a master back from a cut may
    start an election of its own) and has applied what the leader committed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        leader = c.leader_index(timeout=max(0.1, deadline - time.monotonic()))
        s, lead = c.master_status(i), c.master_status(leader)
        if s is not None and lead is not None and s.role == "follower" and \
                s.leader == c.master_addresses[leader] and s.applied_index >= lead.commit_index:
            return True
        time.sleep(0.2)
    return False


def test_each_master_on_its_own_host(group: NetCluster) -> None:
    c = group
    raft = MasterConfig().raft_port
    assert c.master_addresses == tuple(f"{c.master_host(i).ip}:8995" for i in range(3))
    assert [m.raft for m in c.masters] == [f"{c.master_host(i).ip}:{raft}" for i in range(3)]
    leader = c.leader_index()
    statuses = [c.master_status(i) for i in range(3)]
    assert [s.role if s else None for s in statuses].count("leader") == 1
    assert all(s is not None and s.leader == c.master_addresses[leader] for s in statuses)
    assert len(c.report().workers) == 3


def test_a_killed_leader_is_replaced_and_rejoins(group: NetCluster) -> None:
    c = group
    with c.client(3) as client:
        client.put_bytes("/before", b"acknowledged")
    old = c.leader_index()
    c.kill_master(old, signal.SIGKILL)
    t0 = time.monotonic()
    new = c.leader_index(timeout=NEW_LEADER_S)
    print(f"new leader master{new} {time.monotonic() - t0:.2f} s after SIGKILL of master{old}")
    assert new != old
    with c.client(3) as client:
        assert client.get_bytes("/before") == b"acknowledged"
        client.put_bytes("/after", b"on the new leader")
    c.restart_master(old)
    assert rejoined_as_follower(c, old)


def test_a_cut_off_leader_is_replaced_and_rejoins(group: NetCluster) -> None:
    c = group
    with c.client(3) as client:
        client.put_bytes("/before", b"acknowledged")
    old = c.leader_index()
    with c.partitioned(c.master_host(old)):
        t0 = time.monotonic()
        new = c.leader_index(timeout=NEW_LEADER_S)   # the cut one does not answer: never picked
        print(f"new leader master{new} {time.monotonic() - t0:.2f} s after cutting master{old}'s host")
        assert new != old
        with c.client(3) as client:
            assert client.get_bytes("/before") == b"acknowledged"
    assert rejoined_as_follower(c, old)
