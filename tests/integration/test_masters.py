"""Three masters on one machine (LocalCluster(masters=3), `cv cluster start --masters 3`):
one leader is elected, `cv report` and `cv cluster status` show the group, and killing the
leader leaves a new one within seconds (docs/ha.md).

These need the Raft master (master/raft.py, issue 23) and skip, saying so, without it.
The single master's path is tests/integration/test_localcluster.py's.
"""
from __future__ import annotations

import json
import os
import signal
import time
import typing
from pathlib import Path

import pytest

from curvine_py.cluster.local import LocalCluster, read_state
from curvine_py.sdk import Client
from tests.conftest import client_config
from tests.integration.test_cli import free_port_run, ok, run_cv

RAFT = Path(__file__).resolve().parents[2] / "master" / "raft.py"
pytestmark = [
    pytest.mark.skipif(not RAFT.exists(), reason="the Raft master (master/raft.py, issue 23) is not in the tree yet"),
    pytest.mark.timeout(180),
]
NEW_LEADER_S = 10.0      # the bound on a failover: election timeout 1-2 s, plus the new term's first record
Factory = typing.Callable[..., LocalCluster]


@pytest.fixture
def trio_cluster(cluster_factory: Factory) -> LocalCluster:
    """Three masters and two workers on free ports."""
    return cluster_factory(masters=3)


def roles(masters: typing.Sequence[dict[str, typing.Any]]) -> list[str]:
    return sorted(m["role"] for m in masters)


def wait_caught_up(cluster: LocalCluster, timeout: float = 20.0) -> list[dict[str, typing.Any]]:
    """`cv report --json`'s masters once every one answers with lag 0 (followers apply a
    committed entry a moment after the leader)."""
    deadline = time.monotonic() + timeout
    while True:
        masters = json.loads(ok(run_cv("--config", str(cluster.config_path), "report", "--json")))["masters"]
        if all(m["lag"] == 0 for m in masters) or time.monotonic() > deadline:
            return masters
        time.sleep(0.2)


def test_three_masters_elect_one_leader_and_report_it(trio_cluster: LocalCluster) -> None:
    c = trio_cluster
    state = read_state(c.dir)
    assert state is not None
    records = [p for p in state["processes"] if p.role == "master"]
    assert [p.name for p in records] == ["master0", "master1", "master2"]
    assert [p.address for p in records] == list(c.master_addresses) and all(p.is_alive() for p in records)
    assert all((c.dir / f"master{i}").is_dir() for i in range(3))
    leader = c.leader_index()
    statuses = [c.master_status(i) for i in range(3)]
    assert [s.role if s else None for s in statuses].count("leader") == 1
    assert all(s is not None and s.leader == c.master_addresses[leader] for s in statuses)

    masters = wait_caught_up(c)
    assert [m["address"] for m in masters] == list(c.master_addresses)
    assert roles(masters) == ["follower", "follower", "leader"]
    assert len({m["term"] for m in masters}) == 1 and all(m["lag"] == 0 for m in masters)
    assert [m["pid"] for m in masters] == [p.pid for p in records]
    text = ok(run_cv("--config", str(c.config_path), "report"))
    assert "MASTER" in text and text.count("follower") == 2

    status = json.loads(ok(run_cv("cluster", "status", "--dir", str(c.dir), "--json")))
    assert [(m["name"], m["address"], m["pid"]) for m in status["masters"]] == \
        [(p.name, p.address, p.pid) for p in records]
    assert roles(status["masters"]) == ["follower", "follower", "leader"]
    assert status["leader"] == c.master_addresses[leader] and status["live_workers"] == 2
    assert all(m["raft_address"] for m in status["masters"])


def test_killing_the_leader_leaves_a_new_one_within_10_s(trio_cluster: LocalCluster) -> None:
    c = trio_cluster
    with Client(master=c.master_address, config=client_config(c)) as client:
        client.put_bytes("/before", b"acknowledged before the failover")
    old = c.leader_index()
    c.kill_master(old, signal.SIGKILL)
    t0 = time.monotonic()
    new = c.leader_index(timeout=NEW_LEADER_S)
    took = time.monotonic() - t0
    print(f"a new leader (master{new}) {took:.2f} s after SIGKILL of master{old}")
    assert new != old and took < NEW_LEADER_S

    with Client(master=c.master_address, config=client_config(c)) as client:
        masters = {m.address: m for m in client.report().masters}
        assert masters[c.master_addresses[old]].role == "unreachable"
        assert masters[c.master_addresses[new]].role == "leader"
        assert client.get_bytes("/before") == b"acknowledged before the failover"
        client.put_bytes("/after", b"on the new leader")

    c.restart_master(old)   # rejoins the group as a follower and catches up
    masters = wait_caught_up(c)
    assert roles(masters) == ["follower", "follower", "leader"]
    assert masters[old]["role"] != "unreachable" and masters[old]["lag"] == 0


