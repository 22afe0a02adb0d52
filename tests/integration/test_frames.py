"""The framed metadata channel: same answers as gRPC, refusals, garbage, restarts.

Most tests run a master in this process (``master.main.build_server``: the real
service, journal and both servers on real sockets) so they can stop it, start it again
on the same or other ports, or change what it advertises; the kill test uses a master
process (SIGKILL, then a restart on its metadata).
"""
from __future__ import annotations

import errno
import signal
import socket
import struct
import threading
import time
import typing
from pathlib import Path

import grpc
import pytest

from curvine_py.client.framedclient import FramedClient
from curvine_py.client.metaclient import MasterClient
from curvine_py.common import metaframes as mf
from curvine_py.common.config import Config
from curvine_py.common.errors import ConfigError, CurvineError, from_rpc_error
from curvine_py.common.rpc import channel
from curvine_py.cluster.local import LocalCluster
from curvine_py.master.framed import FrameServer
from curvine_py.master.main import Servers, build_server
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc
from curvine_py.cluster.processes import free_ports
from curvine_py.pb.methods import Master, Method, Rep, Req
from tests.conftest import client_config

SECRET = "frames-test-secret"
HOST = "127.0.0.1"


def master_config(meta_dir: Path, port: int = 0, frame_port: int = 0) -> Config:
    cfg = Config()
    cfg.cluster.secret = SECRET
    cfg.master.bind = HOST
    cfg.master.port = port
    cfg.master.frame_port = frame_port
    cfg.master.meta_dir = str(meta_dir)
    cfg.client.retry_s = 20.0
    return cfg


@pytest.fixture
def master(tmp_path: Path) -> typing.Iterator[tuple[Servers, Config]]:
    cfg = master_config(tmp_path / "meta")
    servers = build_server(cfg)
    try:
        yield servers, cfg
    finally:
        servers.stop(grace=0)


def client_of(servers: Servers, cfg: Config, secret: str = SECRET) -> MasterClient:
    return MasterClient(f"{HOST}:{servers.port}", cfg.client, secret)


def caller(mutation: bool = False) -> pb.Caller:
    return pb.Caller(uid=0, gid=0, client_id="frames-test", request_id=str(time.monotonic_ns()) if mutation else "")


def grpc_call(m: MasterClient, method: Method[Req, Rep], request: Req) -> Rep:
    """The same call over the master's gRPC service (which clients no longer use)."""
    stub = pb_grpc.MasterServiceStub(channel(m.address, SECRET))
    reply: Rep = getattr(stub, method.name)(request, timeout=10)
    return reply


# ---------------------------------------------------------------- same answers
def test_frames_answer_as_grpc_does(master: tuple[Servers, Config]) -> None:
    servers, cfg = master
    m = client_of(servers, cfg)
    try:
        root = m.call(Master.GetAttr, pb.InodeRequest(caller=caller(), ino=1))
        assert m.frame_route() is not None
        assert root == grpc_call(m, Master.GetAttr, pb.InodeRequest(caller=caller(), ino=1))
        made = m.call(Master.Create, pb.MknodRequest(caller=caller(True), parent=1, name="f", mode=0o100644,
                                                open_flags=0o1))
        assert made.lease_id and made.attr.ino > 1 and made.dirs
        m.call(Master.Commit, pb.CommitRequest(caller=caller(True), ino=made.attr.ino, lease_id=made.lease_id,
                                          size=0, release=True))
        m.call(Master.Mknod, pb.MknodRequest(caller=caller(True), parent=1, name="d", mode=0o040755))
        for method, request in [
            (Master.Lookup, pb.LookupRequest(caller=caller(), parent=1, name="f")),
            (Master.GetAttr, pb.InodeRequest(caller=caller(), ino=made.attr.ino)),
            (Master.ResolvePath, pb.PathRequest(caller=caller(), path="/d", follow_symlinks=True)),
            (Master.ReadDir, pb.ReadDirRequest(caller=caller(), ino=1, limit=100, plus=True)),
            (Master.StatFs, pb.Empty()),
            (Master.GetBlockLocations, pb.BlockLocationsRequest(caller=caller(), ino=made.attr.ino)),
        ]:
            assert m.call(method, request) == grpc_call(m, method, request), method.name
        ring = m.call(Master.GetRing, pb.Empty())
        assert ring.frame_port == servers.service.frame_port != 0
        # errors: the same errno and message on both transports
        for method, request, code in [
            (Master.Lookup, pb.LookupRequest(caller=caller(), parent=1, name="missing"), errno.ENOENT),
            (Master.Mknod, pb.MknodRequest(caller=caller(True), parent=1, name="f", mode=0o100644), errno.EEXIST),
            (Master.Rmdir, pb.UnlinkRequest(caller=caller(True), parent=1, name="f"), errno.ENOTDIR),
            (Master.Lookup, pb.LookupRequest(caller=caller(), parent=1, name="a/b"), errno.EINVAL),
        ]:
            with pytest.raises(CurvineError) as framed:
                m.call(method, request)
            with pytest.raises(CurvineError) as viagrpc:
                try:
                    grpc_call(m, method, request)
                except grpc.RpcError as e:
                    raise from_rpc_error(e) from None
            assert framed.value.errno == viagrpc.value.errno == code, method
            assert framed.value.strerror == viagrpc.value.strerror, method
        m.unlink(1, "f")
        with pytest.raises(FileNotFoundError):
            m.lookup(1, "f")
    finally:
        m.close()


