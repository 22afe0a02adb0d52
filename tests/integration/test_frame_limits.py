"""A frame's length prefix is a claim, not bytes (issue 40).

The framed metadata channel's reader (``metaframes.FrameReader``, the master's frame
server and the clients) grows its buffer as a frame's bytes arrive, never to what the
length announces before they do.  First the reader itself over a socket pair, byte
counts chosen; then a real master process: connections that announce 64 MiB frames and
send a few bytes of each leave its resident memory (``/proc/PID/status`` VmRSS) where it
was, while normal calls, and a real 3 MiB request, are answered.
"""
from __future__ import annotations

import os
import socket
import threading
import typing
from pathlib import Path

import pytest

from curvine_py.common import frames
from curvine_py.common import metaframes as mf
from curvine_py.common.types import ROOT_INO
from curvine_py.pb import curvine_pb2 as pb
from curvine_py.pb.methods import Master
from curvine_py.sdk import Client
from curvine_py.worker.ufspersist import _holds_more
from tests.conftest import LocalCluster, client_config, wait_until

pytestmark = pytest.mark.timeout(30)
MiB = 1 << 20
CONNS = 32                 # before the fix: 32 x 64 MiB = 2 GiB allocated on announcement
SENT = 1000                # body bytes each of them sends
RSS_SLACK = 24 * MiB       # their 64 KiB buffers, threads and whatever the master did meanwhile


def announce(length: int, body: bytes = b"") -> bytes:
    """A request header announcing `length` (call 1, GetAttr), then body's bytes."""
    return mf.REQUEST.pack(length, 1, Master.GetAttr.id) + body


def receive(reader: mf.FrameReader, peer: socket.socket, data: bytes, n: int) -> None:
    """Send data from peer (a thread: it may exceed the socket buffers) and receive all
    of it, toward n bytes, as fill() does."""
    sender = threading.Thread(target=peer.sendall, args=(data,))
    sender.start()
    expect = reader.end - reader.start + len(data)
    while reader.end - reader.start < expect:
        assert reader.short_of(n)
        reader.received(reader.sock.recv_into(reader.view[reader.end:]), n)
    sender.join()


def test_the_buffer_grows_with_the_bytes_that_arrived() -> None:
    a, b = socket.socketpair()
    with a, b:
        reader = mf.FrameReader(b)
        n = mf.LENGTH.size + mf.MAX_FRAME
        receive(reader, a, announce(mf.MAX_FRAME, bytes(SENT)), n)
        assert len(reader.data) == mf.DEFAULT_BUFFER
        receive(reader, a, bytes(mf.DEFAULT_BUFFER), n)   # the first buffer full: the first growth
        assert len(reader.data) == mf.FIRST_GROWTH
        receive(reader, a, bytes(mf.FIRST_GROWTH), n)
        assert len(reader.data) == mf.GROWTH * mf.FIRST_GROWTH


