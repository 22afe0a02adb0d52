"""The event feed (issue 44 s2): `cv fs watch --json` subprocesses and the SDK's
Client.watch against real clusters see exactly the events of a known sequence, in
order, across a resume; a position older than the retention window is refused with
its own error; a watcher that stops reading is cut off; positions stay valid when the
leader of three masters is killed.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
import typing
from pathlib import Path

import grpc
import pytest

from curvine_py.cluster.local import LocalCluster
from curvine_py.common.security import with_secret
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc
from curvine_py.sdk import Client
from curvine_py.sdk.watch import PositionTooOld, WatchEvent
from tests.conftest import CV, FAST_MASTER_FLAGS, client_config, start_cluster, stop_clusters, wait_until

pytestmark = pytest.mark.timeout(120)
Factory = typing.Callable[..., LocalCluster]
Seen = list[tuple[str, str, str]]   # (kind, name, from_name)


@pytest.fixture(scope="module")
def feed_cluster(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
                 ) -> typing.Iterator[LocalCluster]:
    """Two workers; TTL sweeps every 0.3 s (an eviction on cue); a watcher that takes
    nothing for 1.5 s is cut off; two watches at once; replica events interleave with
    the namespace's from 2 s after the start (the tests filter them: --kinds)."""
    flags = (*FAST_MASTER_FLAGS, "--master-ttl-sweep-s", "0.3", "--master-watch-stall-s", "1.5",
             "--master-watchers", "2", "--master-worker-timeout-s", "2")   # (replica events 2 s after start)
    c = start_cluster(tmp_path_factory.mktemp("feed") / "cluster", extra_master_flags=flags)
    try:
        yield c
    finally:
        stop_clusters([c], request)


def sdk(c: LocalCluster) -> Client:
    return Client(master=c.master_address, config=client_config(c))


NAMES = "created,removed,evicted"   # the namespace's events (replica ones come when the registry's look finds them)


