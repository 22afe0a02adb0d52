"""Clients and workers follow the leader of a master group (docs/ha.md "Clients and workers").

Real masters in this process (``master.main.build_server``), real sockets.  Until the Raft
master runs here, a follower is played by ``Demotable``: a real master's handlers served
by the real frame server and gRPC servicer, answering every call but ``MasterStatus``
with NotLeader once demoted, exactly as docs/ha.md "Wire" says a follower does, so the
client sees the real wire.  The tests at the end use three real Raft masters and skip
until ``master/raft.py`` is in the tree.
"""
from __future__ import annotations

import errno
import subprocess
import sys
import time
import typing
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trio

from curvine_py.client.asyncmeta import AsyncMeta
from curvine_py.client.metaclient import MasterClient
from curvine_py.common.config import Config, WorkerConfig
from curvine_py.common.errors import CurvineError, NotLeader
from curvine_py.common.rpc import grpc_servicer, server_options
from curvine_py.common.security import SecretCheck
from curvine_py.master.framed import FrameServer
from curvine_py.master.main import Servers, build_server
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc
from curvine_py.cluster.processes import dying_with_parent, free_ports
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.heartbeat import Heartbeat
from curvine_py.worker.threadio import ThreadIO
from curvine_py.worker.ufsmounts import master_resolver
from curvine_py.pb.methods import Master

SECRET = "leader-test-secret"
HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]


def master_config(meta_dir: Path) -> Config:
    cfg = Config()
    cfg.cluster.secret = SECRET
    cfg.master.bind = HOST
    cfg.master.port = 0
    cfg.master.frame_port = 0
    cfg.master.meta_dir = str(meta_dir)
    cfg.master.metrics_port = 0
    cfg.client.retry_s = 20.0
    return cfg


def dead_address() -> str:
    """A gRPC address nobody listens on (connections are refused at once)."""
    return f"{HOST}:{free_ports(1, HOST)[0]}"


class Demotable:
    """A real master's handlers; once demoted (``leader`` set) every call but MasterStatus
    is answered NotLeader(leader), as a follower answers.  Records each call's method and
    request id, to check that a retried mutation keeps its id from master to master."""

    def __init__(self, service: object) -> None:
        self.service = service
        self.leader: str | None = None
        self.frame_port = 0
        self.seen: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> typing.Callable[[typing.Any], typing.Any]:
        real = getattr(self.service, name)

        def handle(request: typing.Any) -> typing.Any:
            caller = getattr(request, "caller", None)
            self.seen.append((name, caller.request_id if caller is not None else ""))
            if self.leader is not None and name != "MasterStatus":
                raise NotLeader(self.leader)
            reply = real(request)
            if name == "GetRing":
                reply.frame_port = self.frame_port   # this server's frame port, not the wrapped master's
            return reply
        return handle


@dataclass
class Served:
    """One master as its clients see it: a Demotable on its own frame and gRPC servers."""
    master: Servers
    role: Demotable
    frames: FrameServer
    grpc: grpc.Server
    port: int

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def stop(self) -> None:
        self.frames.stop()
        self.grpc.stop(grace=0).wait()
        self.master.stop(grace=0)


def serve(meta_dir: Path) -> Served:
    master = build_server(master_config(meta_dir))
    role = Demotable(master.service)
    frames = FrameServer(role, SECRET, HOST, 0).start()
    role.frame_port = frames.port
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=server_options(),
                         interceptors=[SecretCheck(SECRET, "master")])
    pb_grpc.add_MasterServiceServicer_to_server(grpc_servicer(role, "MasterService"), server)
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    return Served(master, role, frames, server, port)


@pytest.fixture
def pair(tmp_path: Path) -> typing.Iterator[tuple[Served, Served]]:
    """Two masters, each its own namespace: a name made on one is not on the other, so a
    test can tell which one answered."""
    a, b = serve(tmp_path / "a"), serve(tmp_path / "b")
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


@pytest.fixture
def master(tmp_path: Path) -> typing.Iterator[Servers]:
    servers = build_server(master_config(tmp_path / "meta"))
    try:
        yield servers
    finally:
        servers.stop(grace=0)


def client(addresses: str, retry_s: float = 20.0) -> MasterClient:
    cfg = master_config(Path("/nonexistent")).client
    cfg.retry_s = retry_s
    return MasterClient(addresses, cfg, SECRET)


def mutations(role: Demotable, method: str) -> list[str]:
    return [rid for name, rid in role.seen if name == method]