def test_a_group_killed_whole_comes_back_with_its_namespace(trio_cluster: LocalCluster) -> None:
    """Every master SIGKILLed: each is started without waiting (none can rejoin a group
    alone), then a leader is elected from their journals and the workers register again."""
    c = trio_cluster
    with Client(master=c.master_address, config=client_config(c)) as client:
        client.put_bytes("/kept", b"acknowledged before all died")
    for i in range(3):
        c.kill_master(i, signal.SIGKILL)
    assert all(c.master_status(i, timeout=0.2) is None for i in range(3))
    pids = [c.restart_master(i, wait=False).pid for i in range(3)]
    c.wait_ready()
    c.leader_index()
    assert [m.pid for m in c.masters] == pids and all(m.is_alive() for m in c.masters)
    with Client(master=c.master_address, config=client_config(c)) as client:
        assert client.get_bytes("/kept") == b"acknowledged before all died"


def test_cv_cluster_start_masters_3(tmp_path: Path) -> None:
    """The documented ports from P: masters P..P+5, workers P+6..P+9, metrics P+10..P+15,
    Raft P+16..P+18 (curvine_py/cluster/ports.py)."""
    d = tmp_path / "c"
    port = free_port_run(19)
    started = run_cv("cluster", "start", "--dir", str(d), "--masters", "3", "--master-port", str(port),
                     "--capacity", "256MiB", cwd=tmp_path)
    try:
        out = ok(started)
        assert "3 masters" in out and "master2" in out
        status = json.loads(ok(run_cv("cluster", "status", "--dir", str(d), "--json")))
        assert [m["address"] for m in status["masters"]] == [f"127.0.0.1:{port + 2 * i}" for i in range(3)]
        assert [m["raft_address"] for m in status["masters"]] == [f"127.0.0.1:{port + 16 + i}" for i in range(3)]
        assert all(m["pid"] > 0 and m["alive"] for m in status["masters"])
        assert roles(status["masters"]) == ["follower", "follower", "leader"]
        assert [p["role"] for p in status["processes"]] == ["master"] * 3 + ["worker"] * 2
        rep = json.loads(ok(run_cv("--config", str(d / "curvine.toml"), "report", "--json")))
        assert roles(rep["masters"]) == ["follower", "follower", "leader"]
        assert rep["capacity"] == 2 * 256 << 20
        text = ok(run_cv("cluster", "status", "--dir", str(d)))
        assert "leader" in text and text.count("follower") == 2
    finally:
        stopped = run_cv("cluster", "stop", "--dir", str(d))
    assert "stopped" in ok(stopped)
    assert not (d / "cluster.json").exists()


def test_the_next_leader_uploads_what_the_killed_one_queued_and_reads_through(
        cluster_factory: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A UFS mount in write-back mode: the upload queue is replicated state (docs/ha.md), so
    a file closed on a leader that dies before uploading it is uploaded by the next one,
    and the next one reads an object of the UFS through as the first did."""
    monkeypatch.setenv("CURVINE_UFS_UPLOAD_DELAY_S", "3")
    nas = tmp_path / "nas"
    nas.mkdir()
    old, body = os.urandom((4 << 20) + 3), os.urandom((8 << 20) + 5)
    (nas / "old.bin").write_bytes(old)
    c = cluster_factory(masters=3)
    with Client(master=c.master_address, config=client_config(c)) as client:
        client.ufs.mount(f"file://{nas}", "/wb", write_mode="back")
        client.put_bytes("/wb/kv.tmp", body)
        client.rename("/wb/kv.tmp", "/wb/kv.data")          # the LMCache pattern, at pool speed
        assert client.ufs.stat("/wb/kv.data").state == "pending upload"
    c.kill_master(c.leader_index(), signal.SIGKILL)
    c.leader_index(timeout=NEW_LEADER_S)
    with Client(master=c.master_address, config=client_config(c)) as client:
        deadline = time.monotonic() + 30
        while not ((nas / "kv.data").exists() and (nas / "kv.data").read_bytes() == body):
            assert time.monotonic() < deadline, "the queued upload was not done by the next leader"
            time.sleep(0.2)
        assert not (nas / "kv.tmp").exists()
        assert client.get_bytes("/wb/old.bin") == old
        # the object lands before the record that says so (a new leader answers no
        # mutation for its first master.cache_lease_s: the mounts' old leases)
        while client.ufs.stat("/wb/kv.data").state != "persisted":
            assert time.monotonic() < deadline, client.ufs.stat("/wb/kv.data").state
            time.sleep(0.2)
