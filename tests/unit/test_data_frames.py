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
