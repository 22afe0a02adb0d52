"""The Raft port's message framing (master/rafttls.py ``Connection``): small messages go
out as stored deflate blocks instead of PySyncObj's zlib level 3, and PySyncObj's own
connection (any master, old or new) must read them back exactly, encrypted or not;
large ones are still compressed."""
from __future__ import annotations

import socket
from pathlib import Path
import time
import zlib
from typing import Any

import pytest
from pysyncobj.encryptor import getEncryptor
from pysyncobj.poller import createPoller
from pysyncobj.tcp_connection import TcpConnection

from curvine_py.master.rafttls import STORED_MAX, Connection, cheap, pack, stored_zlib


@pytest.mark.parametrize("size", [0, 1, 300, STORED_MAX])
def test_a_stored_block_is_what_zlib_reads_back(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    framed = stored_zlib(data)
    assert zlib.decompress(framed) == data
    assert len(framed) == len(data) + 11          # header 2, block header 5, adler32 4


def test_large_messages_are_still_compressed() -> None:
    big = {"entries": [(b"{\"op\": \"create\", \"name\": \"f%06d\"}" % i * 20, i, 3) for i in range(200)]}
    framed = pack(big)
    assert len(framed) < 0.2 * len(zlib.decompress(framed))   # compressed, not stored
    small = pack({"type": "next_node_idx", "next_node_idx": 5})
    assert small.startswith(b"\x78\x01\x01")      # one final stored block


def _pair(encrypted: bool) -> tuple[Any, Connection, TcpConnection, list[Any]]:
    """A Connection sending to PySyncObj's own TcpConnection over a socket pair, one poller."""
    poller = createPoller("auto")
    a, b = socket.socketpair()
    for s in (a, b):
        s.setblocking(False)
    sender = TcpConnection(poller=poller, socket=a, timeout=10.0)
    cheap(sender)
    receiver = TcpConnection(poller=poller, socket=b, timeout=10.0)
    got: list[Any] = []
    receiver.setOnMessageReceivedCallback(got.append)
    if encrypted:
        enc = getEncryptor("the cluster secret")
        sender.encryptor = receiver.encryptor = enc
    assert isinstance(sender, Connection)
    return poller, sender, receiver, got


@pytest.mark.parametrize("encrypted", [False, True])
def test_pysyncobjs_connection_reads_what_a_connection_sends(encrypted: bool) -> None:
    poller, sender, receiver, got = _pair(encrypted)
    messages = [{"type": "append_entries", "entries": [(b"\x00rec%d" % i, i, 2)], "commit_index": i}
                for i in range(50)]
    messages.append({"type": "append_entries", "entries": [(b"y" * 200_000, 51, 2)]})   # a compressed one
    for m in messages:
        sender.send(m)
    deadline = time.monotonic() + 10
    while len(got) < len(messages) and time.monotonic() < deadline:
        poller.poll(0.05)
    assert got == messages
    sender.disconnect()
    receiver.disconnect()


def test_a_random_key_is_sent_first_as_pysyncobj_does() -> None:
    """An encrypted connection's messages carry the peer's random key (TcpConnection's
    check against replays); the receiver drops a connection whose key is wrong."""
    poller, sender, receiver, got = _pair(True)
    sender.sendRandKey = receiver.recvRandKey = b"k" * 32
    sender.send({"type": "ping"})
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        poller.poll(0.05)
    assert got == [{"type": "ping"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_group_replicates_over_connections(tmp_path: Path) -> None:
    """Three of master/raft.py's PySyncObj nodes in one process: every connection their
    transports made (incoming and outgoing) is a Connection, and a record submitted to the
    leader is applied on all three."""
    from pysyncobj import SyncObjConf
    from curvine_py.master.raft import _Node

    peers = [f"127.0.0.1:{_free_port()}" for _ in range(3)]
    applied: dict[str, list[str]] = {p: [] for p in peers}
    nodes = []
    for me in peers:
        conf = SyncObjConf(password="secret", appendEntriesUseBatch=True, raftMinTimeout=0.4, raftMaxTimeout=0.8,
                           appendEntriesPeriod=0.05, journalFile=str(tmp_path / me.replace(":", "_")))
        nodes.append(_Node(me, [p for p in peers if p != me], conf,
                           lambda i, text, rec=None, me=me: applied[me].append(text)))
    try:
        deadline = time.monotonic() + 20
        leader = None
        while leader is None and time.monotonic() < deadline:
            leader = next((n for n in nodes if n._isLeader()), None)
            time.sleep(0.05)
        assert leader is not None, "no leader elected"
        done: list[int] = []
        while not done and time.monotonic() < deadline:
            leader.submit("hello", lambda result, error: done.append(error))
            time.sleep(0.3)
        while any("hello" not in a for a in applied.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all("hello" in a for a in applied.values()), applied
        for n in nodes:
            transport = n._SyncObj__transport
            conns = [*transport._connections.values(), *transport._unknownConnections]
            assert conns and all(isinstance(c, Connection) for c in conns), conns
    finally:
        for n in nodes:
            n.destroy()