def cv_watch(c: LocalCluster, path: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([CV, "--config", str(c.config_path), "fs", "watch", path, "--json", "--kinds", NAMES,
                             *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen[str], timeout: float = 30.0) -> list[dict[str, typing.Any]]:
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err
    return [json.loads(line) for line in out.splitlines()]


def kinds(events: typing.Iterable[dict[str, typing.Any]]) -> Seen:
    return [(e["kind"], e["name"], e["from_name"]) for e in events]


def test_a_subscriber_sees_exactly_the_sequence_across_a_resume(feed_cluster: LocalCluster) -> None:
    c = feed_cluster
    with sdk(c) as client:
        d = "/feed/seq"
        client.mkdir(d, parents=True)
        first = cv_watch(c, d, "--since", "0", "--count", "2")
        client.put_bytes(f"{d}/a.tmp", b"x" * (4 << 20) + b"y")     # two blocks; committed at close
        client.rename(f"{d}/a.tmp", f"{d}/a.data")                  # LMCache's rename into place
        got1 = finish(first)
        assert kinds(got1) == [("created", "a.tmp", ""), ("created", "a.data", "a.tmp")]
        assert got1[0]["size"] == got1[1]["size"] == (4 << 20) + 1
        assert got1[0]["path"] == f"{d}/a.tmp" and got1[0]["ino"] == got1[1]["ino"]

        client.mkdir(f"{d}/sub")                                    # directories make no events
        client.put_bytes(f"{d}/b.data", b"b")
        client.remove(f"{d}/b.data")
        client.put_bytes(f"{d}/c.data", b"c" * 100)
        client.put_bytes(f"{d}/c.data", b"C" * 50)                  # rewritten in place: committed again
        client.set_ttl(f"{d}/a.data", 1)
        wait_until("the TTL sweep evicts a.data", lambda: not client.exists(f"{d}/a.data"), timeout=20)
        expected = [("created", "b.data", ""), ("removed", "b.data", ""), ("created", "c.data", ""),
                    ("created", "c.data", ""), ("evicted", "a.data", "")]

        text = subprocess.run([CV, "--config", str(c.config_path), "fs", "watch", d, "--since", "0", "--count", "2",
                               "--kinds", NAMES], capture_output=True, text=True, timeout=30)
        assert text.returncode == 0, text.stderr
        lines = [line.split("\t") for line in text.stdout.splitlines()]
        assert [(f[0], f[1], f[2]) for f in lines] == [(str(got1[0]["position"]), "created", "a.tmp"),
                                                       (str(got1[1]["position"]), "created", "a.tmp -> a.data")]

        since = str(got1[-1]["position"])
        got2 = finish(cv_watch(c, d, "--since", since, "--count", "5"))
        assert kinds(got2) == expected
        assert [e["size"] for e in got2] == [1, 0, 100, 50, 0]
        positions = [e["position"] for e in got1 + got2]
        assert positions == sorted(set(positions)) and positions[0] > 0

        # hosts: those holding every block of the file when the event is sent
        wait_until("c.data's replicas are reported", lambda: len(client.locate([f"{d}/c.data"])[0].hosts) == 2)
        hosts = sorted(client.locate([f"{d}/c.data"])[0].hosts)
        client.put_bytes(f"{d}/z.data", b"z")                        # one more: nothing else came between
        again = finish(cv_watch(c, d, "--since", since, "--count", "6"))
        assert kinds(again) == expected + [("created", "z.data", "")]
        assert [e["position"] for e in again[:5]] == positions[2:]
        assert again[2]["hosts"] == again[3]["hosts"] == hosts and len(hosts) == 2
        assert all(e["hosts"] == [] for e in again[:5] if e["name"] != "c.data")


def test_sdk_watch_is_live_and_a_third_watch_is_refused(feed_cluster: LocalCluster) -> None:
    c = feed_cluster
    with sdk(c) as client:
        d = "/feed/live"
        client.mkdir(d, parents=True)
        got: list[WatchEvent] = []
        w = client.watch(d, kinds=["created"])

        def consume() -> None:
            for e in w:
                got.append(e)
                if len(got) == 2:
                    return
        t = threading.Thread(target=consume)
        t.start()
        wait_until("the watch is open", lambda: w.position >= 0, timeout=10)
        with client.watch(d, kinds=["created"]) as second:   # the second of master.watchers = 2
            it = iter(second)
            client.put_bytes(f"{d}/one", b"1")
            assert next(it).name == "one"
            with pytest.raises(OSError, match="master.watchers"):
                next(iter(client.watch(d)))
        client.put_bytes(f"{d}/two", b"2")
        t.join(timeout=20)
        w.close()
        assert [(e.kind, e.name) for e in got] == [("created", "one"), ("created", "two")]
        assert got[0].position < got[1].position <= w.position


def test_a_watcher_that_stops_reading_is_cut_off(feed_cluster: LocalCluster) -> None:
    """A raw stream that takes nothing: once gRPC's window is full, its batch waits, and
    after master.watch_stall_s (1.5 s) the master cancels it and frees its slot."""
    c = feed_cluster
    with sdk(c) as client:
        d = "/feed/slow"
        client.mkdir(d, parents=True)
        # no BDP probing: the stream's window stays at HTTP/2's 64 KiB (with it, gRPC grows the
        # window to megabytes, all of which a watcher that reads nothing would take first)
        chan = with_secret(grpc.insecure_channel(c.master_address, options=[("grpc.http2.bdp_probe", 0)]), c.secret)
        stream = pb_grpc.EventServiceStub(chan).Watch(pb.WatchRequest(caller=client.meta.caller(), path=d),
                                                      timeout=30)
        next(stream)                               # open: the position it starts from
        a, b = f"{d}/{'n' * 200}0", f"{d}/{'n' * 200}1"
        client.put_bytes(a, b"x")
        for i in range(400):                       # 400 events of ~430 bytes: past gRPC's 64 KiB window
            client.rename(*((a, b) if i % 2 == 0 else (b, a)))
        time.sleep(3.0)
        taken = 0
        with pytest.raises(grpc.RpcError) as cut:
            for reply in stream:
                taken += len(reply.events)
        assert cut.value.code() == grpc.StatusCode.CANCELLED
        assert 0 < taken < 401, taken   # some came before the window filled, not all of them
        chan.close()
        # its slot is free again: two watches open
        with client.watch(d, kinds=["created"]) as w1, client.watch(d, kinds=["created"]) as w2:
            client.put_bytes(f"{d}/after", b"1")
            assert next(iter(w1)).name == next(iter(w2)).name == "after"


def test_a_position_older_than_the_window_is_refused(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    c = start_cluster(tmp_path / "cluster", workers=1,
                      extra_master_flags=(*FAST_MASTER_FLAGS, "--master-events-retention-s", "1"))
    try:
        with sdk(c) as client:
            d = "/old"
            client.mkdir(d)
            for i in range(3):
                client.put_bytes(f"{d}/f{i}", b"x")

            def refused() -> bool:   # all three pruned: under load the puts may span the 1-s window
                try:
                    next(iter(client.watch(d, since=0)))
                except PositionTooOld as e:
                    return e.floor >= 3
                return False
            wait_until("the events are pruned", refused, timeout=20)
            with pytest.raises(PositionTooOld) as too_old:
                next(iter(client.watch(d, since=0)))
            assert too_old.value.floor >= 3
            p = subprocess.run([CV, "--config", str(c.config_path), "fs", "watch", d, "--since", "0"],
                               capture_output=True, text=True, timeout=30)
            assert p.returncode == 1 and p.stdout == ""
            lines = p.stderr.strip().splitlines()
            assert len(lines) == 1 and "older than the events kept" in lines[0]
            assert "master.events_retention_s" in lines[0]
            # from the floor on, nothing is missing
            w = client.watch(d, since=too_old.value.floor, kinds=["created"])
            client.put_bytes(f"{d}/new", b"y")
            assert next(iter(w)).name == "new"
            w.close()
    finally:
        stop_clusters([c], request)


def test_replica_events_follow_a_worker_loss_and_the_copy(cluster_factory: Factory) -> None:
    """A file's two replicas announced after its close; its host's worker killed: that
    host lost, and the host the master copied the blocks to added."""
    c = cluster_factory(workers=3, extra_master_flags=(*FAST_MASTER_FLAGS, "--master-worker-timeout-s", "2",
                                                       "--master-replication-scan-s", "1"))
    with sdk(c) as client:
        d = "/rep"
        client.mkdir(d)
        w = client.watch(d)
        it = iter(w)
        client.put_bytes(f"{d}/f", b"r" * 1000)
        created = next(it)
        assert (created.kind, created.name) == ("created", "f")
        added = [next(it), next(it)]
        holders = sorted(client.locate([f"{d}/f"])[0].hosts)
        assert [(e.kind, e.name) for e in added] == [("replica_added", "f")] * 2
        assert sorted(e.host for e in added) == holders and len(holders) == 2
        victim = holders[0]
        c.kill_worker([c.worker_host(i) for i in range(3)].index(victim))
        lost, copied = next(it), next(it)
        assert (lost.kind, lost.host) == ("replica_lost", victim)
        assert copied.kind == "replica_added" and copied.host not in holders
        assert sorted(client.locate([f"{d}/f"])[0].hosts) == sorted([holders[1], copied.host])
        assert added[0].position < added[1].position < lost.position < copied.position
        w.close()


def test_positions_hold_across_a_leader_failover(cluster_factory: Factory) -> None:
    c = cluster_factory(masters=3, workers=1)
    with Client(master=",".join(c.master_addresses), config=client_config(c)) as client:
        d = "/ha"
        client.mkdir(d)
        client.put_bytes(f"{d}/before", b"1")
        w = client.watch(d, since=0, kinds=["created"])
        it = iter(w)
        before = next(it)
        assert before.name == "before"
        c.kill_master(c.leader_index())
        client.put_bytes(f"{d}/after", b"2")        # retried until the new leader takes it
        after = next(it)                            # the same watch, resumed on the new leader
        assert (after.kind, after.name) == ("created", "after") and after.position > before.position
        w.close()
        # the new leader holds the same events at the same positions
        with client.watch(d, since=0, kinds=["created"]) as replay:
            it = iter(replay)
            assert [(e.position, e.name) for e in (next(it), next(it))] == \
                [(before.position, "before"), (after.position, "after")]
