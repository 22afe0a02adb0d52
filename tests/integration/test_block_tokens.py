"""Block tokens that expire, and the local paths' trust (issue 40; docs/security.md).

A real worker data server and local write socket, real connections: tokens minted with
a past expiry are refused with EKEYEXPIRED, forged ones (another MAC, block, mode or
expiry) with EACCES.  Another uid (a forked child that dropped to nobody) can neither
use the local write socket nor reach block files.  Then a real cluster whose tokens
live 1 s: an SDK read and write, and a FUSE mount's, that span several token lives.
"""
from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
import time
import typing
from pathlib import Path

import pytest
import xxhash

from curvine_py.cli.stats import scrape
from curvine_py.client import metrics
from curvine_py.cluster.local import LocalCluster, fuse_available
from curvine_py.common import frames
from curvine_py.common.security import BlockTokens, TokenExpired, TokenRefused
from curvine_py.pb import data_pb2
from curvine_py.worker.blockstore import BlockStore
from curvine_py.worker.dataserver import DataServer
from curvine_py.worker.ioengine import IoEngine
from curvine_py.worker.localwrite import LocalWriteServer
from tests.conftest import FAST_MASTER_FLAGS, client_config, dump_logs

Op = data_pb2.Op
MiB = 1 << 20
SECRET = "s3cret"
NOBODY = 65534


# ---------------------------------------------------------------- the token itself

def test_a_token_names_its_expiry_and_its_mac_covers_it() -> None:
    now = 1_800_000_000.0
    tokens = BlockTokens(SECRET, ttl_s=600, grace_s=30, clock=lambda: now)
    token = tokens.mint(7, "r")
    mode, stamp, mac = token[0], token[1:].split(".")[0], token.split(".")[1]
    assert (mode, int(stamp), len(mac)) == ("r", 1_800_000_600, 32)
    tokens.check(token, 7, write=False)
    later = BlockTokens(SECRET, ttl_s=600, grace_s=30, clock=lambda: now + 630)
    later.check(token, 7, write=False)                          # within the grace
    with pytest.raises(TokenExpired):
        BlockTokens(SECRET, ttl_s=600, grace_s=30, clock=lambda: now + 631).check(token, 7, write=False)
    assert BlockTokens("").mint(7, "r") == ""                    # an open cluster: no tokens, no checks
    BlockTokens("").check("", 7, write=True)
    with pytest.raises(ValueError):
        BlockTokens(SECRET, ttl_s=0)


# ---------------------------------------------------------------- a real worker's data channel

@pytest.fixture
def data_server(io_engine: IoEngine, tmp_path: Path) -> typing.Iterator[DataServer]:
    store = BlockStore([str(tmp_path / "data")], io_engine, reserve=0)
    server = DataServer(store, "127.0.0.1", 0, worker_id=1, secret=SECRET).start()
    server.tokens = BlockTokens(SECRET, grace_s=2)
    try:
        yield server
    finally:
        server.close()


def write(sock: socket.socket, block_id: int, data: bytes, token: str) -> data_pb2.DataHeader:
    frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=block_id, length=len(data), token=token))
    frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_DATA), data)
    frames.send_frame(sock, data_pb2.DataHeader(op=Op.WRITE_COMMIT, length=len(data),
                                                checksum=xxhash.xxh3_64_intdigest(data)))
    return frames.recv_header(sock)


def read(sock: socket.socket, block_id: int, token: str) -> tuple[data_pb2.DataHeader, bytes]:
    frames.send_frame(sock, data_pb2.DataHeader(op=Op.READ, block_id=block_id, length=1 << 30, token=token))
    h = frames.recv_header(sock)
    data = bytearray(h.length)
    frames.recv_exact_into(sock, memoryview(data))
    return h, bytes(data)


