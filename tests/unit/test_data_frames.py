"""The data channel's frame helpers and their errors."""
from __future__ import annotations

import errno
import socket

import pytest

from curvine_py.common import frames
from curvine_py.common.frames import ChannelClosed


def test_channel_closed_carries_econnreset():
    """A closed data connection is ECONNRESET (an int errno): the mount passes errno on
    to the kernel, and a message in its place once crashed the whole mount."""
    e = ChannelClosed("connection closed after 0 of 4 bytes")
    assert e.errno == errno.ECONNRESET and e.strerror == "connection closed after 0 of 4 bytes"
    assert ChannelClosed().errno == errno.ECONNRESET


def test_a_peer_closing_mid_frame_is_channel_closed():
    a, b = socket.socketpair()
    a.sendall(b"\x00\x00")   # half of a header's length prefix
    a.close()
    with pytest.raises(ChannelClosed) as e:
        frames.recv_header(b)
    assert e.value.errno == errno.ECONNRESET
    b.close()


def _congestion(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()


def test_data_sockets_take_the_configured_congestion_control(caplog: pytest.LogCaptureFixture) -> None:
    """cluster.data_congestion is set before the connection exists: on the sockets a pool
    opens, and on a listener (its accepted sockets inherit it); "" keeps the system's; a
    name the kernel refuses is logged once, not raised."""
    from curvine_py.common.connpool import ConnectionPool
    available = open("/proc/sys/net/ipv4/tcp_available_congestion_control").read().split()
    default = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    other = next((c for c in available if c != default), None)
    if other is None:
        pytest.skip(f"only one congestion control is available here ({default})")
    with socket.create_server(("127.0.0.1", 0)) as server:
        frames.set_congestion(server, other)
        port = server.getsockname()[1]
        pool = ConnectionPool(congestion=other)
        sock = pool.get("127.0.0.1", port)
        accepted, _ = server.accept()
        plain = frames.connect("127.0.0.1", port, 1.0, congestion="")
        try:
            assert _congestion(sock) == other and _congestion(accepted) == other
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)   # tuned as well
            assert _congestion(plain) == default
            for _ in range(2):
                weird = frames.connect("127.0.0.1", port, 1.0, congestion="no-such-cc")
                assert _congestion(weird) == default
                weird.close()
            refused = [r for r in caplog.records if "no-such-cc" in r.getMessage()]
            assert len(refused) == 1 and "refused" in refused[0].getMessage()
        finally:
            for s_ in (accepted, sock, plain):
                s_.close()
            pool.close()
    with pytest.raises(ConnectionRefusedError):
        frames.connect("127.0.0.1", port, 1.0, congestion=other)   # nobody listens any more