# ---------------------------------------------------------------- clients
def test_a_master_that_does_not_answer_is_skipped_once(master: Servers) -> None:
    live = f"{HOST}:{master.port}"
    m = client(f"{dead_address()},{live}")
    try:
        t0 = time.monotonic()
        assert m.getattr(1).ino == 1
        assert time.monotonic() - t0 < 1.0, "the next master of a round is tried at once"
        route = m._frames
        assert route is not None and route.master == live == m.masters.current()
        for i in range(20):
            m.mknod(1, f"f{i}", 0o100644)
        assert m.lookup(1, "f19").ino > 1
        assert m._frames is route, "the client left the master that answers"

        async def loop() -> None:   # the mount's client follows the same route
            fast = AsyncMeta(m)
            assert (await fast.call(Master.Lookup, m.lookup_request(1, "f3"), 5)).attr.ino == m.lookup(1, "f3").ino
            fast.close()
        trio.run(loop)
        assert m._frames is route
    finally:
        m.close()


def test_one_error_names_every_master_when_none_answers() -> None:
    a, b = dead_address(), dead_address()
    m = client(f"{a}, {b}", retry_s=0.5)
    try:
        t0 = time.monotonic()
        with pytest.raises(CurvineError) as e:
            m.getattr(1)
        assert time.monotonic() - t0 < 5
        text = str(e.value)
        assert e.value.errno == errno.EHOSTDOWN and "\n" not in text
        assert text.startswith(f"no master of {a}, {b} answered"), text

        async def loop() -> None:
            with pytest.raises(CurvineError) as e:
                await AsyncMeta(m).call(Master.GetAttr, m.getattr_request(1))
            assert e.value.errno == errno.EHOSTDOWN
            assert str(e.value).startswith(f"no master of {a}, {b} answered"), str(e.value)
        trio.run(loop)
    finally:
        m.close()


def test_one_master_keeps_its_old_error() -> None:
    a = dead_address()
    m = client(a, retry_s=0.3)
    try:
        with pytest.raises(CurvineError) as e:
            m.getattr(1)
        assert str(e.value).startswith(f"master {a} unreachable: ")
    finally:
        m.close()


def test_not_leader_on_frames_moves_to_the_leader_at_once_with_the_same_request_id(
        pair: tuple[Served, Served]) -> None:
    a, b = pair
    m = client(f"{a.address},{b.address}")
    try:
        m.mknod(1, "made-on-a", 0o100644)
        assert m._frames is not None and m._frames.master == a.address
        a.role.leader = b.address   # a steps down; b leads
        t0 = time.monotonic()
        m.mknod(1, "made-on-b", 0o100644)
        assert time.monotonic() - t0 < 1.0, "a named leader is called at once"
        assert m.masters.current() == b.address and m._frames.master == b.address
        # the refused attempt and the applied one carried one request id
        assert mutations(a.role, "Mknod")[-1] == mutations(b.role, "Mknod")[-1] != ""
        assert m.lookup(1, "made-on-b").ino > 1
        with pytest.raises(FileNotFoundError):   # b's namespace: a's file is not there
            m.lookup(1, "made-on-a")
    finally:
        m.close()


def test_a_follower_answering_getring_names_the_leader(pair: tuple[Served, Served]) -> None:
    a, b = pair
    a.role.leader = b.address
    m = client(f"{a.address},{b.address}")
    try:
        assert m.getattr(1).ino == 1
        assert m.masters.current() == b.address and ("GetRing", "") in a.role.seen
    finally:
        m.close()


def test_a_follower_that_knows_no_leader_sends_the_client_to_the_next_master(pair: tuple[Served, Served]) -> None:
    a, b = pair
    a.role.leader = ""   # an election under way
    m = client(f"{a.address},{b.address}")
    try:
        assert m.getattr(1).ino == 1 and m.masters.current() == b.address
    finally:
        m.close()


def test_a_leader_outside_the_configured_list_is_followed(pair: tuple[Served, Served]) -> None:
    """The list may be stale: a follower naming a master the client was not given."""
    a, b = pair
    a.role.leader = b.address
    m = client(a.address)
    try:
        assert m.getattr(1).ino == 1
        assert m.masters.current() == b.address and m.masters.addresses == (a.address,)
    finally:
        m.close()


def test_the_mount_loop_follows_not_leader_at_once(pair: tuple[Served, Served]) -> None:
    a, b = pair
    m = client(f"{a.address},{b.address}")
    try:
        m.getattr(1)   # the route to a is learned
        fast = AsyncMeta(m)
        req = m.mknod_request(1, "loop-made", 0o100644)

        async def loop() -> float:
            assert (await fast.call(Master.GetAttr, m.getattr_request(1), 5)).attr.ino == 1
            a.role.leader = b.address
            t0 = time.monotonic()
            attr = (await fast.call(Master.Mknod, req, 5)).attr
            took = time.monotonic() - t0
            assert attr.ino > 1
            fast.close()
            return took
        took = trio.run(loop)
        assert took < 1.0, f"the loop waited {took:.2f} s before calling the leader"
        route = m.frame_route()
        assert route is not None and route[1] == b.role.frame_port and m.masters.current() == b.address
        assert mutations(a.role, "Mknod") == mutations(b.role, "Mknod") == [req.caller.request_id]
    finally:
        m.close()