def test_an_expired_token_is_refused_with_ekeyexpired(data_server: DataServer) -> None:
    """A genuine token past its expiry (and the 2 s grace) is refused, for reads and
    writes, with EKEYEXPIRED and a message that says so; one within the grace passes."""
    tokens = BlockTokens(SECRET)
    now = int(time.time())
    with socket.create_connection(("127.0.0.1", data_server.port), timeout=20) as s:
        h = write(s, 1, b"bytes", tokens.mint(1, "w", expiry=now - 10))
        assert h.errno == errno.EKEYEXPIRED and "expired" in h.message, h
        assert write(s, 1, b"bytes", tokens.mint(1, "w", expiry=now - 1)).errno == 0   # within the grace
        h, _ = read(s, 1, tokens.mint(1, "r", expiry=now - 10))
        assert h.errno == errno.EKEYEXPIRED and "expired" in h.message, h
        h, _ = read(s, 1, tokens.mint(1, "w", expiry=now - 10))     # a write token reads back, while it lasts
        assert h.errno == errno.EKEYEXPIRED
        assert read(s, 1, tokens.mint(1, "r"))[1] == b"bytes"


@pytest.mark.parametrize("forge", [
    pytest.param(lambda t: t[:-1] + ("0" if t[-1] != "0" else "1"), id="wrong-mac"),
    pytest.param(lambda t: t.replace(t[1:t.index(".")], str(int(t[1:t.index(".")]) + 3600)), id="later-expiry"),
    pytest.param(lambda t: "w" + t[1:], id="read-token-made-write"),
    pytest.param(lambda t: BlockTokens("other").mint(1, "r"), id="other-secret"),
    pytest.param(lambda t: BlockTokens(SECRET).mint(2, "r"), id="other-block"),
    pytest.param(lambda t: "r" + t.split(".")[1], id="no-expiry"),
    pytest.param(lambda t: SECRET, id="the-secret"),
    pytest.param(lambda t: "", id="none"),
])
def test_a_forged_token_is_refused_with_eacces(data_server: DataServer, forge: typing.Callable[[str], str]) -> None:
    """Anything but a token the secret minted for this block and mode is EACCES, never
    EKEYEXPIRED (an expired token made to look fresh is a forgery, not a renewal)."""
    tokens = BlockTokens(SECRET)
    with socket.create_connection(("127.0.0.1", data_server.port), timeout=20) as s:
        assert write(s, 1, b"bytes", tokens.mint(1, "w")).errno == 0
        stale = tokens.mint(1, "r", expiry=int(time.time()) - 60)
        for genuine in (tokens.mint(1, "r"), stale):
            h, _ = read(s, 1, forge(genuine))
            assert h.errno == errno.EACCES, (forge(genuine), h)
            assert "token" in h.message
        genuine = tokens.mint(1, "w")
        if forge(genuine) != genuine:   # (a write token made a write token is itself)
            assert write(s, 1, b"other", forge(genuine)).errno == errno.EACCES
        assert read(s, 1, tokens.mint(1, "r"))[1] == b"bytes"     # still the genuine block


def test_check_names_the_refusal() -> None:
    tokens = BlockTokens(SECRET)
    with pytest.raises(TokenRefused, match="forged") as e:
        tokens.check(tokens.mint(1, "r")[:-2] + "00", 1, write=False)
    assert e.value.errno == errno.EACCES and not isinstance(e.value, TokenExpired)
    with pytest.raises(TokenRefused, match="a read token cannot write"):
        tokens.check(tokens.mint(1, "r"), 1, write=True)
    with pytest.raises(TokenRefused, match="malformed"):
        tokens.check("r123", 1, write=False)


# ---------------------------------------------------------------- local paths: another uid

def as_nobody(fn: typing.Callable[[], int]) -> int:
    """fn's result (an errno, 0 for success) in a forked child that became uid/gid nobody."""
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = fn()
        except OSError as e:
            code = e.errno or 98
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