def test_threads_each_get_their_own_answers(master: tuple[Servers, Config]) -> None:
    servers, cfg = master
    m = client_of(servers, cfg)
    for i in range(4):
        m.mknod(1, f"t{i}", 0o100644)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            ino = m.lookup(1, f"t{i}").ino
            for _ in range(200):
                assert m.getattr(ino).ino == ino
                assert m.lookup(1, f"t{i}").ino == ino
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and m.frame_route() is not None
    m.close()


# ---------------------------------------------------------------- the secret
def test_a_wrong_secret_is_refused_with_eacces(master: tuple[Servers, Config]) -> None:
    servers, cfg = master
    message = ("master refused the call: missing or wrong cluster secret "
               "(set [cluster] secret in the config file, as on the servers)")
    framed = FramedClient(HOST, servers.service.frame_port, "not-the-secret")
    with pytest.raises(CurvineError) as e:
        framed.call(Master.GetAttr, pb.InodeRequest(caller=caller(), ino=1), 5)
    assert e.value.errno == errno.EACCES and e.value.strerror == message
    wrong = client_of(servers, cfg, "not-the-secret")
    with pytest.raises(PermissionError) as e2:
        wrong.getattr(1)
    assert e2.value.strerror == message
    wrong.close()
    # the secret itself never crosses the wire: the client only sends HMAC(secret, nonce)
    sock, nonce = handshake(servers, mac=False)
    sock.sendall(SECRET.encode().ljust(mf.MAC_LEN, b"\0"))
    status, text = read_reply(sock)[1:]
    assert status == mf.UNAUTHENTICATED and text == message
    sock.close()
    assert FramedClient(HOST, servers.service.frame_port, SECRET).call(
        Master.GetAttr, pb.InodeRequest(caller=caller(), ino=1), 5).attr.ino == 1


def test_an_open_cluster_still_shakes_hands(tmp_path: Path) -> None:
    cfg = master_config(tmp_path / "meta")
    cfg.cluster.secret = ""
    servers = build_server(cfg)
    try:
        m = client_of(servers, cfg, "")
        assert m.getattr(1).ino == 1 and m.frame_route() is not None
        m.close()
    finally:
        servers.stop(grace=0)


# ---------------------------------------------------------------- garbage
def handshake(servers: Servers, mac: bool = True) -> tuple[socket.socket, bytes]:
    sock = socket.create_connection((HOST, servers.service.frame_port), timeout=10)
    hello = recv_exact(sock, mf.HELLO.size)
    magic, version, nonce = mf.HELLO.unpack(hello)
    assert magic == b"CVMF" and version == 2 and len(nonce) == 16
    if mac:
        sock.sendall(mf.mac(SECRET, nonce))
    return sock, nonce


def recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def read_reply(sock: socket.socket) -> tuple[int, int, str | bytes]:
    length, call_id, status = struct.unpack(">IIi", recv_exact(sock, 12))
    payload = recv_exact(sock, length - 8)
    return call_id, status, payload.decode() if status != 0 else payload


def good_call(sock: socket.socket, call_id: int = 7) -> None:
    body = pb.InodeRequest(caller=caller(), ino=1).SerializeToString()
    sock.sendall(struct.pack(">IIH", 6 + len(body), call_id, Master.GetAttr.id) + body)
    got_id, status, payload = read_reply(sock)
    assert (got_id, status) == (call_id, 0)
    assert pb.AttrReply.FromString(payload).attr.ino == 1


def closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_garbage_gets_einval_or_a_closed_connection(master: tuple[Servers, Config]) -> None:
    servers, cfg = master
    sock, _ = handshake(servers)
    good_call(sock, 1)
    # an unknown method id: EINVAL, and the connection stays usable
    sock.sendall(struct.pack(">IIH", 6 + 3, 2, 999) + b"abc")
    call_id, status, text = read_reply(sock)
    assert (call_id, status) == (2, errno.EINVAL) and "unknown method" in str(text)
    good_call(sock, 3)
    # undecodable protobuf: EINVAL, usable
    sock.sendall(struct.pack(">IIH", 6 + 4, 4, Master.GetAttr.id) + b"\xff\xff\xff\xff")
    call_id, status, text = read_reply(sock)
    assert (call_id, status) == (4, errno.EINVAL) and "undecodable" in str(text)
    good_call(sock, 5)
    # a length past the 64 MiB cap: EINVAL for that call id, then the connection closes
    sock.sendall(struct.pack(">IIH", (64 << 20) + 1, 6, Master.GetAttr.id))
    call_id, status, text = read_reply(sock)
    assert (call_id, status) == (6, errno.EINVAL) and "exceeds" in str(text)
    assert closed(sock)
    sock.close()
    # a length too short for its own header cannot be parsed: closed
    sock, _ = handshake(servers)
    sock.sendall(struct.pack(">I", 3) + b"xyz" + b"\0" * 3)
    assert closed(sock)
    sock.close()
    # random bytes instead of a MAC: refused
    sock, _ = handshake(servers, mac=False)
    sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 8)
    assert read_reply(sock)[1] == mf.UNAUTHENTICATED
    sock.close()
    # a client that connects and leaves
    socket.create_connection((HOST, servers.service.frame_port)).close()
    # the server still answers a good client
    sock, _ = handshake(servers)
    good_call(sock, 9)
    sock.close()
    m = client_of(servers, cfg)
    assert m.getattr(1).ino == 1 and m.frame_route() is not None
    m.close()


# ---------------------------------------------------------------- restarts and fallbacks
def test_a_restart_on_the_same_ports_reconnects_at_once(tmp_path: Path) -> None:
    port, frame_port = free_ports(2, HOST)
    cfg = master_config(tmp_path / "meta", port, frame_port)
    servers = build_server(cfg)
    m = client_of(servers, cfg)
    try:
        m.mknod(1, "before", 0o100644)
        route = m._frames
        servers.stop(grace=0)
        servers = build_server(cfg)
        t0 = time.monotonic()
        assert m.lookup(1, "before").ino > 1
        took = time.monotonic() - t0
        assert m._frames is route, "the client asked for the frame port again although it did not change"
        assert took < 1.0, f"the first call after the restart took {took:.2f} s"
    finally:
        m.close()
        servers.stop(grace=0)


def test_a_moved_frame_port_is_learned_again(master: tuple[Servers, Config]) -> None:
    servers, cfg = master
    m = client_of(servers, cfg)
    m.mknod(1, "x", 0o100644)
    old = servers.service.frame_port
    assert servers.frames is not None
    servers.frames.stop()
    servers.frames = FrameServer(servers.service, SECRET, HOST, 0)
    servers.service.frame_port = servers.frames.start().port
    assert m.lookup(1, "x").ino > 1
    assert typing.cast(FramedClient, m._frames).port == servers.service.frame_port != old
    m.close()


def test_an_unconnectable_frame_port_is_an_unreachable_master(master: tuple[Servers, Config]) -> None:
    """Frames are the clients' one transport: a frame port the master names but nothing
    answers on (a firewall) is retried like a master down, then one error naming it."""
    servers, cfg = master
    servers.service.frame_port = free_ports(1, HOST)[0]   # named by the master, nothing listens
    cfg.client.retry_s = 1.0
    m = client_of(servers, cfg)
    t0 = time.monotonic()
    with pytest.raises(CurvineError) as e:
        m.getattr(1)
    assert e.value.errno == errno.EHOSTDOWN and time.monotonic() - t0 < 5
    assert f"metadata port {servers.service.frame_port} (master.frame_port) does not answer" in str(e.value)
    m.close()


def test_frame_port_minus_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="master.frame_port = -1: clients make their metadata calls on it"):
        build_server(master_config(tmp_path / "meta", frame_port=-1))


def test_a_killed_master_comes_back_on_frames(cluster_factory: typing.Callable[..., LocalCluster]) -> None:
    """SIGKILL, restart on the same metadata and ports: the client's next call retries
    until the master answers, then goes on over frames on the same port (a port that
    moved is test_a_moved_frame_port_is_learned_again)."""
    from curvine_py.sdk import Client
    c = cluster_factory(workers=1)
    cfg = client_config(c)
    with Client(master=c.master_address, config=cfg) as sdk:
        sdk.put_bytes("/k", b"kept")
        meta = sdk.core.meta
        assert meta.frame_route() is not None
        port = typing.cast(FramedClient, meta._frames).port
        c.kill_master(signal.SIGKILL)
        # the call is issued while the master is down (and retried); the restart runs in
        # this thread because a daemon started with die_with_parent dies with its thread
        failed: list[BaseException] = []
        call = threading.Thread(target=lambda: _catch(failed, lambda: sdk.mkdir("/after-restart")))
        call.start()
        time.sleep(1.0)
        c.restart_master()
        call.join()
        assert failed == []
        assert sdk.get_bytes("/k") == b"kept" and sdk.stat("/after-restart").is_dir
        assert meta.frame_route() is not None
        assert typing.cast(FramedClient, meta._frames).port == port


def _catch(into: list[BaseException], fn: typing.Callable[[], object]) -> None:
    try:
        fn()
    except BaseException as e:
        into.append(e)
