"""Bad input on every service gets a clear error, and the process keeps serving.

Raw gRPC calls (no SDK checks in front) with malformed names, absurd sizes, offsets and
counts, undecodable request bytes, a wrong or missing cluster secret; raw frames on a
worker's data channel.  After each, the same server must still answer a good request.
"""
from __future__ import annotations

import errno
import socket
import time
import typing

import grpc
import pytest

from curvine_py.common import frames
from curvine_py.common.security import BlockTokens
from curvine_py.cluster.local import LocalCluster
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb import curvine_pb2_grpc as pb_grpc
from curvine_py.pb import data_pb2

ERRNO_KEY = "curvine-errno"
Op = data_pb2.Op


class Master:
    """Raw stub calls carrying the secret; returns (status code, errno, details)."""

    def __init__(self, cluster: LocalCluster, secret: str | None = None) -> None:
        self.channel = grpc.insecure_channel(cluster.master_address)
        self.stub = pb_grpc.MasterServiceStub(self.channel)
        s = cluster.secret if secret is None else secret
        self.md = (("curvine-secret", s),) if s else ()

    def call(self, method: str, request: typing.Any) -> typing.Any:
        return getattr(self.stub, method)(request, timeout=10, metadata=self.md)

    def fails(self, method: str, request: typing.Any) -> tuple[grpc.StatusCode, int, str]:
        with pytest.raises(grpc.RpcError) as e:
            self.call(method, request)
        md = dict(e.value.trailing_metadata() or ())
        return e.value.code(), int(md.get(ERRNO_KEY, 0)), e.value.details() or ""


def caller() -> pb.Caller:
    return pb.Caller(uid=0, gid=0)


@pytest.fixture
def master(shared_cluster: LocalCluster) -> typing.Iterator[Master]:
    m = Master(shared_cluster)
    yield m
    # whatever the test sent, the master still serves
    assert m.call("GetAttr", pb.InodeRequest(caller=caller(), ino=1)).attr.ino == 1
    m.channel.close()


@pytest.mark.parametrize("name, code", [
    ("..", errno.EINVAL), (".", errno.EINVAL), ("a/b", errno.EINVAL), ("a\0b", errno.EINVAL),
    ("", errno.EINVAL), ("n" * 256, errno.ENAMETOOLONG), ("é" * 128, errno.ENAMETOOLONG)])
def test_bad_names_are_refused(master: Master, name: str, code: int) -> None:
    req = pb.MknodRequest(caller=caller(), parent=1, name=name, mode=0o100644)
    status, eno, details = master.fails("Mknod", req)
    assert eno == code, (status, details)
    assert details and "Traceback" not in details
    if name not in (".", ".."):     # (looking those up is fine: the kernel does)
        _, eno, _ = master.fails("Lookup", pb.LookupRequest(caller=caller(), parent=1, name=name))
        assert eno in (code, errno.ENOENT)


def test_bad_paths_are_refused(master: Master) -> None:
    for path, code in (("/a\0b", errno.EINVAL), ("/" + "d/" * 2100, errno.ENAMETOOLONG),
                       ("relative", errno.EINVAL)):
        _, eno, details = master.fails("ResolvePath", pb.PathRequest(caller=caller(), path=path))
        assert eno == code, details


def test_absurd_numbers(master: Master) -> None:
    u64 = (1 << 64) - 1
    # inodes that do not exist
    for ino in (0, u64, 1 << 62):
        _, eno, _ = master.fails("GetAttr", pb.InodeRequest(caller=caller(), ino=ino))
        assert eno in (errno.ENOENT, errno.EINVAL)
    # huge listings are bounded, huge offsets are simply past the end
    reply = master.call("ReadDir", pb.ReadDirRequest(caller=caller(), ino=1, offset=1 << 62, limit=4294967295))
    assert list(reply.entries) == [] and reply.eof
    _, eno, _ = master.fails("ReadDir", pb.ReadDirRequest(caller=caller(), ino=1, offset=u64))
    assert eno == errno.EINVAL
    # a file to abuse
    f = master.call("Create", pb.MknodRequest(caller=caller(), parent=1, name="bad-input-file",
                                              mode=0o100644, open_flags=0o1 | 0o100 | 0o1000))
    ino, lease = f.attr.ino, f.lease_id
    try:
        _, eno, _ = master.fails("AllocateBlocks", pb.AllocateBlocksRequest(caller=caller(), ino=ino,
                                                                              lease_id=lease, count=4294967295))
        assert eno == errno.EINVAL
        _, eno, _ = master.fails("AllocateBlocks", pb.AllocateBlocksRequest(caller=caller(), ino=ino,
                                                                              lease_id=lease + 999, count=1))
        assert eno in (errno.EBADF, errno.EPERM, errno.ESTALE, errno.EINVAL, errno.EBUSY)
        for size in (u64, 1 << 63):
            _, eno, _ = master.fails("SetAttr", pb.SetAttrRequest(caller=caller(), ino=ino, valid=1 << 3,
                                                                  size=size))
            assert eno in (errno.EFBIG, errno.EINVAL)
            _, eno, _ = master.fails("Commit", pb.CommitRequest(caller=caller(), ino=ino, lease_id=lease,
                                                                size=size))
            assert eno in (errno.EFBIG, errno.EINVAL)
        # blocks the master never handed out, at absurd offsets
        bogus = pb.BlockInfo(block_id=u64, offset=u64 - 5, length=u64, checksum=1)
        _, eno, _ = master.fails("Commit", pb.CommitRequest(caller=caller(), ino=ino, lease_id=lease, size=10,
                                                            blocks=[bogus]))
        assert eno == errno.EINVAL
        assert master.call("GetAttr", pb.InodeRequest(caller=caller(), ino=ino)).attr.size == 0
    finally:
        master.call("Commit", pb.CommitRequest(caller=caller(), ino=ino, lease_id=lease, size=0, release=True))
        master.call("Unlink", pb.UnlinkRequest(caller=caller(), parent=1, name="bad-input-file"))