@pytest.mark.parametrize("size", [100, 3 * MiB // 2, 4 * MiB + 7])
def test_frames_of_any_size_read_whole_and_in_order(size: int) -> None:
    """A frame under 2 MiB grows the buffer straight to its size; a larger one through
    FIRST_GROWTH; the small frame behind it is read from the same buffer."""
    a, b = socket.socketpair()
    with a, b:
        body = os.urandom(size)
        stream = mf.request_frame(1, 2, body) + mf.request_frame(2, 3, b"next")
        sender = threading.Thread(target=a.sendall, args=(stream,))
        sender.start()
        reader = mf.FrameReader(b)
        for call, method, payload in ((1, 2, body), (2, 3, b"next")):
            length, got_call, got_method = mf.REQUEST.unpack(reader.fill(mf.REQUEST.size))
            assert (got_call, got_method) == (call, method)
            assert bytes(reader.fill(mf.LENGTH.size + length)[mf.REQUEST.size:]) == payload
            reader.consume(mf.LENGTH.size + length)
        sender.join()


def test_a_persisting_worker_never_allocates_a_peers_claimed_length() -> None:
    """The block data channel: a Persist upload asks the holder of a block for 1 byte past
    its length (worker/ufspersist.py _holds_more); a reply announcing 1 TiB is refused
    before anything is allocated (it raised MemoryError, or allocated, before)."""
    a, b = socket.socketpair()
    with a, b:
        def peer() -> None:
            frames.recv_header(b)
            frames.reply(b, length=1 << 40)
        t = threading.Thread(target=peer)
        t.start()
        block = pb.BlockInfo(block_id=7, length=MiB, token="")
        with pytest.raises(frames.ChannelClosed, match="a reply of 1099511627776 bytes to a read of 1"):
            _holds_more(a, block)
        t.join()


# ---------------------------------------------------------------- a real master

def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def unread_by_server(port: int, peers: set[int]) -> int | None:
    """Bytes the server's ends of these connections (from our ports `peers` to its
    `port`) have not read yet, from /proc/net/tcp; None while some end is not listed."""
    queued, seen = 0, set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
            if local == port and remote in peers:
                seen.add(remote)
                queued += int(fields[4].split(":")[1], 16)
    return queued if seen == peers else None


def handshake(cluster: LocalCluster) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", cluster.frame_port), timeout=10)
    reader = mf.FrameReader(sock)
    sock.sendall(mf.answer_hello(reader.fill(mf.HELLO.size), cluster.secret, "the master"))
    return sock


@pytest.fixture
def client(shared_cluster: LocalCluster) -> typing.Iterator[Client]:
    c = Client(master=shared_cluster.master_address, config=client_config(shared_cluster))
    try:
        yield c
    finally:
        c.close()


def test_announced_64_mib_frames_cost_the_master_no_memory(shared_cluster: LocalCluster, client: Client) -> None:
    client.put_bytes("/warm", os.urandom(MiB))   # the master's pools and caches as traffic leaves them
    pid = shared_cluster.master.pid
    before = vm_rss(pid)
    socks = [handshake(shared_cluster) for _ in range(CONNS)]
    try:
        for s in socks:
            s.sendall(announce(mf.MAX_FRAME, bytes(SENT)))
        peers = {s.getsockname()[1] for s in socks}
        wait_until("the master read every announced frame's first bytes",
                   lambda: unread_by_server(shared_cluster.frame_port, peers) == 0, timeout=20)
        grown = vm_rss(pid) - before
        print(f"{CONNS} connections announcing {mf.MAX_FRAME // MiB} MiB, {SENT} bytes each: "
              f"master RSS {before / MiB:.0f} -> {(before + grown) / MiB:.0f} MiB")
        assert grown < RSS_SLACK, f"the master's RSS grew by {grown / MiB:.0f} MiB for {CONNS * SENT} bytes sent"
        data = os.urandom(MiB)   # normal traffic meanwhile
        client.put_bytes("/after", data)
        assert client.get_bytes("/after") == data
        assert client.stat("/after").size == MiB
    finally:
        for s in socks:
            s.close()


def test_a_real_3_mib_request_is_answered_and_the_connection_goes_on(shared_cluster: LocalCluster) -> None:
    """GetAttr of the root with 3 MiB of an unknown field (parsed and ignored), then a
    plain GetAttr on the same connection."""
    padding = b"\x7a" + _varint(3 * MiB) + bytes(3 * MiB)   # field 15, length-delimited
    with handshake(shared_cluster) as sock:
        reader = mf.FrameReader(sock)
        for call, extra in ((1, padding), (2, b"")):
            request = pb.InodeRequest(ino=ROOT_INO).SerializeToString() + extra
            sock.sendall(mf.request_frame(call, Master.GetAttr.id, request))
            length, got, status = mf.REPLY.unpack(reader.fill(mf.REPLY.size))
            body = reader.fill(mf.LENGTH.size + length)[mf.REPLY.size:]
            assert mf.reply_of(Master.GetAttr, call, got, status, body).attr.ino == ROOT_INO
            reader.consume(mf.LENGTH.size + length)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))