# ---------------------------------------------------------------- workers
@pytest.fixture(scope="module")
def engine() -> typing.Iterator[ThreadIO]:
    io = ThreadIO(8)
    try:
        yield io
    finally:
        io.close()


def heartbeat(engine: ThreadIO, tmp_path: Path, masters: str) -> Heartbeat:
    """A worker's heartbeat (not started) over a store holding one block."""
    store = BlockStore([str(tmp_path / "blocks")], engine, reserve=0)
    w = store.create(1)
    w.append(b"block one")
    w.commit()
    return Heartbeat(WorkerConfig(master=masters, ip=HOST, host="leader-test"), store, rpc_port=1234,
                     data_port=5678, secret=SECRET)


def test_a_worker_registers_with_the_master_that_answers(master: Servers, engine: ThreadIO, tmp_path: Path) -> None:
    live = f"{HOST}:{master.port}"
    hb = heartbeat(engine, tmp_path, f"{dead_address()},{live}").start()
    m = client(live)
    try:
        assert hb.registered.wait(10)
        assert hb.link.masters.current() == live
        assert [w.address.host for w in m.call(Master.Report, pb.Empty()).workers] == ["leader-test"]
    finally:
        hb.stop()
        m.close()


def test_a_worker_follows_a_new_leader_and_registers_again(pair: tuple[Served, Served], engine: ThreadIO,
                                                           tmp_path: Path) -> None:
    a, b = pair
    hb = heartbeat(engine, tmp_path, f"{a.address},{b.address}").start()
    try:
        assert hb.registered.wait(10) and hb.link.masters.current() == a.address
        a.role.leader = b.address
        deadline = time.monotonic() + 10
        while not any(name == "ReportBlocks" for name, _ in b.role.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        calls = [name for name, _ in b.role.seen]
        # b does not know the worker: it asks it to register again, then gets the full report
        assert calls[:3] == ["Heartbeat", "RegisterWorker", "ReportBlocks"], calls
        assert hb.link.masters.current() == b.address
        # the worker's other calls go to the leader too (UfsMountGet: b answers, unknown mount)
        with pytest.raises(CurvineError) as e:
            master_resolver(hb.link, 5)(42)
        assert e.value.errno == errno.ENOENT and ("UfsMountGet", "") in b.role.seen
    finally:
        hb.stop()


def test_ufs_mount_lookups_follow_a_follower_to_the_leader(pair: tuple[Served, Served], engine: ThreadIO,
                                                           tmp_path: Path) -> None:
    """No heartbeat has moved the link yet: the lookup itself goes from a to b at once."""
    a, b = pair
    a.role.leader = b.address
    hb = heartbeat(engine, tmp_path, f"{a.address},{b.address}")   # not started
    try:
        with pytest.raises(CurvineError) as e:
            master_resolver(hb.link, 5)(42)
        assert e.value.errno == errno.ENOENT
        assert ("UfsMountGet", "") in a.role.seen and ("UfsMountGet", "") in b.role.seen
    finally:
        hb.link.close()


# ---------------------------------------------------------------- three Raft masters
needs_raft = pytest.mark.skipif(not (ROOT / "master" / "raft.py").exists(),
                                reason="the Raft master (master/raft.py, issue 23) is not in this tree yet")


@dataclass
class RaftMaster:
    address: str
    proc: subprocess.Popen[bytes]


def start_group(tmp_path: Path, n: int = 3) -> list[RaftMaster]:
    """n master processes replicating by Raft, configured as docs/ha.md says."""
    ports = free_ports(3 * n, HOST)
    grpc_ports, frame_ports, raft_ports = ports[:n], ports[n:2 * n], ports[2 * n:]
    peers = ",".join(f"{HOST}:{p}" for p in raft_ports)
    group = []
    for i in range(n):
        argv = [sys.executable, "-m", "curvine_py.master.main", "--cluster-secret", SECRET,
                "--master-bind", HOST, "--master-ip", HOST, "--master-port", str(grpc_ports[i]),
                "--master-frame-port", str(frame_ports[i]), "--master-raft-port", str(raft_ports[i]),
                "--master-raft-peers", peers, "--master-meta-dir", str(tmp_path / f"m{i}"),
                "--master-metrics-port", "0", "--master-heartbeat-ms", "200", "--master-worker-timeout-s", "2"]
        log = open(tmp_path / f"m{i}.log", "wb")
        group.append(RaftMaster(f"{HOST}:{grpc_ports[i]}",
                                subprocess.Popen(dying_with_parent(argv), stdout=log, stderr=subprocess.STDOUT)))
    return group


def status(address: str) -> pb.MasterStatusReply | None:
    from curvine_py.common.rpc import channel
    chan = channel(address, SECRET)
    try:
        reply: pb.MasterStatusReply = pb_grpc.MasterServiceStub(chan).MasterStatus(pb.Empty(), timeout=1)
        return reply
    except grpc.RpcError:
        return None
    finally:
        chan.close()


def wait_leader(group: list[RaftMaster], timeout: float = 30) -> RaftMaster:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in group:
            s = status(m.address) if m.proc.poll() is None else None
            if s is not None and s.role == "leader" and s.ready:
                return m
        time.sleep(0.1)
    raise AssertionError("no master became a ready leader")


def wait_listening(group: list[RaftMaster], logs: Path, timeout: float = 30) -> None:
    """Every master of the group answers MasterStatus; a test that kills the leader needs
    the other two alive, so one that died at its start fails here, with its log."""
    deadline = time.monotonic() + timeout
    for i, m in enumerate(group):
        while status(m.address) is None:
            assert m.proc.poll() is None and time.monotonic() < deadline, \
                f"master {i} ({m.address}) not up, exit {m.proc.poll()}:\n{(logs / f'm{i}.log').read_text()[-3000:]}"
            time.sleep(0.1)


@pytest.fixture
def raft_group(tmp_path: Path) -> typing.Iterator[list[RaftMaster]]:
    group = start_group(tmp_path)
    try:
        wait_listening(group, tmp_path)
        yield group
    finally:
        for i, m in enumerate(group):
            if m.proc.poll() is None:
                m.proc.kill()
            m.proc.wait()
            tail = (tmp_path / f"m{i}.log").read_text()[-2000:]
            print(f"---- master {i} {m.address} exit {m.proc.returncode}\n{tail}")


@needs_raft
def test_a_client_of_three_raft_masters_survives_the_leader_s_death(raft_group: list[RaftMaster]) -> None:
    leader = wait_leader(raft_group)
    followers = [m for m in raft_group if m is not leader]
    # the leader listed last: the client is sent there by a follower (or finds it)
    m = client(",".join([followers[0].address, followers[1].address, leader.address]), retry_s=30)
    try:
        m.mknod(1, "before", 0o100644)
        assert m.masters.current() == leader.address
        leader.proc.kill()
        leader.proc.wait()
        m.mknod(1, "after", 0o100644)          # retried until a new leader answers
        assert m.masters.current() != leader.address
        assert m.lookup(1, "before").ino > 1 and m.lookup(1, "after").ino > 1
    finally:
        m.close()


@needs_raft
def test_the_mount_loop_follows_a_new_raft_leader(raft_group: list[RaftMaster]) -> None:
    leader = wait_leader(raft_group)
    m = client(",".join(r.address for r in raft_group), retry_s=30)
    try:
        m.getattr(1)
        fast = AsyncMeta(m)

        async def loop() -> None:
            await fast.call(Master.Mknod, m.mknod_request(1, "loop-before", 0o100644))
            leader.proc.kill()
            await fast.call(Master.Mknod, m.mknod_request(1, "loop-after", 0o100644))
            fast.close()
        trio.run(loop)
        leader.proc.wait()
        assert m.lookup(1, "loop-before").ino > 1 and m.lookup(1, "loop-after").ino > 1
    finally:
        m.close()


@needs_raft
def test_a_worker_registers_again_with_a_new_raft_leader(raft_group: list[RaftMaster], engine: ThreadIO,
                                                         tmp_path: Path) -> None:
    leader = wait_leader(raft_group)
    hb = heartbeat(engine, tmp_path, ",".join(r.address for r in raft_group)).start()
    m = client(",".join(r.address for r in raft_group), retry_s=30)
    try:
        assert hb.registered.wait(20) and hb.link.masters.current() == leader.address
        leader.proc.kill()
        leader.proc.wait()
        new = wait_leader([r for r in raft_group if r is not leader])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            workers = m.call(Master.Report, pb.Empty()).workers
            if hb.link.masters.current() == new.address and any(w.address.host == "leader-test" for w in workers):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the worker did not register with the new leader")
    finally:
        hb.stop()
        m.close()