def test_undecodable_request_bytes(master: Master, shared_cluster: LocalCluster) -> None:
    raw = master.channel.unary_unary("/curvine.MasterService/Mknod", request_serializer=None,
                                     response_deserializer=None)
    for junk in (b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", b"\x12" * 1000):
        with pytest.raises(grpc.RpcError) as e:
            raw(junk, timeout=10, metadata=master.md)
        assert e.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.UNKNOWN)


@pytest.mark.parametrize("secret", ["", "wrong-secret"])
def test_wrong_or_missing_secret_is_refused_clearly(shared_cluster: LocalCluster, secret: str) -> None:
    m = Master(shared_cluster, secret=secret)
    with pytest.raises(grpc.RpcError) as e:
        m.call("GetAttr", pb.InodeRequest(caller=caller(), ino=1))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "cluster secret" in (e.value.details() or "")
    m.channel.close()
    # the SDK turns it into a clear CurvineError (EACCES), not a traceback from gRPC
    from curvine_py.common.config import Config
    from curvine_py.common.errors import CurvineError
    from curvine_py.sdk import Client
    cfg = Config()
    cfg.client.master = shared_cluster.master_address
    cfg.cluster.secret = secret
    cfg.client.retry_s = 5
    with Client(master=shared_cluster.master_address, config=cfg) as c:
        with pytest.raises(CurvineError) as ce:
            c.stat("/")
        assert ce.value.errno == errno.EACCES and "secret" in str(ce.value)


# ---------------------------------------------------------------- the data channel

def _data_address(c: LocalCluster) -> tuple[str, int]:
    host, port = c.workers[0].data_address.rsplit(":", 1)
    return host, int(port)


def _reply(sock: socket.socket) -> data_pb2.DataHeader:
    return frames.recv_header(sock)


def test_data_channel_bad_frames(shared_cluster: LocalCluster) -> None:
    addr = _data_address(shared_cluster)
    tokens = BlockTokens(shared_cluster.secret)
    # garbage instead of a frame: the connection is dropped at once, the server lives on.
    # A header of 65,535 bytes (the most one may have) that is no protobuf: with only 4 KiB
    # of it sent, as before, the server waited for the rest and this test for its 10-s
    # timeout, which it took for the drop.
    with socket.create_connection(addr, timeout=10) as s:
        header = b"GET / HTTP/1.1\r\n\r\n" + b"\xff" * (0xFFFF - 18)
        s.sendall(b"\x00\x00\xff\xff" + header)
        t0 = time.monotonic()
        try:
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
        assert time.monotonic() - t0 < 5, "the server kept a connection that sent garbage"
    # absurd offsets and lengths on a read, a huge write announced: clear errnos
    with socket.create_connection(addr, timeout=10) as s:
        frames.send_frame(s, data_pb2.DataHeader(op=Op.READ, block_id=123456789, offset=(1 << 64) - 1,
                                                 length=(1 << 64) - 1, token=tokens.mint(123456789, "r")))
        assert _reply(s).errno == errno.ENOENT
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=987654321, length=(1 << 62),
                                                 token=tokens.mint(987654321, "w")))
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_COMMIT, block_id=987654321, length=(1 << 62)))
        h = _reply(s)
        assert h.errno in (errno.EINVAL, errno.EFBIG, errno.ENOSPC, errno.EBADMSG), h
        assert h.message
    # and a good exchange still works
    with socket.create_connection(addr, timeout=10) as s:
        frames.send_frame(s, data_pb2.DataHeader(op=Op.READ, block_id=5, length=10, token=tokens.mint(5, "r")))
        assert _reply(s).errno == errno.ENOENT