@pytest.fixture
def open_dir() -> typing.Iterator[Path]:
    """A directory every uid may traverse (pytest's own tmp dirs are 0700: they would hide
    what the worker's modes must hide by themselves)."""
    path = Path(tempfile.mkdtemp(prefix="cv-tokens-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def opened(path: str) -> int:
    """0 if path opens for reading (an OSError's errno is the forked child's exit code)."""
    os.close(os.open(path, os.O_RDONLY))
    return 0


def local_write_open(name: str, block_id: int, token: str) -> int:
    """WRITE_OPEN on a worker's local write socket: the reply's errno (0: a descriptor came)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(name)
        frames.send_frame(s, data_pb2.DataHeader(op=Op.WRITE_OPEN, block_id=block_id, length=MiB, token=token))
        reply, fd = frames.recv_header_with_fd(s)
        if fd is not None:
            os.close(fd)
        assert (fd is not None) == (reply.errno == 0), reply
        return reply.errno


def test_another_uid_cannot_use_the_local_write_socket_nor_reach_block_files(
        io_engine: IoEngine, open_dir: Path) -> None:
    """SO_PEERCRED: only root, the worker's uid and security.local_uids are served; block
    files sit in 0700 dirs.  The worker's own uid (root here) writes; an expired token is
    EKEYEXPIRED on this path as on TCP."""
    store = BlockStore([str(open_dir / "data")], io_engine, reserve=0)
    server = DataServer(store, "127.0.0.1", 0, worker_id=3, secret=SECRET).start()
    local = LocalWriteServer(store, server.port, lambda: 3, secret=SECRET, token_grace_s=0).start()
    tokens = BlockTokens(SECRET)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
            assert write(s, 5, b"secret bytes", tokens.mint(5, "w")).errno == 0
        block_file = store.dirs[0].block_path(5)
        assert os.path.exists(block_file)
        assert local_write_open(local.name, 6, tokens.mint(6, "w")) == 0
        assert local_write_open(local.name, 7, tokens.mint(7, "w", expiry=int(time.time()) - 5)) == errno.EKEYEXPIRED
        assert local_write_open(local.name, 8, BlockTokens("other").mint(8, "w")) == errno.EACCES

        assert as_nobody(lambda: 0) == 0                                    # the child runs
        assert as_nobody(lambda: local_write_open(local.name, 9, tokens.mint(9, "w"))) == errno.EACCES
        assert as_nobody(lambda: opened(block_file)) == errno.EACCES
        assert as_nobody(lambda: len(os.listdir(store.dirs[0].blocks_dir)) and 0) == errno.EACCES
        assert as_nobody(lambda: len(os.listdir(store.dirs[0].path)) and 0) == 0   # the data dir itself: open
    finally:
        local.close()
        server.close()

    allowed = LocalWriteServer(store, server.port + 1, lambda: 3, secret=SECRET, allowed_uids=[NOBODY]).start()
    try:   # security.local_uids lets nobody in
        assert as_nobody(lambda: local_write_open(allowed.name, 10, tokens.mint(10, "w"))) == 0
    finally:
        allowed.close()


# ---------------------------------------------------------------- a real cluster, tokens of 1 s

TTL_ENV = {"CURVINE_SECURITY_BLOCK_TOKEN_TTL_S": "1", "CURVINE_SECURITY_BLOCK_TOKEN_GRACE_S": "0",
           # every byte over the data channel, where tokens are checked
           "CURVINE_CLIENT_SHORT_CIRCUIT": "false", "CURVINE_CLIENT_SHORT_CIRCUIT_WRITES": "false",
           "CURVINE_FUSE_PASSTHROUGH": "false", "CURVINE_FUSE_DIRECT_IO": "true",
           # one block fetched per read: each pause is followed by a fetch with a stale token
           "CURVINE_CLIENT_READ_AHEAD_BLOCKS": "0", "CURVINE_CLIENT_BLOCK_SIZE": "1MiB"}
# past a token's longest life: 1 s, its expiry rounded up to the second (at most 2 s), no
# grace (2 s tokens and 3.2 s pauses before: 9 pauses, 9 s more, the same refusals and renewals)
PAUSE_S = 2.2
BLOCKS = 2         # a pause before each: the second block's token is the one the first's renewal
                   # brought, stale by the next pause (a third block repeated that, 2.2 s a pause)


def renewals(access: str) -> float:
    return metrics.TOKEN_RENEWALS.labels(access)._value.get()


@pytest.fixture(scope="module")
def short_tokens(tmp_path_factory: pytest.TempPathFactory) -> typing.Iterator[LocalCluster]:
    """A cluster whose tokens live 1 s (1-2 s from their minting), with a mount where FUSE runs (one for both tests)."""
    base = tmp_path_factory.mktemp("tokens")
    c = LocalCluster(base / "cluster", workers=2, mount=str(base / "mnt") if fuse_available() else None,
                     die_with_parent=True, extra_master_flags=FAST_MASTER_FLAGS, env=TTL_ENV).start(timeout=60)
    try:
        yield c
    finally:
        c.stop()


def test_sdk_reads_and_writes_outlive_their_tokens(short_tokens: LocalCluster) -> None:
    """A writer and a reader held open across several token lives: each pause makes every
    token it holds expire, the workers refuse them, and the client renews (counted) and
    goes on; the bytes are exact."""
    from curvine_py.sdk import Client
    c = short_tokens
    try:
        cfg = client_config(c)
        cfg.client.short_circuit = cfg.client.short_circuit_writes = False
        cfg.client.read_ahead_blocks = 0
        blocks = [os.urandom(MiB) for _ in range(BLOCKS)]
        with Client(master=c.master_address, config=cfg) as client:
            w0, r0 = renewals("write"), renewals("read")
            with client.open("/sdk-long", "wb", block_size=MiB) as f:
                for data in blocks:
                    f.write(data)
                    f.flush()
                    time.sleep(PAUSE_S)
            assert renewals("write") > w0
            with client.open("/sdk-long", "rb") as f:
                got = []
                for _ in blocks:
                    time.sleep(PAUSE_S)
                    got.append(f.read(MiB))
            assert got == blocks
            assert renewals("read") - r0 >= len(blocks)   # one per pause: the reader's other blocks took its tokens
    except BaseException:
        dump_logs(c)
        raise


@pytest.mark.skipif(not fuse_available(), reason="no FUSE mount here")
def test_a_mount_reads_and_writes_files_held_open_past_their_tokens(short_tokens: LocalCluster) -> None:
    """The same through a real mount (direct_io: every read and write reaches it): a file
    written with pauses past the token life between writes and fsyncs (each fsync ships
    and commits, the next write starts a block with a stale spare id), then read with
    pauses; the bytes are exact and the mount counted its renewals."""
    c = short_tokens
    try:
        fuse = next(p.metrics for p in c.processes if p.name == "fuse")
        path = Path(c.mount or "") / "long"
        blocks = [os.urandom(MiB) for _ in range(BLOCKS)]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            for data in blocks:
                assert os.write(fd, data) == len(data)
                os.fsync(fd)
                time.sleep(PAUSE_S)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY)
        try:
            got = []
            for _ in blocks:
                time.sleep(PAUSE_S)
                got.append(os.read(fd, MiB))
        finally:
            os.close(fd)
        assert got == blocks

        # A block shipped and not yet committed, read back after its write token expired:
        # renewed under the writer's lease (BlockLocationsRequest.pending).
        fd = os.open(path.with_name("patched"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            assert os.write(fd, blocks[0]) == MiB          # a whole block: shipped at once
            time.sleep(PAUSE_S)
            assert os.pread(fd, MiB, 0) == blocks[0]
            assert os.pwrite(fd, b"patch", 10) == 5         # the block read back and shipped anew
        finally:
            os.close(fd)
        assert path.with_name("patched").read_bytes() == blocks[0][:10] + b"patch" + blocks[0][15:]
        counts = scrape(fuse)
        assert counts.total("curvine_client_token_renewals_total", access="write") >= 1
        assert counts.total("curvine_client_token_renewals_total", access="read") >= len(blocks)
    except BaseException:
        dump_logs(c)
        raise
